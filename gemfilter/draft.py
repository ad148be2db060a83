"""A draft selector: GemFilter's selection on a smaller model, generation on the target.

SpecPrefill's idea (Liu et al. 2025, "Speculative Prefill": a small model with the target's tokenizer rates
the prompt's tokens, the target prefills only the kept ones) with GemFilter's renumbering (Shi et al. 2024,
Algorithm 2 step 5: the kept tokens sit at positions 0..k-1). The filter pass runs layers 0..r of the
draft; the target never sees the dropped tokens. Token ids pass from one model to the other unchanged, so
both must share a tokenizer; the vocabulary sizes are checked (a necessary condition: two tokenizers with
one size may still differ, which no config shows).
"""

from __future__ import annotations

import dataclasses

from .compat import text_config
from .selection import Selection, check_causal_decoder


def vocab_size(model) -> int:
    """The token vocabulary of ``model``: its (text) config's ``vocab_size``."""
    return int(text_config(model).vocab_size)


def check_selector(selector, model) -> None:
    """Refuse a draft selector whose token ids would mean other tokens to ``model`` (ValueError), or one that
    is not a causal decoder (TypeError)."""
    if getattr(selector, "config", None) is None:
        raise TypeError(f"selector must be a transformers causal LM, got {type(selector).__name__}")
    check_causal_decoder(selector)
    if vocab_size(selector) != vocab_size(model):
        raise ValueError(
            f"selector vocabulary ({vocab_size(selector)} tokens) differs from the model's ({vocab_size(model)}): "
            "the kept token ids go to the model unchanged, so the selector must use the model's tokenizer "
            "(e.g. Llama 3.2 1B selecting for Llama 3.1 8B)")


def to_device(selection: Selection, device) -> Selection:
    """``selection`` with its tensors on ``device`` (the target's, when the draft sits elsewhere)."""
    return dataclasses.replace(selection, indices=[i.to(device) for i in selection.indices],
                               scores=selection.scores.to(device), kept_ids=[k.to(device) for k in selection.kept_ids])


def drafted_begin(method, selector):
    """``method.begin`` with the selection made on ``selector``: a prompt filter's ``select`` on the draft, then
    its ``start`` on the target (the generate call's model). method: a resolved prompt filter (its ``layer``
    is the draft's)."""
    if not (callable(getattr(method, "select", None)) and callable(getattr(method, "start", None))):
        raise ValueError(f"a selector model works with the prompt filters (gemfilter, gemfilter-span, ...), not "
                         f"{method.name}: a {method.kind} method changes the target's own prefill")

    def begin(model, input_ids, valid, tokenizer=None):
        device = next(model.parameters()).device
        selection = method.select(selector, input_ids, None if valid.all() else valid.long(), tokenizer)
        return method.start(model, to_device(selection, device), valid)

    return begin
