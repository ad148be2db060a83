"""Methods: small frozen dataclasses registered by name (``gemfilter methods`` lists them).

Every method answers ``begin(model, input_ids, attention_mask, tokenizer) -> call``, where the call
object holds the per-call state and rewrites ``generate``'s forward inputs (see ``gemfilter.apply``).
Methods that choose tokens at a filter layer implement ``score(query, key, valid)`` and ``pick``.
"""

from __future__ import annotations

from . import asl, cache, fastkv, full, prompt, variants  # noqa: E402,F401  (registers the built-in methods)
from .asl import GemFilterASL  # noqa: E402
from .cache import H2O, H2OPerHead, OneRun, SnapKV, SnapKVPerHead  # noqa: E402
from .fastkv import FastKV  # noqa: E402
from .full import Full  # noqa: E402
from .prompt import GemFilter, GemFilterOrigPos, GemFilterSpan, LargestRow, MiddleRow  # noqa: E402
from .registry import REGISTRY, check_for_model, describe, get_method, register  # noqa: F401
from .spec import (  # noqa: E402
    CacheMethod,
    FullMethod,
    Method,
    PromptMethod,
    Spec,
    parse_method,
    parse_spec,
    parse_specs,
    spec_of,
    split_specs,
)
from .variants import GemFilterCLAA, GemFilterQWin, GemFilterSpanCLAA, GemFilterSpanQMax, GemFilterSpanQWin  # noqa: E402

__all__ = [
    "REGISTRY",
    "register",
    "get_method",
    "check_for_model",
    "describe",
    "Full",
    "GemFilter",
    "GemFilterSpan",
    "GemFilterOrigPos",
    "GemFilterQWin",
    "GemFilterCLAA",
    "GemFilterSpanQWin",
    "GemFilterSpanCLAA",
    "GemFilterSpanQMax",
    "GemFilterASL",
    "MiddleRow",
    "LargestRow",
    "SnapKV",
    "SnapKVPerHead",
    "H2O",
    "H2OPerHead",
    "OneRun",
    "FastKV",
    "Method",
    "PromptMethod",
    "CacheMethod",
    "FullMethod",
    "parse_method",
    "spec_of",
    "Spec",
    "parse_spec",
    "parse_specs",
    "split_specs",
]
