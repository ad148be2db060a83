"""All KV: plain generation, the baseline every method is compared with."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ..continuation import Continuation, real_rows
from .registry import register
from .spec import FullMethod


class PassThrough:
    """A call that changes nothing; ``kept`` is every real prompt token."""

    selection = None

    def __init__(self, valid):
        self.valid = valid
        self.kept = [int(v) for v in valid.sum(1)]

    def continuation(self) -> Continuation:
        """Plain decoding: the next token sits after the real tokens; the cache holds the prompt as given."""
        return Continuation(positions=self.valid.sum(1), valid=real_rows(self.valid))

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
