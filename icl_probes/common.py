"""Shared plumbing for the ICL probes: seeding, devices, resumable JSONL, JSON and PNG output.

Every probe (looped transformer, label flip, modular arithmetic) writes its results the same way:
one JSONL row per finished unit of work (fsynced, so an interrupted run resumes), a results JSON,
a markdown table and PNG figures. Nothing here runs at import time.
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
from pathlib import Path

import torch


def seed_everything(seed: int) -> torch.Generator:
    """Seed python, torch (CPU and CUDA) and return a CPU ``torch.Generator`` seeded with ``seed``.

    Pass the returned generator to samplers explicitly; the global seeds only cover library code
    that takes no generator (parameter initialisation).
    """
    random.seed(seed)
    torch.manual_seed(seed)
    return torch.Generator().manual_seed(seed)


def resolve_device(name: str = "auto") -> torch.device:
    """``auto`` gives cuda when available, else cpu; ``cpu``/``cuda``/``cuda:N`` are checked."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"--device {name} asked for CUDA, but torch sees no GPU here; allowed: auto, cpu")
    try:
        return torch.device(name)
    except RuntimeError as err:
        raise ValueError(f"unknown device {name!r}; allowed: auto, cpu, cuda, cuda:N") from err


def append_jsonl(path, row: dict) -> None:
    """Append one row and fsync it, so a crash loses at most the row being written.

    A crash mid-write leaves a torn last line without its newline; the new row then starts on a
    line of its own, so only the torn line is lost (``read_jsonl`` skips it).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    torn = False
    if path.exists() and path.stat().st_size:
        with open(path, "rb") as f:
            f.seek(-1, os.SEEK_END)
            torn = f.read(1) != b"\n"
    with open(path, "a", encoding="utf-8") as f:
        f.write(("\n" if torn else "") + json.dumps(row) + "\n")
        f.flush()
        os.fsync(f.fileno())


def read_jsonl(path) -> list:
    """All complete rows of a JSONL file ([] if it does not exist); a torn last line is skipped."""
    path = Path(path)
    if not path.exists():
        return []
    rows = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue  # an interrupted write leaves at most one partial line
    return rows


def as_stored(obj):
    """``obj`` as a JSON file gives it back: dataclasses become dicts and tuples lists, so a config
    compares equal to the copy read from a results or config file."""
    if dataclasses.is_dataclass(obj):
        obj = dataclasses.asdict(obj)
    return json.loads(json.dumps(obj))


def write_json(path, obj) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj, indent=2) + "\n", encoding="utf-8")


def pyplot():
    """matplotlib.pyplot on the non-interactive Agg backend (imported only when a plot is drawn)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_png(fig, path) -> Path:
    """Save ``fig`` as a PNG at ``path`` (parents created) and close it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120, bbox_inches="tight")
    pyplot().close(fig)
    return path
