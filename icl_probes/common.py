"""Shared plumbing for the ICL probes: seeding, devices, resumable JSONL, JSON and PNG output.

Every probe (looped transformer, label flip, modular arithmetic) writes its results the same way:
one JSONL row per finished unit of work (fsynced, so an interrupted run resumes), a results JSON,
a markdown table and PNG figures. The file plumbing is ``gemfilter.io``'s (atomic writes, locked
appends), so every command in the repo writes the same way. Nothing here runs at import time.
"""

from __future__ import annotations

import dataclasses
import json
import random
from pathlib import Path

import torch

from gemfilter import io


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
    """Append one row, fsynced, under the folder lock (``gemfilter.io.append_jsonl``): a crash loses
    at most the row being written, and a torn last line is isolated so only it is lost."""
    io.append_jsonl(path, row)


def read_jsonl(path, required=()) -> list:
    """All complete rows of a JSONL file ([] if it does not exist). A torn line, a line that is not a
    JSON object, or one lacking a field of ``required`` is skipped with a warning (its unit is redone)."""
    return io.read_jsonl(path, required=required)


def as_stored(obj):
    """``obj`` as a JSON file gives it back: dataclasses become dicts and tuples lists, so a config
    compares equal to the copy read from a results or config file."""
    if dataclasses.is_dataclass(obj):
        obj = dataclasses.asdict(obj)
    return json.loads(json.dumps(obj))


def write_json(path, obj) -> None:
    """``obj`` as indented JSON, written atomically (a crash leaves the old file, never half a new one)."""
    io.write_json_atomic(path, obj, indent=2)


def read_json(path, what: str = "results file") -> dict:
    """A JSON object written by :func:`write_json`; CorruptFileError names the file and says to delete it."""
    return io.read_json_object(path, what, fix=f"Delete {path} to recompute it (or fix it by hand)")


def pyplot():
    """matplotlib.pyplot on the non-interactive Agg backend (imported only when a plot is drawn)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_png(fig, path) -> Path:
    """Save ``fig`` as a PNG at ``path`` (parents created) atomically and close it (:func:`gemfilter.io.save_png`)."""
    return io.save_png(fig, path, dpi=120, bbox_inches="tight")
