"""The typed bases of every method, and what each declares it can do.

A method is a frozen dataclass on one of three bases (:class:`PromptMethod`, :class:`CacheMethod`,
:class:`FullMethod`); its abilities are class attributes and methods with defaults here, overridden where a
method differs, so callers ask the type, never ``hasattr``. Imports nothing of the package, so the registry and
the spec parser can both import it.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

#: count parameters of the methods, with their least allowed value. ``layer`` may be None (the model's default);
#: its range depends on the model, so it is checked against the model's layers when the method meets it.
COUNTS = {
    "topk": 1,
    "layer": 0,
    "kernel": 1,
    "window": 1,
    "tsp_len": 1,
    "sink": 0,
    "tail": 0,
    "max_span": 1,
    "block": 1,
    "layers": 1,
    "chunk": 1,
}
OPTIONAL = {"layer", "chunk"}


class Method:
    """Base of every registered method: ``name``, ``description`` and ``kind`` (a display word) say what it is.

    What a method can do is declared here, with the default every method has, and overridden where a method
    differs (as transformers' ``_supports_*`` class flags): callers read these, never ``hasattr``.
    ``layer``, ``topk`` and ``kernel`` are dataclass fields on the methods that have them; here they are the
    values of a method without them (the row fields a runner records).
    """

    name: ClassVar[str]
    description: ClassVar[str]
    kind: ClassVar[str]
    #: runs in front of a serving engine (the engine sees only the prompt tokens it is sent)
    serves_engine: ClassVar[bool] = False
    #: the conversation protocols it runs under (``gemfilter.Conversation``); the benchmarks label a method
    #: with its protocol where it has more than one
    protocols: ClassVar[tuple] = ("reuse",)
    #: log p(continuation | context) in one plain forward over the kept context (``gemfilter.score``)
    one_pass_scoring: ClassVar[bool] = False
    #: scores with the prompt's last query row alone, so a shared prefix's cache can be reused to select
    scores_last_row: ClassVar[bool] = False
    #: scores with its own pass over several layers (``score_pass``) instead of one filter layer's q.k
    own_score_pass: ClassVar[bool] = False
    #: its selection (``select``) and its generation set-up (``start``) run apart, so the selection may be made
    #: on another model (a draft) or ahead of the call (a conversation's ``reselect``)
    separable: ClassVar[bool] = False
    #: its selection can run only a conversation's new tokens on a cache of the earlier ones, equal to a pass
    #: over the whole history (``reselect`` and ``stable`` need it)
    selects_from_cache: ClassVar[bool] = False
    #: the query rows its scores read (the last ones)
    query_rows: ClassVar[int] = 1
    #: its scores read every key at sliding-window layers too
    scores_sliding_layers: ClassVar[bool] = False
    #: the filter (or propagation) layer; None: the model's default, filled in by ``gemfilter.apply``
    layer = None
    #: tokens kept; None: no budget (``full``)
    topk = None
    #: pooling kernel of the selection (the paper's 5)
    kernel = 5

    def default_layer(self, model) -> int:
        """The layer used where ``layer`` is None: GemFilter's filter layer for the model
        (:func:`gemfilter.layers.default_layer`); a method with its own rule overrides this (FastKV)."""
        from ..layers import default_layer

        return default_layer(model)

    def longest_budget(self) -> int | None:
        """The longest token budget on this method's path (a warm-up of that length runs all of it)."""
        return self.topk

    def check_model(self, config, prompt_tokens: int) -> None:
        """Refuse, from a model's config alone, prompts of ``prompt_tokens`` this method cannot run on (raise
        ValueError); the default runs on any model that takes its layer."""
        return None

    def prompt_cost(self, n: int, m: int) -> tuple | None:
        """(published, this code's) prompt-phase cost relative to full's for n prompt tokens and m layers;
        None where no cost model is stated."""
        return None

    def scoring_bytes(self, config, n: int) -> int:
        """Working memory of this method's scoring beyond the model's own forward, at n prompt tokens."""
        return 0

    def __post_init__(self):
        """Every count parameter is checked here, once, however the method was built."""
        values = vars(self)  # the fields' values (frozen dataclasses without slots)
        for f in dataclasses.fields(self):
            value = values[f.name]
            if f.name in COUNTS and not (value is None and f.name in OPTIONAL):
                low = COUNTS[f.name]
                if isinstance(value, bool) or not isinstance(value, int):
                    raise TypeError(
                        f"{self.name}: {f.name} must be an int"
                        + (" (or None: the model's default)" if f.name in OPTIONAL else "")
                        + f", got {value!r}"
                    )
                if low is not None and value < low:
                    raise ValueError(f"{self.name}: {f.name}={value} must be >= {low}")

    def begin(self, model, input_ids, valid, tokenizer=None):  # pragma: no cover - every method overrides it
        """Per-call state for one generate call (see :func:`gemfilter.apply`)."""
        raise NotImplementedError


class PromptMethod(Method):
    """Picks prompt tokens at a filter layer, then generates from them (runs in front of an engine).

    The prompt filters declare ``separable``: their ``select`` and ``start`` split ``begin`` in two."""

    kind: ClassVar[str] = "prompt"
    serves_engine: ClassVar[bool] = True
    protocols: ClassVar[tuple] = (
        "reselect",
        "reuse",
        "stable",
        "stable-cf",
        "stable-gap",
        "stable-front",
        "stable-late",
        "stable-late-runs",
    )


class CacheMethod(Method):
    """Keeps ``topk`` rows of each layer's KV cache after the prefill."""

    kind: ClassVar[str] = "cache"
    #: how grouped-query heads share a selection: "group-mean" (one per KV head) or "repeat-kv" (per query head)
    gqa = "group-mean"


class FullMethod(Method):
    """Changes nothing: the whole prompt, the whole cache."""

    kind: ClassVar[str] = "full"
    serves_engine: ClassVar[bool] = True
    protocols: ClassVar[tuple] = ("full",)
