"""Command line for the modular-addition probes (Ch. 4): ``python -m icl_probes.modular <subcommand>``.

Subcommands: ``mlp`` (Figs. 4.1, 4.2), ``transformer`` (Fig. 4.3), ``grok`` (Fig. 4.4), ``presets``.
Each writes a results JSON, a markdown summary (also printed), PNG figures and, unless --no-log, a JSONL
log; a finished run with the same settings is not retrained (--force retrains). A folder holding an
``mlp``/``transformer`` result of other settings is refused (--force replaces it); ``grok --force``
drops only the rows of the (k, p) pairs it recomputes.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path

from gemfilter.toolkit.entry import command
from icl_probes.common import as_stored, resolve_device
from icl_probes.io import check_out_dir, read_json, remove_jsonl_rows, write_json, write_text
from icl_probes.modular import plots, report
from icl_probes.modular.experiments import (
    GROK_PRESETS,
    MLP_PRESETS,
    TRANSFORMER_PRESETS,
    run_grokking,
    run_mlp,
    run_transformer,
)

PRESETS = {"mlp": MLP_PRESETS, "transformer": TRANSFORMER_PRESETS, "grok": GROK_PRESETS}

EPILOG = {
    "mlp": """examples:
  python -m icl_probes.modular mlp --preset cpu --out results/modular/mlp          # k=2, p=47, about 10 s
  python -m icl_probes.modular mlp --preset cpu --out results/modular/mlp --fig-dir icl_probes/figures
  python -m icl_probes.modular mlp --preset paper --device cuda --out $OUT/mlp --no-log
outputs (in --out): mlp_result.json (config, history, per-neuron power and frequency before/after),
  mlp_summary.md, mlp_log.jsonl (one row per evaluation); in --fig-dir: modular_fig41_neurons.png,
  modular_fig42_frequencies.png""",
    "transformer": """examples:
  python -m icl_probes.modular transformer --preset cpu --out results/modular/tf1
  python -m icl_probes.modular transformer --preset paper --device cuda --out $OUT/tf1 --no-log
outputs (in --out): transformer_result.json (history, per-head 2-D DFT sparsity of W^KQ, shown heads),
  transformer_summary.md, transformer_log.jsonl; in --fig-dir: modular_fig43_wkq.png""",
    "grok": """examples:
  python -m icl_probes.modular grok --preset cpu --out results/modular/grok
  python -m icl_probes.modular grok --preset cpu --kps "2,97;4,11" --steps 2000 --out results/modular/grok2
  python -m icl_probes.modular grok --preset paper --device cuda --out $OUT/grok
outputs (in --out): grok_runs.jsonl (one row per finished (k, p); an interrupted sweep resumes from it),
  grok_result.json, grok_summary.md; in --fig-dir: modular_fig44_grokking.png""",
}


def _kps(text: str) -> tuple[tuple[int, int], ...]:
    try:
        pairs = tuple(tuple(int(v) for v in part.split(",")) for part in text.split(";") if part.strip())
    except ValueError:
        pairs = ()
    if not pairs or any(len(pair) != 2 for pair in pairs):
        raise argparse.ArgumentTypeError(f"{text!r}: expected k,p pairs separated by ';', e.g. \"2,97;3,23\"")
    return pairs


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m icl_probes.modular",
        description="Modular addition with k inputs (Z. Shi 2024, Ch. 4): Fourier features of the Eq. 4.2 "
        "network, W^KQ of a one-layer transformer, and grokking against k.",
        epilog="run '<subcommand> --help' for its options; 'presets' lists every preset with its settings",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="{mlp,transformer,grok,presets}")
    parser.subcommands = {}  # errors are reported by the subcommand's parser, so its usage line is shown
    helps = {
        "mlp": "Eq. 4.2 network: per-neuron Fourier power and frequency histogram (Figs. 4.1, 4.2)",
        "transformer": "one-layer transformer: W^KQ per head and its 2-D DFT (Fig. 4.3)",
        "grok": "two-layer transformers over several (k, p): grokking delay (Fig. 4.4)",
    }
    for name, text in helps.items():
        sp = sub.add_parser(
            name, help=text, description=text, epilog=EPILOG[name], formatter_class=argparse.RawDescriptionHelpFormatter
        )
        parser.subcommands[name] = sp
        sp.add_argument(
            "--preset",
            default="cpu",
            choices=sorted(PRESETS[name]),
            help="settings table entry (default cpu; see the 'presets' subcommand)",
        )
        sp.add_argument("--out", required=True, type=Path, help="folder for the JSON, markdown and JSONL outputs")
        sp.add_argument("--fig-dir", type=Path, help="folder for the PNG figures (default: --out)")
        sp.add_argument("--device", default="auto", help="auto (cuda if available), cpu, cuda or cuda:N")
        sp.add_argument("--threads", type=int, default=2, help="torch CPU threads (default 2)")
        sp.add_argument("--seed", type=int, help="override the preset's seed (data split and initialisation)")
        sp.add_argument("--steps", type=int, help="override the number of optimiser steps")
        sp.add_argument("--lr", type=float, help="override the peak learning rate")
        sp.add_argument("--weight-decay", type=float, help="override AdamW's weight decay (the paper's lambda)")
        sp.add_argument("--batch-size", type=int, help="override the batch size (0 = full batch)")
        sp.add_argument("--schedule", choices=["constant", "cosine"], help="override the lr schedule after warm-up")
        sp.add_argument("--eval-every", type=int, help="override the evaluation interval in steps")
        sp.add_argument("--no-log", action="store_true", help="write no JSONL log (fewer output files)")
        sp.add_argument(
            "--force",
            action="store_true",
            help="retrain even if a finished result with these settings exists; mlp/transformer: replace "
            "a result of other settings; grok: drop only the rows of the listed (k, p) pairs",
        )
        sp.add_argument("--quiet", action="store_true", help="no progress bar")
        sp.add_argument(
            "--max-minutes",
            type=float,
            help="stop training after this many minutes and write what "
            "was reached (marked time_limit in the JSON); for a sweep, the budget covers all runs",
        )
        if name in ("mlp", "transformer"):
            sp.add_argument("--k", type=int, help="number of inputs (>= 2)")
            sp.add_argument("--p", type=int, help="modulus (an odd prime)")
        if name == "mlp":
            sp.add_argument("--m", type=int, help="width (0 = the paper's 2^{2k-2}(p-1))")
            sp.add_argument("--init-std", type=float, help="std of the N(0, std^2) initialisation")
        else:
            sp.add_argument("--heads", type=int, help="number of attention heads")
            sp.add_argument("--d-model", type=int, help="residual stream (hidden) dimension")
        if name == "grok":
            sp.add_argument("--kps", type=_kps, help='(k, p) pairs, e.g. "2,97;3,23;4,11;5,7"')
    sub.add_parser(
        "presets",
        help="print every preset's settings as JSON",
        description="Print every preset of every subcommand with all its settings as JSON.",
    )
    return parser


def make_config(args):
    """The preset named by --preset with the command-line overrides applied."""
    cfg = PRESETS[args.command][args.preset]
    train = {
        key: getattr(args, attr)
        for key, attr in (
            ("steps", "steps"),
            ("lr", "lr"),
            ("weight_decay", "weight_decay"),
            ("batch_size", "batch_size"),
            ("schedule", "schedule"),
            ("eval_every", "eval_every"),
        )
        if getattr(args, attr) is not None
    }
    over = {"train": replace(cfg.train, **train)}
    for key, attr in (
        ("seed", "seed"),
        ("k", "k"),
        ("p", "p"),
        ("m", "m"),
        ("init_std", "init_std"),
        ("n_heads", "heads"),
        ("d_model", "d_model"),
        ("kps", "kps"),
    ):
        if getattr(args, attr, None) is not None:
            over[key] = getattr(args, attr)
    if train or len(over) > 1:
        over["note"] = cfg.note + " (with command-line overrides)"
    cfg = replace(cfg, **over)
    cfg.train.check()
    if getattr(cfg, "m", 0) < 0:
        raise ValueError(f"--m {cfg.m}: must be >= 0 (0 = the paper width)")
    return cfg


def _same(path: Path, cfg, force: bool = False) -> dict | None:
    """The stored result at path if it finished with exactly these settings, else None (train).

    A result of other settings is never overwritten silently: ValueError names the settings that
    differ, unless ``force`` (then it is replaced).
    """
    if not path.exists():
        return None
    stored = read_json(path, "results file")
    want = as_stored(cfg)
    have = stored.get("config")
    if have != want and not force:
        if isinstance(have, dict):
            diff = ", ".join(f"{k}: {have.get(k)!r} there, {want[k]!r} now" for k in want if have.get(k) != want[k])
        else:
            diff = "it stores no settings"
        raise ValueError(
            f"--out {path.parent} already holds {path.name} of other settings ({diff}); use another "
            "--out to keep both, or --force to replace it"
        )
    if force or stored.get("final", {}).get("time_limit"):
        return None  # asked to retrain, or cut short by --max-minutes: train again
    return stored


def _drop_rows(path: Path, settings: dict, kps) -> None:
    """grok --force: remove from path only the rows that this sweep will recompute (same settings, listed (k, p))."""
    remove_jsonl_rows(path, lambda r: r.get("settings") == settings and (r.get("k"), r.get("p")) in kps)


@command("probes", name="python -m icl_probes.modular")
def main(argv=None) -> int:
    import torch

    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "presets":
        print(json.dumps({name: {k: asdict(v) for k, v in table.items()} for name, table in PRESETS.items()}, indent=2))
        return 0
    parser = parser.subcommands[args.command]
    if args.max_minutes is not None and args.max_minutes <= 0:
        parser.error(f"--max-minutes {args.max_minutes}: must be > 0")
    deadline = None if args.max_minutes is None else time.time() + 60 * args.max_minutes
    if args.threads < 1:
        parser.error(f"--threads {args.threads}: must be >= 1")
    command = "python -m icl_probes.modular " + shlex.join(sys.argv[1:] if argv is None else argv)
    try:
        cfg = make_config(args)
        device = resolve_device(args.device)
        torch.set_num_threads(args.threads)
        out = check_out_dir(args.out, files=(f"{args.command}_summary.md", f"{args.command}_result.json"))
        figs = check_out_dir(args.fig_dir, "--fig-dir") if args.fig_dir else out
        progress = not args.quiet
        if args.command == "mlp":
            path = out / "mlp_result.json"
            result = _same(path, cfg, args.force)
            if result is None:
                result = run_mlp(
                    cfg, device, None if args.no_log else out / "mlp_log.jsonl", progress, deadline=deadline
                )
                write_json(path, result)
            md = report.mlp_markdown(result, command)
            pngs = [
                plots.plot_neurons(result, figs / "modular_fig41_neurons.png"),
                plots.plot_frequencies(result, figs / "modular_fig42_frequencies.png"),
            ]
        elif args.command == "transformer":
            path = out / "transformer_result.json"
            result = _same(path, cfg, args.force)
            if result is None:
                result = run_transformer(
                    cfg, device, None if args.no_log else out / "transformer_log.jsonl", progress, deadline=deadline
                )
                write_json(path, result)
            md = report.transformer_markdown(result, command)
            pngs = [plots.plot_kq(result, figs / "modular_fig43_wkq.png")]
        else:
            jsonl = None if args.no_log else out / "grok_runs.jsonl"
            if args.force and jsonl is not None and jsonl.exists():
                from icl_probes.modular.experiments import grok_settings

                _drop_rows(jsonl, grok_settings(cfg), {tuple(kp) for kp in cfg.kps})
            rows = run_grokking(cfg, device, jsonl, progress, deadline=deadline)
            write_json(
                out / "grok_result.json", dict(experiment="grok", config=asdict(cfg), device=str(device), runs=rows)
            )
            md = report.grok_markdown(rows, asdict(cfg), command)
            pngs = [plots.plot_grokking(rows, figs / "modular_fig44_grokking.png")]
    except ValueError as err:
        parser.error(str(err))
    write_text(out / f"{args.command}_summary.md", md)
    print(md)
    print("wrote:", ", ".join(str(p) for p in [out / f"{args.command}_summary.md", *pngs]))
    return 0
