"""NIAH grids: named presets (data) and parsing of --lengths / --depths.

needlehaystack 0.1.0 and the GemFilter repo both round their linspace grids to ints
(``np.round(np.linspace(...)).astype(int)``), so the presets do too.
"""

from __future__ import annotations

import numpy as np

from gemfilter.toolkit.options import normalize_depth, parse_depths, parse_lengths  # noqa: F401  (one parser for every command)


def _lin(lo: float, hi: float, n: int) -> tuple:
    return tuple(int(v) for v in np.round(np.linspace(lo, hi, n)))


#: name -> (context lengths in tokens, depth percents, what it is)
PRESETS = {
    "kamradt": (_lin(1000, 16000, 35), _lin(0, 100, 35), "Kamradt's default: 35 lengths 1K-16K x 35 depths"),
    "gemfilter-paper": (
        _lin(1000, 128000, 40),
        _lin(0, 100, 10),
        "GemFilter paper (Fig. 3): 40 lengths 1K-128K x depths 0,11,...,89,100",
    ),
    "cpu-demo": (
        (1000, 2000, 4000, 8000),
        (0, 25, 50, 75, 100),
        "CPU demo (make demo-full): lengths 1K,2K,4K,8K x 5 depths",
    ),
    "cpu-quick": (
        (1000, 2000, 4000),
        (0, 50, 100),
        "newcomer demo (make demo, minutes): lengths 1K,2K,4K x depths 0,50,100",
    ),
}

#: What a preset sets besides its grid, where it claims to be the paper's (explicit options win):
#: the GemFilter repo's context protocol, the per-query-head SnapKV the paper compared with, fp16 on GPU.
PRESET_SETTINGS = {
    "gemfilter-paper": {
        "protocol": "gemfilter-repo",
        "methods": ("full", "snapkv-per-head", "gemfilter"),
        "dtype": "float16",
    },
}
DEFAULT_SETTINGS = {"protocol": "kamradt", "methods": ("full", "gemfilter"), "dtype": None}


def preset_settings(preset: str) -> dict:
    """protocol, methods and dtype of ``preset`` (the defaults where it sets none)."""
    return {**DEFAULT_SETTINGS, **PRESET_SETTINGS.get(preset, {})}


def resolve_grid(preset: str, lengths: str | None = None, depths: str | None = None) -> tuple:
    """(lengths, depths): the preset's axes, each replaced by --lengths / --depths when given."""
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; allowed: {', '.join(PRESETS)}")
    pl, pd, _ = PRESETS[preset]
    return (parse_lengths(lengths) if lengths else pl), (parse_depths(depths) if depths else pd)
