"""The single integration point: an attention wrapper registered with transformers.

transformers 5.x looks an attention kernel up by ``config._attn_implementation`` in
``AttentionInterface`` and the matching mask builder in ``AttentionMaskInterface``. We register a
wrapper under ``"gemfilter_<base>"`` in *both* (the mask builder is the base kernel's own one;
without it padding and sliding windows are silently dropped), and switch the model to that name
only inside :func:`wrapped_attention`, which restores the original name in ``finally``.

The wrapper is stateless. Per-call state travels as the forward keyword ``gemfilter_state``,
which transformers passes through every decoder layer to the attention kernel. A state object
implements ``attention(module, query, key, value, attention_mask, base, **kwargs)``.
"""

from __future__ import annotations

import sys
import threading
import warnings
import weakref
from contextlib import contextmanager

from .compat import attention_functions, mask_functions, register_attention

STATE_KWARG = "gemfilter_state"
_PREFIX = "gemfilter_"
# Models switched to the wrapper by wrapped_attention: model -> [base kernel name, blocks inside]. Threads that
# share a model (a serving selector's workers) share its switch; the last block to leave restores the kernel.
_SWITCHED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_SWITCH_LOCK = threading.Lock()


class FilterLayerReached(Exception):
    """Private early exit: raised inside the filter layer once its q and k exist."""

    def __init__(self, payload):
        super().__init__("filter layer reached")
        self.payload = payload


def _base_kernel(base: str, module):
    """The attention function the model would have used without us."""
    if base == "eager":
        # "eager" is not in the global interface: each model file defines its own
        # ``eager_attention_forward`` (Gemma's has soft-capping, for example). Use the model's own.
        fn = getattr(sys.modules[type(module).__module__], "eager_attention_forward", None)
        if fn is None:
            raise TypeError(f"{type(module).__name__}'s module defines no eager_attention_forward to delegate to")
        return fn
    return attention_functions()[base]


def _make_wrapper(base: str):
    def gemfilter_attention(module, query, key, value, attention_mask, **kwargs):
        state = kwargs.pop(STATE_KWARG, None)
        kernel = _base_kernel(base, module)
        if state is None:
            return kernel(module, query, key, value, attention_mask, **kwargs)
        return state.attention(module, query, key, value, attention_mask, kernel, **kwargs)

    gemfilter_attention.__name__ = f"{_PREFIX}{base}"
    return gemfilter_attention


def register(base: str) -> str:
    """Register the wrapper around ``base`` (sdpa, eager, flash_attention_2, ...) and return its name."""
    name = f"{_PREFIX}{base}"
    masks = mask_functions()
    if base not in masks:
        allowed = ", ".join(sorted(k for k in masks if not k.startswith(_PREFIX)))
        raise ValueError(f"attention implementation {base!r} has no mask builder in transformers; allowed: {allowed}")
    register_attention(name, _make_wrapper(base), masks[base])
    return name


def check_dispatch(model) -> None:
    """Raise TypeError unless the model's attention goes through ``AttentionInterface``."""
    can_set = getattr(type(model), "_can_set_attn_implementation", None)
    ok = bool(can_set()) if callable(can_set) else False
    impl = getattr(getattr(model, "config", None), "_attn_implementation", None)
    if not ok or impl is None:
        raise TypeError(
            f"{type(model).__name__} does not dispatch its attention through transformers' AttentionInterface, "
            "so GemFilter cannot hook it. Supported: models whose attention calls "
            "ALL_ATTENTION_FUNCTIONS.get_interface(...) (Llama, Mistral, Qwen2, Phi3, Gemma3 and most current "
            "decoder-only models in transformers 5.x)."
        )


@contextmanager
def wrapped_attention(model):
    """Switch ``model`` to the wrapper around its current kernel; restore it on exit, errors included.

    Nested and concurrent blocks on one model (threads that share it) share one switch: the first to enter
    switches, the last to leave restores, so no block runs a layer on the restored kernel."""
    check_dispatch(model)
    with _SWITCH_LOCK:
        held = _SWITCHED.get(model)
        base = model.config._attn_implementation
        # a model its owner switched outside this manager (base already wrapped) is left as it is: held None
        if held is None and not base.startswith(_PREFIX):
            name = register(base)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                model.set_attn_implementation(name)
            held = _SWITCHED[model] = [base, 0]
        if held is not None:
            held[1] += 1
    try:
        yield model.config._attn_implementation
    finally:
        if held is not None:
            with _SWITCH_LOCK:
                held[1] -= 1
                if held[1] == 0:
                    del _SWITCHED[model]
                    model.set_attn_implementation(held[0])
