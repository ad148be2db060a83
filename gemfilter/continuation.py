"""Where a prefilled cache goes on: what a method's call tells a decoder that is not ``generate``.

After ``apply()``'s prefill, every method leaves a KV cache of R rows per layer and a rule for the decode
steps: the position id of each new token, and which of the R rows are real (left padding is not). For all
the methods that decode with the model's own attention, that rule is "position p0 + i for the i-th new
token, rows as left by the prefill", so a static cache of R + t rows and a compiled step can continue it
(:mod:`gemfilter.compiled`). A call whose decode steps need its own attention (a per-query-head cache, position
masks for sliding windows) says why it cannot.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Continuation:
    """positions: (b,) position id of each row's first new token (the next ones follow one by one);
    valid: (b, R) bool over the cache's rows after the prefill, or None when every row is real."""

    positions: torch.Tensor
    valid: torch.Tensor | None


class NotContinuable(ValueError):
    """This call's decode steps need its own attention, so only ``generate`` (eager) can continue its cache."""


def real_rows(valid: torch.Tensor) -> torch.Tensor | None:
    """``valid`` (b, R) as a bool mask, or None when every row is real (the decoder then builds no mask)."""
    valid = valid.bool()
    return None if bool(valid.all()) else valid
