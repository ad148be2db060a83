"""Command line of the Midpoint Mixup probe: ``python -m feature_probes.midpoint_mixup <subcommand>``.

Subcommands: ``synthetic`` (Sec. 4, Def. 4.1 data), ``images`` (Table 1's protocol on digits), ``presets``.
Each writes one JSONL row per finished (method, seed) (an interrupted run resumes), a results JSON, a
markdown table (also printed) and PNG figures.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np

from feature_probes.common import add_run_args, mean_std, start_run
from feature_probes.midpoint_mixup.experiments import (
    IMAGES_PRESETS,
    SWEEPS,
    SYNTHETIC_PRESETS,
    run_images,
    run_synthetic,
    run_units,
)
from feature_probes.midpoint_mixup.model import METHODS
from gemfilter.toolkit.entry import command
from icl_probes.common import pyplot
from icl_probes.io import save_png, write_json, write_text

PRESETS = {"synthetic": SYNTHETIC_PRESETS, "images": IMAGES_PRESETS}
PAPER_TABLE1_FMNIST = {"erm": "16.55 ± 2", "midpoint": "14.84 ± 1", "uniform": "9.66"}
NAMES = {"erm": "ERM", "midpoint": "Midpoint Mixup", "uniform": "Uniform Mixup (Beta(1,1))"}

EPILOG = {
    "synthetic": """examples:
  python -m feature_probes.midpoint_mixup synthetic --out results/midpoint/synthetic --fig-dir feature_probes/figures
  python -m feature_probes.midpoint_mixup synthetic --seeds 0,1,2 --steps 800 --out results/midpoint/syn3
  python -m feature_probes.midpoint_mixup synthetic --pairs different --out results/midpoint/syn_diff
outputs (in --out): synthetic_runs.jsonl (one row per (method, seed)), synthetic_result.json,
  synthetic_summary.md; in --fig-dir: midpoint_synthetic.png""",
    "images": """examples:
  python -m feature_probes.midpoint_mixup images --out results/midpoint/images --fig-dir feature_probes/figures
  python -m feature_probes.midpoint_mixup images --seeds 0 --epochs 20 --out results/midpoint/images_quick
  python -m feature_probes.midpoint_mixup images --preset cpu-steps --out results/midpoint/images_steps
outputs (in --out): images_runs.jsonl, images_result.json, images_summary.md; in --fig-dir: midpoint_images.png
  (midpoint_images_<preset>.png for another preset)""",
    "sweep": """sweeps (each a list of synthetic presets; 'presets' prints their settings):
  lr   lr10 (600 steps), lr1 (6000), lr0.1 (60000): the cpu preset on seed 0, lr x steps = 6000
examples:
  python -m feature_probes.midpoint_mixup sweep --out results/midpoint/lr_sweep --fig-dir feature_probes/figures
outputs (in --out): sweep_runs.jsonl (one row per (setting, method, seed); an interrupted sweep resumes),
  sweep_summary.md; in --fig-dir: midpoint_sweep_lr.png""",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m feature_probes.midpoint_mixup",
        description="Midpoint Mixup (Chidambaram, Wang, Wu, Ge, ICML 2023): ERM learns one feature per class on "
        "multi-view data, Midpoint Mixup learns both (Sec. 4); Table 1's image protocol (Sec. 5).",
        epilog="run '<subcommand> --help' for its options; 'presets' prints every preset",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="{synthetic,images,sweep,presets}")
    parser.subcommands = {}
    helps = {
        "synthetic": "Def. 4.1 data, Eq. 4.1 network, full-batch GD: feature strengths and single-view accuracy",
        "images": "Table 1 protocol on scikit-learn's digits: test error over 5 seeds",
    }
    for name, text in helps.items():
        sp = sub.add_parser(
            name, help=text, description=text, epilog=EPILOG[name], formatter_class=argparse.RawDescriptionHelpFormatter
        )
        parser.subcommands[name] = sp
        add_run_args(sp, PRESETS[name])
        sp.add_argument("--methods", type=_methods, help=f"comma-separated subset of {','.join(METHODS)}")
        sp.add_argument("--lr", type=float, help="override the learning rate")
        if name == "synthetic":
            sp.add_argument("--steps", type=int, help="override the number of full-batch GD steps")
            sp.add_argument(
                "--pairs",
                choices=["all", "different"],
                help="mixup pairs: all N^2 ordered pairs (Eq. 3.1) or only pairs of different classes",
            )
        else:
            sp.add_argument("--epochs", type=int, help="override the number of epochs (paper: 100)")
    text = "several synthetic presets in a row (the step-size sweep): classes with both features, per setting"
    sp = sub.add_parser(
        "sweep",
        help=text,
        description=text,
        epilog=EPILOG["sweep"],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.subcommands["sweep"] = sp
    sp.add_argument("--sweep", default="lr", choices=sorted(SWEEPS), help="which sweep (default lr)")
    sp.add_argument("--out", required=True, type=Path, help="folder for the JSONL rows and the markdown table")
    sp.add_argument("--fig-dir", type=Path, help="folder for the PNG figure (default: --out)")
    sp.add_argument("--threads", type=int, default=2, help="torch CPU threads (default 2)")
    sp.add_argument("--quiet", action="store_true", help="no progress bars")
    sub.add_parser("presets", help="print every preset's settings as JSON")
    return parser


def _methods(text: str) -> tuple[str, ...]:
    methods = tuple(v.strip() for v in text.split(",") if v.strip())
    bad = [v for v in methods if v not in METHODS]
    if not methods or bad:
        raise argparse.ArgumentTypeError(f"{text!r}: methods must be a comma-separated subset of {','.join(METHODS)}")
    return methods


def make_config(args):
    cfg = PRESETS[args.command][args.preset]
    over = {
        key: getattr(args, key)
        for key in ("methods", "seeds", "lr", "steps", "pairs", "epochs")
        if getattr(args, key, None) is not None
    }
    if set(over) - {"methods", "seeds"}:
        over["note"] = cfg.note + " (with command-line overrides)"
    cfg = replace(cfg, **over)
    cfg.check()
    return cfg


def synthetic_markdown(rows: list[dict], cfg: dict, command: str) -> str:
    lines = [
        f"Midpoint Mixup, synthetic (Def. 4.1): `{command}`",
        "",
        f"k={cfg['data']['k']}, P={cfg['data']['P']}, N={cfg['n_train']}, m={cfg['m']}, d={cfg['d']}, "
        f"lr={cfg['lr']}, steps={cfg['steps']}, pairs={cfg['pairs']}; a feature is learned when its single-view "
        f"per-class accuracy is >= {cfg['learned_at']}",
        "",
        "| method | seeds | train acc | test acc | single-view acc | classes with both features learned | "
        "with exactly one | mean Lambda strong / weak | max off-class corr | seconds |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for method in METHODS:
        mine = [r for r in rows if r["method"] == method]
        if not mine:
            continue
        f = [r["final"] for r in mine]
        avg = lambda key: "%.3f ± %.3f" % mean_std(x[key] for x in f)  # noqa: E731
        lines.append(
            f"| {NAMES[method]} | {len(mine)} | {avg('train_acc')} | {avg('test_acc')} | {avg('single_view_acc')} | "
            f"{avg('both_learned')} | {avg('one_learned')} | "
            f"{mean_std(x['lam_strong'] for x in f)[0]:.2f} / {mean_std(x['lam_weak'] for x in f)[0]:.2f} | "
            f"{max(x['off_class_max'] for x in f):.3f} | {sum(r['seconds'] for r in mine):.0f} |"
        )
    lines += [
        "",
        "Per class (first seed): Lambda_{y,1} / Lambda_{y,2} and single-view accuracy keeping v_{y,1} / v_{y,2}",
        "",
        "| method | " + " | ".join(f"y={c}" for c in range(cfg["data"]["k"])) + " |",
        "|---|" + "---|" * cfg["data"]["k"],
    ]
    for method in METHODS:
        mine = [r for r in rows if r["method"] == method]
        if mine:
            f = mine[0]["final"]
            cells = [
                f"{a:.2f}/{b:.2f} ({p:.2f}/{q:.2f})" for (a, b), (p, q) in zip(f["lam"], f["per_class_single_view"])
            ]
            lines.append(f"| {NAMES[method]} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def images_markdown(rows: list[dict], cfg: dict, command: str) -> str:
    lines = [
        f"Midpoint Mixup, Table 1 protocol on digits: `{command}`",
        "",
        f"epochs={cfg['epochs']}, batch={cfg['batch']}, Adam lr={cfg['lr']}, SmallCNN width {cfg['width']}",
        "",
        "| method | seeds | our test error (%) on digits, mean ± std | per seed | paper FMNIST (%) | seconds |",
        "|---|---|---|---|---|---|",
    ]
    for method in METHODS:
        mine = [r for r in rows if r["method"] == method]
        if mine:
            m, s = mean_std(r["test_error"] for r in mine)
            per = ", ".join(f"{r['test_error']:.2f}" for r in mine)
            lines.append(
                f"| {NAMES[method]} | {len(mine)} | {m:.2f} ± {s:.2f} | {per} | {PAPER_TABLE1_FMNIST[method]} | "
                f"{sum(r['seconds'] for r in mine):.0f} |"
            )
    return "\n".join(lines) + "\n"


def plot_synthetic(rows: list[dict], path):
    plt = pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(14, 3.8))
    for i, method in enumerate(METHODS):
        mine = [r for r in rows if r["method"] == method]
        if not mine:
            continue
        h = mine[0]["history"]
        steps = [row["step"] for row in h]
        axes[0].plot(steps, [row["lam_strong"] for row in h], color=f"C{i}", label=f"{NAMES[method]}: stronger")
        axes[0].plot(steps, [row["lam_weak"] for row in h], color=f"C{i}", ls="--", label=f"{NAMES[method]}: weaker")
        axes[1].plot(steps, [row["both_learned"] for row in h], color=f"C{i}", label=NAMES[method])
        lam = np.array(mine[0]["final"]["lam"])
        axes[2].scatter(lam.max(axis=1), lam.min(axis=1), color=f"C{i}", label=NAMES[method], s=18)
    axes[0].set(
        xlabel="GD step", ylabel="mean over classes of Lambda_{y,l}", title="stronger / weaker feature per class"
    )
    axes[0].legend(fontsize=6)
    axes[1].set(
        xlabel="GD step",
        ylabel="fraction of classes",
        title="both features learned (single-view test)",
        ylim=(-0.05, 1.05),
    )
    axes[1].legend(fontsize=7)
    top = max(1e-3, max(max(max(v) for v in r["final"]["lam"]) for r in rows))
    axes[2].plot([0, top], [0, top], "k:", lw=0.8)
    axes[2].set(
        xlabel="stronger feature's Lambda", ylabel="weaker feature's Lambda", title="per class, end of training"
    )
    axes[2].legend(fontsize=7)
    return save_png(fig, path)


def plot_images(rows: list[dict], path):
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    for i, method in enumerate(METHODS):
        curves = np.array([r["curve"] for r in rows if r["method"] == method])
        if len(curves):
            x = np.arange(1, curves.shape[1] + 1)
            ax.plot(x, curves.mean(axis=0), color=f"C{i}", label=NAMES[method])
            ax.fill_between(
                x,
                curves.mean(axis=0) - curves.std(axis=0),
                curves.mean(axis=0) + curves.std(axis=0),
                color=f"C{i}",
                alpha=0.2,
            )
    ax.set(xlabel="epoch", ylabel="test error (%)", title="digits, second view zeroed at test (mean ± 1 std)")
    ax.set_ylim(0, 60)
    ax.legend()
    return save_png(fig, path)


def run_sweep(name: str, jsonl: Path, figs: Path, progress: bool = True) -> str:
    """Every preset of SWEEPS[name], one row per unit in ``jsonl`` (resumable); the table goes beside it as
    sweep_summary.md, the figure to ``figs``. Returns the table and where the files went."""
    out = jsonl.parent
    lines = [
        f"Midpoint Mixup, synthetic, sweep {name!r}: the fraction of the k classes with both features learned "
        "(and with exactly one), per setting and method; train accuracy and loss at the end",
        "",
        "| setting | lr | steps | method | both features | exactly one | train acc | final loss |",
        "|---|---|---|---|---|---|---|---|",
    ]
    results = {}
    for preset in SWEEPS[name]:
        cfg = SYNTHETIC_PRESETS[preset]
        rows = run_units(run_synthetic, cfg, jsonl, progress=progress)
        results[preset] = rows
        for method in cfg.methods:
            f = [r["final"] for r in rows if r["method"] == method]
            avg = lambda key: "%.2f" % mean_std(x[key] for x in f)[0]  # noqa: E731
            loss = mean_std(x["loss"] for x in f)[0]
            lines.append(
                f"| {preset} | {cfg.lr:g} | {cfg.steps} | {NAMES[method]} | {avg('both_learned')} | "
                f"{avg('one_learned')} | {avg('train_acc')} | {loss:.4f} |"
            )
    plt = pyplot()
    fig, axes = plt.subplots(1, len(results), figsize=(4.5 * len(results), 3.6), sharey=True)
    for ax, (preset, rows) in zip(np.atleast_1d(axes), results.items()):
        for i, method in enumerate(METHODS):
            for r in (r for r in rows if r["method"] == method):
                h = r["history"]
                ax.plot([x["step"] for x in h], [x["both_learned"] for x in h], color=f"C{i}", label=NAMES[method])
        cfg = SYNTHETIC_PRESETS[preset]
        ax.set(title=f"{preset}: lr {cfg.lr:g}, {cfg.steps} steps", xlabel="GD step", ylim=(-0.05, 1.05))
    np.atleast_1d(axes)[0].set_ylabel("classes with both features learned")
    np.atleast_1d(axes)[0].legend(fontsize=7)
    png = save_png(fig, figs / f"midpoint_sweep_{name}.png")
    md = "\n".join(lines) + "\n"
    write_text(out / "sweep_summary.md", md)
    return md + f"\nwrote: {out / 'sweep_summary.md'} {png}"


@command("probes", name="python -m feature_probes.midpoint_mixup")
def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "presets":
        print(json.dumps({name: {k: asdict(v) for k, v in table.items()} for name, table in PRESETS.items()}, indent=2))
        return 0
    # sweep: its "config" is the sweep's name; start_run checks --threads, sets them and creates --out
    cfg, command, out, figs, jsonl = start_run(
        parser,
        args,
        argv,
        "feature_probes.midpoint_mixup",
        (lambda a: a.sweep) if args.command == "sweep" else make_config,
        f"{args.command}_runs.jsonl",
    )
    if args.command == "sweep":
        print(run_sweep(cfg, jsonl, figs, progress=not args.quiet))
        return 0
    run = run_synthetic if args.command == "synthetic" else run_images
    rows = run_units(run, cfg, jsonl, progress=not args.quiet, force=args.force)
    write_json(out / f"{args.command}_result.json", dict(config=asdict(cfg), command=command, runs=rows))
    if args.command == "synthetic":
        md, png = synthetic_markdown(rows, asdict(cfg), command), plot_synthetic(rows, figs / "midpoint_synthetic.png")
    else:
        name = "midpoint_images.png" if args.preset == "cpu" else f"midpoint_images_{args.preset}.png"
        md, png = images_markdown(rows, asdict(cfg), command), plot_images(rows, figs / name)
    write_text(out / f"{args.command}_summary.md", md)
    print(md)
    print("wrote:", out / f"{args.command}_summary.md", png)
    return 0
