"""Conversations timed turn by turn: ``gemfilter.Conversation`` under each protocol on one long context.

SCBench's multi-turn setting (Li et al. 2024): one context, then follow-up questions, each answer kept in the
history. A follow-up's time to first token is what separates the protocols: ``full`` extends its cache (prefix
reuse), ``reselect`` runs the new tokens through layers 0..r and regenerates from the k tokens it keeps, ``reuse``
feeds the new tokens to the first turn's compressed cache. With random weights and random-token text the answers
mean nothing: these rows are timings only. Every answer is forced to ``--answer-tokens`` tokens.

``python -m gemfilter.lab.bench.conversation --model config:llama-3.1-8b --out OUT.jsonl`` appends a row per turn.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

#: (protocol, method spec) pairs timed by default; None: no method (full)
DEFAULT_RUNS = "full,reselect:gemfilter,stable:gemfilter,reuse:gemfilter,reuse:snapkv"


def parse_runs(text: str, topk: int) -> list:
    """``full,reselect:gemfilter,...`` -> [(protocol, parsed Spec or None)], each spec parsed once and checked with
    ``topk`` as its budget unless it sets one."""
    from gemfilter.conversation import PROTOCOLS
    from gemfilter.methods import parse_spec

    runs = []
    for item in filter(None, (x.strip() for x in text.split(","))):
        protocol, _, spec = item.partition(":")
        if protocol not in PROTOCOLS:
            raise ValueError(f"--runs {item!r}: the protocol must be one of {', '.join(PROTOCOLS)}")
        if (protocol == "full") != (not spec):
            raise ValueError(
                f"--runs {item!r}: 'full' takes no method, the other protocols need one (e.g. reselect:gemfilter)"
            )
        runs.append((protocol, parse_spec(spec, topk=topk) if spec else None))
    if not runs:
        raise ValueError("--runs is empty; e.g. " + DEFAULT_RUNS)
    return runs


def converse(
    model,
    protocol: str,
    spec,
    context: int,
    turns: int,
    question: int,
    answer: int,
    topk: int,
    layer: int | None,
    seed: int = 0,
) -> list:
    """One conversation: a ``context``-token document with the first question, then ``turns - 1`` follow-ups of
    ``question`` tokens; returns a row per turn (ttft_s, total_s, kept, history_tokens, peak_mib).

    spec: a parsed :class:`gemfilter.methods.Spec` (None: full)."""
    import torch

    import gemfilter

    from .archs import random_prompt

    device = next(model.parameters()).device
    method = None if spec is None else spec.method(context, topk=topk, layer=layer)
    vocab = model.config.get_text_config().vocab_size
    doc = random_prompt(vocab, context, seed=seed, device=device)
    rows = []
    with gemfilter.Conversation(model, method, protocol=protocol) as chat:
        for t in range(turns):
            ids = random_prompt(vocab, question, seed=seed + 1000 + t, device=device)
            if t == 0:
                ids = torch.cat([doc, ids], dim=1)
            turn = chat.ask(ids, max_new_tokens=answer, min_new_tokens=answer)
            rows.append(
                {
                    "turn": t + 1,
                    "ttft_s": turn.ttft_s,
                    "total_s": turn.total_s,
                    "kept": turn.kept,
                    "history_tokens": turn.history_tokens,
                    "peak_mib": turn.peak_mib,
                    "new_tokens": int(turn.new_tokens.shape[0]),
                }
            )
    return rows


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m gemfilter.lab.bench.conversation",
        description=__doc__.split("\n\n")[0] + " One row per turn, appended to --out as it "
        "ends; a run already in --out is skipped (resume).",
    )
    p.add_argument("--model", required=True, help="config:<arch> (random weights), e.g. config:llama-3.1-8b")
    p.add_argument("--layers", type=int, default=None, help="keep the first N decoder layers")
    p.add_argument("--test-shrink", action="store_true", help="TESTS ONLY: the shrunk architecture")
    p.add_argument("--dtype", default=None, help="auto (default), bf16, fp16 or fp32")
    p.add_argument("--device", default=None, help="cpu, cuda, cuda:N (default: cuda if available)")
    p.add_argument(
        "--runs", default=DEFAULT_RUNS, help=f"protocol[:method spec], comma-separated (default {DEFAULT_RUNS})"
    )
    p.add_argument("--context", type=int, default=32768, help="document tokens (default 32768)")
    p.add_argument("--turns", type=int, default=5, help="questions per conversation (default 5)")
    p.add_argument("--question-tokens", type=int, default=32, help="tokens per question (default 32)")
    p.add_argument("--answer-tokens", type=int, default=20, help="tokens per answer, forced (default 20)")
    from gemfilter.toolkit.options import add_method_options

    add_method_options(
        p,
        methods=None,
        topk_default=1024,
        topk_help="budget of the methods whose spec sets none (default 1024, the paper's k)",
    )
    p.add_argument("--out", required=True, help="JSONL file the rows are appended to")
    return p


def main(argv=None) -> int:
    from gemfilter.toolkit.io import append_jsonl
    from gemfilter.toolkit.loop import Unit, compute, missing, stored_rows

    from .archs import arch_of, build_model, is_config_name
    from .core import device_name

    p = build_parser()
    args = p.parse_args(argv)
    if not is_config_name(args.model):
        p.error(f"--model {args.model!r}: give config:<arch> (random weights: timing only)")
    for flag, value in (
        ("--context", args.context),
        ("--turns", args.turns),
        ("--question-tokens", args.question_tokens),
        ("--answer-tokens", args.answer_tokens),
        ("--topk", args.topk),
    ):
        if value < 1:
            p.error(f"{flag} must be >= 1, got {value}")
    try:
        runs = parse_runs(args.runs, args.topk)
    except ValueError as err:
        p.error(str(err))
    layer = args.layer if args.layer is not None else arch_of(args.model).paper_layer
    setting = dict(
        model=args.model,
        layers=args.layers,
        context=args.context,
        turns=args.turns,
        question_tokens=args.question_tokens,
        answer_tokens=args.answer_tokens,
        topk=args.topk,
        layer=layer,
    )
    out = Path(args.out)
    done = {(r["protocol"], r["method"]) for r in stored_rows(out, setting, required=("protocol", "method"))}
    units = [Unit(out.name, (protocol, spec.label if spec else "full"), spec) for protocol, spec in runs]
    model = build_model(
        args.model, layers=args.layers, dtype=args.dtype, device=args.device, test_shrink=args.test_shrink
    )
    device = next(model.parameters()).device
    fixed = dict(dtype=str(model.dtype).replace("torch.", ""), device=str(device), device_name=device_name(device))
    # Warm-up: a short conversation per protocol, so CUDA's first-call costs fall outside the timed turns.
    for protocol, spec in runs:
        converse(model, protocol, spec, min(args.context, 2048), 2, args.question_tokens, 2, args.topk, layer)

    def predict(unit: Unit) -> list:
        (protocol, label), spec = unit.key, unit.data
        start = time.perf_counter()
        rows = converse(
            model, protocol, spec, args.context, args.turns, args.question_tokens, args.answer_tokens, args.topk, layer
        )
        print(
            f"{protocol} {label}: ttft "
            + ", ".join(f"{r['ttft_s']:.3f}" for r in rows)
            + f" s ({time.perf_counter() - start:.1f} s)",
            file=sys.stderr,
        )
        return [{**setting, "protocol": protocol, "method": label, **row, **fixed} for row in rows]

    def write(unit: Unit, rows: list) -> None:
        for row in rows:
            append_jsonl(out, row)

    compute(missing(units, {out.name: done}), predict, write, desc="conversations", noun="run", progress=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
