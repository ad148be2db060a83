"""Everything that depends on transformers' internals, for every release in the supported range.

The project reaches into transformers at a few places: the forward keyword that carries the KV cache,
the output field that returns it, the cache layer class, the attention and mask interfaces, the mask
helpers of ``masking_utils``, SDPA's forward and ``no_init_weights``. Each is named here once, and no
other module checks a version or imports a transformers internal.

The one rename inside the range (``pyproject.toml``'s ``transformers`` bounds, each end tested in CI):

- transformers 5.24 renamed the model-forward keyword ``past_key_values`` to ``cache``, and the
  output field likewise. ``generate`` passes ``cache=``; the old keyword stays a deprecated alias
  (renamed by ``deprecate_kwarg`` inside ``forward``) until 5.40. A forward pre-hook sees the keywords
  as the caller spelled them, before that rename, so the hooks accept both (:func:`cache_in`).

One release boundary is not an API but a converter: transformers below 5.23 turn the embedded model's GGUF
tokenizer into a wrong one (5.17: character pieces; 5.18 to 5.22: no ``<bos>``). The copy a newer release
wrote loads right under every release, so only the first conversion needs 5.23 (:data:`GGUF_GEMMA3_TOKENIZER`).

transformers is imported on first use, never when gemfilter is imported.
"""

from __future__ import annotations

import functools
from contextlib import contextmanager

# Both spellings of the forward keyword, the current one first.
CACHE_KWARGS = ("cache", "past_key_values")
_RENAMED_IN = (5, 24)  # first release whose forward and generate use ``cache``
#: First release whose GGUF converter gives the embedded Gemma 3 its trained tokenizer (pieces and <bos>); read
#: off the package's GGUF with 5.17.0 to 5.24.0 on 2026-11-27 (gemfilter.models.TOKENIZER_PROBE).
GGUF_GEMMA3_TOKENIZER = (5, 23)


def _version() -> tuple[int, int]:
    import transformers

    major, minor = transformers.__version__.split(".")[:2]
    return int(major), int("".join(ch for ch in minor if ch.isdigit()) or 0)


def gguf_tokenizer_converts_right() -> bool:
    """Whether this release converts the embedded model's GGUF tokenizer right (see the module docstring)."""
    return _version() >= GGUF_GEMMA3_TOKENIZER


@functools.cache
def cache_kwarg() -> str:
    """The forward keyword (and output field) this transformers release uses for the KV cache."""
    return CACHE_KWARGS[0] if _version() >= _RENAMED_IN else CACHE_KWARGS[1]


def cache_in(kwargs: dict):
    """(keyword, cache) of a forward call's keywords, whichever spelling the caller used; (None, None) if none.

    Both at once is refused, as transformers itself refuses it.
    """
    present = [k for k in CACHE_KWARGS if kwargs.get(k) is not None]
    if len(present) > 1:
        raise ValueError("pass the KV cache once: both `cache` and `past_key_values` were given")
    return (present[0], kwargs[present[0]]) if present else (None, None)


def cache_kwargs(cache) -> dict:
    """Keywords that hand ``cache`` to a model's forward under this release's name: ``model(ids,
    **cache_kwargs(c))``."""
    return {cache_kwarg(): cache}


def first_position(kwargs: dict):
    """(b,) position of the first token a forward call feeds, as ``generate`` numbers the whole sequence
    (its ``position_ids``, from the attention mask's running count; ``cache_position`` where a release passes
    only that), or None when the call carries neither."""
    pos = kwargs.get("position_ids")
    if pos is not None:
        return pos.reshape(-1, pos.shape[-1])[:, 0] if pos.dim() > 1 else pos[:1]
    cache_pos = kwargs.get("cache_position")
    return None if cache_pos is None else cache_pos[:1]


def text_config(model):
    """The text config of a model, or of a transformers config given directly (no weights needed).

    A multimodal config (Gemma 3's ``Gemma3Config``) keeps the decoder's fields in ``text_config``;
    ``get_text_config`` returns that, or the config itself for a text-only model. Imports nothing, so
    that config checks need no torch import.
    """
    cfg = getattr(model, "config", model)
    return cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg


def output_cache(output):
    """The KV cache a forward returned (``output.cache`` from 5.24 on, ``output.past_key_values`` before)."""
    return getattr(output, cache_kwarg())


def dynamic_cache(config):
    """An empty ``DynamicCache`` laid out for ``config`` (sliding layers included)."""
    from transformers import DynamicCache

    return DynamicCache(config=config)


def unwindowed_cache():
    """An empty ``DynamicCache`` whose every layer keeps every key, sliding-window layers too (made on first use);
    the model's masks still apply each layer's window, so its outputs are those of the windowed cache."""
    from transformers import DynamicCache

    return DynamicCache()


@functools.cache
def _windowed_recording_layer():
    """``DynamicSlidingWindowLayer`` that records the whole past, and whose ``update`` returns only the keys its mask
    sizes announce. 5.24 slices them itself; 5.17 returns every recorded key, so a forward after the window is full
    met a mask for fewer keys than the layer gave (a shape error in sdpa and banded). Slicing keys 5.24 already
    sliced is a no-op, so one class serves the whole range.

    Its ``crop(-n)`` keeps every earlier key: transformers' cuts the record back to the window, so a later cut
    deeper than what was written since gave back fewer keys than the window held (a shape error on Gemma 3 when
    ``stable-late`` opened its free positions after a turn that had cut its answer)."""
    from transformers.cache_utils import DynamicSlidingWindowLayer

    class WindowedRecordingLayer(DynamicSlidingWindowLayer):
        def update(self, key_states, value_states, *args, **kwargs):
            keys, values = super().update(key_states, value_states, *args, **kwargs)
            if not self.record_past:
                return keys, values
            visible = self.sliding_window - 1 + key_states.shape[-2]
            return keys[:, :, -visible:, :], values[:, :, -visible:, :]

        def crop(self, max_length: int) -> None:
            if max_length >= 0 or not self.record_past or not self.is_initialized:
                return super().crop(max_length)
            self.keys, self.values = self.keys[:, :, :max_length, :], self.values[:, :, :max_length, :]
            self.cumulative_length = self.keys.shape[-2]

    return WindowedRecordingLayer


def croppable_cache(config):
    """An empty ``DynamicCache`` laid out for ``config`` whose sliding-window layers keep every key until
    :func:`drop_last` cuts them (``activate_past_recording``), so that cutting gives back the keys the window held
    before; each forward still sees only the window's keys."""
    from transformers.cache_utils import DynamicSlidingWindowLayer

    cache = dynamic_cache(config)
    recording = _windowed_recording_layer()
    for i, layer in enumerate(cache.layers):
        # only the plain sliding layer is swapped: a subclass (a hybrid model's linear-attention-and-window layer)
        # holds more state than the window, and keeps its own class
        if type(layer) is DynamicSlidingWindowLayer:
            layer = cache.layers[i] = recording(sliding_window=layer.sliding_window)
        if hasattr(layer, "activate_past_recording"):  # sliding-window layers only
            layer.activate_past_recording()
    return cache


def drop_last(cache, count: int) -> None:
    """Remove the last ``count`` positions from every layer of a ``DynamicCache`` (``layer.crop(-count)``, whose
    negative form 5.17 and later share). A sliding-window layer past its window must come from
    :func:`croppable_cache` (RuntimeError otherwise)."""
    if count <= 0:
        return
    for layer in cache.layers:
        if getattr(layer, "is_initialized", True):
            layer.crop(-count)


def dynamic_layer_class():
    """The cache layer class of a full-attention ``DynamicCache`` layer."""
    from transformers.cache_utils import DynamicLayer

    return DynamicLayer


def attention_functions():
    """transformers' global registry of attention kernels (``ALL_ATTENTION_FUNCTIONS``)."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    return ALL_ATTENTION_FUNCTIONS


def mask_functions():
    """transformers' global registry of mask builders (``ALL_MASK_ATTENTION_FUNCTIONS``)."""
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS

    return ALL_MASK_ATTENTION_FUNCTIONS


def register_attention(name: str, attention_fn, mask_fn) -> None:
    """Register ``attention_fn`` in ``AttentionInterface`` and ``mask_fn`` in ``AttentionMaskInterface``, under
    one ``name`` (transformers looks both up by ``config._attn_implementation``)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(name, attention_fn)
    AttentionMaskInterface.register(name, mask_fn)


def register_mask(name: str, mask_fn) -> None:
    """Replace only the mask builder registered under ``name``."""
    from transformers.masking_utils import AttentionMaskInterface

    AttentionMaskInterface.register(name, mask_fn)


def mask_helpers():
    """(causal_mask_function, prepare_padding_mask, sdpa_mask) from ``transformers.masking_utils``."""
    from transformers.masking_utils import causal_mask_function, prepare_padding_mask, sdpa_mask

    return causal_mask_function, prepare_padding_mask, sdpa_mask


def sdpa_attention_forward():
    """transformers' SDPA attention kernel (the ``"sdpa"`` entry of the attention registry)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward as fn

    return fn


def no_init_weights():
    """transformers' context manager that skips weight initialisation while a model is built."""
    from transformers.initialization import no_init_weights as ctx

    return ctx()


class _ModesInsideApply(tuple):
    """The generation modes ``apply()`` runs exactly; its repr is the sentence transformers' refusal prints."""

    def __repr__(self):
        return (
            "greedy search, sampling and beam search inside gemfilter.apply() (assisted generation, prompt "
            "lookup and assistant early exit feed draft tokens into the prefill and crop the cache, so the method "
            "would score the drafts as prompt: run without assistant_model / prompt_lookup_num_tokens / "
            "assistant_early_exit)"
        )

    __str__ = __repr__


@contextmanager
def generation_modes_limited(model):
    """Inside the block, ``model.generate`` refuses every generation mode but greedy, sampling and beam search.

    transformers' ``generate`` checks ``model._supported_generation_modes`` before it decodes, and raises a
    ValueError naming the mode it got; the instance attribute set here is removed (or the class's own
    restored) on exit, errors included.
    """
    from transformers.generation.configuration_utils import GenerationMode

    ours = [GenerationMode.GREEDY_SEARCH, GenerationMode.SAMPLE, GenerationMode.BEAM_SEARCH, GenerationMode.BEAM_SAMPLE]
    had = "_supported_generation_modes" in vars(model)
    before = getattr(model, "_supported_generation_modes", None)
    model._supported_generation_modes = _ModesInsideApply(m for m in ours if before is None or m in before)
    try:
        yield
    finally:
        if had:
            model._supported_generation_modes = before
        else:
            del model._supported_generation_modes


def static_cache(config, max_cache_len: int):
    """An empty ``StaticCache`` of ``max_cache_len`` rows per layer, laid out for ``config`` (sliding layers
    included); its tensors are allocated, and marked static for ``torch.compile``, at the first ``update``."""
    from transformers import StaticCache

    return StaticCache(config=config, max_cache_len=max_cache_len)


def step_begins() -> None:
    """Tell CUDA graphs (``torch.compile(mode="reduce-overhead")``) that a new decode step starts, so the last
    step's outputs may be overwritten; a no-op where torch has no such marker."""
    import torch

    mark = getattr(getattr(torch, "compiler", None), "cudagraph_mark_step_begin", None)
    if mark is not None:
        mark()


def compile_limits(limit: int = 64):
    """A context in which ``torch.compile`` may recompile one function up to ``limit`` times, and raises past
    that instead of running it eagerly without a word (torch's default: 8, then silent eager). Every
    :class:`gemfilter.compiled.StaticDecoder` shares its step's code, so each decoder adds recompilations;
    the keys were renamed in torch 2.7 (``cache_size_limit`` -> ``recompile_limit``)."""
    import torch._dynamo

    config = torch._dynamo.config
    names = dict(config._config) if hasattr(config, "_config") else {}
    if "recompile_limit" in names:
        patch = {"recompile_limit": limit, "fail_on_recompile_limit_hit": True}
    else:
        patch = {"cache_size_limit": limit, "fail_on_cache_limit_hit": True}
    return config.patch(patch)
