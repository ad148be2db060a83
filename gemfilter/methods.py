"""Methods: small frozen dataclasses registered by name (``gemfilter methods`` lists them).

Each method has one scoring method. GemFilter's ``score(query, key)`` maps the filter layer's
post-RoPE query (b, h, n, d) and key (b, h_kv, n, d) to one raw score per input token (b, n).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from .selection import last_row_scores

REGISTRY: dict = {}


def register(cls):
    """Class decorator: add a method class to :data:`REGISTRY` under ``cls.name``."""
    if cls.name in REGISTRY:
        raise ValueError(f"method name {cls.name!r} is registered twice")
    REGISTRY[cls.name] = cls
    return cls


def get_method(name: str, **params):
    """Build a registered method by name; unknown names list the allowed ones."""
    if name not in REGISTRY:
        raise ValueError(f"unknown method {name!r}; allowed: {', '.join(sorted(REGISTRY))}")
    return REGISTRY[name](**params)


@register
@dataclass(frozen=True)
class GemFilter:
    """Paper-faithful GemFilter: raw last-row q.k summed over heads, avg-pool, top-k (Algorithm 2).

    layer: 0-based filter layer (None: the model's default); topk: tokens kept; kernel: pool width.
    """

    layer: int | None = None
    topk: int = 1024
    kernel: int = 5
    name: ClassVar[str] = "gemfilter"
    description: ClassVar[str] = "paper-faithful: raw last-row q.k at the filter layer, avg-pool 5, top-k, regenerate"

    def score(self, query, key):
        return last_row_scores(query, key)
