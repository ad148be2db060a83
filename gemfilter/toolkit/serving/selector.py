"""The selection half of GemFilter, on its own: layers 0..r of a causal LM, for the proxy and the vLLM plugin.

Paper: Shi et al. 2024, Algorithm 2 steps 1-4. The filter pass stops inside layer r, so a selector
needs only the embeddings, decoder layers 0..r and the final norm: :func:`load_selector` builds the
base model (no LM head) from a config cut to r+1 layers, and ``from_pretrained`` reads no weight of a
later layer. The kept token ids then go to any engine as an ordinary prompt (positions 0..k-1).
"""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass


def is_prompt_method(method) -> bool:
    """Whether ``method`` (a class or an object) can run in front of an engine: ``full``, or a method that
    picks prompt tokens. KV-cache methods evict inside the model, which an engine does not expose."""
    from gemfilter.methods import FullMethod, PromptMethod

    return issubclass(method if isinstance(method, type) else type(method), (PromptMethod, FullMethod))


def prompt_methods() -> tuple:
    """Names of the registered methods that can run in front of an engine (``full`` sends the whole prompt)."""
    from gemfilter.methods import REGISTRY

    return tuple(sorted(name for name, cls in REGISTRY.items() if is_prompt_method(cls)))


def cut_config(config, layers: int):
    """``config`` (its text config) cut to the first ``layers`` decoder layers, in place; returns it."""
    text = config.get_text_config()
    total = int(text.num_hidden_layers)
    if not 1 <= layers <= total:
        raise ValueError(f"a selector keeps layers 0..r, so r+1 = {layers} must lie in [1, {total}]")
    text.num_hidden_layers = layers
    if getattr(text, "layer_types", None) is not None:
        text.layer_types = list(text.layer_types)[:layers]
    return config


def load_selector(name: str | None = None, *, layer: int | None = None, attn: str | None = None, dtype=None):
    """(selector model, tokenizer, layer): the base model of ``name`` with decoder layers 0..``layer`` only.

    name: as for :func:`gemfilter.load_model` (None: the embedded Gemma 3 270M). layer: the filter layer
    r (None: the model's default). The model has no LM head and never runs past layer r.
    """
    import torch
    from transformers import AutoModel, AutoTokenizer

    from gemfilter.layers import default_layer
    from gemfilter.models import _check_attn, is_embedded, load_config, model_path

    config = load_config(name)
    full_layers = int(config.get_text_config().num_hidden_layers)
    if layer is None:
        layer = default_layer(config)
    if not 0 <= layer < full_layers:
        raise ValueError(f"layer={layer} is outside [0, {full_layers}): the model has {full_layers} decoder layers")
    embedded = is_embedded(name)
    path = model_path(name)
    cut_config(config, layer + 1)
    kw = {"attn_implementation": attn} if attn not in (None, "banded") else {}
    from transformers.utils import logging as hf_logging

    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # the weights of layers > r are skipped on purpose: no report of them
    try:
        model = AutoModel.from_pretrained(
            path, config=config, dtype=dtype or (torch.float32 if embedded else "auto"), **kw
        )
    finally:
        hf_logging.set_verbosity(level)
    if attn == "banded" or (attn is None and embedded):
        model.set_attn_implementation(_check_attn("banded", model.config))
    tok = AutoTokenizer.from_pretrained(path)
    model.eval()
    return model, tok, layer


def open_selector(
    name: str | None = None,
    *,
    layer: int | None = None,
    attn: str | None = None,
    cache_bytes: int = 0,
    workers: int = 1,
) -> "Selector":
    """A ready :class:`Selector`: layers 0..``layer`` of ``name`` (:func:`load_selector`), with Gemma 3's chat
    template for the embedded model, whose tokenizer has none (:func:`~.chat_template.fallback_template`).

    cache_bytes, workers: as for :class:`Selector`. What ``gemfilter serve`` and the vLLM plugin both load.
    """
    from gemfilter.toolkit.serving.chat_template import fallback_template

    model, tok, layer = load_selector(name, layer=layer, attn=attn)
    return Selector(
        model, tok, layer, chat_template=fallback_template(name, tok), cache_bytes=cache_bytes, workers=workers
    )


class ClientGone(Exception):
    """The client left before its selection ran (or while it ran): nothing more is done for it."""


@dataclass
class Choice:
    """One request's selection: the ids to send upstream and what to report."""

    ids: list
    method: str
    topk: int | None
    prompt_tokens: int
    kept_tokens: int
    passthrough: bool
    seconds: float  # from the request's arrival at the selector to its kept ids, the wait included
    waited: float = 0.0  # of which spent waiting for a free selector (other requests' selections)
    reused: int = 0  # prompt tokens whose layers 0..r came from the prefix cache

    def meta(self, layer: int) -> dict:
        return {
            "method": self.method,
            "topk": self.topk,
            "layer": layer,
            "prompt_tokens": self.prompt_tokens,
            "kept_tokens": self.kept_tokens,
            "passthrough": self.passthrough,
            "selection_seconds": round(self.seconds, 4),
            "selector_wait_seconds": round(self.waited, 4),
            "selector_cached_tokens": self.reused,
        }


class Selector:
    """A loaded selector and its tokenizer; :meth:`choose` is safe to call from several threads.

    chat_template: a template the proxy supplies because the tokenizer has none
    (:func:`gemfilter.toolkit.serving.chat_template.fallback_template`); chats are then always sent as token ids.
    cache_bytes: the prefix cache's budget (0: no cache). workers: selections that run at once on the one
    model (1: one at a time, in arrival order; more share the CPU threads or the GPU between them).
    """

    def __init__(
        self,
        model,
        tokenizer,
        layer: int,
        max_tokens: int | None = None,
        chat_template: str | None = None,
        cache_bytes: int = 0,
        workers: int = 1,
    ):
        from gemfilter.toolkit.serving.prefix_cache import PrefixCache

        if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
            raise ValueError(f"selector workers must be a whole number >= 1, got {workers!r}")

        self.model, self.tokenizer, self.layer, self.chat_template = model, tokenizer, layer, chat_template
        cfg = model.config.get_text_config()
        self.max_tokens = max_tokens or int(getattr(cfg, "max_position_embeddings", 0) or 0) or None
        self.vocab_size = int(getattr(cfg, "vocab_size", 0) or 0) or None
        # layers 0..r of prompts already seen (``--selector-cache-gb``); None: every prompt runs whole
        self.prefix_cache = PrefixCache(cache_bytes) if cache_bytes > 0 else None
        self._slots = threading.BoundedSemaphore(workers)
        self._cache_lock = threading.Lock()  # the prefix cache's LRU order and budget: one caller at a time

    def method_for(self, n: int, method, topk: int | None = None):
        """The method object for a prompt of ``n`` tokens: ``method`` a spec (text or
        :class:`~gemfilter.methods.Spec`), ``topk`` the budget where the spec sets none (None: its own)."""
        from gemfilter.methods import parse_spec

        spec = parse_spec(method) if isinstance(method, str) else method
        m = spec.method(n, topk=topk, layer=self.layer)
        if m.layer is not None and m.layer != self.layer:
            raise ValueError(
                f"{spec.text}: this selector holds layers 0..{self.layer}; it cannot filter at layer {m.layer}"
            )
        return m

    @staticmethod
    def passes_through(n: int, method) -> bool:
        """Whether a prompt of ``n`` tokens is sent unchanged by ``method`` (an object, :meth:`method_for`):
        ``full``, or a prompt of at most the method's ``topk`` tokens."""
        from gemfilter.methods import FullMethod

        return isinstance(method, FullMethod) or n <= method.topk

    def choose(self, ids: list, method, topk: int | None = None, gone=None) -> Choice:
        """Select from prompt ``ids`` with a prompt method (a spec, as for :meth:`method_for`); prompts of at most
        its ``topk`` tokens pass unchanged.

        gone: optional ``() -> bool``, true once the client has left. A request whose client left while it waited for
        a free selector is dropped before its selection (:class:`ClientGone`), so departed clients never hold up
        the ones still there."""
        import torch

        n = len(ids)
        if self.max_tokens is not None and n > self.max_tokens:
            raise ValueError(
                f"the prompt has {n} tokens; the selector's model takes at most {self.max_tokens} "
                "(max_position_embeddings)"
            )
        start = time.perf_counter()
        m = self.method_for(n, method, topk)
        label = method if isinstance(method, str) else method.label
        k = m.topk
        if self.passes_through(n, m):
            return Choice(list(ids), label, k, n, n, True, time.perf_counter() - start)
        reused = 0
        with self._slot(gone), torch.no_grad():
            waited = time.perf_counter() - start
            if self.prefix_cache is not None and m.scores_last_row:
                selection, reused = self._select_cached(m, ids)
            else:
                selection = m.select(self.model, torch.tensor([ids]), tokenizer=self.tokenizer)
        kept = selection.kept_ids[0].tolist()
        return Choice(kept, label, k, n, len(kept), False, time.perf_counter() - start, waited, reused)

    @contextmanager
    def _slot(self, gone, poll: float = 0.05):
        """Hold one of the selector's worker slots, waiting in turn; raise :class:`ClientGone` if the client leaves
        while it waits (checked every ``poll`` seconds) or before the slot is used."""
        if gone is None:
            with self._slots:
                yield
            return
        while not self._slots.acquire(timeout=poll):
            if gone():
                raise ClientGone()
        try:
            if gone():
                raise ClientGone()
            yield
        finally:
            self._slots.release()

    def _select_cached(self, method, ids: list):
        """(the selection, the prompt tokens served from the cache) with the prefix cache: copy the longest stored
        prefix's layers 0..r, run the rest of the prompt's whole blocks and store them as a new entry (and one at
        the point where the prompt leaves an earlier one, if that lies beyond the stored prefix), then run the
        last tokens and select."""
        import torch

        from gemfilter.compat import dynamic_cache
        from gemfilter.selection import filter_pass, select_cached

        aligned = self.prefix_cache.aligned(len(ids))
        with self._cache_lock:  # branch: where it leaves an earlier prompt (a shared document's end)
            reused, cache, branch = self.prefix_cache.lookup(ids)
        cache = cache if cache is not None else dynamic_cache(self.model.config)
        device = next(self.model.parameters()).device
        prompt = torch.tensor([ids], device=device)
        done = reused
        for stop in sorted({branch, aligned}):  # whole blocks beyond the stored prefix: run, keep for next time
            if stop > done:
                block = prompt[:, done:stop]
                filter_pass(self.model, block, torch.ones_like(block), self.layer, lambda q, k: None, cache=cache)
                with self._cache_lock:
                    self.prefix_cache.store(ids[:stop], cache)
                done = stop
        return select_cached(self.model, method, prompt, cache, self.tokenizer), reused
