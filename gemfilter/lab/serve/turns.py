"""``gemfilter bench --engine URL --turns T``: conversations over one document each, through a serving engine.

SCBench (Li et al. 2024, arXiv 2412.10319) names the two ways several questions meet one context:
``multi-turn`` (each question follows the conversation so far: the document, earlier questions and the
engine's own answers) and ``multi-request`` (independent questions over the same document). Each of
``--concurrency`` N conversations (N at once, one thread each, released together) has a document of its own
(``--lengths`` tokens of the essays, a first line of its own, and T facts "The magic number for NAME is
NNNNNN." spread through it) and asks about one fact per turn. The same conversations run on three routes,
one route after another, each with documents no other route has sent:

- ``full``: the whole prompt straight to the engine, with its prefix caching as it is deployed (vLLM's is on
  by default): a follow-up turn reuses the engine's KV of the history;
- ``<method>, cached``: an in-process ``gemfilter serve`` with the selector's prefix cache
  (``--selector-cache-gb``): a follow-up turn runs only its new tokens through layers 0..r;
- ``<method>, uncached``: the same proxy without it: every turn runs its whole prompt through layers 0..r.

Rows go to OUT/bench-turns.jsonl as each conversation ends (a cell, route x N, counts once all its
conversations are stored; an interrupted run reruns the cells it had not finished). A row is one request:
time to first token, total, tokens kept, the selection's seconds and its wait for the selector, whether the
answer holds the fact's number, and (N = 1) the engine's cached prompt tokens (vLLM's ``prompt_tokens_cached``).
A cell's row adds its wall time and the engine's peak KV-cache use (its ``/metrics``); OUT/bench-turns.md: tables.
"""

from __future__ import annotations

import random
import re
import threading
import time
import urllib.request
import uuid

from .bench import BrokenStream, stream_timed
from .bench import quantile as _q

OUTPUTS = ("bench-turns.jsonl", "bench-turns.md", "bench-turns.json")
MODES = ("multi-turn", "multi-request")
NAMES = ("Amber", "Birch", "Cobalt", "Dune", "Ember", "Fjord", "Granite", "Harbor", "Indigo", "Juniper")
QUESTION = "\n\nQuestion: What is the magic number for {name}? Answer with the number.\nAnswer:"


def metrics_text(base: str, timeout: float = 5.0) -> str:
    """The engine's Prometheus text ("" if it has no ``/metrics``). ``base`` is the OpenAI base URL (``.../v1``);
    vLLM serves its metrics at the server's root."""
    url = re.sub(r"/v1/?$", "", base.rstrip("/")) + "/metrics"
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.read().decode("utf-8", "replace")
    except OSError:
        return ""


def prefix_caching(base: str):
    """True or False as the engine's ``vllm:cache_config_info`` says it runs prefix caching; None if it does not say."""
    m = re.search(r'vllm:cache_config_info\{[^}]*enable_prefix_caching="(\w+)"', metrics_text(base))
    return None if m is None else m.group(1).lower() == "true"


def engine_metrics(base: str, timeout: float = 5.0) -> dict:
    """vLLM's counters and gauges this benchmark reads, by name without ``vllm:`` (summed over label sets); {} if
    the engine has no ``/metrics``."""
    wanted = (
        "kv_cache_usage_perc",
        "prompt_tokens_cached_total",
        "prompt_tokens_total",
        "prefix_cache_hits_total",
        "prefix_cache_queries_total",
        "num_requests_waiting",
    )
    text = metrics_text(base, timeout)
    out: dict = {}
    for line in text.splitlines():
        m = re.match(r"vllm:([a-z_]+)(\{[^}]*\})?\s+([-+0-9.eE]+|NaN)$", line)
        if m and m.group(1) in wanted:
            out[m.group(1)] = out.get(m.group(1), 0.0) + float(m.group(3))  # summed over label sets
    return out


def make_document(tok, hay_ids: list, length: int, turns: int, seed: int, salt: str = "") -> tuple:
    """(document ids, [(name, number)] * turns): ``length`` tokens of the haystack from an offset of its own
    (``seed``), one fact per turn at depths (t + 0.5) / turns, each at a sentence's end, and a first line of
    its own (``seed`` and ``salt``: the same document under two salts shares no prefix in any cache; the
    runner's salt holds the route, the mode, N and a nonce per run, so no cell meets another's document)."""
    rng = random.Random(seed)
    tag = uuid.uuid5(uuid.NAMESPACE_OID, f"{seed}/{salt}").hex[:12]
    header = tok(f"Document {tag}.\n", add_special_tokens=False)["input_ids"]
    facts = [
        (NAMES[t % len(NAMES)] + (str(t // len(NAMES)) if t >= len(NAMES) else ""), rng.randrange(10**5, 10**6))
        for t in range(turns)
    ]
    fact_ids = [
        tok(f" The magic number for {name} is {number}.", add_special_tokens=False)["input_ids"]
        for name, number in facts
    ]
    body_len = length - len(header) - sum(map(len, fact_ids))
    if body_len < 16 * turns:
        raise ValueError(
            f"--lengths {length}: too short for {turns} facts and a document; give at least "
            f"{length - body_len + 16 * turns} tokens"
        )
    start = rng.randrange(0, max(1, len(hay_ids) - body_len))
    body = list(hay_ids[start : start + body_len])
    period = set(tok(".", add_special_tokens=False)["input_ids"])
    ids, at = list(header), 0
    for t, fact in enumerate(fact_ids):
        cut = int(body_len * (t + 0.5) / turns)
        while cut > at and body[cut - 1] not in period:  # back to the end of a sentence, as NIAH's needle
            cut -= 1
        ids += body[at:cut] + fact
        at = cut
    ids += body[at:]
    bos = [tok.bos_token_id] if getattr(tok, "bos_token_id", None) is not None else []
    return bos + ids, facts


def converse(
    url: str,
    body: dict,
    doc: list,
    facts: list,
    mode: str,
    tok,
    timeout: float,
    start: threading.Barrier,
    metrics_of=None,
) -> list:
    """One conversation's rows, turn by turn: ``multi-turn`` appends each question and the engine's answer to
    the history; ``multi-request`` asks each question over the document alone. ``metrics_of`` (N = 1): a
    callable returning the engine's counters, read around each request."""
    rows, history = [], list(doc)
    start.wait()
    for t, (name, number) in enumerate(facts):
        question = tok(QUESTION.format(name=name), add_special_tokens=False)["input_ids"]
        prompt = (history if mode == "multi-turn" else list(doc)) + question
        before = metrics_of() if metrics_of else {}
        begun = time.perf_counter()
        res = stream_timed(url, dict(body, prompt=prompt), timeout)
        after = metrics_of() if metrics_of else {}
        info = res["meta"] or {}
        row = dict(
            turn=t + 1,
            ttft=res["ttft"],
            total=res["total"],
            began=begun,
            prompt_tokens=len(prompt),
            kept_tokens=info.get("kept_tokens", len(prompt)),
            selection_seconds=info.get("selection_seconds"),
            selector_wait_seconds=info.get("selector_wait_seconds"),
            selector_cached_tokens=info.get("selector_cached_tokens"),
            hit=str(number) in res["text"],
            tokens=res["tokens"],
            finish_reason=res["finish_reason"],
            done=res["done"],
        )
        if "prompt_tokens_cached_total" in before and "prompt_tokens_cached_total" in after:
            row["engine_cached_tokens"] = after["prompt_tokens_cached_total"] - before["prompt_tokens_cached_total"]
        rows.append(row)
        if mode == "multi-turn":
            history = prompt + tok(res["text"], add_special_tokens=False)["input_ids"]
    return rows


class Sampler:
    """Reads the engine's ``/metrics`` every ``every`` seconds on a thread of its own; ``peak`` of each gauge."""

    def __init__(self, base: str, every: float = 0.5):
        self.base, self.every, self.peak, self._stop = base, every, {}, threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self):
        while not self._stop.is_set():
            for key, value in engine_metrics(self.base, timeout=2).items():
                self.peak[key] = max(self.peak.get(key, value), value)
            self._stop.wait(self.every)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


def run_cell(
    route: dict,
    n: int,
    mode: str,
    length: int,
    turns: int,
    tok,
    hay_ids: list,
    timeout: float,
    engine: str,
    seed: int,
    nonce: str = "",
) -> tuple:
    """(request rows, the cell's row) for N conversations at once on one route. The documents' bodies and facts
    depend on ``seed`` only (the same on every route); their first lines on the route, mode, N and ``nonce``."""
    salt = f"{route['name']}/{mode}/{n}/{nonce}"
    docs = [make_document(tok, hay_ids, length, turns, seed * 1000 + i, salt) for i in range(n)]
    barrier = threading.Barrier(n + 1)
    results, errors = [None] * n, []
    counters = (lambda: engine_metrics(engine)) if n == 1 else None

    def work(i):
        try:
            results[i] = converse(route["url"], route["body"], *docs[i], mode, tok, timeout, barrier, counters)
        except BaseException as err:  # noqa: BLE001 - reported below, with the conversation that failed
            errors.append((i, err))
            barrier.abort()

    threads = [threading.Thread(target=work, args=(i,), daemon=True) for i in range(n)]
    for th in threads:
        th.start()
    before = engine_metrics(engine)
    with Sampler(engine) as sampler:
        try:
            barrier.wait()
        except threading.BrokenBarrierError:
            pass
        begun = time.perf_counter()
        for th in threads:
            th.join()
        wall = time.perf_counter() - begun
    if errors:
        i, err = errors[0]
        what = err if isinstance(err, BrokenStream) else f"{type(err).__name__}: {err}"
        raise BrokenStream(f"{route['name']}, {mode}, N={n}, conversation {i}: {what}")
    after = engine_metrics(engine)
    rows = [dict(r, conversation=i, began=r["began"] - begun) for i, conv in enumerate(results) for r in conv]
    cell = dict(
        kind="cell",
        wall=wall,
        requests=len(rows),
        kv_cache_usage_peak=sampler.peak.get("kv_cache_usage_perc"),
        waiting_peak=sampler.peak.get("num_requests_waiting"),
        **{
            f"engine_{k}": after[k] - before[k]
            for k in (
                "prompt_tokens_cached_total",
                "prompt_tokens_total",
                "prefix_cache_hits_total",
                "prefix_cache_queries_total",
            )
            if k in after and k in before
        },
    )
    return rows, cell


def summarize(rows: list, cells: list) -> dict:
    """Per turn (N = 1, and every N) and per cell: the medians, p95s and rates the tables show."""
    per_turn, per_cell = [], []
    for c in cells:
        mine = [r for r in rows if r["cell"] == c["cell"]]
        per_cell.append(
            dict(
                c,
                ttft_p50=_q([r["ttft"] for r in mine], 50),
                ttft_p95=_q([r["ttft"] for r in mine], 95),
                total_p50=_q([r["total"] for r in mine], 50),
                total_p95=_q([r["total"] for r in mine], 95),
                per_minute=60 * len(mine) / c["wall"] if c["wall"] else None,
                wait_p50=_q([r["selector_wait_seconds"] for r in mine], 50),
                wait_p95=_q([r["selector_wait_seconds"] for r in mine], 95),
                selection_p50=_q([r["selection_seconds"] for r in mine], 50),
                accuracy=100 * sum(r["hit"] for r in mine) / len(mine) if mine else None,
            )
        )
        for t in sorted({r["turn"] for r in mine}):
            at = [r for r in mine if r["turn"] == t]
            per_turn.append(
                dict(
                    mode=c["mode"],
                    length=c["length"],
                    route=c["route"],
                    concurrency=c["concurrency"],
                    turn=t,
                    ttft_p50=_q([r["ttft"] for r in at], 50),
                    ttft_p95=_q([r["ttft"] for r in at], 95),
                    total_p50=_q([r["total"] for r in at], 50),
                    prompt_tokens=_q([r["prompt_tokens"] for r in at], 50),
                    kept_tokens=_q([r["kept_tokens"] for r in at], 50),
                    selection_p50=_q([r["selection_seconds"] for r in at], 50),
                    selector_cached=_q([r.get("selector_cached_tokens") for r in at], 50),
                    engine_cached=_q([r.get("engine_cached_tokens") for r in at], 50),
                    accuracy=100 * sum(r["hit"] for r in at) / len(at),
                )
            )
    return {"turns": per_turn, "cells": per_cell}


def markdown(summary: dict, meta: dict) -> str:
    def f(x, spec=".2f"):
        return "n/a" if x is None else format(x, spec)

    def ratio(a, b):
        return "n/a" if a is None or not b else f"{a / b:.2f}x"

    m, routes = meta["method"], meta["routes"]
    lines = [
        f"# Conversations through the engine: full vs {m} (layer {meta['layer']})",
        "",
        f"engine {meta['engine']} (prefix caching: {meta['engine_prefix_caching']}); {meta['turns']} turns, "
        f"{meta['gen_tokens']} new tokens per answer, streamed; selector cache {meta['selector_cache_gb']:g} GB, "
        f"{meta['selector_workers']} selector worker(s); selector on {meta['selector_device']}.",
        "",
    ]
    for key in sorted({(t["mode"], t["length"], t["concurrency"]) for t in summary["turns"]}):
        mode, length, n = key
        at = {(t["route"], t["turn"]): t for t in summary["turns"] if (t["mode"], t["length"], t["concurrency"]) == key}
        names = [r for r in routes if any(k[0] == r for k in at)]
        picked = [r for r in names if r != "full"]
        ratios = [f"full / {r}" for r in picked] if "full" in names else []
        heads = (
            ["turn", "prompt tokens", "kept"]
            + [f"TTFT {r}" for r in names]
            + ratios
            + [f"selection {r} (s)" for r in picked]
            + [f"selector cached tokens {r}" for r in picked]
            + [f"engine cached tokens {r}" for r in names]
        )
        lines += [
            f"## {mode}, {length} tokens, N = {n}: time to first token per turn (s, median over conversations)",
            "",
            "| " + " | ".join(heads) + " |",
            "|" + "---|" * len(heads),
        ]
        for t in sorted({k[1] for k in at}):
            get = {r: at.get((r, t)) or {} for r in names}
            any_row = next(x for x in get.values() if x)
            kept = next((get[r].get("kept_tokens") for r in picked if get[r]), None)
            cells = (
                [str(t), f(any_row.get("prompt_tokens"), ".0f"), f(kept, ".0f")]
                + [f(get[r].get("ttft_p50")) for r in names]
                + [ratio(get["full"].get("ttft_p50"), get[r].get("ttft_p50")) for r in picked if ratios]
                + [f(get[r].get("selection_p50")) for r in picked]
                + [f(get[r].get("selector_cached"), ".0f") for r in picked]
                + [f(get[r].get("engine_cached"), ".0f") for r in names]
            )
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
    lines += [
        "## Per cell: every request of the N conversations",
        "",
        "| mode | length | N | route | requests | TTFT p50 / p95 (s) | total p50 / p95 (s) | wall (s) | requests/min "
        "| selector wait p50 / p95 (s) | selection p50 (s) | answers with the number | engine cached / prompt "
        "tokens | KV cache peak |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for c in summary["cells"]:
        cached, total = c.get("engine_prompt_tokens_cached_total"), c.get("engine_prompt_tokens_total")
        lines.append(
            f"| {c['mode']} | {c['length']} | {c['concurrency']} | {c['route']} | {c['requests']} | "
            f"{f(c['ttft_p50'])} / {f(c['ttft_p95'])} | {f(c['total_p50'])} / {f(c['total_p95'])} | "
            f"{f(c['wall'], '.1f')} | {f(c['per_minute'], '.1f')} | {f(c['wait_p50'])} / {f(c['wait_p95'])} | "
            f"{f(c['selection_p50'])} | {f(c['accuracy'], '.0f')}% | {f(cached, '.0f')} / {f(total, '.0f')} | "
            f"{'n/a' if c['kv_cache_usage_peak'] is None else format(100 * c['kv_cache_usage_peak'], '.1f') + '%'} |"
        )
    return "\n".join(lines) + "\n"


def finished_rows(rows: list) -> tuple:
    """(request rows, cell rows) of the cells stored whole: a cell's row is written after all its requests'."""
    cells = [r for r in rows if r.get("kind") == "cell"]
    done = {c["cell"] for c in cells}
    return [r for r in rows if r.get("kind") == "request" and r["cell"] in done], cells


def rebuild(folder) -> str:
    """OUT/bench-turns.md again, from the folder's rows (those of the run its bench-turns.json describes)."""
    from pathlib import Path

    from gemfilter.toolkit.io import read_json_object, read_jsonl

    folder = Path(folder)
    meta = read_json_object(folder / "bench-turns.json")["meta"]
    rows = [
        r
        for r in read_jsonl(folder / "bench-turns.jsonl")
        if all(r.get(k) == v for k, v in meta.items() if k != "routes")
    ]
    return markdown(summarize(*finished_rows(rows)), meta)


def routes_of(text: str, method: str) -> list:
    names = [r.strip() for r in str(text).split(",") if r.strip()]
    bad = [r for r in names if r not in ("full", "cached", "uncached")]
    if bad or not names or len(set(names)) != len(names):
        raise ValueError(f"--routes {text!r}: give distinct routes from full, cached, uncached")
    return ["full" if r == "full" else f"{method}, {r}" for r in names]


def _check(args):
    """(spec, method text, lengths, modes, concurrency, routes) of ``--turns``' options, each checked by name."""
    from gemfilter.toolkit.options import check_int, method_specs_of, parse_lengths, parse_positive_ints

    from ...methods import FullMethod
    from .proxy import request_options

    spec = method_specs_of(args)[-1]
    if issubclass(spec.cls, FullMethod):
        raise ValueError("--turns compares full with a prompt method: give one, e.g. --methods gemfilter")
    method = spec.text
    request_options({}, {"method": method, "topk": args.topk})
    lengths = parse_lengths(args.lengths, "--lengths")
    modes = [x.strip() for x in args.mode.split(",") if x.strip()]
    if not modes or any(x not in MODES for x in modes) or len(set(modes)) != len(modes):
        raise ValueError(f"--mode {args.mode!r}: give distinct modes from {', '.join(MODES)}")
    concurrency = parse_positive_ints(args.concurrency, "--concurrency")
    routes = routes_of(args.routes, method)
    for flag, value, low in (
        ("--turns", args.turns, 1),
        ("--gen-tokens", args.gen_tokens, 1),
        ("--threads", args.threads, 0),
        ("--selector-workers", args.selector_workers, 1),
    ):
        check_int(value, flag, low)
    if not 0 < args.selector_cache_gb <= 1024:
        raise ValueError(
            f"--selector-cache-gb must be in (0, 1024] GB here (the uncached route is its own), "
            f"got {args.selector_cache_gb}"
        )
    return spec, method, lengths, modes, concurrency, routes


def _routes_table(args, method, upstream, plain):
    """({route: {name, url, body}}, the two proxy servers, started): full straight to the engine; the method through
    a proxy whose selector caches the conversation's layers (``cached``) and through one that does not."""
    from gemfilter.toolkit.serving.selector import Selector

    from .proxy import ProxyServer

    cached = Selector(
        plain.model,
        plain.tokenizer,
        plain.layer,
        chat_template=plain.chat_template,
        workers=args.selector_workers,
        cache_bytes=int(args.selector_cache_gb * 2**30),
    )
    servers = {
        f"{method}, {name}": ProxyServer(
            ("127.0.0.1", 0), selector, upstream, method=method, topk=args.topk, quiet=True, max_concurrency=256
        )
        for name, selector in (("cached", cached), ("uncached", plain))
    }
    for server in servers.values():
        threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    base = {
        "model": upstream.default_model(),
        "max_tokens": args.gen_tokens,
        "min_tokens": args.gen_tokens,
        "ignore_eos": True,
        "temperature": 0,
    }
    table = {"full": dict(name="full", url=args.engine.rstrip("/") + "/completions", body=base)}
    for name, server in servers.items():
        table[name] = dict(
            name=name,
            url=f"http://127.0.0.1:{server.server_address[1]}/v1/completions",
            body=dict(base, gemfilter={"method": method}),
        )
    return table, servers


def _warm_up(table: dict, routes, warm: list, timeout: float) -> None:
    """One short request per route, not recorded: the engine's first request and the selector's first pass are
    slower."""
    for route in routes:
        try:
            stream_timed(
                table[route]["url"], dict(table[route]["body"], prompt=warm, max_tokens=2, min_tokens=2), timeout
            )
        except BrokenStream as err:
            raise BrokenStream(f"the warm-up request ({route}) failed: {err}; nothing was timed") from None


def _meta(args, method: str, plain) -> dict:
    """The settings a stored row must carry to count for this run (``plain``: the uncached selector)."""
    return dict(
        engine=args.engine,
        model=args.model or "embedded:gemma3-270m",
        method=method,
        topk=args.topk,
        layer=plain.layer,
        gen_tokens=args.gen_tokens,
        turns=args.turns,
        selector_cache_gb=args.selector_cache_gb,
        selector_workers=args.selector_workers,
        seed=args.seed,
        selector_device=str(next(plain.model.parameters()).device),
    )


def run(args) -> int:
    """Run ``gemfilter bench --engine URL --turns T`` for the parsed ``args``; returns the exit status."""
    from gemfilter.toolkit.haystack import make_haystack
    from gemfilter.toolkit.io import append_jsonl, check_out_dir, write_json_atomic, write_text_atomic
    from gemfilter.toolkit.loop import Unit, compute, missing, stored_rows

    from .cli import connect

    spec, method, lengths, modes, concurrency, routes = _check(args)
    out = check_out_dir(args.out, files=OUTPUTS)
    upstream, plain, _ = connect(
        args.engine,
        timeout=args.timeout,
        model=args.model,
        layer=dict(spec.params).get("layer", args.layer),
        attn=args.attn,
        threads=args.threads,
        workers=args.selector_workers,
    )
    tok = plain.tokenizer
    table, servers = _routes_table(args, method, upstream, plain)
    meta = _meta(args, method, plain)
    jsonl = out / "bench-turns.jsonl"
    rows, cells = finished_rows(stored_rows(jsonl, meta))
    units = [
        Unit(jsonl.name, (mode, n_tok, n, route))
        for mode in modes
        for n_tok in lengths
        for n in concurrency
        for route in routes
    ]
    todo = missing(units, {jsonl.name: {(c["mode"], c["length"], c["concurrency"], c["route"]) for c in cells}})
    meta["engine_prefix_caching"] = prefix_caching(args.engine)
    nonce = uuid.uuid4().hex  # this run's documents are new to the engine's and the selector's caches
    hay = make_haystack(tok, max(lengths) + 4096).ids if todo else None

    def predict(unit: Unit) -> list:
        """The cell's request rows, then its own row (last: a cell counts once every row of it is stored)."""
        mode, n_tok, n, route = unit.key
        seed = args.seed * 7919 + n_tok * 31 + n  # the same documents on every route, headers apart
        got, cell = run_cell(table[route], n, mode, n_tok, args.turns, tok, hay, args.timeout, args.engine, seed, nonce)
        where = dict(meta, mode=mode, length=n_tok, concurrency=n, route=route, cell=uuid.uuid4().hex)
        return [dict(where, kind="request", **r) for r in got] + [dict(where, **cell)]

    def write(unit: Unit, new: list) -> None:
        for row in new:
            append_jsonl(jsonl, row)

    try:
        if todo:
            _warm_up(table, routes, make_document(tok, hay, min(lengths), 1, -1, "warm-up")[0], args.timeout)
        for new in compute(todo, predict, write, desc="conversation cells", noun="cell"):
            rows, cells = rows + new[:-1], cells + new[-1:]
    finally:
        for server in servers.values():
            server.shutdown()
            server.server_close()

    def keep(r):
        return (
            r["mode"] in modes and r["length"] in lengths and r["concurrency"] in concurrency and r["route"] in routes
        )

    summary = summarize([r for r in rows if keep(r)], [c for c in cells if keep(c)])
    meta["routes"] = routes
    write_json_atomic(out / "bench-turns.json", {"meta": meta, **summary})
    text = markdown(summary, meta)
    write_text_atomic(out / "bench-turns.md", text)
    print(text)
    return 0
