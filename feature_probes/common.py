"""Pieces shared by the feature probes.

Seeding comes from ``icl_probes.common``; every file (JSONL, JSON, PNG) is written through ``icl_probes.io``.

- ``smoothed_relu``: the polynomially smoothed ReLU of both the Midpoint Mixup paper (Def. 4.2, ReLU~ with
  power alpha and threshold rho) and the MRP paper (Sec. 3.2, ReLU-bar with power q and threshold varrho).
"""

from __future__ import annotations

import torch


def smoothed_relu(z: torch.Tensor, power: float, threshold: float) -> torch.Tensor:
    """0 for z <= 0; z^power / (power * threshold^(power-1)) on [0, threshold]; z - (1 - 1/power) threshold above.

    Continuous with a continuous derivative (1 at the threshold). z: any shape."""
    zc = z.clamp(0.0, threshold)
    poly = zc.pow(power) / (power * threshold ** (power - 1))
    return torch.where(z >= threshold, z - (1 - 1 / power) * threshold, poly)


def run_resumable(
    cfg, jsonl_path, sweep: tuple, units, key_of, compute, *, force: bool = False, desc: str | None = None
) -> list[dict]:
    """compute(*unit) for every unit, resumable: the settings are cfg without its ``sweep`` fields; a row in
    jsonl_path with the same settings and ``key_of(row) == unit`` is reused, each new row is appended (so an
    interrupted sweep resumes). Returns the rows in the order of ``units``.

    force: recompute these units; first their old rows (same settings, one of ``units``) are removed from
    jsonl_path (the file is replaced atomically), and every other row (other settings, other units) stays.
    desc: show a progress bar over the units with this label."""
    from gemfilter.toolkit import loop
    from icl_probes.common import as_stored
    from icl_probes.io import append_jsonl, read_jsonl, remove_jsonl_rows

    units = list(units)
    settings = {key: val for key, val in as_stored(cfg).items() if key not in sweep}
    done = {}
    if force:  # none of our units' rows is left to reuse
        if jsonl_path and jsonl_path.exists():
            ours = set(units)
            remove_jsonl_rows(jsonl_path, lambda r: r.get("settings") == settings and key_of(r) in ours)
    elif jsonl_path:
        done = {key_of(r): r for r in read_jsonl(jsonl_path) if r.get("settings") == settings}
    return loop.every_row(
        units,
        done,
        lambda unit: dict(compute(*unit), settings=settings),
        (lambda row: append_jsonl(jsonl_path, row)) if jsonl_path else None,
        desc=desc or "",
        noun="unit",
        progress=desc is not None,
    )


def start_run(parser, args, argv, prog: str, make_config, jsonl_name: str):
    """What every feature-probe run subcommand does before computing: check --threads, the config, --out and
    --fig-dir (created if missing; errors go to the subcommand's parser), record the command line and set
    torch's threads. Returns (cfg, command, out, fig_dir, jsonl path); --force is the run function's (it drops
    only the rows it recomputes)."""
    import shlex
    import sys

    import torch

    from icl_probes.io import check_out_dir

    sp = parser.subcommands[args.command]
    if args.threads < 1:
        sp.error(f"--threads {args.threads}: must be >= 1")
    command = f"python -m {prog} " + shlex.join(sys.argv[1:] if argv is None else argv)
    try:
        cfg = make_config(args)
        out = check_out_dir(args.out)
        fig_dir = check_out_dir(args.fig_dir, "--fig-dir") if args.fig_dir else out
    except ValueError as err:
        sp.error(str(err))
    torch.set_num_threads(args.threads)
    return cfg, command, out, fig_dir, out / jsonl_name


def add_run_args(sp, presets: dict) -> None:
    """The options every feature-probe subcommand shares (preset, output folder, figure folder, threads,
    seeds, progress, forced rerun)."""
    from pathlib import Path

    sp.add_argument(
        "--preset",
        default="cpu",
        choices=sorted(presets),
        help="settings table entry (default cpu; the 'presets' subcommand prints them all)",
    )
    sp.add_argument(
        "--out", required=True, type=Path, help="folder for the JSONL rows, results JSON and markdown table"
    )
    sp.add_argument("--fig-dir", type=Path, help="folder for the PNG figures (default: --out)")
    sp.add_argument("--seeds", type=seed_list, help="override the preset's seeds, e.g. 0,1,2")
    sp.add_argument("--threads", type=int, default=2, help="torch CPU threads (default 2)")
    sp.add_argument(
        "--force",
        action="store_true",
        help="recompute this run's units: their old rows (same settings) are removed from the "
        "JSONL first; rows of other settings stay",
    )
    sp.add_argument("--quiet", action="store_true", help="no progress bars")


def seed_list(text: str) -> tuple[int, ...]:
    import argparse

    try:
        seeds = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        seeds = ()
    if not seeds or any(s < 0 for s in seeds):
        raise argparse.ArgumentTypeError(f"{text!r}: expected non-negative integers separated by commas, e.g. 0,1,2")
    return seeds


def mean_std(values) -> tuple[float, float]:
    """Mean and sample standard deviation (0 for a single value)."""
    import statistics

    values = list(values)
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


def read_table_result(folder, stem: str) -> dict:
    """A run folder's ``<stem>_result.json`` ({config, command, runs}); a clear error if it is missing or not one."""
    import json
    from pathlib import Path

    path = Path(folder) / f"{stem}_result.json"
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist: give a folder written by 'table' (its --out)")
    try:
        result = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise ValueError(f"{path} is not valid JSON ({err.msg}, line {err.lineno}); run 'table' again") from None
    if not isinstance(result, dict) or not {"config", "command", "runs"} <= set(result):
        raise ValueError(f"{path} is not a {stem} result (it needs config, command and runs)")
    return result


def fmt_seeds(values, scale=100.0, digits=1) -> str:
    """``mean ± std`` over seeds of the non-None ``values`` (times ``scale``); "NA" when none."""
    values = [v for v in values if v is not None]
    if not values:
        return "NA"
    m, s = mean_std(v * scale for v in values)
    return f"{m:.{digits}f}" + (f" ± {s:.{digits}f}" if len(values) > 1 else "")


def table_command(parser, args, argv, *, prog: str, stem: str, make_config, run_table, markdown, figures) -> int:
    """The ``report`` and ``table`` subcommands of a table probe (parity, interval labelling): ``report`` rewrites
    ``<stem>_summary.md`` from a folder's ``<stem>_result.json``; ``table`` runs (resuming ``<stem>_runs.jsonl``),
    then writes the result JSON, the summary and the figures. figures: ((plot(rows, path), file name), ...)."""
    from dataclasses import asdict

    from icl_probes.io import write_json, write_text

    if args.command == "report":
        try:
            result = read_table_result(args.dir, stem)
        except (OSError, ValueError) as err:
            parser.subcommands["report"].error(str(err))  # exit 2, with the subcommand's usage
        md = markdown(result["runs"], result["config"], result["command"])
        write_text(args.dir / f"{stem}_summary.md", md)
        print(md)
        return 0
    cfg, command, out, figs, jsonl = start_run(parser, args, argv, prog, make_config, f"{stem}_runs.jsonl")
    rows = run_table(cfg, jsonl, progress=not args.quiet, force=args.force)
    slim = [{key: val for key, val in r.items() if key != "mds"} for r in rows]
    write_json(out / f"{stem}_result.json", dict(config=asdict(cfg), command=command, runs=slim))
    md = markdown(rows, asdict(cfg), command)
    pngs = [plot(rows, figs / name) for plot, name in figures]
    write_text(out / f"{stem}_summary.md", md)
    print(md)
    print("wrote:", out / f"{stem}_summary.md", *pngs)
    return 0
