"""Generation at the hardware's pace: a static KV cache and a compiled decode step after any method's prefill.

Paper: Shi et al. 2024, Fig. 9.3 times prompt phase plus 50 new tokens. transformers' eager ``generate`` spends
about 65 ms per token at batch 1 on an 8B model whatever the cache holds (Python and kernel launches), while
reading the bf16 weights once takes about 3.4 ms on an H200. GemFilter leaves a cache of k rows, fixed
whatever the prompt's length, so a static cache of k + t rows and one compiled step (CUDA graphs through
``torch.compile(mode="reduce-overhead")``) serve every prompt.

How it runs (:func:`gemfilter.generate` with ``compile=True``):

1. the method's prefill runs eagerly inside :func:`gemfilter.apply`, exactly as in ``model.generate``: the
   filter pass and the k-token prefill for a prompt method, the full prefill and eviction for a cache method;
2. the call's :class:`~gemfilter.continuation.Continuation` says each row's next position and which cached
   rows are real; the R rows per layer are copied into a :class:`StaticDecoder`'s static cache (each layer of
   the prefill's cache freed as soon as it is copied);
3. greedy decoding runs on the compiled step, one token at a time, at positions p0, p0 + 1, ... and cache
   slots R, R + 1, ...

Greedy decoding equals ``generate``'s token for token (``tests/test_compiled.py`` on CPU and CUDA): the prefill
is the same call, and the steps are the same model on the same rows. Supported ``generate`` keywords:
``max_new_tokens`` (required: it sizes the cache), ``min_new_tokens``, ``eos_token_id``, ``pad_token_id``,
``streamer``; sampling, beams and logits processors are refused by name.
"""

from __future__ import annotations

import weakref

import torch

from .compat import cache_kwargs, compile_limits, dynamic_cache, static_cache, step_begins

#: generate() keywords the compiled path honours (do_sample / num_beams only at their greedy values)
KEYWORDS = ("max_new_tokens", "min_new_tokens", "eos_token_id", "pad_token_id", "streamer", "do_sample", "num_beams")
#: generation-config fields that add a logits processor to greedy decoding, with their inactive values
_PROCESSORS = {
    "repetition_penalty": (None, 1.0),
    "no_repeat_ngram_size": (None, 0),
    "bad_words_ids": (None,),
    "suppress_tokens": (None,),
    "begin_suppress_tokens": (None,),
    "forced_bos_token_id": (None,),
    "forced_eos_token_id": (None,),
    "sequence_bias": (None,),
    "encoder_repetition_penalty": (None, 1.0),
    "exponential_decay_length_penalty": (None,),
    "min_length": (None, 0),
}


class StaticDecoder:
    """A static KV cache of ``capacity`` rows per layer and a compiled decode step for ``model``.

    Reused across calls: a prompt method's cache has k rows whatever the prompt, so one decoder of capacity
    k + max_new_tokens serves every prompt with one compilation. A call that needs more rows than
    ``capacity`` is refused (build a larger decoder).

    Parameters
    ----------
    model: a transformers causal LM.
    capacity: rows per layer: the most prefill rows R plus max_new_tokens - 1 (the last token is never fed).
    compile: False runs the same static-cache step eagerly (a reference for tests and timings).
    mode: torch.compile's mode; default "reduce-overhead" (CUDA graphs) on CUDA, inductor's default elsewhere.
    """

    def __init__(self, model, capacity: int, *, compile: bool = True, mode: str | None = "auto"):
        if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1:
            raise ValueError(f"capacity must be an int >= 1 (rows per layer), got {capacity!r}")
        self.model, self.capacity = model, capacity
        device = next(model.parameters()).device
        if mode == "auto":
            mode = "reduce-overhead" if device.type == "cuda" else None
        self.cache = static_cache(model.config, capacity)
        self._cache_kw = cache_kwargs(self.cache)  # read once: the compiled step traces no version check
        self.batch = None  # the static cache's batch size, fixed at its first fill
        self.compiled = compile
        self._step = torch.compile(self._forward, mode=mode) if compile else self._forward

    def _forward(self, ids, positions, mask):
        out = self.model(
            input_ids=ids,
            position_ids=positions,
            attention_mask=mask,
            use_cache=True,
            logits_to_keep=1,
            **self._cache_kw,
        )
        return out.logits[:, -1, :].float()

    def load(self, cache, valid) -> torch.Tensor | None:
        """Copy ``cache``'s rows (R per layer) into the static cache, freeing each of its layers once copied.
        Returns the (b, capacity) mask of real rows for the steps (None when every row is real)."""
        rows = [int(layer.keys.shape[-2]) for layer in cache.layers]
        batch = int(cache.layers[0].keys.shape[0])
        sliding = [bool(getattr(layer, "is_sliding", False)) for layer in self.cache.layers]
        full = {r for r, s in zip(rows, sliding) if not s}
        if len(full) > 1:
            raise ValueError(
                f"compile=True needs every full-attention layer to hold the same rows after the prefill, "
                f"got {sorted(full)}: this method's cache cannot go on in one static cache; use "
                "compile=False"
            )
        if any(s for s in sliding) and valid is not None:
            raise ValueError(
                "compile=True on a model with sliding-window layers takes unpadded batches (a sliding "
                "layer's static cache rolls its rows, so a padding mask cannot follow them): run the "
                "rows one at a time, or compile=False"
            )
        for i, (r, s) in enumerate(zip(rows, sliding)):
            if s and r > self.cache.layers[i].max_cache_len:
                raise ValueError(
                    f"layer {i} holds {r} rows, more than its sliding window's static cache "
                    f"({self.cache.layers[i].max_cache_len}): use compile=False"
                )
        if self.batch is not None and batch != self.batch:
            raise ValueError(
                f"this decoder's static cache holds batches of {self.batch}, got {batch}: build a "
                "StaticDecoder per batch size"
            )
        self.batch = batch
        self.cache.reset()
        for i, layer in enumerate(cache.layers):
            self.cache.layers[i].update(layer.keys, layer.values)
            layer.keys = layer.values = None  # the static copy is the only one now
        if valid is None:
            return None
        mask = torch.ones((batch, self.capacity), dtype=torch.long, device=valid.device)
        mask[:, : valid.shape[1]] = valid.long()
        return mask

    def cache_bytes(self) -> int:
        """Bytes of the static cache's keys and values (allocated at the first load)."""
        return sum(
            t.numel() * t.element_size()
            for layer in self.cache.layers
            for t in (getattr(layer, "keys", None), getattr(layer, "values", None))
            if t is not None
        )

    def decode(
        self,
        first_logits,
        cont,
        mask,
        *,
        max_new_tokens: int,
        min_new_tokens: int = 0,
        eos=(),
        pad_token_id=None,
        streamer=None,
    ) -> torch.Tensor:
        """Greedy tokens (b, t), t <= max_new_tokens: the first from ``first_logits`` (b, V), the rest from the
        compiled step, as ``generate``'s greedy search does (EOS suppressed before ``min_new_tokens``; a finished
        row gets ``pad_token_id``; stops when every row has finished)."""
        device = first_logits.device
        eos_t = torch.tensor(sorted(eos), dtype=torch.long, device=device) if eos else None
        pad = eos_t[0] if pad_token_id is None and eos_t is not None else pad_token_id
        unfinished = torch.ones(first_logits.shape[0], dtype=torch.bool, device=device)
        positions = cont.positions.to(device).long()
        logits, out = first_logits, []
        for i in range(max_new_tokens):
            if i < min_new_tokens and eos_t is not None:
                logits = logits.clone()
                logits[:, eos_t] = float("-inf")
            token = logits.argmax(-1)
            if pad is not None:
                token = torch.where(unfinished, token, torch.as_tensor(pad, device=device))
            out.append(token)
            if streamer is not None:
                streamer.put(token.cpu())
            if eos_t is not None:
                unfinished = unfinished & ~torch.isin(token, eos_t)
                if not bool(unfinished.any()):
                    break
            if i == max_new_tokens - 1:
                break
            step_begins()
            with compile_limits():
                logits = self._step(token[:, None], (positions + i)[:, None], mask).clone()
        if streamer is not None:
            streamer.end()
        return torch.stack(out, dim=1)


_DECODERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def decoder_for(model, capacity: int, batch: int | None = None) -> StaticDecoder:
    """The decoder ``compile=True`` reuses for ``model``: the last one, if it holds ``capacity`` rows for batches
    of ``batch``, else a new one of that capacity (which compiles again). :func:`release` frees it."""
    held = _DECODERS.get(model)
    if held is None or held.capacity < capacity or held.batch not in (None, batch):
        _DECODERS.pop(model, None)
        held = _DECODERS[model] = StaticDecoder(model, capacity)
    return held


def release(model) -> None:
    """Free the static cache that ``generate(..., compile=True)`` keeps for ``model`` between calls."""
    _DECODERS.pop(model, None)


def check_keywords(model, kwargs: dict) -> dict:
    """The greedy settings of a compiled call, from ``generate`` keywords and the model's generation config;
    a clear error for anything the compiled path does not do."""
    extra = sorted(set(kwargs) - set(KEYWORDS))
    if extra:
        raise ValueError(
            f"compile=True decodes greedily with a static cache and takes only {', '.join(KEYWORDS)}; "
            f"got {', '.join(extra)}: use compile=False for the other generate options"
        )
    if kwargs.get("do_sample") or kwargs.get("num_beams", 1) != 1:
        raise ValueError("compile=True decodes greedily: give do_sample=False and num_beams=1, or compile=False")
    new = kwargs.get("max_new_tokens")
    if isinstance(new, bool) or not isinstance(new, int) or new < 1:
        raise ValueError(f"compile=True sizes its static cache by max_new_tokens: give an int >= 1, got {new!r}")
    least = kwargs.get("min_new_tokens") or 0
    if isinstance(least, bool) or not isinstance(least, int) or least < 0:
        raise ValueError(f"min_new_tokens must be an int >= 0, got {least!r}")
    config = model.generation_config
    active = [f for f, off in _PROCESSORS.items() if getattr(config, f, None) not in off]
    if active:
        raise ValueError(
            f"the model's generation config sets {', '.join(active)}, which compile=True does not "
            "apply: use compile=False, or reset them in model.generation_config"
        )
    eos = kwargs.get("eos_token_id", config.eos_token_id)
    eos = set() if eos is None else {int(eos)} if isinstance(eos, int) else {int(e) for e in eos}
    pad = kwargs.get("pad_token_id", config.pad_token_id)
    return dict(max_new_tokens=new, min_new_tokens=least, eos=eos, pad_token_id=pad, streamer=kwargs.get("streamer"))


def prefill(model, handle, input_ids, attention_mask):
    """Run the method's prefill (inside ``handle``'s apply block) as ``generate`` runs it: returns the first
    logits (b, V) in float32 and the cache it left."""
    from .selection import positions_from_mask

    cache = dynamic_cache(model.config)
    mask = torch.ones_like(input_ids) if attention_mask is None else attention_mask
    with torch.no_grad():
        out = model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=positions_from_mask(mask),
            use_cache=True,
            logits_to_keep=1,
            **cache_kwargs(cache),
        )
    return out.logits[:, -1, :].float(), cache
