"""``gemfilter-niah`` / ``python -m eval.niah``: the Needle-in-a-Haystack grid (Kamradt protocol).

Runs every (method, context length, depth) cell with greedy decoding, scores the answer (rouge1 x10,
word recall, exact hit), appends one JSONL row per cell, and draws heatmaps and a summary table.
GemFilter: Shi et al. 2024, "Discovering the Gems in Early Layers" (NIAH setup of its Fig. 3).
"""

from __future__ import annotations

import argparse
import sys

from gemfilter.toolkit.entry import command

from .grid import PRESET_SETTINGS, PRESETS

EPILOG = """presets (--lengths / --depths replace the preset's axis; explicit options win):
{presets}

protocols (--protocol): how the context is tokenized around the needle.
  kamradt         clean text: every encode without special tokens (default)
  gemfilter-repo  the GemFilter repository's harness, which made the paper's NIAH figures: encodes
                  with the tokenizer's default special tokens, so on a BOS tokenizer the context holds
                  BOS tokens (two at its start, one right before the needle); the gemfilter-paper
                  preset uses it

methods (gemfilter's registry), each named by a spec NAME[:key=value,...] (see 'gemfilter methods NAME'),
e.g. gemfilter-span:k=256, snapkv:ratio=0.1; --topk/--layer go to those that have them and set none:
{methods}

outputs in --out: results.jsonl (one row per cell: response, rouge1 x10, recall, hit, kept tokens,
seconds), heatmap_<method>.png, heatmaps.png (all methods), summary.md, config.json.
Rerunning the same command skips finished cells, so an interrupted run resumes where it stopped.

examples:
  gemfilter-niah --preset cpu-demo --methods full,gemfilter,gemfilter-span,snapkv --out results/niah
  gemfilter-niah --lengths 2k,4k --depths 0,50,100 --methods gemfilter --topk 256 --layer 11
  gemfilter-niah --preset cpu-demo --methods full,gemfilter:k=256,gemfilter:k=1024,snapkv:ratio=0.1
  gemfilter-niah --report-only --out results/niah          # redraw plots from finished rows
  # several processes (each takes every n-th missing cell; the main one merges the shards):
  accelerate launch --multi_gpu --num_processes 2 -m eval.niah --preset cpu-demo --out results/niah
  torchrun --nproc_per_node 2 -m eval.niah --preset cpu-demo --out results/niah
  (On CPU, 'accelerate launch --cpu --num_processes 2' starts only one process unless MPI is set up;
  the two lines above start real processes and the runner then uses gloo on CPU.)

The default model is the embedded Gemma 3 270M (offline; first load about 75 s, then about 3 s)."""


def _add_grid_options(p) -> None:
    """The grid and its prompt: lengths, depths, the prompt's wording, how it is tokenized, the haystack."""
    p.add_argument(
        "--lengths",
        default=None,
        help="context lengths in tokens, comma-separated, k = thousands (e.g. 1000,2k,4k); "
        "overrides the preset's lengths; each must exceed the 200-token buffer plus the needle",
    )
    p.add_argument(
        "--depths",
        default=None,
        help="needle depths in percent of the context, comma-separated (e.g. 0,25,50,75,100); "
        "overrides the preset's depths",
    )
    p.add_argument(
        "--prompt",
        default="gemfilter",
        choices=["gemfilter", "kamradt-chat"],
        help="gemfilter: the GemFilter repo's plain 'very long story book' prompt (default); "
        "kamradt-chat: needlehaystack's system/context/question chat (needs a chat template)",
    )
    p.add_argument(
        "--protocol",
        default=None,
        choices=["kamradt", "gemfilter-repo"],
        help="kamradt: clean context (default); gemfilter-repo: the GemFilter repo's special tokens, "
        "as the paper's figures used (default of --preset gemfilter-paper); see below",
    )
    p.add_argument(
        "--haystack-dir",
        default=None,
        help="folder of .txt files to use as haystack (default: needlehaystack's Paul Graham essays)",
    )


def build_parser() -> argparse.ArgumentParser:
    from gemfilter import describe
    from gemfilter.models import add_attn_argument
    from gemfilter.toolkit.options import add_method_options
    from gemfilter.toolkit.serving.engine import add_engine_argument

    from .grid import PRESET_SETTINGS

    presets = "\n".join(
        f"  {name:<16} {desc}"
        + "".join(
            f"\n  {'':<16} sets --{k} {','.join(v) if isinstance(v, tuple) else v}"
            for k, v in PRESET_SETTINGS.get(name, {}).items()
        )
        for name, (_, _, desc) in PRESETS.items()
    )
    width = max(len(n) for n, _ in describe())
    methods = "\n".join(f"  {name:<{width}}  {desc}" for name, desc in describe())
    p = argparse.ArgumentParser(
        prog="gemfilter-niah",
        description="Needle in a Haystack (Kamradt protocol, GemFilter repo settings): find the San Francisco "
        "needle in Paul Graham essays at every context length x depth, for each method.",
        epilog=EPILOG.format(presets=presets, methods=methods),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--model", default=None, help="Hugging Face id or local path (default: the embedded Gemma 3 270M, offline)"
    )
    add_attn_argument(p)
    add_engine_argument(p)
    add_method_options(p, default=None, default_help="the preset's, else full,gemfilter; see the list below")
    p.add_argument("--preset", default="cpu-demo", choices=list(PRESETS), help="named grid (default: cpu-demo)")
    _add_grid_options(p)
    p.add_argument(
        "--dtype",
        default=None,
        choices=["float16", "bfloat16", "float32"],
        help="model dtype on GPU (default: the loader's; --preset gemfilter-paper: float16 as the "
        "GemFilter repo); CPU always runs float32 and prints so",
    )
    p.add_argument("--out", default="results/niah", help="output folder (default: results/niah)")
    p.add_argument(
        "--max-new-tokens", type=int, default=50, help="greedy tokens per answer (default 50, GemFilter repo)"
    )
    p.add_argument(
        "--max-cells",
        type=int,
        default=None,
        help="compute at most this many missing cells now (a quick smoke run); rerun to do the rest",
    )
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads per process (default: torch's choice)")
    p.add_argument("--report-only", action="store_true", help="skip generation; redraw plots and summary from --out")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    return p


def _settings(settings: dict, lengths, depths) -> str:
    """The summary's settings line. settings: the run's identity (RunConfig.identity() or its stored
    config.json); lengths, depths: the grid axes."""
    layer = "model default" if settings.get("layer") is None else settings["layer"]
    topk = "each method's own" if settings.get("topk") is None else settings["topk"]
    return (
        f"topk {topk}, layer {layer}, prompt `{settings.get('prompt')}`, "
        f"protocol `{settings.get('protocol', 'kamradt')}`, max_new_tokens "
        f"{settings.get('max_new_tokens')}, grid {len(lengths)} lengths x {len(depths)} depths. "
        "Score: word recall of the answer (max 11/12), averaged over the cells."
    )


@command("eval", name="gemfilter-niah")
def main(argv=None) -> int:
    """Entry point of ``gemfilter-niah`` and ``python -m eval.niah``; returns the exit status."""
    from gemfilter.toolkit.options import cli_exit

    args = build_parser().parse_args(argv)
    return cli_exit(lambda: _main(args))


def _main(args) -> int:
    from pathlib import Path

    from eval.rundir import read_config

    from .grid import preset_settings, resolve_grid
    from .report import write_report
    from .runner import RunConfig, finished_rows, run

    lengths, depths = resolve_grid(args.preset, args.lengths, args.depths)
    preset = preset_settings(args.preset)
    from gemfilter.toolkit.options import method_specs_of

    specs = method_specs_of(args, default=",".join(preset["methods"]))
    config = RunConfig(
        model=args.model,
        methods=specs,
        lengths=lengths,
        depths=depths,
        topk=args.topk,
        layer=args.layer,
        prompt=args.prompt,
        max_new_tokens=args.max_new_tokens,
        haystack_dir=args.haystack_dir,
        attn=args.attn,
        protocol=args.protocol or preset["protocol"],
        dtype=args.dtype or preset["dtype"],
        engine=args.engine,
        extra={"preset": args.preset, "attn": args.attn or "model default"},
    )
    if not args.report_only:
        print(
            f"methods {','.join(config.labels)}; protocol {config.protocol}"
            + (f" (preset {args.preset})" if args.protocol is None and args.preset in PRESET_SETTINGS else ""),
            file=sys.stderr,
        )
    if args.max_cells is not None and args.max_cells < 1:
        raise ValueError(f"--max-cells must be >= 1, got {args.max_cells}")
    if args.threads < 0:
        raise ValueError(f"--threads must be >= 0 (0 = torch's choice), got {args.threads}")
    label = args.model or "embedded:gemma3-270m"
    out = Path(args.out)
    if args.report_only:  # report what the folder holds, not this command line's defaults
        if out.exists() and not out.is_dir():
            raise ValueError(f"--out {out} is a file, not a results folder")
        rows = list(finished_rows(out).values()) if out.is_dir() else []
        stored = (read_config(out) if out.is_dir() else None) or {}
        grid = (sorted({r["length"] for r in rows}), sorted({float(r["depth"]) for r in rows}))
        settings = _settings(stored, *grid) if stored else "Settings unknown: this folder has no config.json."
        paths = write_report(rows, out, rows[0]["model"] if rows else label, settings)
    else:
        if args.threads:
            import torch

            torch.set_num_threads(args.threads)
        rows = run(config, out, progress=not args.no_progress, max_cells=args.max_cells)
        if rows is None:  # not the main process: it only computed its shard
            return 0
        paths = write_report(rows, out, label, _settings(config.identity(), config.lengths, config.depths))
    print((out / "summary.md").read_text(encoding="utf-8"))
    print("wrote " + ", ".join(str(p) for p in paths))
    return 0


if __name__ == "__main__":
    sys.exit(main())
