"""Command line of the parity simulation: ``python -m feature_probes.parity <subcommand>``.

Subcommands: ``table`` (Table A.1 with Figs. A.1 and A.2), ``step1`` and ``ntk`` (measured causes of the One
Step cosine and NTK gaps, ``studies``), ``report``, ``presets``. One JSONL row per finished
(law, seed), so an interrupted table resumes; a results JSON, a markdown table (also printed) and PNGs.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np

from feature_probes.common import add_run_args, fmt_seeds, start_run, table_command
from feature_probes.parity.data import ParitySpec
from feature_probes.parity.experiments import PRESETS, run_table
from gemfilter.toolkit.entry import command
from icl_probes.common import pyplot
from icl_probes.io import save_png, write_text

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
PAPER = {  # Table A.1: (train acc, test acc, cos similarity); "w/o structure" is the network's column
    "network": (100.0, 100.0, 0.997),
    "network_adam": (100.0, 100.0, 0.997),
    "ntk": (84.0, 86.4, None),
    "ntk_ridge": (84.0, 86.4, None),
    "rf": (74.7, 76.0, 0.114),
    "one_step": (51.3, 52.2, 0.848),
    "two_step": (100.0, 100.0, 0.997),
    "unstructured": (100.0, 52.0, 0.253),
}

EPILOG = """examples:
  python -m feature_probes.parity table --out results/parity --fig-dir feature_probes/figures     # ~2-4 min
  python -m feature_probes.parity table --preset paper --out results/parity5                        # 5 seeds
  python -m feature_probes.parity table --step1 lemma_a17 --out results/parity_a17
  python -m feature_probes.parity table --stage3 thm_a20 --lr3 0.5 --out results/parity_gd05
stage 3 (steps 3..T, each from the same step-2 network; --stage3 picks, default both):
  thm_a20   plain minibatch GD at Thm A.20's eta = k^2/(T m^(1/3)) (or --lr3), lambda = --lam3
  adam      Adam (lr 0.01) on both layers, same hinge loss and lambda (ours; the paper does not say)
NTK solvers: Adam on the linearised network (lr 0.01, as the other baselines), and ridge regression on the
  NTK features with its penalty chosen on a held-out 20% of the training set, then refit on all of it.
outputs (in --out): parity_runs.jsonl (one row per (law, seed)), parity_result.json, parity_summary.md;
  in --fig-dir: parity_figA1_curves.png, parity_figA2_mds.png"""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m feature_probes.parity",
        description="Gradient feature learning on parities (Z. Shi 2024, Ch. 2, App. A.7.1): the two-layer network "
        "trained by Thm A.20's process against NTK and random features, with and without input structure.",
        epilog="run '<subcommand> --help' for its options",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="{table,step1,ntk,report,presets}")
    text = "Table A.1 (network, NTK, RF, One/Two Step; with and without structure), Figs. A.1 and A.2"
    sp = sub.add_parser(
        "table", help=text, description=text, epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.subcommands = {"table": sp}
    add_run_args(sp, PRESETS)
    sp.add_argument("--steps", type=int, help="override T (paper: 600)")
    sp.add_argument("--n-train", type=int, help="override the training-set size (paper: 50000)")
    sp.add_argument("--step1", choices=["thm_a20", "lemma_a17"], help="step-1 size and smoothing (default thm_a20)")
    sp.add_argument("--lr3", type=float, help="step size of steps 3..T (0 = Thm A.20's k^2/(T m^(1/3)))")
    sp.add_argument("--lam3", type=float, help="lambda_a = lambda_w in steps 3..T")
    sp.add_argument("--stage3", help="comma-separated stage-3 settings: thm_a20, adam (default: both)")
    sp.add_argument(
        "--laws",
        choices=["both", "structured", "unstructured"],
        default="both",
        help="which data laws to run (default both)",
    )
    _add_studies(sub, parser)
    rp = sub.add_parser("report", help="write a run folder's parity_summary.md again from its parity_result.json")
    rp.add_argument("dir", type=Path, help="a folder written by 'table' (its --out)")
    parser.subcommands["report"] = rp
    sub.add_parser("presets", help="print every preset's settings as JSON")
    return parser


STUDIES_EPILOG = """examples:
  python -m feature_probes.parity step1 --out results/parity-step1              # ~2 min, seeds 0-4
  python -m feature_probes.parity ntk --out results/parity-ntk                  # ~10 min, seeds 0-2
  python -m feature_probes.parity ntk --n-train 50000 --seeds 0 --out results/parity-ntk0
outputs (in --out): <study>_rows.jsonl (one row per finished unit; a rerun resumes), <study>_summary.md"""


def _add_studies(sub, parser) -> None:
    from feature_probes.parity.studies import STEP1_VARIANTS

    text = (
        "One Step / Two Step cosines after steps 1 and 2 under the spec and under changes that could lower "
        "One Step's towards the paper's 0.848: " + "; ".join(v.name for v in STEP1_VARIANTS)
    )
    sp = sub.add_parser(
        "step1",
        help="cosines after steps 1-2 under step-1 variants (structured law)",
        description=text,
        epilog=STUDIES_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_run_args(sp, PRESETS)
    parser.subcommands["step1"] = sp
    text = (
        "NTK ridge (penalty chosen on a held-out 20%) at several training-set sizes, scored on --n-test fresh "
        "points and on their disjoint subsets of --subset points: how far test accuracy strays above train "
        "accuracy by sampling alone (Table A.1: NTK 84.0 train, 86.4 test)"
    )
    sp = sub.add_parser(
        "ntk",
        help="NTK ridge accuracy against training-set size, and its test-subset spread",
        description=text,
        epilog=STUDIES_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_run_args(sp, PRESETS)
    sp.add_argument("--n-train", help="comma-separated training-set sizes (default 12500,25000,50000,100000)")
    sp.add_argument("--n-test", type=int, default=100000, help="fresh test points (default 100000)")
    sp.add_argument("--subset", type=int, default=1000, help="test-subset size for the spread (default 1000)")
    parser.subcommands["ntk"] = sp


def _study_config(args):
    from feature_probes.parity.studies import NTKStudy, Step1Study

    run = PRESETS[args.preset]
    seeds = {"seeds": args.seeds} if args.seeds else {}
    if args.command == "step1":
        return Step1Study(run=run, **seeds)
    extra = {}
    if args.n_train:
        try:
            extra["n_trains"] = tuple(int(v) for v in args.n_train.split(",") if v.strip())
        except ValueError:
            raise ValueError(f"--n-train {args.n_train!r}: expected integers separated by commas, e.g. 25000,50000")
    study = NTKStudy(run=run, n_test=args.n_test, subset=args.subset, **seeds, **extra)
    study.check()
    return study


def _run_study(parser, args, argv) -> int:
    from feature_probes.parity import studies

    study, command, out, _, jsonl = start_run(
        parser, args, argv, "feature_probes.parity", _study_config, f"{args.command}_rows.jsonl"
    )
    if args.command == "step1":
        rows = studies.run_step1(study, jsonl, force=args.force, progress=not args.quiet)
        md = studies.step1_markdown(rows)
    else:
        rows = studies.run_ntk(study, jsonl, force=args.force, progress=not args.quiet)
        md = studies.ntk_markdown(rows)
    md = f"`{command}`\n\n" + md
    write_text(out / f"{args.command}_summary.md", md)
    print(md)
    return 0


def make_config(args):
    cfg = PRESETS[args.preset]
    over = {
        key: getattr(args, key)
        for key in ("seeds", "steps", "step1", "lr3", "lam3", "n_train")
        if getattr(args, key) is not None
    }
    over["laws"] = {"both": (True, False), "structured": (True,), "unstructured": (False,)}[args.laws]
    if args.stage3 is not None:
        over["stage3"] = tuple(x.strip() for x in args.stage3.split(",") if x.strip())
    if set(over) - {"seeds", "laws"}:
        over["note"] = cfg.note + " (with command-line overrides)"
    cfg = replace(cfg, **over)
    cfg.check()
    return cfg


def markdown(rows: list[dict], cfg: dict, command: str) -> str:
    k, m, steps = cfg["spec"]["k"], cfg["m"], cfg["steps"]
    eta3 = cfg["lr3"] or k**2 / (steps * m ** (1 / 3))
    lines = [
        f"Parity simulation (Table A.1): `{command}`",
        "",
        f"d={cfg['spec']['d']}, D={cfg['spec']['D']}, k={k}, p_o={cfg['spec']['p_o']}, m={m}, "
        f"T={steps}, n_train={cfg['n_train']}, n_test={cfg['n_test']}, step 1: {cfg['step1']}; stage 3 GD: "
        f"η = {eta3:.4g} ({'--lr3' if cfg['lr3'] else 'Thm A.20'}), λ = {cfg['lam3']:g}",
        "",
        "| law | method | train acc (%) | test acc (%) | cos similarity | paper train / test / cos |",
        "|---|---|---|---|---|---|",
    ]
    for structured in (True, False):
        mine = [r for r in rows if r["structured"] == structured]
        for method in METHODS:
            if not mine or any(method not in r["methods"] for r in mine):
                continue
            ms = [r["methods"][method] for r in mine]
            paper = PAPER[method] if structured else (PAPER["unstructured"] if method == "network" else None)
            ptxt = "—" if paper is None else " / ".join("NA" if v is None else str(v) for v in paper)
            lines.append(
                f"| {'structured' if structured else 'no structure'} | {NAMES[method]} | "
                f"{fmt_seeds(m['train_acc'] for m in ms)} | {fmt_seeds(m['test_acc'] for m in ms)} | "
                f"{fmt_seeds((m['cos'] for m in ms), 1.0, 3)} | {ptxt} |"
            )
    secs = sum(r["seconds"] for r in rows)
    lams = ", ".join(
        f"{'structured' if r['structured'] else 'no structure'} seed {r['seed']}: {r['methods']['ntk_ridge']['lam']:g}"
        for r in rows
        if "ntk_ridge" in r["methods"]
    )
    spec = ParitySpec(**{**cfg["spec"], "structured": True})
    lines += [
        "",
        f"Best accuracy of any classifier linear in s = sum_(j in A) phi_j (a threshold on s), on the exact "
        f"law: {100 * spec.linear_ceiling():.1f}% with structure, "
        f"{100 * replace(spec, structured=False).linear_ceiling():.1f}% without.",
    ]
    lines += ["", f"NTK ridge penalty chosen on the held-out split: {lams}." if lams else ""]
    lines += ["", f"{len(rows)} (law, seed) units, {secs:.0f} s of training and evaluation in total."]
    return "\n".join(lines) + "\n"


def plot_curves(rows: list[dict], path):
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8), sharey=True)
    for ax, structured in zip(axes, (True, False)):
        mine = [r for r in rows if r["structured"] == structured]
        for i, method in enumerate(("network", "network_adam", "ntk", "rf")):
            for j, r in enumerate(mine):
                if method not in r["methods"]:
                    continue
                c = np.array(r["methods"][method]["curve"])
                ax.plot(c[:, 0], 100 * c[:, 1], color=f"C{i}", alpha=0.8, label=NAMES[method] if j == 0 else None)
        ax.set(xlabel="step", title="with input structure" if structured else "without structure (D^(0) only)")
        ax.axhline(50, color="k", lw=0.6, ls=":")
    axes[0].set_ylabel("test accuracy (%)")
    for ax in axes:  # a run of one law leaves the other panel empty
        if ax.get_legend_handles_labels()[0]:
            ax.legend()
    return save_png(fig, path)


def plot_mds(rows: list[dict], path):
    """Fig. A.2: MDS of the first-layer weights at init, after step 1 and after step 2 (first structured seed)."""
    plt = pyplot()
    row = next((r for r in rows if r["structured"]), rows[0])
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.8))
    for ax, (key, title) in zip(
        axes, (("init", "initialisation"), ("step1", "after step 1"), ("step2", "after step 2"))
    ):
        pts = np.array(row["mds"][key])
        ax.scatter(pts[:-2, 0], pts[:-2, 1], s=6, alpha=0.5, label="w_i")
        ax.scatter(pts[-2:, 0], pts[-2:, 1], marker="*", s=200, c=["C3", "C2"], label="+/- sum_{j in A} M_j")
        ax.set_title(title)
        ax.set_xticks([])
        ax.set_yticks([])
    axes[0].legend(fontsize=7)
    return save_png(fig, path)


@command("probes", name="python -m feature_probes.parity")
def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "presets":
        print(json.dumps({k: asdict(v) for k, v in PRESETS.items()}, indent=2))
        return 0
    if args.command in ("step1", "ntk"):
        return _run_study(parser, args, argv)
    return table_command(
        parser,
        args,
        argv,
        prog="feature_probes.parity",
        stem="parity",
        make_config=make_config,
        run_table=run_table,
        markdown=markdown,
        figures=((plot_curves, "parity_figA1_curves.png"), (plot_mds, "parity_figA2_mds.png")),
    )
