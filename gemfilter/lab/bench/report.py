"""``gemfilter bench``: run the measurements, then report medians, ratios, growth exponents and plots.

Paper: Shi et al. 2024, Fig. 9.3 (time and memory against n) and Theorem 9.3 (prompt-phase ratio
(r+1)/m). Results go to ``OUT/bench.jsonl`` one measurement per line, so an interrupted run resumes;
the summary goes to ``OUT/bench.json``, ``OUT/bench.md`` and ``OUT/bench.png``.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from pathlib import Path

from gemfilter.toolkit.entry import ErrorExit, command
from gemfilter.toolkit.io import append_jsonl, check_out_dir, save_png, write_json_atomic, write_text_atomic
from gemfilter.toolkit.options import add_method_options, check_against_model, parse_lengths

from .rows import key_of, load_rows

DEFAULT_METHODS = "full,gemfilter,snapkv,h2o"
DEFAULT_LENGTHS = "2000,4000,8000,16000"


def growth_exponent(ns, ts) -> float | None:
    """Least-squares slope of log t against log n: t ~ n^b. None with fewer than two lengths."""
    pts = [(math.log(n), math.log(t)) for n, t in zip(ns, ts) if n > 0 and t > 0]
    if len(pts) < 2:
        return None
    mx = sum(x for x, _ in pts) / len(pts)
    my = sum(y for _, y in pts) / len(pts)
    sxx = sum((x - mx) ** 2 for x, _ in pts)
    return sum((x - mx) * (y - my) for x, y in pts) / sxx if sxx else None


def summarize(rows: list, kernels=None) -> dict:
    """Medians per (kernel, method, length), ratios and growth exponents per (kernel, method).

    Ratios ``*_vs_full`` and ``*_vs_snapkv`` compare with that method on the same kernel; ``*_vs_ref_full``
    compares with ``full`` on the reference kernel (the first of ``kernels``, e.g. stock sdpa).
    """
    cells = {}
    for r in rows:
        cells.setdefault((r.get("attn"), r["method"], r["length"]), []).append(r)
    fields = ("n", "kept", "prompt_s", "gen_s", "total_s", "prompt_peak_mib", "gen_peak_mib")
    med = {}
    for (attn, method, length), rs in cells.items():
        cell = {f: statistics.median(r[f] for r in rs) for f in fields}
        mask = [r["mask_s"] for r in rs if r.get("mask_s") is not None]
        cell.update(
            attn=attn,
            method=method,
            length=length,
            repeats=len(rs),
            layer=rs[0].get("layer"),
            m=rs[0].get("m"),
            mask_s=statistics.median(mask) if mask else None,
        )
        if "theory_prompt_ratio" in rs[0]:  # the method's own cost model (fastkv), and this code's cost
            cell.update(theory_prompt_ratio=rs[0]["theory_prompt_ratio"], theory_here_ratio=rs[0]["theory_here_ratio"])
        elif cell["layer"] is not None:  # Theorem 9.3
            cell["theory_prompt_ratio"] = (cell["layer"] + 1) / cell["m"]
        med[(attn, method, length)] = cell
    ref_kernel = kernels[0] if kernels else None
    for (attn, method, length), cell in med.items():
        refs = {"full": med.get((attn, "full", length)), "snapkv": med.get((attn, "snapkv", length))}
        if ref_kernel is not None:
            refs["ref_full"] = med.get((ref_kernel, "full", length))
        for base, ref in refs.items():
            if ref is None:
                continue
            for f in ("prompt_s", "gen_s", "total_s", "prompt_peak_mib"):
                if ref[f] > 0:
                    cell[f"{f}_vs_{base}"] = cell[f] / ref[f]
    exponents = {}
    for attn, method in sorted({(a, m) for a, m, _ in med}, key=lambda x: (str(x[0]), x[1])):
        series = sorted((c for (a, m, _), c in med.items() if (a, m) == (attn, method)), key=lambda c: c["n"])
        exponents[_label(attn, method)] = {
            f: growth_exponent([c["n"] for c in series], [c[f] for c in series]) for f in ("prompt_s", "total_s")
        }
    order = {k: i for i, k in enumerate(kernels or [])}
    return {
        "cells": sorted(med.values(), key=lambda c: (c["length"], c["method"], order.get(c["attn"], 99))),
        "exponents": exponents,
        "ref_kernel": ref_kernel,
    }


def _label(attn, method) -> str:
    return method if attn is None else f"{method} [{attn}]"


def _fmt(x, spec=".2f"):
    return "–" if x is None else format(x, spec)


def _span(values) -> str:
    """'4' for one value, '2-4' for several, 'unknown' for none."""
    vals = sorted({v for v in values if v is not None})
    return "unknown" if not vals else str(vals[0]) if len(vals) == 1 else f"{vals[0]}-{vals[-1]}"


def markdown(summary: dict, meta: dict) -> str:
    ref = summary.get("ref_kernel")
    lines = [
        f"Model: {meta['model']}; device: {meta['device']}; threads: {meta['threads']}; "
        f"top-k: {meta['topk'] or 'per method'}; generated tokens: {meta['gen_tokens']}; medians of {meta['repeats']} "
        "run(s) per cell, each in a fresh process.",
        "",
        "Ratios ×full and ×snapkv compare with that method on the same kernel"
        + (f"; ×{ref} full compares with `full` on {ref}." if ref else "."),
        "mask s: time spent building attention masks during the run.",
        "theory: prompt phase over a full prefill by the method's cost model: Theorem 9.3's (r+1)/m for GemFilter's "
        "selection; for fastkv, FastKV's (r+1)/m + (1 - (r+1)/m) k/n (k = tsp_len). theory here: what this code "
        "computes, which for fastkv adds (r+1)/m k/n (layers 0..r rerun on the k propagated tokens).",
        "",
        "| kernel | method | n | kept | prompt s | gen s | total s | mask s | prompt ×full | theory | theory here | "
        + (f"prompt ×{ref} full | peak ×{ref} full | " if ref else "")
        + "total ×full | total ×snapkv | prompt peak MiB | gen peak MiB |",
        "|---|---|---|---|---|---|---|---|---|---|---|" + ("---|---|" if ref else "") + "---|---|---|---|",
    ]
    for c in summary["cells"]:
        lines.append(
            f"| {c['attn'] or 'default'} | {c['method']} | {int(c['n'])} | {int(c['kept'])} | {c['prompt_s']:.2f} | "
            f"{c['gen_s']:.2f} | {c['total_s']:.2f} | {_fmt(c.get('mask_s'), '.3f')} | "
            f"{_fmt(c.get('prompt_s_vs_full'))} | {_fmt(c.get('theory_prompt_ratio'))} | "
            f"{_fmt(c.get('theory_here_ratio', c.get('theory_prompt_ratio')))} | "
            + (
                f"{_fmt(c.get('prompt_s_vs_ref_full'))} | {_fmt(c.get('prompt_peak_mib_vs_ref_full'))} | "
                if ref
                else ""
            )
            + f"{_fmt(c.get('total_s_vs_full'))} | {_fmt(c.get('total_s_vs_snapkv'))} | "
            f"{c['prompt_peak_mib']:.0f} | {c['gen_peak_mib']:.0f} |"
        )
    lines += [
        "",
        "Growth exponent b of time ~ n^b (least squares over the lengths):",
        "",
        "| method | prompt phase | prompt + generation |",
        "|---|---|---|",
    ]
    for method, e in summary["exponents"].items():
        lines.append(f"| {method} | {_fmt(e['prompt_s'])} | {_fmt(e['total_s'])} |")
    return "\n".join(lines) + "\n"


def plot(summary: dict, path: Path, title: str) -> None:
    """Fig. 9.3 style: prompt time, generation time and prompt-phase peak memory against n."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    panels = (
        ("prompt_s", "prompt phase (s)"),
        ("gen_s", "generation phase (s)"),
        ("prompt_peak_mib", "prompt-phase peak memory (MiB)"),
    )
    for attn, method in sorted({(c["attn"], c["method"]) for c in summary["cells"]}, key=lambda x: (str(x[0]), x[1])):
        series = sorted(
            (c for c in summary["cells"] if (c["attn"], c["method"]) == (attn, method)), key=lambda c: c["n"]
        )
        for ax, (field, _) in zip(axes, panels):
            ax.plot([c["n"] for c in series], [c[field] for c in series], marker="o", label=_label(attn, method))
    for ax, (_, label) in zip(axes, panels):
        ax.set_xlabel("input tokens n")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    axes[0].legend()
    fig.suptitle(title)
    fig.tight_layout()
    save_png(fig, path, dpi=120)


def _add_model_options(p) -> None:
    """The model measured: an HF model or one of the paper's architectures, scaled, in which dtype, where."""
    from .archs import ARCHS
    from .paper import PRESETS

    p.add_argument(
        "--model",
        default=None,
        help="HF id or local path (default: embedded Gemma 3 270M), or one of the paper's architectures "
        "with random weights: " + ", ".join("config:" + a for a in ARCHS) + " (random-token prompts)",
    )
    p.add_argument(
        "--preset",
        choices=sorted(PRESETS),
        default=None,
        help="the paper's Fig. 9.3 settings: methods full,snapkv,gemfilter (H2O left out, as in the "
        "paper), k=1024, 50 new tokens, lengths 4K..120K, the architecture's paper layer (13 for Llama "
        "3.1 8B, 19 for Nemo and Phi). Options you give explicitly override it",
    )
    p.add_argument(
        "--layers",
        type=int,
        default=None,
        help="config:<arch> only: keep the first N decoder layers (a scaled model; the report says so)",
    )
    p.add_argument(
        "--dtype",
        default=None,
        help="auto (bf16 on CUDA and on CPUs with native bf16, else fp32; the default for config:<arch>), "
        "bf16, fp16 or fp32",
    )
    p.add_argument(
        "--device",
        default=None,
        help="cpu, cuda, cuda:N, or auto (HF models: device_map='auto'); default: config:<arch> on cuda "
        "if available, HF models as load_model places them (CPU)",
    )
    p.add_argument(
        "--test-shrink",
        action="store_true",
        help="TESTS ONLY: shrink config:<arch> widths/heads by 8 and the vocabulary to 1024; the timings "
        "then describe no published architecture",
    )


def _add_run_options(p) -> None:
    """How the cells run: compiled decoding, order, one worker or a fresh one per cell, past failures."""
    p.add_argument(
        "--compile",
        action="store_true",
        help="decode on a static KV cache with a compiled step (torch.compile; CUDA graphs on CUDA) after "
        "each method's own prefill: gemfilter.generate(..., compile=True). The warm-up compiles; the timed "
        "run does not. Rows record compile=true and never mix with an eager run's: give such a run its "
        "own --out",
    )
    p.add_argument(
        "--longest-first",
        action="store_true",
        help="measure the longest --lengths first, so that a run cut short (a time limit) keeps them",
    )
    p.add_argument(
        "--one-process",
        action="store_true",
        help="run every cell of a kernel in one worker process: the model loads once and compiled cells "
        "share one decoder per capacity (each cell still warms up first). On CUDA each cell's peaks are "
        "its own (reset per cell); on a CPU freed memory may stay in the process, so keep fresh processes "
        "(the default) for CPU memory figures",
    )
    p.add_argument(
        "--keep-going",
        action="store_true",
        help="a cell that fails (out of memory, past --timeout) prints one 'error:' line and the run goes "
        "on with the next cell; the report covers the cells that ran and the exit status is 2. A rerun "
        "measures only the failed and missing cells (default: stop at the first failure)",
    )


def _add_engine_options(p) -> None:
    """--engine (one request per route) and --turns (conversations through the engine)."""
    p.add_argument(
        "--engine",
        default=None,
        metavar="URL",
        help="time a serving engine instead (its OpenAI base URL, e.g. http://127.0.0.1:8000/v1): time to "
        "first token and total time of full against the last of --methods (a prompt method) through an "
        "in-process 'gemfilter serve', and the proxy's own overhead; writes OUT/bench-engine.md. A row is "
        "kept only with proof its stream completed (finish_reason, tokens, [DONE]); a broken answer is an "
        "error row, retried by a rerun, and ends the run with one error line (exit 2)",
    )
    p.add_argument(
        "--plugin",
        action="store_true",
        help="with --engine: the engine is vLLM started with its GemFilter plugin (VLLM_PLUGINS=gemfilter, "
        "docs/serving.md); also time the method through the plugin, in the same run as plain vLLM and "
        'the proxy (the request carries {"gemfilter": {"method": ...}}, with --topk where the spec '
        "sets no budget)",
    )
    g = p.add_argument_group("conversations through the engine (--engine URL --turns T; writes OUT/bench-turns.md)")
    g.add_argument(
        "--turns",
        type=int,
        default=0,
        help="questions per conversation, one fact of its document each (default 0: the single-request "
        "benchmark above). Routes: full straight to the engine (its prefix caching as deployed), and the "
        "last of --methods through in-process proxies with the selector's prefix cache (cached) and "
        "without it (uncached)",
    )
    g.add_argument(
        "--mode",
        default="multi-turn",
        help="multi-turn (each question follows the history: document, questions, the engine's answers), "
        "multi-request (each question over the document alone), or both, comma-separated "
        "(SCBench's two modes; default multi-turn)",
    )
    g.add_argument(
        "--concurrency",
        default="1",
        help="conversations at once, each over a document of its own, e.g. 1,4,8 (default 1)",
    )
    g.add_argument("--routes", default="full,cached,uncached", help="which routes to time (default all three)")
    g.add_argument(
        "--selector-cache-gb",
        type=float,
        default=1.0,
        help="the cached route's prefix cache, GB of K/V (default 1.0, as gemfilter serve's)",
    )
    g.add_argument(
        "--selector-workers",
        type=int,
        default=1,
        help="selections at once on the selector model (default 1, as gemfilter serve's)",
    )
    g.add_argument("--seed", type=int, default=0, help="seed of the documents and their facts (default 0)")


def build_parser() -> argparse.ArgumentParser:
    from ...models import add_attn_argument

    p = argparse.ArgumentParser(
        prog="gemfilter bench",
        description="Measure prompt-phase time, generation time and peak memory for each method and context "
        "length, each in a fresh subprocess; report medians, ratios against full and snapkv, Theorem 9.3's "
        "(r+1)/m, and the growth exponent of time in n. Interrupted runs resume from OUT/bench.jsonl.",
    )
    _add_model_options(p)
    add_method_options(p, default=DEFAULT_METHODS)
    p.add_argument(
        "--lengths",
        default=DEFAULT_LENGTHS,
        help=f"context lengths in tokens, k = thousands, e.g. 2k,4k (default {DEFAULT_LENGTHS})",
    )
    p.add_argument(
        "--gen-tokens",
        type=int,
        default=50,
        help="tokens generated per run, forced (min = max) for every method (default 50, as in the paper)",
    )
    p.add_argument("--repeats", type=int, default=1, help="runs per cell; medians are reported (default 1)")
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads in each worker (default: torch's choice)")
    add_attn_argument(p, multiple=True)
    p.add_argument("--out", default="results/bench", help="output folder (default results/bench)")
    p.add_argument("--timeout", type=float, default=1800, help="seconds before a worker is killed (default 1800)")
    _add_run_options(p)
    _add_engine_options(p)
    return p


def _check_arch_args(args) -> None:
    """Refuse config:<arch> settings that cannot work before any computation starts."""
    from .archs import arch_of, is_config_name, published_config, resolve_dtype

    if args.dtype is not None:
        try:
            resolve_dtype(args.dtype, "cpu")
        except ValueError as err:
            raise ErrorExit(f"--dtype: {err}")
    if not is_config_name(args.model):
        if args.layers is not None or args.test_shrink:
            raise ErrorExit("--layers and --test-shrink apply to --model config:<arch> only")
        return
    try:
        total = published_config(args.model)["num_hidden_layers"]
    except ValueError as err:
        raise ErrorExit(f"--model: {err}")
    m = args.layers if args.layers is not None else total
    if not 1 <= m <= total:
        raise ErrorExit(f"--layers {args.layers}: {args.model} has {total} decoder layers; give 1..{total}")
    if args.layer is not None and not 0 <= args.layer < m:
        paper = arch_of(args.model).paper_layer
        hint = f" (the paper's layer {paper} needs >= {paper + 1} layers)"
        raise ErrorExit(
            f"--layer {args.layer} is outside the model's {m} layers (0..{m - 1}){hint}; "
            "pass --layer to choose one inside, e.g. --layers 8 --layer 3"
        )


OUTPUTS = ("bench.jsonl", "bench.json", "bench.md", "bench.png")


def check_args(args) -> tuple:
    """Every check that needs no measurement, before the first worker starts: (methods, lengths, kernels, out)."""
    from gemfilter.toolkit.options import check_int, method_specs_of

    from ...models import ATTN_CHOICES, load_config

    specs = method_specs_of(args)
    methods = [s.label for s in specs]
    lengths = parse_lengths(args.lengths, "--lengths")
    kernels = [a.strip() for a in args.attn.split(",") if a.strip()] if args.attn else [None]
    bad = [a for a in kernels if a is not None and a not in ATTN_CHOICES]
    if bad or len(set(kernels)) != len(kernels):
        raise ValueError(f"--attn {args.attn!r}: give distinct kernels from {', '.join(ATTN_CHOICES)}")
    for flag, value, low in (
        ("--repeats", args.repeats, 1),
        ("--gen-tokens", args.gen_tokens, 1),
        ("--threads", args.threads, 0),
    ):
        check_int(value, flag, low)
    out = check_out_dir(args.out, files=OUTPUTS)
    from .archs import is_config_name

    if not is_config_name(args.model):  # config:<arch> models are checked by _check_arch_args
        check_against_model(load_config(args.model), layer=args.layer, lengths=lengths, specs=specs)
        from gemfilter.toolkit.haystack import check_lengths

        from ...models import load_tokenizer

        check_lengths(load_tokenizer(args.model), lengths)  # the prompt is a needle case: not in a worker, later
    return methods, lengths, kernels, out


@command("plots", name="gemfilter bench")
def main(argv=None) -> int:
    """Entry point of ``gemfilter bench``; errors exit with a message that names the option or file."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.preset:  # the preset's values become defaults, so options given explicitly still win
        from .paper import PRESETS, preset_layer

        parser.set_defaults(**PRESETS[args.preset], layer=preset_layer(args.model))
        args = parser.parse_args(argv)
    _check_arch_args(args)
    if not (math.isfinite(args.timeout) and 0 < args.timeout <= 86400):  # every path: local, --engine, --turns
        raise ErrorExit(f"--timeout must be > 0 seconds, finite and at most 86400, got {args.timeout:g}")
    try:
        if args.turns and not args.engine:
            raise ValueError("--turns times conversations through a serving engine: give --engine URL too")
        if args.plugin and (not args.engine or args.turns):
            raise ValueError(
                "--plugin adds the vLLM plugin's route to the single-request engine benchmark: give "
                "--engine URL (and no --turns)"
            )
        if args.engine and args.turns:
            from ..serve.turns import run

            return run(args)
        if args.engine:
            from ..serve.bench import run

            return run(args)
        return _main(args)
    except (ValueError, OSError, RuntimeError) as err:
        raise ErrorExit(f"{err}") from None


def _measured(args, todo):
    """Yield ``(cell, row, error)`` for each (attn, method, length, repeat) of ``todo`` as it is measured: each in
    a fresh worker process, or with --one-process every cell of a kernel in one."""
    from . import core

    common = dict(
        model_name=args.model,
        threads=args.threads,
        layers=args.layers,
        dtype=args.dtype,
        device=args.device,
        test_shrink=args.test_shrink,
        compile=args.compile,
    )
    if not args.one_process:
        for attn, method, length, rep in todo:
            spec = dict(
                common,
                method_name=method,
                length=length,
                gen_tokens=args.gen_tokens,
                topk=args.topk,
                layer=args.layer,
                attn=attn,
            )
            try:
                yield (attn, method, length, rep), core.run_worker(spec, timeout=args.timeout), None
            except RuntimeError as err:
                yield (attn, method, length, rep), None, str(err)
        return
    for attn in dict.fromkeys(a for a, _, _, _ in todo):
        cells = [c for c in todo if c[0] == attn]
        shared = dict(common, attn=attn, topk=args.topk, layer=args.layer, gen_tokens=args.gen_tokens)
        for index, row, error in core.run_cells(shared, [(m, n) for _, m, n, _ in cells], timeout=args.timeout):
            yield cells[index], row, error


def _meta(args) -> dict:
    """The settings a stored row must carry to count for this run. layer_arg, not layer: each row keeps the layer its
    method actually resolved to; threads_arg, not threads: the thread count its worker actually used."""
    return dict(
        model=args.model or "embedded:gemma3-270m",
        topk=args.topk,
        gen_tokens=args.gen_tokens,
        layer_arg=args.layer,
        threads_arg=args.threads,
        layers=args.layers,
        dtype_arg=args.dtype,
        device_arg=args.device,
        test_shrink=args.test_shrink,
        compile=args.compile,
    )


def _measure_missing(args, jsonl, meta: dict, methods, lengths, kernels, failed: list) -> list:
    """Every row of this setup: the stored ones, then the missing cells (attn_arg, method, length, repeat) measured
    on the one row loop (:mod:`gemfilter.toolkit.loop`), each appended as it comes. A failed cell raises, or with
    --keep-going is named in ``failed`` and stays missing."""
    from tqdm import tqdm

    from gemfilter.toolkit.loop import Unit, compute, missing

    rows = load_rows(jsonl, meta)
    # attn_arg is the kernel asked for (None: the model's default); attn the kernel it resolved to.
    units = [
        Unit(jsonl.name, (a, m, n, i))
        for n in sorted(lengths, reverse=args.longest_first)
        for m in methods
        for a in kernels
        for i in range(args.repeats)
    ]
    todo = missing(units, {jsonl.name: {key_of(r) for r in rows}})
    measured = _measured(args, [u.key for u in todo])  # yields in todo's order

    def predict(unit):
        (attn, method, length, rep), row, error = next(measured)
        if error is not None:
            if not args.keep_going:
                raise RuntimeError(error)
            failed.append(f"{method} at {length} tokens" + (f" ({attn})" if attn else ""))
            tqdm.write(f"error: {failed[-1]}: {str(error)[-1500:]}", file=sys.stderr)
            return None
        return dict(row, **meta, repeat=rep, attn_arg=attn)

    return rows + compute(todo, predict, lambda unit, row: append_jsonl(jsonl, row), desc="bench cells", noun="run")


def _main(args) -> int:
    methods, lengths, kernels, out = check_args(args)
    meta, failed = _meta(args), []
    rows = _measure_missing(args, out / "bench.jsonl", meta, methods, lengths, kernels, failed)
    rows = [r for r in rows if r["method"] in methods and r["length"] in lengths and r.get("attn_arg") in kernels]
    excluded = [r for r in rows if r.get("excluded")]
    rows = [r for r in rows if not r.get("excluded")]
    if not rows:
        raise ErrorExit(
            "no cell could run: "
            + "; ".join(
                [f"{r['method']} at {r['length']}: {r['excluded']}" for r in excluded]
                + [f"{f}: failed" for f in failed]
            )
        )
    summary = summarize(rows, kernels if len(kernels) > 1 else None)
    cells = summary["cells"]
    device = _span(r["device"] + (f" ({r['device_name']})" if r.get("device_name") else "") for r in rows)
    meta.update(
        device=device, threads=_span(r.get("threads") for r in rows), repeats=_span(c["repeats"] for c in cells)
    )
    write_json_atomic(out / "bench.json", {"meta": meta, **summary, "excluded": excluded})
    table = markdown(summary, meta)
    from .archs import is_config_name

    if "gemfilter" in methods or is_config_name(args.model):  # the paper's columns; says if the model is scaled
        from .paper import paper_table

        for kernel in kernels:  # one comparison per kernel: its header names the kernel
            table += "\n" + paper_table(
                [r for r in rows if r.get("attn_arg") == kernel],
                dict(meta, preset=args.preset, methods=",".join(methods)),
                excluded,
            )
    write_text_atomic(out / "bench.md", table)
    plot(
        summary,
        out / "bench.png",
        f"{meta['model']} on {meta['device']}, k={args.topk or 'per method'}, t={args.gen_tokens}",
    )
    print(table)
    print(f"wrote {out / 'bench.md'}, {out / 'bench.json'}, {out / 'bench.png'}", file=sys.stderr)
    if failed:
        print(
            f"error: {len(failed)} cell(s) failed and are not in the report: {'; '.join(failed)}. A rerun "
            "measures only those",
            file=sys.stderr,
        )
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
