"""A draft selector: GemFilter's selection on a smaller model, generation on the target.

SpecPrefill's idea (Liu et al. 2025, "Speculative Prefill": a small model with the target's tokenizer rates
the prompt's tokens, the target prefills only the kept ones) with GemFilter's renumbering (Shi et al. 2024,
Algorithm 2 step 5: the kept tokens sit at positions 0..k-1). The filter pass runs layers 0..r of the
draft; the target never sees the dropped tokens. Token ids pass from one model to the other unchanged, so
both must share a tokenizer; the vocabulary sizes are checked (a necessary condition: two tokenizers with
one size may still differ, which no config shows).
"""

from __future__ import annotations

from .selection import check_selector, to_device, vocab_size  # noqa: F401 (the draft's checks live with the selection)


def drafted_begin(method, selector):
    """``method.begin`` with the selection made on ``selector``: a prompt filter's ``select`` on the draft, then
    its ``start`` on the target (the generate call's model). method: a resolved prompt filter (its ``layer``
    is the draft's)."""
    if not method.separable:
        raise ValueError(
            f"a selector model works with the prompt filters (gemfilter, gemfilter-span, ...), not "
            f"{method.name}: a {method.kind} method changes the target's own prefill"
        )

    def begin(model, input_ids, valid, tokenizer=None):
        device = next(model.parameters()).device
        selection = method.select(selector, input_ids, None if valid.all() else valid.long(), tokenizer)
        return method.start(model, to_device(selection, device), valid)

    return begin
