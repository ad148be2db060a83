"""All KV: plain generation, the baseline every method is compared with."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from .registry import register
from .spec import FullMethod


class PassThrough:
    """A call that changes nothing; ``kept`` is every real prompt token."""

    selection = None

    def __init__(self, valid):
        self.kept = [int(v) for v in valid.sum(1)]

    def prefill(self, kwargs, cache):
        return kwargs

    def after_prefill(self, cache):
        pass

    def decode(self, kwargs, cache, past):
        return kwargs


@register
@dataclass(frozen=True)
class Full(FullMethod):
    """All KV: the whole prompt, the whole cache."""

    name: ClassVar[str] = "full"
    description: ClassVar[str] = "All KV: plain generation on the whole prompt (baseline)"

    def begin(self, model, input_ids, valid, tokenizer=None):
        return PassThrough(valid)
