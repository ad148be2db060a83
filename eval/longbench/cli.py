"""``gemfilter-longbench`` / ``python -m eval.longbench``: LongBench v1 (English) with any registered method.

Subcommands: ``run`` generates predictions (official pred.py pipeline) into the official folder
layout and scores them; ``score DIR`` scores any prediction folder in that layout (official eval.py)
and writes the Table 9.1-style report. Sources: THUDM/LongBench v1; GemFilter (Shi et al. 2024).
"""

from __future__ import annotations

import argparse
import sys

from gemfilter.toolkit.entry import command

RUN_EPILOG = """tasks (config: category, metric, max_new_tokens; * = has a LongBench-E variant):
{tasks}
  aliases: all (the 16), paper (the first 14, the GemFilter paper's Table 9.1), e (the 13 LongBench-E tasks)

methods (gemfilter's registry; --topk/--layer go to those that have them):
{methods}

pipeline (official pred.py): prompt template -> middle truncation to --max-length tokens (first and
last halves kept) -> optional chat template -> greedy decoding -> new tokens decoded.

presets (--preset; explicit options win):
{presets}
  The official runs (GemFilter repo, config/model2maxlen.json) cut H2O's prompts to 8192 tokens and
  every other method's to 128000 for Llama 3.1 8B, Mistral Nemo and Phi 3.5 (other models: their
  window minus 500); --max-length-per-method sets such per-method lengths yourself.

outputs in --out: pred/<method>/<task>.jsonl (pred_e/ with --e), one row per sample: pred, answers,
all_classes, length, _id, kept (prompt tokens the answer came from), prompt_tokens, layer;
report.md / report.csv (methods x tasks, Table 9.1 layout); result.json per method; config.json.
Rerunning the same command skips finished samples, so an interrupted run resumes where it stopped.

examples:
  gemfilter-longbench run --tasks hotpotqa,trec --limit 20 --methods full,gemfilter --topk 1024
  gemfilter-longbench run --tasks paper --data-dir ~/data/longbench --out results/longbench
  gemfilter-longbench run --e --tasks qasper,hotpotqa --data-dir ~/data/longbench
  # several processes (each takes every n-th missing sample; the main one merges the shards):
  accelerate launch --multi_gpu --num_processes 2 -m eval.longbench run --tasks hotpotqa --out results/lb
  (on CPU, 'accelerate launch --cpu --num_processes 2' starts only one process unless MPI is set up;
  --multi_gpu or torchrun starts real processes, and the runner then uses gloo on CPU.)

data: the Hugging Face hub (load_dataset("THUDM/LongBench", config, split="test")) unless --data-dir
names a local folder of <config>.jsonl files (the unpacked LongBench data.zip; <task>_e.jsonl for --e).
The default model is the embedded Gemma 3 270M (offline; first load about 75 s, then about 3 s)."""

SCORE_EPILOG = """DIR may be: an output folder of `run` (holding pred/ and/or pred_e/), a folder of method
folders (like the official pred/), or one method folder of <task>.jsonl files. Each <task>.jsonl
holds rows with pred, answers, all_classes and length (official pred.py output works as is).

metrics (official metrics.py): qa_f1 (token F1 after normalization), rouge (ROUGE-L F, PyPI 'rouge'),
classification (TREC, with the official removal quirk), count and retrieval (share of the numbers
in the prediction that equal the answer), code_sim (fuzzywuzzy ratio via difflib). trec, triviaqa and samsum
score only the first line. Per sample: max over answers; per task: round(100 x mean, 2); LongBench-E
(pred_e/ or --e): per length bucket 0-4k, 4-8k, 8k+. Writes result.json per method folder and
report.md / report.csv (report_e.*) in DIR.

examples:
  gemfilter-longbench score results/longbench
  python -m eval.longbench score LongBench/pred --e"""


def _add_prompt_options(r) -> None:
    """What the model is fed: the tasks, their samples and how each prompt is cut and wrapped."""
    r.add_argument(
        "--tasks",
        default=None,
        help="comma-separated task configs or aliases (default: all 16; with --e the 13 LongBench-E tasks)",
    )
    r.add_argument(
        "--e", action="store_true", help="LongBench-E: <task>_e data, pred_e/ folder, scores per length bucket"
    )
    r.add_argument("--limit", type=int, default=None, help="first N samples per task (default: all; a quick smoke run)")
    r.add_argument(
        "--max-length",
        default=None,
        help="prompt tokens kept by middle truncation, k = thousands, e.g. 3.5k (default: the model's "
        "context window minus 500; "
        "official configs use 3500, 15500, 31500 for 4K, 16K, 32K models)",
    )
    r.add_argument(
        "--max-length-per-method",
        default=None,
        metavar="METHOD=TOKENS,...",
        help="a max length for some methods, e.g. h2o=8192 (the official H2O cut); the others use "
        "--max-length; each METHOD must name one of --methods (a name applies to each of its specs)",
    )
    r.add_argument(
        "--chat-template",
        action="store_true",
        help="wrap prompts in the tokenizer's chat template (not for trec, triviaqa, samsum, lcc, "
        "repobench-p); the GemFilter paper's Table 9.1 uses none (default: off)",
    )
    r.add_argument(
        "--data-dir", default=None, help="local folder of <config>.jsonl files instead of the Hugging Face hub"
    )


def build_parser() -> argparse.ArgumentParser:
    from gemfilter import describe
    from gemfilter.models import add_attn_argument
    from gemfilter.toolkit.options import add_method_options
    from gemfilter.toolkit.serving.engine import add_engine_argument

    from .presets import PRESETS
    from .tasks import TASKS

    presets = "\n".join(f"  {name}: {p['description']}" for name, p in PRESETS.items())
    tasks = "\n".join(
        f"  {t.config:<21} {t.category}, {t.metric}, {t.max_new_tokens}{' *' if t.e else ''}" for t in TASKS
    )
    width = max(len(n) for n, _ in describe())
    methods = "\n".join(f"  {name:<{width}}  {desc}" for name, desc in describe())
    raw = argparse.RawDescriptionHelpFormatter
    p = argparse.ArgumentParser(
        prog="gemfilter-longbench",
        formatter_class=raw,
        description="LongBench v1, English tasks (THUDM/LongBench), with GemFilter, SnapKV, H2O or full attention. "
        "'run' predicts and scores; 'score' scores an existing prediction folder. See '<command> --help'.",
        epilog="examples:\n  gemfilter-longbench run --tasks hotpotqa,trec --limit 20 --methods full,gemfilter\n"
        "  gemfilter-longbench score results/longbench\n  gemfilter-longbench run --help   # tasks, methods, layout",
    )
    sub = p.add_subparsers(dest="command", required=True, metavar="{run,score}")
    r = sub.add_parser(
        "run",
        formatter_class=raw,
        help="generate predictions, then score them",
        description="Generate LongBench predictions with each method (greedy, official pipeline), "
        "write them in the official layout, and score them.",
        epilog=RUN_EPILOG.format(tasks=tasks, methods=methods, presets=presets),
    )
    r.add_argument("--model", default=None, help="Hugging Face id or local path (default: the embedded Gemma 3 270M)")
    add_attn_argument(r)
    add_engine_argument(r)
    r.add_argument(
        "--preset",
        default=None,
        choices=sorted(PRESETS),
        help="settings of a published run (see below); explicit options override them",
    )
    add_method_options(r, default=None, default_help="the preset's, else full,gemfilter")
    _add_prompt_options(r)
    r.add_argument(
        "--dtype",
        default=None,
        choices=["float16", "bfloat16", "float32"],
        help="model dtype on GPU (default: the loader's; --preset gemfilter-paper: float16, as the "
        "official runs); CPU always runs float32 and prints so",
    )
    r.add_argument("--out", default="results/longbench", help="output folder (default: results/longbench)")
    r.add_argument("--threads", type=int, default=0, help="torch CPU threads per process (default: torch's choice)")
    r.add_argument("--no-progress", action="store_true", help="no progress bar")
    s = sub.add_parser(
        "score",
        formatter_class=raw,
        help="score a prediction folder (official layout)",
        description="Score LongBench predictions with the official metrics and write the report.",
        epilog=SCORE_EPILOG,
    )
    s.add_argument("dir", metavar="DIR", help="prediction folder (see below)")
    s.add_argument(
        "--e",
        action="store_true",
        default=None,
        help="score as LongBench-E (length buckets) even if the folder is not named pred_e",
    )
    return p


@command("eval", name="gemfilter-longbench")
def main(argv=None) -> int:
    """Entry point of ``gemfilter-longbench`` and ``python -m eval.longbench``; returns the exit status."""
    from gemfilter.toolkit.options import cli_exit

    args = build_parser().parse_args(argv)
    return cli_exit(lambda: _run(args) if args.command == "run" else _score(args))


def _settings(config) -> str:
    layer = "model default" if config.layer is None else config.layer
    max_length = "model window - 500" if config.max_length is None else config.max_length
    own = {m: v for m, v in config.method_max_length.items() if m in config.labels}
    if own:
        max_length = f"{max_length} ({', '.join(f'{m} {v}' for m, v in own.items())})"
    topk = "each method's own" if config.topk is None else config.topk
    return (
        f"Model {config.model or 'embedded:gemma3-270m'}; topk {topk}, layer {layer}, max_length "
        f"{max_length}, chat template {'on' if config.chat_template else 'off'}"
        + (f", first {config.limit} samples per task" if config.limit else "")
        + "."
    )


def _run(args) -> int:
    from .report import write_report
    from .runner import RunConfig, run
    from .tasks import parse_tasks

    if args.threads < 0:
        raise ValueError(f"--threads must be >= 0 (0 = torch's choice), got {args.threads}")
    from gemfilter.toolkit.options import method_specs_of, parse_length

    from .presets import PRESETS, paper_max_length, parse_method_lengths

    preset = PRESETS.get(args.preset, {})
    tasks = parse_tasks(args.tasks if args.tasks is not None else preset.get("tasks"), e=args.e)
    specs = method_specs_of(args, default=",".join(preset.get("methods", ("full", "gemfilter"))))
    given = parse_method_lengths(args.max_length_per_method)
    stray = [m for m in given if not any(m in (s.text, s.name) for s in specs)]
    if stray:  # the preset's entries may name methods this run leaves out; the user's must not (a typo)
        raise ValueError(
            f"--max-length-per-method names {', '.join(stray)}, which --methods does not run; allowed: "
            f"{', '.join(dict.fromkeys(n for s in specs for n in (s.name, s.text)))}"
        )
    # a method's name applies to each of its specs; the preset's entries first, so the user's win
    per_name = {**preset.get("method_max_length", {}), **given}
    own = {s.label: per_name[k] for s in specs for k in (s.name, s.text) if k in per_name}
    max_length = None if args.max_length is None else parse_length(args.max_length, "--max-length")
    if max_length is None and preset:
        max_length = paper_max_length(args.model)  # None: the model's window minus 500
    config = RunConfig(
        model=args.model,
        methods=specs,
        tasks=tuple(t.config for t in tasks),
        e=args.e,
        limit=args.limit,
        topk=args.topk,
        layer=args.layer,
        max_length=max_length,
        chat_template=args.chat_template or preset.get("chat_template", False),
        data_dir=args.data_dir,
        method_max_length=own,
        attn=args.attn,
        dtype=args.dtype or preset.get("dtype"),
        engine=args.engine,
        extra={"preset": args.preset, "attn": args.attn or "model default"},
    )
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    if run(config, args.out, progress=not args.no_progress) is None:
        return 0  # not the main process: it only computed its shard
    from eval.rundir import print_report

    return print_report(write_report(args.out, settings=_settings(config)))


def _score(args) -> int:
    from eval.rundir import print_report

    from .report import write_report

    return print_report(write_report(args.dir, e=args.e))


if __name__ == "__main__":
    sys.exit(main())
