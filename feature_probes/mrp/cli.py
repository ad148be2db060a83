"""Command line of the MRP probe: ``python -m feature_probes.mrp <subcommand>``.

Subcommands: ``run`` (supervised baseline and MRP at each mask ratio, per seed), ``presets``. One JSONL row
per finished unit (an interrupted run resumes), a results JSON, a markdown table (also printed) and PNGs.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict, replace

import numpy as np

from feature_probes.common import add_run_args, mean_std, start_run
from feature_probes.mrp.experiments import PRESETS, run_units
from gemfilter.toolkit.entry import command
from icl_probes.common import pyplot
from icl_probes.io import save_png, write_json, write_text

EPILOG = """examples:
  python -m feature_probes.mrp run --out results/mrp --fig-dir feature_probes/figures        # ~2 min
  python -m feature_probes.mrp run --mask-ratios 0.1,0.5,0.9 --seeds 0,1 --out results/mrp_sweep
  python -m feature_probes.mrp run --steps 400 --lr-mrp 0.2 --out results/mrp_long
outputs (in --out): mrp_runs.jsonl (one row per unit), mrp_result.json, mrp_summary.md;
  in --fig-dir: mrp_capture.png"""


def _ratios(text: str) -> tuple[float, ...]:
    try:
        vals = tuple(float(v) for v in text.split(",") if v.strip())
    except ValueError:
        vals = ()
    if not vals or any(not 0 <= v < 1 for v in vals):
        raise argparse.ArgumentTypeError(f"{text!r}: expected mask ratios in [0, 1) separated by commas, e.g. 0.25,0.5")
    return vals


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m feature_probes.mrp",
        description="Mask-reconstruction pretraining (Pan, Zhou, Yan): a teacher-student encoder pretrained on masked "
        "multi-view patch data against supervised learning at the same width and steps.",
        epilog="run '<subcommand> --help' for its options",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="{run,presets}")
    text = "SL baseline and MRP per mask ratio: captured features, downstream single-/multi-view accuracy"
    sp = sub.add_parser(
        "run", help=text, description=text, epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.subcommands = {"run": sp}
    add_run_args(sp, PRESETS)
    sp.add_argument("--mask-ratios", type=_ratios, help="mask ratios 1 - theta, e.g. 0.25,0.5,0.75")
    sp.add_argument("--steps", type=int, help="GD steps of pretraining and of supervised training")
    sp.add_argument("--lr-mrp", type=float, help="pretraining step size")
    sp.add_argument("--lr-sl", type=float, help="supervised step size")
    sp.add_argument("--c-tau", type=float, help="constant of the teacher's Theta(1/(t+1)) term")
    sub.add_parser("presets", help="print every preset's settings as JSON")
    return parser


def make_config(args):
    cfg = PRESETS[args.preset]
    names = {
        "seeds": "seeds",
        "mask_ratios": "mask_ratios",
        "steps": "steps",
        "lr_mrp": "lr_mrp",
        "lr_sl": "lr_sl",
        "c_tau": "c_tau",
    }
    over = {field: getattr(args, attr) for attr, field in names.items() if getattr(args, attr) is not None}
    if set(over) - {"seeds", "mask_ratios"}:
        over["note"] = cfg.note + " (with command-line overrides)"
    cfg = replace(cfg, **over)
    cfg.check()
    return cfg


def _avg(values, digits=3):
    values = [v for v in values if v is not None]
    if not values:
        return "—"
    m, s = mean_std(values)
    return f"{m:.{digits}f}" + (f" ± {s:.{digits}f}" if len(values) > 1 else "")


def markdown(rows: list[dict], cfg: dict, command: str) -> str:
    d = cfg["data"]
    lines = [
        f"MRP probe: `{command}`",
        "",
        f"k={d['k']}, d={d['d']}, P={d['P']}, C_p={d['C_p']}, mu={d['mu']}, km={d['k'] * cfg['m']} kernels, "
        f"q={cfg['q']}, "
        f"N={cfg['n_train']}, steps={cfg['steps']}, lr MRP/SL {cfg['lr_mrp']}/{cfg['lr_sl']}",
        "",
        "| encoder | seeds | diverged | features captured | classes with both | winning kernels (max features each) | "
        "head: single-view acc | head: multi-view acc | own F: single / multi | seconds |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    groups = [("supervised (SL)", [r for r in rows if r["method"] == "sl"])]
    for ratio in sorted({r["mask_ratio"] for r in rows if r["method"] == "mrp"}):
        groups.append(
            (f"MRP, mask ratio {ratio}", [r for r in rows if r["method"] == "mrp" and r["mask_ratio"] == ratio])
        )
    for name, mine in groups:
        if not mine:
            continue
        ok = [r for r in mine if r["final"] is not None]
        div = [str(r["diverged_at"]) for r in mine if r["diverged_at"] is not None]
        win = ", ".join(f"{r['final']['winning_kernels']} ({r['final']['max_features_per_kernel']})" for r in ok) or "—"
        own = "—"
        if mine[0]["method"] == "sl":
            own = f"{_avg(r['own']['single_acc'] for r in mine)} / {_avg(r['own']['multi_acc'] for r in mine)}"
        lines.append(
            f"| {name} | {len(mine)} | {'at step ' + ', '.join(div) if div else 'no'} | "
            f"{_avg(r['final']['captured'] for r in ok)} | {_avg(r['final']['classes_both'] for r in ok)} | {win} | "
            f"{_avg(r['head']['head_single_acc'] for r in ok)} | {_avg(r['head']['head_multi_acc'] for r in ok)} | "
            f"{own} | {sum(r['seconds'] for r in mine):.0f} |"
        )
    init = rows[0]["init"]
    lines += [
        "",
        f"At initialisation (seed {rows[0]['seed']}): {init['captured']:.2f} of the features captured, "
        f"Lambda mean {init['lam_mean']:.3f} (threshold {cfg['capture_at'] or 'varrho*C_p'}).",
    ]
    return "\n".join(lines) + "\n"


def plot(rows: list[dict], path):
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
    for i, r in enumerate(x for x in rows if x["seed"] == rows[0]["seed"]):
        label = "SL" if r["method"] == "sl" else f"MRP mask {r['mask_ratio']}"
        h = r["history"]
        axes[0].plot([x["step"] for x in h], [x["captured"] for x in h], color=f"C{i}", label=label)
        if r["final"] is not None:
            lam = np.array(r["final"]["lam"])
            axes[1].scatter(lam[:, 0], lam[:, 1], color=f"C{i}", s=16, label=label)
    axes[0].set(xlabel="GD step", ylabel="fraction of the 2k features", title="features captured", ylim=(-0.05, 1.05))
    axes[0].legend(fontsize=7)
    axes[1].set(xlabel="Lambda_{i,1}", ylabel="Lambda_{i,2}", title="per class, end of training (log scale)")
    axes[1].set_xscale("symlog", linthresh=0.1)
    axes[1].set_yscale("symlog", linthresh=0.1)
    axes[1].legend(fontsize=7)
    return save_png(fig, path)


@command("probes", name="python -m feature_probes.mrp")
def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "presets":
        print(json.dumps({k: asdict(v) for k, v in PRESETS.items()}, indent=2))
        return 0
    cfg, command, out, figs, jsonl = start_run(parser, args, argv, "feature_probes.mrp", make_config, "mrp_runs.jsonl")
    rows = run_units(cfg, jsonl, progress=not args.quiet, force=args.force)
    write_json(out / "mrp_result.json", dict(config=asdict(cfg), command=command, runs=rows))
    md = markdown(rows, asdict(cfg), command)
    png = plot(rows, figs / "mrp_capture.png")
    write_text(out / "mrp_summary.md", md)
    print(md)
    print("wrote:", out / "mrp_summary.md", png)
    return 0
