"""``gemfilter-scbench`` / ``python -m eval.scbench``: SCBench's shared-context protocol on offline synthetic tasks.

Subcommands: ``run`` computes every missing conversation (and writes the report), ``report`` scores any
run folder again. See docs/scbench.md.
"""

from __future__ import annotations

import argparse
import sys

from gemfilter.toolkit.entry import command

EPILOG = """modes (SCBench, Li et al. 2024, microsoft/MInference scbench/):
  multi-turn     one conversation: turn 1 is context + question; each later turn appends a follow-up that
                 starts with the previous turn's gold answer; the model's own answer is dropped
  multi-request  the context is prefilled once; each question is answered over it alone

protocols (what a method keeps between turns; gemfilter.Conversation):
  full      the baseline: the whole cache of the history, extended (prefix reuse)
  reuse     turn 1's compressed cache goes on (cache methods always; prompt methods with --protocols reuse)
  reselect  prompt methods select again each turn from the history's layers 0..r (the default for them)
  stable    prompt methods select as reselect, keep last turn's kept tokens in their cache slots, mask the
            dropped ones and run only the newly kept ones (greedy; rebuilt past half holes; --max-fresh caps
            the earlier tokens a follow-up newly keeps)
  stable-cf stable for the context's kept tokens; the conversation's kept tokens (questions, answers) run
            again each turn after them, so new context never sits between a question and its answer
  stable-gap stable-cf's order in positions, but the conversation's slots stay: the context is laid out with
            free positions before the conversation, a newly kept context token takes one of them, and a turn
            runs only the tokens it newly keeps (measured slower than stable-cf here: docs/scbench.md)
  stable-front stable-gap with its free positions before the context instead of after it: a rebuilt layout
            (turn 1's) keeps reselect's relative positions, and new context takes the positions below the context's
            (measured: turn 1 as reselect, but the follow-ups fall: docs/scbench.md)
  stable-late stable-gap whose rebuilt layout has no free positions (reselect's prompt: turn 1 answers as
            reselect); the first follow-up that keeps new context opens them, running the kept conversation again
  stable-late-runs stable-late where a newly kept context token brings the held tokens of its run (consecutive
            in the history) along, written again whole, so a kept sentence or number is never split
  A prompt method's label is its spec with @ and the protocol: @reselect, @reuse, @stable, @stable-cf, ...

tasks (offline generators; docs/scbench.md says what each transcribes):
  scbench_kv (Retr.KV), scbench_prefix_suffix (Retr.Prefix-Suffix), scbench_vt (Retr.MultiHop),
  scbench_mf (Math.Find)
  this project's own, in SCBench's protocol (RULER's needles, one asked per turn; the embedded model solves them):
  gf_facts (GF.Facts), gf_multikey (GF.MultiKey), gf_vt (GF.VarTrack)

layout of --out:
  <mode>/<L>/<label>/<task>.jsonl   one row per sample: _id (its seed), turns [{turn_idx, prediction,
                                    ground_truth, score, ttft_s, total_s, kept, history_tokens}], prefill_s
  config.json, report.md, report.png

Rerunning the same command skips finished conversations, so an interrupted run resumes.

examples:
  gemfilter-scbench run --methods full,gemfilter:k=1024,snapkv:k=1024 --lengths 4096 --num-samples 20 \\
      --modes multi-turn,multi-request --out results/scbench
  gemfilter-scbench report results/scbench"""


def add_protocol_options(r) -> None:
    """The protocols a prompt method runs under, and the layouts' settings (gemfilter.Conversation's)."""
    from gemfilter.stable import FRESH_BY, FRESH_HOLES, OUTGROWN

    r.add_argument(
        "--protocols",
        default="reselect",
        help="protocols for prompt methods, comma-separated: reselect, reuse, stable, stable-cf, stable-gap, "
        "stable-front, stable-late, stable-late-runs (default reselect)",
    )
    r.add_argument(
        "--max-holes",
        type=float,
        default=0.5,
        help="the layouts (stable, stable-cf, stable-gap, stable-front, stable-late, stable-late-runs): rebuild the "
        "layout in history order once its masked slots would pass this share of its slots, in [0, 1] (0: on every "
        "turn that masks a slot, and under the last five also one that adds a context slot, which answers as "
        "reselect; 1: only on the first turn and when a turn would run nothing new, and under stable-gap, "
        "stable-front and stable-late* when new context outgrows its free positions) (default 0.5); a folder "
        "records it",
    )
    r.add_argument(
        "--max-fresh",
        type=int,
        default=None,
        metavar="N",
        help="the layouts (stable*) only; the run's other protocols are not capped: a follow-up that is not "
        "rebuilt adds at most N of the earlier tokens it newly keeps (under the context-first layouts, of the "
        "context's), the highest-scoring (what it keeps of its question always runs, and under stable-cf the whole "
        "kept conversation; as many of the slots it drops stay, up to k; under stable-late-runs a run counts with "
        "the held tokens it writes again), so its write stays short: an approximation, measured in docs/scbench.md "
        "(default: no cap); a folder records it",
    )
    r.add_argument(
        "--fresh-by",
        choices=FRESH_BY,
        default="runs",
        help="with --max-fresh: what the cap takes whole, from the highest-scoring down: runs of consecutive newly "
        "kept tokens (a span method's sentences) or single tokens (measured to cut sentences apart); runs-new, "
        "stable-late-runs only: runs, but a sentence the turn keeps anew ranks before a run that extends a held one "
        "(default runs); a folder records it",
    )
    r.add_argument(
        "--fresh-holes",
        choices=FRESH_HOLES,
        default="capped",
        help="with --max-fresh: the masked slots the rebuild rule (--max-holes) reads on a capped follow-up: those "
        "the capped turn leaves (capped), or those the whole selection would leave, as stable without a cap reads "
        "them, so a turn whose selection moved far is rebuilt as there (selection) (default capped); a folder "
        "records it",
    )
    r.add_argument(
        "--outgrown",
        choices=OUTGROWN,
        default="rebuild",
        help="stable-gap, stable-late and stable-late-runs (the run's other protocols ignore it): what a follow-up "
        "does when its new context outgrows the free positions or a conversation token it newly keeps precedes a "
        "held one: run every kept token again in reselect's order (rebuild), or keep the context slots before the "
        "conversation's first and run the rest again, the context first, with free positions after it again "
        "(reopen), an approximation measured in docs/scbench.md (default rebuild); a folder records it",
    )


def build_parser() -> argparse.ArgumentParser:
    from gemfilter.models import add_attn_argument
    from gemfilter.toolkit.options import add_method_options

    parser = argparse.ArgumentParser(
        prog="gemfilter-scbench",
        description=__doc__.split("\n\n")[0],
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True)
    r = sub.add_parser(
        "run",
        help="compute the missing conversations and write the report",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    r.add_argument("--model", default=None, help="Hugging Face id or local path (default: the embedded Gemma 3 270M)")
    add_method_options(r, default="full,gemfilter")
    add_protocol_options(r)
    r.add_argument("--modes", default="multi-turn", help="multi-turn and/or multi-request (default multi-turn)")
    r.add_argument(
        "--tasks",
        default="scbench_kv,scbench_prefix_suffix,scbench_vt,scbench_mf",
        help="comma-separated task names (default: the four offline ones)",
    )
    r.add_argument(
        "--lengths",
        default="4096",
        help="window each sample is sized to, in tokens, e.g. 4096,8192 (k means 1000: 4k is 4000) (default 4096)",
    )
    r.add_argument("--num-samples", type=int, default=20, help="samples per task, seeds 0..n-1 (default 20)")
    r.add_argument("--turns", type=int, default=5, help="queries per context (default 5, run_scbench.py's)")
    r.add_argument(
        "--max-units",
        type=int,
        default=None,
        help="compute at most this many conversations now; the rest on a later run",
    )
    r.add_argument("--threads", type=int, default=0, help="torch CPU threads (default: torch's choice)")
    r.add_argument("--dtype", default=None, help="model dtype on an accelerator (default: the loader's)")
    add_attn_argument(r)
    from gemfilter.toolkit.serving.engine import add_engine_argument

    add_engine_argument(r)
    r.add_argument(
        "--timeout",
        type=float,
        default=600.0,
        help="with --engine: seconds to wait for the engine, for a connection and for each chunk of an "
        "answer (default 600)",
    )
    r.add_argument(
        "--no-warmup",
        action="store_true",
        help="skip the untimed full conversation run before the first timed one (locally); the first row's times "
        "then carry the process's one-time start-up",
    )
    r.add_argument("--no-progress", action="store_true", help="no progress bar")
    r.add_argument("--out", required=True, help="run folder (created; a rerun resumes it)")
    s = sub.add_parser("report", help="score a run folder again: report.md and report.png")
    s.add_argument("dir", help="a gemfilter-scbench run folder")
    s.add_argument("--no-plot", action="store_true", help="the table only")
    return parser


@command("plots", name="gemfilter-scbench")
def main(argv=None) -> int:
    """Entry point of ``gemfilter-scbench``; returns the exit status."""
    from gemfilter.toolkit.options import cli_exit

    args = build_parser().parse_args(argv)
    return cli_exit(lambda: {"run": _run, "report": _report}[args.command](args))


def _run(args) -> int:
    from eval.rundir import print_report
    from gemfilter.toolkit.options import method_specs_of, parse_lengths, split_names

    from .report import write_report
    from .runner import RunConfig, run

    if args.threads < 0:
        raise ValueError(f"--threads must be >= 0 (0 = torch's choice), got {args.threads}")
    if args.max_units is not None and args.max_units < 1:
        raise ValueError(f"--max-units must be >= 1, got {args.max_units}")
    config = RunConfig(
        model=args.model,
        methods=method_specs_of(args),
        topk=args.topk,
        layer=args.layer,
        protocols=split_names(args.protocols),
        modes=split_names(args.modes),
        tasks=split_names(args.tasks),
        lengths=parse_lengths(args.lengths),
        num_samples=args.num_samples,
        turns=args.turns,
        attn=args.attn,
        dtype=args.dtype,
        engine=args.engine,
        timeout=args.timeout,
        warmup=not args.no_warmup,
        max_holes=args.max_holes,
        max_fresh=args.max_fresh,
        fresh_by=args.fresh_by,
        fresh_holes=args.fresh_holes,
        outgrown=args.outgrown,
        extra={"attn": args.attn or "model default"},
    )
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    if run(config, args.out, progress=not args.no_progress, max_units=args.max_units) is None:
        return 0  # not the main process
    settings = (
        f"Model {args.model or 'embedded:gemma3-270m'}; layer {args.layer or 'model default'}; "
        f"{args.turns} turns; samples = seeds 0..n-1 of each task's generator."
    )
    return print_report(write_report(args.out, settings))


def _report(args) -> int:
    from eval.rundir import print_report

    from .report import write_report

    return print_report(write_report(args.dir, plot=not args.no_plot))


if __name__ == "__main__":
    sys.exit(main())
