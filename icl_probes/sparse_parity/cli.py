"""``python -m icl_probes.sparse_parity``: Sec. 5.5 of Z. Shi's 2024 dissertation (Thms 5.5.1 and 5.5.2).

Subcommands: ``run`` (every part, or those of --parts; resumable), ``report`` (the tables and figures again from a
run folder's rows), ``presets``. Pure torch; figures through ``icl_probes.io``.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from dataclasses import asdict, replace
from pathlib import Path

from gemfilter.toolkit.entry import command
from icl_probes.io import check_out_dir, read_jsonl, write_json, write_text

EPILOG = """parts (--parts, default all):
  closed  Thm 5.5.1's g1* (m = 2(v1+1)) and g2* (m = 2(v2+1)) in closed form: the subset check, the exact
          N -> infinity hinge loss on S1 and S2 tasks, and Thm 5.5.2's signal term on every S1 task
  loss    hinge loss and accuracy of g1*, g2* on prompts of N examples (x = G phi, G random orthonormal)
  ratio   E||P_D1(Xi)||^2 / E||P_D2(Xi)||^2 by Monte Carlo against (v1+1)/(v2+1), and on real prompts' noise
  flips   accuracy of g1* and g2* on S1 prompts as in-context labels are flipped (0-50%) or get Gaussian noise
  train   the m-head model trained from small initialisation at small lambda (Adam, N -> infinity loss),
          compared with the closed form up to sign and permutation

examples:
  python -m icl_probes.sparse_parity run --preset cpu --out results/sparse_parity --fig-dir icl_probes/figures
  python -m icl_probes.sparse_parity run --preset cpu --parts closed,ratio --out results/sp_quick   # seconds
  python -m icl_probes.sparse_parity run --preset cpu --train-seeds 0,1,2 --parts train --out results/sp_seeds
  python -m icl_probes.sparse_parity report results/sparse_parity

outputs (in --out): rows.jsonl (one row per finished unit; rerun the same command to resume), result.json,
  summary.md; in --fig-dir (default --out): sparse_parity_theory.png, sparse_parity_train.png"""


def _ints(text: str) -> tuple:
    try:
        vals = tuple(int(s) for s in text.split(",") if s.strip())
    except ValueError:
        vals = ()
    if not vals or min(vals) < 0:
        raise argparse.ArgumentTypeError(
            f"expected non-negative integers separated by commas, e.g. 0,1,2; got {text!r}"
        )
    return vals


def _parts(text: str) -> tuple:
    from icl_probes.sparse_parity.experiments import PARTS

    vals = tuple(s.strip() for s in text.split(",") if s.strip())
    bad = [v for v in vals if v not in PARTS]
    if not vals or bad:
        raise argparse.ArgumentTypeError(f"expected a comma-separated subset of {','.join(PARTS)}; got {text!r}")
    return vals


def build_parser() -> argparse.ArgumentParser:
    from icl_probes.sparse_parity.experiments import PARTS, PRESETS

    fmt = argparse.RawDescriptionHelpFormatter
    p = argparse.ArgumentParser(
        prog="python -m icl_probes.sparse_parity",
        formatter_class=fmt,
        epilog="run '<subcommand> --help' for its options",
        description="Sparse-parity in-context learning with two-layer multi-head linear attention (Z. Shi 2024, "
        "Sec. 5.5): Thm 5.5.1's closed-form heads for a small (m = 2(v1+1)) and a large (m = 2(v2+1)) "
        "model, Thm 5.5.2's noise ratio (v1+1)/(v2+1), accuracy under flipped labels, and training.",
    )
    sub = p.add_subparsers(dest="command", required=True, metavar="{run,report,presets}")
    r = sub.add_parser(
        "run",
        formatter_class=fmt,
        epilog=EPILOG,
        help="run the parts of a preset (resumable)",
        description="Run every unit of the chosen parts; one JSONL row per finished unit, so a rerun of "
        "the same command into the same --out resumes. Then write the tables and figures.",
    )
    r.add_argument(
        "--preset",
        default="cpu",
        choices=sorted(PRESETS),
        help="settings (default cpu, ~10 min on one "
        "thread; tiny is a smoke test); the 'presets' subcommand prints them",
    )
    r.add_argument("--out", required=True, type=Path, help="folder for rows.jsonl, result.json and summary.md")
    r.add_argument("--fig-dir", type=Path, help="folder for the PNG figures (default: --out)")
    r.add_argument(
        "--parts", type=_parts, default=PARTS, help=f"comma-separated subset of {','.join(PARTS)} (default all)"
    )
    r.add_argument("--seed", type=int, help="seed of G and every draw (default: the preset's, 0)")
    r.add_argument("--prompts", type=int, help="prompts per cell of the loss and flips parts (cpu: 2000)")
    r.add_argument("--train-seeds", type=_ints, help="seeds of the training units, e.g. 0,1,2 (default 0)")
    r.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1)")
    r.add_argument("--force", action="store_true", help="recompute the chosen units (their old rows are dropped first)")
    r.add_argument("--quiet", action="store_true", help="no progress bar")
    rp = sub.add_parser(
        "report",
        formatter_class=fmt,
        help="write summary.md, result.json and the figures again",
        description="Build summary.md, result.json and the figures again from a run folder's rows.jsonl.",
    )
    rp.add_argument("dir", type=Path, help="a folder written by 'run' (its --out)")
    rp.add_argument("--fig-dir", type=Path, help="folder for the PNG figures (default: the folder)")
    sub.add_parser("presets", help="print every preset's settings as JSON")
    p.subcommands = {"run": r, "report": rp}
    return p


def _config(args):
    from icl_probes.sparse_parity.experiments import PRESETS

    cfg = PRESETS[args.preset]
    over = {}
    if args.seed is not None:
        over["seed"] = args.seed
    if args.prompts is not None:
        over["prompts"] = args.prompts
    if args.train_seeds is not None:
        over["train_seeds"] = args.train_seeds
    cfg = replace(cfg, **over)
    cfg.check()
    return cfg


def write_outputs(rows: list, out: Path, figs: Path, command_line: str, config: dict) -> str:
    """result.json, summary.md (the command, then the tables) and the two figures; returns the markdown."""
    from icl_probes.sparse_parity.report import markdown, plot_theory, plot_train

    slim = [{k: v for k, v in r.items() if k != "settings"} for r in rows]
    write_json(out / "result.json", dict(command=command_line, config=config, rows=slim))
    md = f"`{command_line}`\n\n" + markdown(rows)
    write_text(out / "summary.md", md)
    plot_theory(rows, figs / "sparse_parity_theory.png")
    if any(r["part"] == "train" for r in rows):
        plot_train(rows, figs / "sparse_parity_train.png")
    return md


@command("probes", name="python -m icl_probes.sparse_parity")
def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "presets":
        from icl_probes.sparse_parity.experiments import PRESETS

        print(json.dumps({k: asdict(v) for k, v in PRESETS.items()}, indent=2))
        return 0
    sp = parser.subcommands[args.command]
    try:
        if args.command == "report":
            path = args.dir / "rows.jsonl"
            if not path.is_file():
                raise ValueError(f"{path} does not exist: give a folder written by 'run' (its --out)")
            figs = check_out_dir(args.fig_dir, "--fig-dir") if args.fig_dir else args.dir
            rows = read_jsonl(path, ("part",))
            if not rows:
                raise ValueError(f"{path} holds no rows; run 'run' into {args.dir} first")
            result = json.loads((args.dir / "result.json").read_text()) if (args.dir / "result.json").is_file() else {}
            md = write_outputs(
                rows, args.dir, figs, result.get("command", "(unknown command)"), result.get("config", {})
            )
            print(md)
            return 0
        if args.threads < 1:
            raise ValueError(f"--threads {args.threads}: must be >= 1")
        cfg = _config(args)
        out = check_out_dir(args.out)
        figs = check_out_dir(args.fig_dir, "--fig-dir") if args.fig_dir else out
    except ValueError as err:
        sp.error(str(err))
    import torch

    from icl_probes.common import as_stored
    from icl_probes.sparse_parity.experiments import run_all

    torch.set_num_threads(args.threads)
    command_line = "python -m icl_probes.sparse_parity " + shlex.join(sys.argv[1:] if argv is None else argv)
    rows = run_all(cfg, out / "rows.jsonl", parts=args.parts, force=args.force, progress=not args.quiet)
    md = write_outputs(rows, out, figs, command_line, as_stored(cfg))
    print(md)
    print(f"rows: {out / 'rows.jsonl'}\nsummary: {out / 'summary.md'}\nfigures: {figs}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
