"""Make a plain ``model.generate`` run GemFilter, and a ``generate`` helper that does it for you.

``apply(model, GemFilter(layer=13, topk=1024))`` switches the model's attention to the wrapper and
adds a forward pre-hook that rewrites each generate call's inputs:

- prefill (empty KV cache): run the filter pass on the prompt, then feed only the kept tokens,
  left-padded per row, at new contiguous positions 0..k-1 (Algorithm 2, step 5);
- decode steps: translate ``generate``'s attention mask and positions, which still count the
  original n prompt tokens, to the k kept ones.

``generate`` therefore returns exactly what it normally returns (the original prompt plus the new
tokens), and streamers, stopping criteria and every generation kwarg pass through untouched. Both
the hook and the attention switch are undone in ``finally``.
"""

from __future__ import annotations

import weakref
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

from .attention import wrapped_attention
from .layers import default_layer
from .selection import Selection, as_batch, check_params, check_prompt, positions_from_mask, select_tokens


@dataclass
class _Call:
    """State of one ``generate`` call, keyed by its KV cache object."""

    selection: Selection
    prompt_len: int
    kept_mask: torch.Tensor  # (b, k') 0/1, left padding


@dataclass
class Applied:
    """Handle yielded by :func:`apply`; ``selection`` is the last generate call's selection."""

    method: object
    layer: int
    selections: list = field(default_factory=list)
    _calls: weakref.WeakKeyDictionary = field(default_factory=weakref.WeakKeyDictionary)

    @property
    def selection(self) -> Selection | None:
        return self.selections[-1] if self.selections else None


def _pad_left(rows: list, pad_id: int):
    """Stack 1-D tensors, left-padded to the longest; returns (ids (b, L), mask (b, L))."""
    width = max(len(r) for r in rows)
    ids = rows[0].new_full((len(rows), width), pad_id)
    mask = torch.zeros_like(ids)
    for i, r in enumerate(rows):
        if len(r):
            ids[i, width - len(r):] = r
            mask[i, width - len(r):] = 1
    return ids, mask


def _pad_id(model) -> int:
    for cfg in (model.generation_config, model.config):
        pid = getattr(cfg, "pad_token_id", None)
        if isinstance(pid, (list, tuple)):
            pid = pid[0] if pid else None
        if pid is not None:
            return int(pid)
    return 0


def _make_hook(model, handle: Applied):
    method = handle.method

    def hook(module, args, kwargs):
        if args:
            raise TypeError("apply(): call the model with keyword arguments (as model.generate does)")
        if kwargs.get("inputs_embeds") is not None:
            raise ValueError("apply(): GemFilter selects input tokens, so it needs input_ids, not inputs_embeds")
        cache = kwargs.get("past_key_values")
        if cache is None:
            raise ValueError(
                "apply(): GemFilter needs generate's KV cache (use_cache=True). For a single forward pass use "
                "gemfilter.select_tokens and run the model on the kept tokens."
            )
        input_ids = kwargs["input_ids"]
        mask = kwargs.get("attention_mask")
        if mask is not None and mask.dim() != 2:
            raise ValueError("apply(): only 2-D attention masks are supported (no static/compiled cache)")
        past = cache.get_seq_length()
        if past == 0:  # prefill: filter, then feed only the kept tokens at positions 0..k-1
            sel = select_tokens(
                model, input_ids, mask, layer=handle.layer, topk=method.topk, kernel=method.kernel,
                score_fn=method.score,
            )
            ids, kept_mask = _pad_left(sel.kept_ids, _pad_id(model))
            handle._calls[cache] = _Call(sel, input_ids.shape[1], kept_mask)
            handle.selections.append(sel)
            kwargs["input_ids"] = ids
            kwargs["attention_mask"] = kept_mask if not kept_mask.all() else None
            kwargs["position_ids"] = positions_from_mask(kept_mask)
            return args, kwargs
        call = handle._calls.get(cache)
        if call is None:  # a cache we did not start: leave the call alone
            return args, kwargs
        q = input_ids.shape[1]
        b = call.kept_mask.shape[0]
        # Every token after the prompt is real (generate extends its mask with ones).
        tail = call.kept_mask.new_ones((b, past + q - call.kept_mask.shape[1]))
        new_mask = torch.cat([call.kept_mask, tail], dim=1)
        kwargs["attention_mask"] = new_mask if not call.kept_mask.all() else None
        kwargs["position_ids"] = positions_from_mask(new_mask)[:, -q:]
        return args, kwargs

    return hook


@contextmanager
def apply(model, method):
    """Inside the block, ``model.generate(...)`` filters the prompt with ``method`` (e.g. GemFilter).

    Yields an :class:`Applied` handle whose ``selection`` holds the last call's kept indices.
    The model is restored on exit, exceptions included.
    """
    layer = method.layer if method.layer is not None else default_layer(model)
    check_params(model, layer, method.topk, method.kernel)
    handle = Applied(method=method, layer=layer)
    with wrapped_attention(model):
        hook = model.register_forward_pre_hook(_make_hook(model, handle), with_kwargs=True)
        try:
            yield handle
        finally:
            hook.remove()


@dataclass
class GemFilterOutput:
    """What :func:`generate` returns: ``output`` is exactly what ``model.generate`` returned."""

    output: object
    selection: Selection
    kept_text: list | None
    prompt_len: int

    @property
    def sequences(self) -> torch.Tensor:
        return self.output if torch.is_tensor(self.output) else self.output.sequences

    @property
    def new_tokens(self) -> torch.Tensor:
        """(b, t) generated tokens only."""
        return self.sequences[:, self.prompt_len:]


def generate(model, inputs, *, layer: int | None = None, topk: int = 1024, kernel: int = 5, tokenizer=None,
             method=None, **generate_kwargs) -> GemFilterOutput:
    """GemFilter generation (Algorithm 2): filter with the first ``layer`` layers, then generate from top-k.

    Parameters
    ----------
    inputs: a (b, n) LongTensor or a tokenizer output (mapping with input_ids and optional attention_mask).
    layer: 0-based filter layer; None -> :func:`gemfilter.layers.default_layer`.
    topk: tokens kept per row.
    tokenizer: if given, ``kept_text`` holds the decoded kept tokens.
    method: a method object instead of (layer, topk, kernel).
    generate_kwargs: passed to ``model.generate``. Decoding is greedy unless you say otherwise.
    """
    from .methods import GemFilter

    if hasattr(inputs, "keys") and "input_ids" in inputs:
        input_ids, attention_mask = as_batch(inputs["input_ids"], inputs.get("attention_mask"))
    elif torch.is_tensor(inputs) or isinstance(inputs, (list, tuple)):
        input_ids, attention_mask = as_batch(inputs)
    else:
        raise TypeError("inputs must be a LongTensor (b, n), a list of token lists, or a tokenizer output with 'input_ids'")
    check_prompt(input_ids, attention_mask)
    method = method or GemFilter(layer=layer, topk=topk, kernel=kernel)
    generate_kwargs.setdefault("do_sample", False)
    generate_kwargs.setdefault("num_beams", 1)
    with apply(model, method) as handle:
        out = model.generate(input_ids=input_ids, attention_mask=attention_mask, **generate_kwargs)
    sel = handle.selection
    text = sel.kept_text(tokenizer) if tokenizer is not None else None
    return GemFilterOutput(output=out, selection=sel, kept_text=text, prompt_len=input_ids.shape[1])
