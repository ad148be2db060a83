"""Command-line options, parsed and checked one way for every command (gemfilter, eval, icl_probes).

- context lengths have one parser (:func:`parse_lengths`): ``1000``, ``2k``, ``1.5K``; never ``300.9``,
  ``inf`` or more than :data:`MAX_TOKENS`; depths, positive integer lists and names likewise;
- :func:`check_against_model` checks ``--layer`` and lengths against a model's config before any weights
  load; :func:`cli_exit` turns a user error into ``error: ...`` and exit status 2.

Nothing here imports torch or transformers at import time.
"""

from __future__ import annotations

import math
import sys
from .compat import text_config

#: No model we know of reads more tokens than this; a larger --lengths value is a typo (1e9 would spin).
MAX_TOKENS = 10_000_000


def parse_length(item, flag: str = "--lengths") -> int:
    """One context length in tokens: a whole number, ``k``/``K`` = thousands (``2k``, ``1.5k``)."""
    text = str(item).strip()
    scale = 1000 if text[-1:] in ("k", "K") else 1
    num = text[:-1] if scale == 1000 else text
    try:
        value = float(num) * scale
    except ValueError:
        raise ValueError(f"{flag}: {text!r} is not a number; give token counts like 1000,2k,1.5k") from None
    if not math.isfinite(value):
        raise ValueError(f"{flag}: {text!r} is not a finite number; give token counts like 1000,2k,1.5k")
    if value != int(value) or value < 1:
        raise ValueError(f"{flag}: {text!r} must be a positive whole number of tokens (1000, 2k, 1.5k)")
    if value > MAX_TOKENS:
        raise ValueError(f"{flag}: {text!r} is {int(value):,} tokens, more than any model's context window "
                         f"(at most {MAX_TOKENS:,} allowed)")
    return int(value)


def split_names(text) -> tuple:
    """'full, gemfilter,' -> ('full', 'gemfilter'): a comma-separated option's items (may be empty)."""
    return tuple(s.strip() for s in str(text).split(",") if s.strip())


def cli_exit(call) -> int:
    """``call()``'s exit status; a ValueError or OSError (bad input, missing file) is printed as one
    ``error: ...`` line on stderr and gives 2, so commands fail with a message instead of a traceback."""
    try:
        return call()
    except (ValueError, OSError) as err:  # FileNotFoundError is an OSError
        print(f"error: {err}", file=sys.stderr)
        return 2


def _items(text, flag: str) -> list:
    items = list(split_names(text))
    if not items:
        raise ValueError(f"{flag} is empty; give a comma-separated list")
    return items


def parse_lengths(text, flag: str = "--lengths") -> tuple:
    """'1000,2k,4K' -> (1000, 2000, 4000): :func:`parse_length` for each, sorted, unique."""
    return tuple(sorted({parse_length(item, flag) for item in _items(text, flag)}))


def normalize_depth(value):
    """Whole floats become ints, so 50 and 50.0 name the same cell in files and keys."""
    return int(value) if float(value) == int(value) else float(value)


def parse_depths(text, flag: str = "--depths") -> tuple:
    """'0,50,100' -> (0, 50, 100): percents in [0, 100] (ints where whole), sorted, unique."""
    out = []
    for item in _items(text, flag):
        try:
            value = float(item)
        except ValueError:
            raise ValueError(f"{flag}: {item!r} is not a number; give percents like 0,25,50,75,100") from None
        if not 0 <= value <= 100:
            raise ValueError(f"{flag}: {item!r} is outside [0, 100] (depth is a percent of the context)")
        out.append(normalize_depth(value))
    return tuple(sorted(set(out)))


def parse_positive_ints(text, flag: str) -> tuple:
    """'256,512' -> (256, 512): whole numbers >= 1, sorted, unique."""
    out = []
    for item in _items(text, flag):
        try:
            value = float(item)
        except ValueError:
            raise ValueError(f"{flag}: {item!r} is not a number; give whole numbers >= 1 like 256,512") from None
        if not math.isfinite(value) or value != int(value) or value < 1:
            raise ValueError(f"{flag}: {item!r} must be a whole number >= 1")
        out.append(int(value))
    return tuple(sorted(set(out)))


def check_int(value, flag: str, low: int) -> None:
    """ValueError unless ``value`` is an int >= ``low``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{flag} must be a whole number >= {low}, got {value!r}")




def check_against_model(config, *, layer=None, lengths=(), length_flag: str = "--lengths") -> None:
    """Check options against a model's config (no weights needed): 0 <= layer < layers, lengths <= window.

    config: a transformers config (``gemfilter.models.load_config``) or a model's ``.config``.
    """
    text = text_config(config)
    m = getattr(text, "num_hidden_layers", None)
    if layer is not None and isinstance(m, int) and not 0 <= layer < m:
        raise ValueError(f"--layer {layer} is outside [0, {m}): this model has {m} decoder layers (0-based)")
    window = getattr(text, "max_position_embeddings", None)
    too_long = [n for n in lengths if isinstance(window, int) and n > window]
    if too_long:
        raise ValueError(f"{length_flag}: {', '.join(map(str, too_long))} tokens exceed this model's context window "
                         f"of {window} tokens (max_position_embeddings); allowed: up to {window}")
