"""Shared pieces of the ICL and feature probes: seeding, devices, JSON-ready configs, pyplot.

The files a probe writes (resumable JSONL rows, results JSON, markdown tables, PNG figures) go through
``icl_probes.io``. Nothing here runs at import time.
"""

from __future__ import annotations

import dataclasses
import json
import random

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


def as_stored(obj):
    """``obj`` as a JSON file gives it back: dataclasses become dicts and tuples lists, so a config
    compares equal to the copy read from a results or config file."""
    if dataclasses.is_dataclass(obj):
        obj = dataclasses.asdict(obj)
    return json.loads(json.dumps(obj))


def pyplot():
    """matplotlib.pyplot on the non-interactive Agg backend (imported only when a plot is drawn)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt
