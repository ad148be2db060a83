"""Command line of the interval labelling: ``python -m feature_probes.interval <subcommand>``.

Subcommands: ``table`` (Table A.2 with Figs. A.3 and A.4), ``report``, ``presets``. One JSONL row per finished
(law, seed), so an interrupted table resumes; a results JSON, a markdown table (also printed) and PNGs.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np

from feature_probes.common import add_run_args, fmt_seeds, table_command
from feature_probes.interval.data import IntervalSpec
from feature_probes.interval.experiments import PRESETS, run_table
from feature_probes.parity.cli import plot_mds
from gemfilter.toolkit.entry import command
from icl_probes.common import pyplot
from icl_probes.io import save_png

METHODS = ("network", "network_adam", "ntk", "ntk_ridge", "rf", "one_step", "two_step")
NAMES = {
    "network": "Network, stage 3 thm_a20 (minibatch GD, Eq. 2.4)",
    "network_adam": "Network, stage 3 adam",
    "ntk": "NTK, Adam",
    "ntk_ridge": "NTK, ridge",
    "rf": "RF",
    "one_step": "One Step",
    "two_step": "Two Step",
}
PAPER = {  # Table A.2 as printed: (train acc, test acc, cos similarity); "w/o structure" is the network's column
    "network": ("100.0", "100.0", "1.00"),
    "network_adam": ("100.0", "100.0", "1.00"),
    "ntk": ("100.0", "100.0", "NA"),
    "ntk_ridge": ("100.0", "100.0", "NA"),
    "rf": ("76.4", "73.2", "0.153"),
    "one_step": ("44.1", "41.0", "0.901"),
    "two_step": ("100.0", "100.0", "0.994"),
    "unstructured": ("100.0", "100.0", "0.965"),
}

EPILOG = """examples:
  python -m feature_probes.interval table --out results/interval --fig-dir feature_probes/figures   # ~1 min
  python -m feature_probes.interval table --preset paper --out results/interval5                     # 5 seeds, ~4 min
  python -m feature_probes.interval table --preset natural --out results/interval-natural            # unbalanced law
the law: y = +1 iff t1 <= sum_{i in A} phi_i <= t2 (t1=20, t2=30, |A|=30); with structure Pr[phi_i = 1] = 2/3 on A,
  1/2 elsewhere; without, 1/2 everywhere. The network, its learning process (Thm A.20) and the baselines are the
  parity experiment's (python -m feature_probes.parity table --help says each choice).
stage 3 (steps 3..T, each from the same step-2 network; --stage3 picks, default both):
  thm_a20   plain minibatch GD at Thm A.20's eta = k^2/(T m^(1/3)) (or --lr3), lambda = --lam3
  adam      Adam (lr 0.01) on both layers, same hinge loss and lambda (ours; the paper does not say)
outputs (in --out): interval_runs.jsonl (one row per (law, seed)), interval_result.json, interval_summary.md;
  in --fig-dir: interval_figA3_curves.png, interval_figA4_weights.png"""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m feature_probes.interval",
        description="Interval labelling (Z. Shi 2024, App. A.7, Table A.2, Figs. A.3-A.4): the parity experiment's "
        "two-layer network and baselines on y = +1 iff sum_A phi lies in [20, 30], with and without "
        "input structure.",
        epilog="run '<subcommand> --help' for its options",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="{table,report,presets}")
    text = "Table A.2 (network, NTK, RF, One/Two Step; with and without structure), Figs. A.3 and A.4"
    sp = sub.add_parser(
        "table", help=text, description=text, epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.subcommands = {"table": sp}
    add_run_args(sp, PRESETS)
    sp.add_argument("--steps", type=int, help="override T (paper: 200)")
    sp.add_argument("--n-train", type=int, help="override the training-set size (default 50000)")
    sp.add_argument("--lr3", type=float, help="step size of steps 3..T (0 = Thm A.20's k^2/(T m^(1/3)))")
    sp.add_argument("--stage3", help="comma-separated stage-3 settings: thm_a20, adam (default: both)")
    sp.add_argument(
        "--sampling",
        choices=["balanced", "natural"],
        help="balanced: n/2 points per class (the presets cpu and paper); natural: the law as is",
    )
    sp.add_argument(
        "--laws",
        choices=["both", "structured", "unstructured"],
        default="both",
        help="which data laws to run (default both)",
    )
    rp = sub.add_parser("report", help="write a run folder's interval_summary.md again from its interval_result.json")
    rp.add_argument("dir", type=Path, help="a folder written by 'table' (its --out)")
    parser.subcommands["report"] = rp
    sub.add_parser("presets", help="print every preset's settings as JSON")
    return parser


def make_config(args):
    cfg = PRESETS[args.preset]
    over = {key: getattr(args, key) for key in ("seeds", "steps", "lr3", "n_train") if getattr(args, key) is not None}
    over["laws"] = {"both": (True, False), "structured": (True,), "unstructured": (False,)}[args.laws]
    if args.stage3 is not None:
        over["stage3"] = tuple(x.strip() for x in args.stage3.split(",") if x.strip())
    if args.sampling is not None:
        over["spec"] = replace(cfg.spec, balanced=args.sampling == "balanced")
    if set(over) - {"seeds", "laws"}:
        over["note"] = cfg.note + " (with command-line overrides)"
    cfg = replace(cfg, **over)
    cfg.check()
    return cfg


def markdown(rows: list[dict], cfg: dict, command: str) -> str:
    """Table A.2 measured (mean ± std over seeds) beside the paper's row, and the law's exact numbers."""
    spec = cfg["spec"]
    k, m, steps = spec["k"], cfg["m"], cfg["steps"]
    eta3 = cfg["lr3"] or k**2 / (steps * m ** (1 / 3))
    sampling = "balanced (n/2 per class)" if spec["balanced"] else "natural (the product law as is)"
    lines = [
        f"Interval labelling (Table A.2): `{command}`",
        "",
        f"d={spec['d']}, D={spec['D']}, k={k}, y=+1 iff {spec['t1']} <= sum_A phi <= {spec['t2']}, "
        f"Pr[phi_i=1]={spec['p_a']:.4g} on A, m={m}, T={steps}, n_train={cfg['n_train']}, n_test={cfg['n_test']}, "
        f"sampling: {sampling}; stage 3 GD: η = {eta3:.4g} ({'--lr3' if cfg['lr3'] else 'Thm A.20'}), "
        f"λ = {cfg['lam3']:g}",
        "",
        "| law | method | train acc (%) | test acc (%) | cos similarity | test +1 predictions (%) | "
        "paper train / test / cos |",
        "|---|---|---|---|---|---|---|",
    ]
    for structured in (True, False):
        mine = [r for r in rows if r["structured"] == structured]
        for method in METHODS:
            if not mine or any(method not in r["methods"] for r in mine):
                continue
            ms = [r["methods"][method] for r in mine]
            paper = PAPER[method] if structured else (PAPER["unstructured"] if method == "network" else None)
            ptxt = "—" if paper is None else " / ".join(paper)
            lines.append(
                f"| {'structured' if structured else 'no structure'} | {NAMES[method]} | "
                f"{fmt_seeds(m['train_acc'] for m in ms)} | {fmt_seeds(m['test_acc'] for m in ms)} | "
                f"{fmt_seeds((m['cos'] for m in ms), 1.0, 3)} | {fmt_seeds(m.get('test_pos_share') for m in ms)} | "
                f"{ptxt} |"
            )
    lines.append("")
    for structured in (True, False):
        law = IntervalSpec(**{**spec, "structured": structured})
        if any(r["structured"] == structured for r in rows):
            lines.append(
                f"- {'With' if structured else 'Without'} structure (exact): P(y=+1) = "
                f"{law.positive_share():.4f} under the product law; on the sampled law the best constant "
                f"classifier gets {100 * law.majority_share():.1f}%, the best threshold on s "
                f"{100 * law.linear_ceiling():.1f}%; γ = {law.gamma():.4f}, "
                f"σ̃ = {law.centre_and_scale()[1]:.4f}."
            )
    lams = ", ".join(
        f"{'structured' if r['structured'] else 'no structure'} seed {r['seed']}: {r['methods']['ntk_ridge']['lam']:g}"
        for r in rows
        if "ntk_ridge" in r["methods"]
    )
    if lams:
        lines.append(f"- NTK ridge penalty chosen on the held-out split: {lams}.")
    lines.append(
        f"- {len(rows)} (law, seed) units, {sum(r['seconds'] for r in rows):.0f} s of training and evaluation in total."
    )
    return "\n".join(lines) + "\n"


def plot_curves(rows: list[dict], path):
    """Fig. A.3: test accuracy against training steps for each method, with and without input structure."""
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8), sharey=True)
    for ax, structured in zip(axes, (True, False)):
        mine = [r for r in rows if r["structured"] == structured]
        for i, method in enumerate(("network", "network_adam", "ntk", "rf", "one_step", "two_step")):
            for j, r in enumerate(mine):
                if method not in r["methods"]:
                    continue
                c = np.array(r["methods"][method]["curve"])
                ax.plot(c[:, 0], 100 * c[:, 1], color=f"C{i}", alpha=0.8, label=NAMES[method] if j == 0 else None)
        ax.set(
            xlabel="step",
            title="with input structure (Pr = 2/3 on A)" if structured else "without structure (Pr = 1/2 everywhere)",
        )
        ax.axhline(50, color="k", lw=0.6, ls=":")
    axes[0].set_ylabel("test accuracy (%)")
    for ax in axes:  # a run of one law leaves the other panel empty
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    return save_png(fig, path)


@command("probes", name="python -m feature_probes.interval")
def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "presets":
        print(json.dumps({k: asdict(v) for k, v in PRESETS.items()}, indent=2))
        return 0
    return table_command(
        parser,
        args,
        argv,
        prog="feature_probes.interval",
        stem="interval",
        make_config=make_config,
        run_table=run_table,
        markdown=markdown,
        figures=((plot_curves, "interval_figA3_curves.png"), (plot_mds, "interval_figA4_weights.png")),
    )
