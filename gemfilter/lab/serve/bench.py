"""``gemfilter bench --engine URL``: time to first token and total time through a serving engine.

Paper: Shi et al. 2024, Sec. 9 (the prompt-phase saving of generating from k kept tokens). For each
context length the same NIAH prompt (needle at 50%) is sent three ways, streamed, with exactly
``--gen-tokens`` new tokens (``min_tokens`` = ``max_tokens``, ``ignore_eos``), each run's prompt with a
first line of its own (a random run id) so that the engine cannot serve it from a cached prefix:

- ``full, direct``: the whole prompt straight to the engine;
- ``full, proxy``: the whole prompt through an in-process ``gemfilter serve`` (passthrough), so that
  its difference from the direct route is the proxy's own overhead;
- ``<method>, proxy``: the selection on layers 0..r here, then the k kept ids to the engine;
- ``<method>, plugin`` (``--plugin``): the same request straight to the engine, whose own server runs the
  selection (vLLM started with ``VLLM_PLUGINS=gemfilter``, :mod:`gemfilter.lab.serve.vllm_plugin`). The full
  routes then reach vLLM's own route through the plugin, which passes a request without a ``gemfilter`` field
  on untouched.

Rows go to OUT/bench-engine.jsonl as they finish (an interrupted run resumes); OUT/bench-engine.md holds
the medians and ratios. A row is a timing only with the proof that its stream completed (``finish_reason``,
``tokens``, ``done``: ``[DONE]`` seen). A broken answer (HTML, an HTTP error, a stream closed early or without
``[DONE]``, a cut chunk, an error event) is stored as an error row, which a rerun measures again, and ends
the run with one ``error:`` line (exit 2), before any table is written.
"""

from __future__ import annotations

import functools
import http.client
import json
import statistics
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass

OUTPUTS = ("bench-engine.jsonl", "bench-engine.md", "bench-engine.json")


def quantile(values, p: float):
    """The p-th percentile of ``values`` (``None`` entries dropped; ``None`` when nothing is left).

    p = 50 is the median; any other p is the sorted value at rank round(p/100 * (n - 1)), numpy's
    ``method="nearest"``. Every lab table (bursts, conversations) uses this one rank rule.
    """
    values = sorted(v for v in values if v is not None)
    if not values:
        return None
    return statistics.median(values) if p == 50 else values[min(len(values) - 1, round(p / 100 * (len(values) - 1)))]


class BrokenStream(RuntimeError):
    """An engine's answer that is not a complete stream: never stored as a timing."""


def _parse_chunk(payload: bytes) -> dict:
    try:
        chunk = json.loads(payload)
    except ValueError:
        raise BrokenStream(f"a stream chunk is not JSON (cut short?): {payload[:120]!r}") from None
    if not isinstance(chunk, dict):
        raise BrokenStream(f"a stream chunk is not a JSON object: {payload[:120]!r}")
    if "error" in chunk:
        raise BrokenStream(f"the engine's stream failed: {chunk['error']}")
    return chunk


def stream_timed(url: str, body: dict, timeout: float) -> dict:
    """POST a streamed completion; seconds to the first text chunk and to the end, the text and the metadata.

    Raises :class:`BrokenStream` unless the answer is a complete SSE stream: a ``text/event-stream`` 200 whose
    every chunk parses, one of which carries a finish reason, ended by ``data: [DONE]``. The result carries that
    proof: ``finish_reason``, ``tokens`` (the engine's ``usage.completion_tokens`` when it reports it, asked for
    with ``stream_options``, else the text chunks counted; ``tokens_from`` says which) and ``done`` (True).
    """
    body = {**body, "stream": True, "stream_options": {"include_usage": True}}
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    start = time.perf_counter()
    first, text, meta, finish, usage, chunks, done = None, [], None, None, None, 0, False
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            kind = resp.headers.get("Content-Type", "")
            if not kind.startswith("text/event-stream"):
                raise BrokenStream(f"the answer is not a stream (Content-Type {kind or 'none'!r}): {resp.read(120)!r}")
            for line in resp:
                line = line.strip()
                if not line.startswith(b"data:"):
                    continue
                if done:
                    raise BrokenStream("data after [DONE]")
                payload = line[5:].strip()
                if payload == b"[DONE]":
                    done = True
                    continue
                chunk = _parse_chunk(payload)
                meta = meta or chunk.get("gemfilter")
                usage = chunk.get("usage") or usage
                choices = chunk.get("choices") or []
                piece = "".join(c.get("text", "") for c in choices if isinstance(c, dict))
                finish = next(
                    (c["finish_reason"] for c in choices if isinstance(c, dict) and c.get("finish_reason")), finish
                )
                if piece:
                    chunks += 1
                    if first is None:
                        first = time.perf_counter() - start
                text.append(piece)
    except urllib.error.HTTPError as err:
        raise BrokenStream(f"the engine answered HTTP {err.code}: {err.read(200)!r}") from None
    except (http.client.HTTPException, OSError) as err:  # a cut chunk, a reset, a timeout
        raise BrokenStream(f"the stream broke: {type(err).__name__}: {err}") from None
    if not done:
        raise BrokenStream("the stream ended without data: [DONE] (closed early)")
    if finish is None:
        raise BrokenStream("no chunk carried a finish_reason")
    if first is None:
        raise BrokenStream("the stream carried no text")
    tokens = usage.get("completion_tokens") if isinstance(usage, dict) else None
    return {
        "ttft": first,
        "total": time.perf_counter() - start,
        "text": "".join(text),
        "meta": meta,
        "finish_reason": finish,
        "tokens": chunks if tokens is None else tokens,
        "tokens_from": "text chunks" if tokens is None else "usage",
        "done": done,
    }


def complete(row: dict) -> bool:
    """Whether a stored row is a timing with the proof that its stream completed (not an error row)."""
    return "error" not in row and row.get("done") is True and bool(row.get("finish_reason")) and bool(row.get("tokens"))


def summarize(rows: list, method: str) -> list:
    """One dict per length: medians of each route and the ratios docs/serving.md reports."""
    out = []
    for n in sorted({r["length"] for r in rows}):

        def med(route, key):
            vals = [r[key] for r in rows if r["length"] == n and r["route"] == route and r[key] is not None]
            return statistics.median(vals) if vals else None

        d, p, g, q = "full, direct", "full, proxy", f"{method}, proxy", f"{method}, plugin"
        row = {
            "length": n,
            "prompt_tokens": med(d, "prompt_tokens"),
            "kept_tokens": med(g, "kept_tokens"),
            "ttft_full": med(d, "ttft"),
            "total_full": med(d, "total"),
            "ttft_method": med(g, "ttft"),
            "total_method": med(g, "total"),
            "selection": med(g, "selection_seconds"),
            "overhead_ttft": None,
            "overhead_total": None,
        }
        if any(r["route"] == q for r in rows):  # --plugin: the same method inside the engine's own server
            row.update(
                kept_plugin=med(q, "kept_tokens"),
                ttft_plugin=med(q, "ttft"),
                total_plugin=med(q, "total"),
                selection_plugin=med(q, "selection_seconds"),
            )
        if med(p, "ttft") is not None and row["ttft_full"] is not None:
            row["overhead_ttft"] = med(p, "ttft") - row["ttft_full"]
            row["overhead_total"] = med(p, "total") - row["total_full"]
        out.append(row)
    return out


def markdown(summary: list, meta: dict) -> str:
    def f(x, spec=".2f"):
        return "n/a" if x is None else format(x, spec)

    def ratio(a, b):
        return "n/a" if a is None or not b else f"{a / b:.2f}x"

    m = meta["method"]
    if any("ttft_plugin" in r for r in summary):
        return _markdown_plugin(summary, meta, f, ratio)
    lines = [
        f"# Through the engine: full vs {m} (k={meta['topk'] or 'its own'}, layer {meta['layer']})",
        "",
        f"engine {meta['engine']}; {meta['gen_tokens']} new tokens, streamed; medians of {meta['repeats']} "
        f"run(s); selector on {meta['selector_device']}.",
        "",
        f"| length | prompt tokens | kept | TTFT full (s) | TTFT {m} (s) | TTFT full / {m} | total full (s) | "
        f"total {m} (s) | total full / {m} | selection (s) | proxy overhead TTFT / total (s) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in summary:
        lines.append(
            f"| {r['length']} | {f(r['prompt_tokens'], '.0f')} | {f(r['kept_tokens'], '.0f')} | "
            f"{f(r['ttft_full'])} | {f(r['ttft_method'])} | {ratio(r['ttft_full'], r['ttft_method'])} | "
            f"{f(r['total_full'])} | {f(r['total_method'])} | {ratio(r['total_full'], r['total_method'])} | "
            f"{f(r['selection'])} | {f(r['overhead_ttft'], '+.3f')} / {f(r['overhead_total'], '+.3f')} |"
        )
    return "\n".join(lines) + "\n"


def _markdown_plugin(summary: list, meta: dict, f, ratio) -> str:
    """The table of a ``--plugin`` run: plain vLLM, the proxy in front of it, and the plugin inside it."""
    m = meta["method"]
    lines = [
        f"# Time to first token: plain vLLM, {m} through the proxy, {m} through the vLLM plugin "
        f"(k={meta['topk'] or 'its own'}, layer {meta['layer']})",
        "",
        f"engine {meta['engine']} (started with VLLM_PLUGINS=gemfilter; full requests carry no gemfilter field "
        f"and reach vLLM's own route); {meta['gen_tokens']} new tokens, streamed; medians of {meta['repeats']} "
        f"run(s); proxy's selector on {meta['selector_device']}.",
        "",
        "| length | prompt tokens | kept (proxy / plugin) | TTFT vLLM (s) | TTFT proxy (s) | TTFT plugin (s) | "
        "vLLM / proxy | vLLM / plugin | proxy / plugin | total vLLM / proxy / plugin (s) | "
        "selection proxy / plugin (s) | proxy overhead TTFT (s) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in summary:
        lines.append(
            f"| {r['length']} | {f(r['prompt_tokens'], '.0f')} | {f(r['kept_tokens'], '.0f')} / "
            f"{f(r.get('kept_plugin'), '.0f')} | {f(r['ttft_full'])} | {f(r['ttft_method'])} | "
            f"{f(r.get('ttft_plugin'))} | {ratio(r['ttft_full'], r['ttft_method'])} | "
            f"{ratio(r['ttft_full'], r.get('ttft_plugin'))} | "
            f"{ratio(r['ttft_method'], r.get('ttft_plugin'))} | "
            f"{f(r['total_full'])} / {f(r['total_method'])} / {f(r.get('total_plugin'))} | "
            f"{f(r['selection'])} / {f(r.get('selection_plugin'))} | {f(r['overhead_ttft'], '+.3f')} |"
        )
    return "\n".join(lines) + "\n"


def _spec_of(args):
    """The one prompt method ``--engine`` measures against full: the last of --methods (a note names the others)."""
    from gemfilter.toolkit.options import method_specs_of

    from ...methods import FullMethod

    specs = method_specs_of(args)
    spec = specs[-1]
    if len(specs) > 1:  # the help says so; a run with several must say it too, or a user reads b's table as a's
        print(
            f"note: --engine measures full against one prompt method, the last of --methods: {spec.text} "
            f"(not {', '.join(s.text for s in specs[:-1])})",
            file=sys.stderr,
        )
    if issubclass(spec.cls, FullMethod):
        raise ValueError("--engine compares full with a prompt method: give one, e.g. --methods gemfilter")
    return spec


def _check(args) -> tuple:
    """(spec, lengths) of ``--engine``'s options, each checked by name before anything connects."""
    from gemfilter.toolkit.options import check_int, parse_lengths

    from .proxy import request_options

    spec = _spec_of(args)
    request_options({}, {"method": spec.text, "topk": args.topk})
    lengths = parse_lengths(args.lengths, "--lengths")
    for flag, value, low in (
        ("--repeats", args.repeats, 1),
        ("--gen-tokens", args.gen_tokens, 1),
        ("--threads", args.threads, 0),
    ):
        check_int(value, flag, low)
    return spec, lengths


def _warm_up(routes, body_of, tok, lengths, hay, args) -> None:
    """One short request per route, not recorded: the engine's first request and the selector's first pass are
    slower. The plugin's route must answer with GemFilter's metadata."""
    from gemfilter.toolkit.haystack import build_case

    warm = tok(build_case(tok, min(lengths), 50, haystack=hay).prompt)["input_ids"]
    for route, url, m in routes:
        try:
            res = stream_timed(url, body_of(route, url, m, warm, 2, forced=False), args.timeout)
        except BrokenStream as err:
            raise BrokenStream(f"the warm-up request ({route}) failed: {err}; nothing was timed") from None
        if route.endswith(", plugin") and not res["meta"]:
            raise BrokenStream(
                f"the engine at {args.engine} answered a request with a gemfilter field "
                "without GemFilter's metadata: start it with VLLM_PLUGINS=gemfilter (the "
                "vLLM plugin, docs/serving.md), or leave out --plugin"
            )


@dataclass(frozen=True)
class _Bodies:
    """The request body of one route: the proxy gets the method (its own --topk applies), the plugin's route the
    method and the run's --topk where the spec sets no budget; the full routes go without a gemfilter field."""

    model_id: str
    proxy: str
    plugin_field: dict

    def __call__(self, route: str, url: str, method: str, ids, tokens: int, forced: bool = True) -> dict:
        body = {"model": self.model_id, "prompt": ids, "max_tokens": tokens, "temperature": 0}
        if forced:
            body.update(min_tokens=tokens, ignore_eos=True)
        if url == self.proxy:
            body["gemfilter"] = {"method": method}
        elif route.endswith(", plugin"):
            body["gemfilter"] = self.plugin_field
        return body


def _time_one(unit, *, tok, hay, body_of, meta: dict, args, jsonl) -> dict:
    """One timed run of ``unit`` ((length, route, repeat), (url, method)): its row, or an error row stored as
    evidence and BrokenStream raised (a rerun measures it again)."""
    from gemfilter.toolkit.haystack import build_case
    from gemfilter.toolkit.io import append_jsonl

    (n, route, i), (url, m) = unit.key, unit.data
    case = build_case(tok, n, 50, haystack=hay)
    # A first line of its own per run, so that no engine serves it from a cached prefix of an earlier run
    # (vLLM's automatic prefix caching would make every repeat's prefill almost free).
    ids = tok(f"Run {uuid.uuid4().hex[:8]}.\n" + case.prompt, add_special_tokens=case.add_special_tokens)["input_ids"]
    where = dict(meta, length=n, route=route, repeat=i)
    try:
        res = stream_timed(url, body_of(route, url, m, ids, args.gen_tokens), args.timeout)
        if res["tokens_from"] == "usage" and res["tokens"] != args.gen_tokens:
            raise BrokenStream(f"the engine generated {res['tokens']} tokens, not the forced {args.gen_tokens}")
    except BrokenStream as err:  # kept as evidence, never as a timing: a rerun measures it again
        append_jsonl(jsonl, dict(where, error=str(err)))
        raise BrokenStream(
            f"{route} at length {n} (repeat {i}): {err}; nothing was timed for it (an error "
            f"row in {jsonl.name}, retried by a rerun)"
        ) from None
    info = res["meta"] or {}
    return dict(
        where,
        ttft=res["ttft"],
        total=res["total"],
        prompt_tokens=len(ids),
        kept_tokens=info.get("kept_tokens", len(ids)),
        selection_seconds=info.get("selection_seconds"),
        finish_reason=res["finish_reason"],
        tokens=res["tokens"],
        tokens_from=res["tokens_from"],
        done=res["done"],
    )


def run(args) -> int:
    """Run the engine benchmark for ``gemfilter bench --engine``'s parsed ``args``; returns the exit status."""
    from gemfilter.toolkit.haystack import check_lengths, make_haystack
    from gemfilter.toolkit.io import append_jsonl, check_out_dir, write_json_atomic, write_text_atomic
    from gemfilter.toolkit.loop import Unit, compute, missing, stored_rows

    from .cli import connect
    from .proxy import ProxyServer

    spec, lengths = _check(args)
    method = spec.text
    out = check_out_dir(args.out, files=OUTPUTS)
    layer = dict(spec.params).get("layer", args.layer)  # the spec's layer wins, as for every default
    upstream, selector, _ = connect(
        args.engine, timeout=args.timeout, model=args.model, layer=layer, attn=args.attn, threads=args.threads
    )
    model_id, tok, layer = upstream.default_model(), selector.tokenizer, selector.layer
    check_lengths(tok, lengths)  # before the warm-up: a length too short for the needle is one line
    server = ProxyServer(("127.0.0.1", 0), selector, upstream, method=method, topk=args.topk, quiet=True)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    proxy = f"http://127.0.0.1:{server.server_address[1]}/v1/completions"
    meta = dict(
        engine=args.engine,
        model=args.model or "embedded:gemma3-270m",
        method=method,
        topk=args.topk,
        layer=layer,
        gen_tokens=args.gen_tokens,
        selector_device=str(next(selector.model.parameters()).device),
    )
    if args.plugin:
        meta["plugin"] = True  # rows of a run with the plugin's route never mix with one without
    jsonl = out / "bench-engine.jsonl"
    rows = stored_rows(jsonl, meta)
    rows = [r for r in rows if complete(r)]  # error rows, and rows without the stream proof, run again
    direct = args.engine.rstrip("/") + "/completions"
    routes = (("full, direct", direct, "full"), ("full, proxy", proxy, "full"), (f"{method}, proxy", proxy, method))
    if args.plugin:
        routes += ((f"{method}, plugin", direct, method),)
    # The proxy applies its --topk where the spec sets no budget; the plugin is told it per request, so that
    # both keep the same k whatever the engine's GEMFILTER_TOPK.
    own = args.topk if args.topk is not None and spec.ratio is None and "topk" not in dict(spec.params) else None
    plugin_field = {"method": method, **({"topk": own} if own is not None else {})}

    body_of = _Bodies(model_id, proxy, plugin_field)
    units = [
        Unit(jsonl.name, (n, route, i), (url, m))
        for n in lengths
        for i in range(args.repeats)
        for route, url, m in routes
    ]
    todo = missing(units, {jsonl.name: {(r["length"], r["route"], r["repeat"]) for r in rows}})
    hay = make_haystack(tok, max(lengths)) if todo else None
    predict = functools.partial(_time_one, tok=tok, hay=hay, body_of=body_of, meta=meta, args=args, jsonl=jsonl)

    try:
        if todo:
            _warm_up(routes, body_of, tok, lengths, hay, args)
        rows += compute(todo, predict, lambda unit, row: append_jsonl(jsonl, row), desc="engine runs", noun="run")
    finally:
        server.shutdown()
        server.server_close()
    rows = [r for r in rows if r["length"] in lengths]
    summary = summarize(rows, method)
    meta["repeats"] = args.repeats
    write_json_atomic(out / "bench-engine.json", {"meta": meta, "lengths": summary})
    table = markdown(summary, meta)
    write_text_atomic(out / "bench-engine.md", table)
    print(table)
    return 0
