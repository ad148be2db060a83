"""NIAH grids: named presets (data) and parsing of --lengths / --depths.

needlehaystack 0.1.0 and the GemFilter repo both round their linspace grids to ints
(``np.round(np.linspace(...)).astype(int)``), so the presets do too.
"""

from __future__ import annotations

import numpy as np


def _lin(lo: float, hi: float, n: int) -> tuple:
    return tuple(int(v) for v in np.round(np.linspace(lo, hi, n)))


#: name -> (context lengths in tokens, depth percents, what it is)
PRESETS = {
    "kamradt": (_lin(1000, 16000, 35), _lin(0, 100, 35), "Kamradt's default: 35 lengths 1K-16K x 35 depths"),
    "gemfilter-paper": (_lin(1000, 128000, 40), _lin(0, 100, 10),
                        "GemFilter paper (Fig. 3): 40 lengths 1K-128K x depths 0,11,...,89,100"),
    "cpu-demo": ((1000, 2000, 4000, 8000), (0, 25, 50, 75, 100), "CPU demo (make demo-full): lengths 1K,2K,4K,8K x 5 depths"),
    "cpu-quick": ((1000, 2000, 4000), (0, 50, 100), "newcomer demo (make demo, minutes): lengths 1K,2K,4K x depths 0,50,100"),
}

#: What a preset sets besides its grid, where it claims to be the paper's (explicit options win):
#: the GemFilter repo's context protocol, the per-query-head SnapKV the paper compared with, fp16 on GPU.
PRESET_SETTINGS = {
    "gemfilter-paper": {"protocol": "gemfilter-repo", "methods": ("full", "snapkv-per-head", "gemfilter"),
                        "dtype": "float16"},
}
DEFAULT_SETTINGS = {"protocol": "kamradt", "methods": ("full", "gemfilter"), "dtype": None}


def preset_settings(preset: str) -> dict:
    """protocol, methods and dtype of ``preset`` (the defaults where it sets none)."""
    return {**DEFAULT_SETTINGS, **PRESET_SETTINGS.get(preset, {})}


def parse_lengths(text: str) -> tuple:
    """'1000,2000,4k' -> (1000, 2000, 4000): positive ints, a k/K suffix means thousands, sorted, unique."""
    out = []
    for item in _items(text, "--lengths"):
        scale = 1000 if item[-1] in "kK" else 1
        num = item[:-1] if scale == 1000 else item
        try:
            value = float(num) * scale
        except ValueError:
            raise ValueError(f"--lengths: {item!r} is not a number; give token counts like 1000,2000,4k") from None
        if value != int(value) or value < 1:
            raise ValueError(f"--lengths: {item!r} must be a positive whole number of tokens")
        out.append(int(value))
    return tuple(sorted(set(out)))


def parse_depths(text: str) -> tuple:
    """'0,50,100' -> (0, 50, 100): percents in [0, 100] (ints where whole), sorted, unique."""
    out = []
    for item in _items(text, "--depths"):
        try:
            value = float(item)
        except ValueError:
            raise ValueError(f"--depths: {item!r} is not a number; give percents like 0,25,50,75,100") from None
        if not 0 <= value <= 100:
            raise ValueError(f"--depths: {item!r} is outside [0, 100] (depth is a percent of the context)")
        out.append(normalize_depth(value))
    return tuple(sorted(set(out)))


def normalize_depth(value):
    """Whole floats become ints, so 50 and 50.0 name the same cell in files and keys."""
    return int(value) if float(value) == int(value) else float(value)


def _items(text: str, flag: str) -> list:
    items = [s.strip() for s in str(text).split(",") if s.strip()]
    if not items:
        raise ValueError(f"{flag} is empty; give a comma-separated list")
    return items


def resolve_grid(preset: str, lengths: str | None = None, depths: str | None = None) -> tuple:
    """(lengths, depths): the preset's axes, each replaced by --lengths / --depths when given."""
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; allowed: {', '.join(PRESETS)}")
    pl, pd, _ = PRESETS[preset]
    return (parse_lengths(lengths) if lengths else pl), (parse_depths(depths) if depths else pd)
