"""A cache the model's own generation step drops: Phi-3's LongRoPE switch, inside :func:`gemfilter.apply`.

Phi-3 and Phi-3.5 (LongRoPE, ``original_max_position_embeddings``) use short RoPE factors while every
position is below that length and long ones beyond it. Their ``prepare_inputs_for_generation`` passes no
cache when the sequence is longer than ``original_max_position_embeddings`` while the cache holds no more
tokens than that, so that the model recomputes every key with the long factors. Inside ``apply()`` a
method has shrunk the cache below the sequence, so this fires on a long prompt's prefill and at every
decode step after it, although nothing switches:

- prefill (the cache is empty): nothing is lost; the call gets a fresh cache;
- decode: the call gets back the cache this block filled: the one whose consumed tokens begin its input
  (releases from 5.24 pass the whole sequence) or end where its new tokens start (5.17 passes only those),
  whose keys were computed with the factors this step uses;
- a decode step that crosses the switch starts over on a fresh cache where the cache holds every token
  (``full``, or a budget that kept all) and the input is the whole sequence, as the model does; otherwise it
  is refused: the model would recompute tokens the method dropped (or, given only the new tokens, has none to
  recompute from).
"""

from __future__ import annotations

import torch

from .compat import cache_kwargs, dynamic_cache, first_position, text_config


def switch_length(model) -> int | None:
    """``original_max_position_embeddings`` of a LongRoPE model (where its RoPE factors switch), else None."""
    return getattr(text_config(model), "original_max_position_embeddings", None)


def give_back(model, consumed: dict, kwargs: dict):
    """(cache, kwargs) for a forward call that carries no cache although it asked for one (``use_cache``).

    consumed: ``{cache: Consumed}`` of this apply() block. Returns (None, kwargs) where nothing applies: the
    call asked for no cache, or the model has no RoPE switch (then the caller refuses the call).
    """
    if kwargs.get("use_cache") is False or switch_length(model) is None or kwargs.get("input_ids") is None:
        return None, kwargs
    ids, first = kwargs["input_ids"], first_position(kwargs)
    whole = [cache for cache, done in list(consumed.items()) if _begins(done, ids)]
    live = whole or [cache for cache, done in list(consumed.items()) if _follows(done, ids, first)]
    if len(live) > 1:
        raise ValueError(
            f"apply(): the model passed no KV cache to this step (its RoPE switch at original_max_position_embeddings="
            f"{switch_length(model)}), and {len(live)} caches of this block consumed the same tokens, so the one to "
            "continue is unknown: continue each fork in a block of its own"
        )
    cache = live[0] if live else None
    if cache is not None and whole and _recompute(model, consumed[cache], cache, ids.shape[1]):
        cache = None  # a cache that holds every token is rebuilt across the switch, as the model itself does
    cache = dynamic_cache(model.config) if cache is None else cache
    return cache, {**kwargs, **cache_kwargs(cache)}


def _begins(done, ids) -> bool:
    """The input is the whole sequence (what releases from 5.24 pass): this cache's consumed tokens, then more."""
    c = done.ids.shape[1]
    return done.ids.shape[0] == ids.shape[0] and c < ids.shape[1] and torch.equal(done.ids.to(ids.device), ids[:, :c])


def _follows(done, ids, first) -> bool:
    """The input is only the new tokens (what 5.17 passes, cut at its cache_position), and they start where this
    cache's consumed tokens end: positions count real tokens (position_ids) or every slot (cache_position)."""
    if first is None or done.ids.shape[0] != ids.shape[0]:
        return False
    first = first.to(done.real.device)
    return bool((first == done.real).all()) or bool((first == done.ids.shape[1]).all())


def _recompute(model, done, cache, length: int) -> bool:
    """True when this step crosses the switch and ``cache`` holds every token it consumed (nothing dropped):
    then the call starts over on a fresh cache (a prefill of the whole sequence), which is the model's own way."""
    limit, top = switch_length(model), done.top
    crosses = top is not None and (top + 1 > limit) != (length > limit)
    return crosses and cache.get_seq_length() == done.ids.shape[1]


def fed_top(kwargs: dict, past: int) -> int:
    """The largest position this forward feeds: its position_ids, else the model's own count from ``past``."""
    pos = kwargs.get("position_ids")
    if pos is not None:
        return int(pos.max())
    return past + int(kwargs["input_ids"].shape[1]) - 1


def check_switch(model, done, kwargs: dict, past: int, name: str) -> None:
    """Record the top position a forward feeds in ``done`` (at prefill: past 0), and refuse a decode step whose
    positions cross the model's RoPE switch. A model without one is left alone: reading the top position of a
    GPU tensor would wait for the device at every decode step.

    done: the cache's Consumed record (``top``: the largest position fed so far, None before its prefill)."""
    limit = switch_length(model)
    if limit is None:
        return
    top, previous = fed_top(kwargs, past), done.top
    done.top = top
    if previous is None or (previous + 1 > limit) == (top + 1 > limit):
        return
    raise ValueError(
        f"apply(): {name}: this step goes from position {previous} to {top}, across the model's RoPE switch at "
        f"original_max_position_embeddings={limit}, where the model recomputes every cached key with its long "
        f"RoPE factors; {name} dropped tokens from its cache, so they cannot be recomputed. Keep a generation on "
        f"one side of it: prompt plus new tokens within {limit} positions (as the method numbers them), or a "
        f"prompt longer than {limit}"
    )
