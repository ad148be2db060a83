"""Selection variants of GemFilter: other scores at the filter layer, the same regeneration.

Each is a prompt method built on :class:`gemfilter.methods.prompt._FilterMethod`, so it runs through
``select_tokens``, ``apply()`` and ``gemfilter serve`` as ``gemfilter`` does, and generates from its kept
tokens at positions 0..k-1 (Shi et al. 2024, Algorithm 2 step 5). Only the scores change:

- ``gemfilter-qwin``: every row of the last ``window`` queries votes (SnapKV's observation window, Li et al.
  2024, applied to GemFilter's layer-r selection) instead of the last row alone.
- ``gemfilter-claa``: the last row's softmax scores averaged over the ``layers`` layers ending at r (CLAA,
  McDanel, Li, Khaitan 2026, arXiv 2602.16054: rankings from one layer are unstable across layers).
- ``gemfilter-span-qwin``, ``gemfilter-span-claa``: ``gemfilter-span``'s sentence spans ranked by those scores.
- ``gemfilter-span-qmax``: ``gemfilter-span``'s sentence spans ranked by each token's largest softmax weight
  from any head and any row of the kept question tail (this project's rule, measured in docs/ruler-variants.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from ..selection import filter_pass, sliding_window_of
from .prompt import PaperFilter, SpanFilter, softmax_last_row
from .registry import register


def window_scores(query, key, valid, window: int):
    """Softmax votes of the last ``window`` query rows, summed over those rows and all heads: (b, n).
    Arguments and masking as :func:`window_probs`."""
    return window_probs(query, key, valid, window).sum(dim=(1, 2, 3))


def window_max_scores(query, key, valid, window: int):
    """Each key's largest softmax weight from any head and any of the last ``window`` query rows: (b, n).
    Arguments and masking as :func:`window_probs`. Unlike the sum, a key that one (head, row) attends to
    sharply ranks high even when the other rows look elsewhere (a question naming several keys)."""
    return window_probs(query, key, valid, window).amax(dim=(1, 2, 3))


def window_probs(query, key, valid, window: int):
    """Softmax of each of the last ``window`` query rows over the keys, per head: (b, h_kv, g, w, n).

    query: (b, h, t, d) post-RoPE, the rows of the last t of the n positions (t = n in one pass; a cached pass
    may give fewer, at least the window's); key: (b, h_kv, n, d) post-RoPE, h = g * h_kv (GQA: each query head
    reads its group's key head); valid: (b, n) bool, False on left padding. Row i of the window sits at position
    n - w + i and sees keys 0..n - w + i (causal), so the window's own tokens are scored too. Logits are
    fp32 and scaled by 1/sqrt(d), as ``gemfilter-span``'s last-row softmax. A padding row (a prompt shorter
    than the window) casts no vote; padding keys get zero weight.
    """
    b, h, t, d = query.shape
    h_kv, n = key.shape[1], key.shape[2]
    w = min(window, n)
    if t < w:
        raise ValueError(
            f"window scores need the last {w} query rows, got {t}: a cached pass must keep the rows "
            "of the tokens before (gemfilter.selection.QueryTail)"
        )
    q = query[:, :, t - w :, :].float().reshape(b, h_kv, h // h_kv, w, d)
    logits = torch.einsum("bkgwd,bknd->bkgwn", q, key.float()) / d**0.5
    rows = torch.arange(n - w, n, device=query.device)[:, None]
    allowed = (torch.arange(n, device=query.device)[None, :] <= rows)[None] & valid[:, None, :]  # (b, w, n)
    logits = logits.masked_fill(~allowed[:, None, None], float("-inf"))
    # a padding row allows no key, so its softmax is NaN: masked_fill (not a product) clears it
    return logits.softmax(-1).masked_fill(~valid[:, None, None, n - w :, None], 0.0)


@register
@dataclass(frozen=True)
class GemFilterQWin(PaperFilter):
    """Question-window GemFilter: layer r's softmax over the prefix from each of the last ``window`` query
    rows (the question), summed over rows and heads, avg-pooled, top-k kept in their original order.

    Paper: Shi et al. 2024 (Algorithm 2) with SnapKV's observation window (Li et al. 2024) as the scorer.
    layer: 0-based filter layer (None: the model's default); topk: tokens kept; kernel: odd avg-pool width
    (1: none); window: query rows that vote (the last ``window`` tokens, capped at the prompt's length).
    """

    window: int = 16
    name: ClassVar[str] = "gemfilter-qwin"
    description: ClassVar[str] = (
        "variant: softmax votes of the last 16 query rows (SnapKV-style window) at the "
        "filter layer, summed over rows and heads, avg-pool 5, top-k, regenerate"
    )
    # it reads rows before the last, which a cache of the earlier turns does not hold: a QueryTail keeps them
    scores_last_row: ClassVar[bool] = False

    @property
    def query_rows(self) -> int:
        return self.window

    def score(self, query, key, valid):
        return window_scores(query, key, valid, self.window)

    def cached_scores(self, model, new_ids, cache, valid, tail=None):
        return window_cached_scores(self, model, new_ids, cache, valid, tail)


def window_cached_scores(method, model, new_ids, cache, valid, tail):
    """A window method's raw scores on a cached pass: the new tokens' query rows at the filter layer, after the
    earlier ones ``tail`` (a :class:`gemfilter.selection.QueryTail`) kept, score every key the cache holds."""
    return filter_pass(
        model,
        new_ids,
        torch.ones_like(new_ids),
        method.layer,
        lambda q, k: method.score(tail.extend(method.layer, q), k, valid),
        cache=cache,
    )


def claa_layers(model, layer: int, count: int) -> list:
    """The layers whose scores ``gemfilter-claa`` averages: the ``count`` layers ending at ``layer`` (clamped
    at 0), less the sliding-window ones before ``layer`` (their q.k beyond the window is no learned signal;
    the filter layer itself always counts, as in ``gemfilter``)."""
    return [i for i in range(max(0, layer - count + 1), layer + 1) if i == layer or sliding_window_of(model, i) is None]


@register
@dataclass(frozen=True)
class GemFilterCLAA(PaperFilter):
    """Cross-layer GemFilter: the last query row's softmax (per head over the prefix, summed over heads) at
    each of the ``layers`` layers ending at r, averaged over those layers, avg-pooled, top-k in order.

    Paper: McDanel, Li, Khaitan 2026, "CLAA: Cross-Layer Attention Aggregation for Accelerating LLM Prefill"
    (arXiv 2602.16054): rankings from a single layer degrade sharply at some layers; aggregating scores across
    layers fixes it. Only its abstract was readable here, so the aggregation is the plain mean of per-layer
    normalised scores (softmax: every layer's row sums to h, so no layer dominates by its logit scale).
    layer: the last layer averaged, where the pass stops (None: the model's default); layers: how many layers
    end at it (1: ``gemfilter`` with softmax scores); topk, kernel: as ``gemfilter``.
    """

    layers: int = 4
    own_score_pass: ClassVar[bool] = True
    name: ClassVar[str] = "gemfilter-claa"
    description: ClassVar[str] = (
        "variant (CLAA): last-row softmax averaged over the 4 layers ending at the filter "
        "layer (sliding ones skipped), avg-pool 5, top-k, regenerate"
    )
    # its score is the pass below, not the filter layer's alone (every layer it reads holds the last row)
    scores_last_row: ClassVar[bool] = False

    def score(self, query, key, valid):
        return softmax_last_row(query, key, valid)

    def score_pass(self, model, input_ids, mask, layer, valid):
        return claa_scores(model, input_ids, mask, layer, valid, self.layers)

    def cached_scores(self, model, new_ids, cache, valid, tail=None):
        return claa_scores(model, new_ids, torch.ones_like(new_ids), self.layer, valid, self.layers, cache=cache)


def claa_scores(model, input_ids, mask, layer, valid, count, cache=None):
    """One filter pass to ``layer`` r; the last-row softmax (summed over heads) of each of :func:`claa_layers`,
    meaned over them: (b, n). input_ids, mask: (b, n); valid: (b, n) bool. With a ``cache`` of the earlier tokens'
    layers 0..r, input_ids are the new tokens (b, t) and valid spans every token: the last row is a new one."""
    wanted = set(claa_layers(model, layer, count))
    seen = []

    def observe(idx, query, key):
        if idx in wanted:
            seen.append(softmax_last_row(query, key, valid))

    last = filter_pass(
        model, input_ids, mask, layer, lambda q, k: softmax_last_row(q, k, valid), observe=observe, cache=cache
    )
    return torch.stack(seen + [last]).mean(0)


@register
@dataclass(frozen=True)
class GemFilterSpanQWin(SpanFilter):
    """``gemfilter-span`` with the question-window scores: sentences ranked by their best token's summed
    softmax votes from the last ``window`` query rows (see :func:`window_scores`); sink and tail kept as
    ``gemfilter-span``. Parameters as ``gemfilter-span``, plus ``window``."""

    window: int = 16
    name: ClassVar[str] = "gemfilter-span-qwin"
    description: ClassVar[str] = (
        "variant: gemfilter-span's whole sentences, ranked by the votes of the last 16 "
        "query rows instead of the last row"
    )
    scores_last_row: ClassVar[bool] = False

    @property
    def query_rows(self) -> int:
        return self.window

    def score(self, query, key, valid):
        return window_scores(query, key, valid, self.window)

    def cached_scores(self, model, new_ids, cache, valid, tail=None):
        return window_cached_scores(self, model, new_ids, cache, valid, tail)


@register
@dataclass(frozen=True)
class GemFilterSpanCLAA(SpanFilter):
    """``gemfilter-span`` with CLAA's scores: sentences ranked by their best token's last-row softmax averaged
    over the ``layers`` layers ending at r (see :class:`GemFilterCLAA`). Parameters as ``gemfilter-span``,
    plus ``layers``."""

    layers: int = 4
    own_score_pass: ClassVar[bool] = True
    name: ClassVar[str] = "gemfilter-span-claa"
    description: ClassVar[str] = (
        "variant: gemfilter-span's whole sentences, ranked by the last-row softmax "
        "averaged over the 4 layers ending at the filter layer"
    )
    scores_last_row: ClassVar[bool] = False

    def score_pass(self, model, input_ids, mask, layer, valid):
        return claa_scores(model, input_ids, mask, layer, valid, self.layers)

    def cached_scores(self, model, new_ids, cache, valid, tail=None):
        return claa_scores(model, new_ids, torch.ones_like(new_ids), self.layer, valid, self.layers, cache=cache)


@register
@dataclass(frozen=True)
class GemFilterSpanQMax(SpanFilter):
    """``gemfilter-span`` ranked by the question's sharpest look: each token scores its largest softmax weight
    from any head and any of the last ``window`` query rows (see :func:`window_max_scores`); sentences are
    ranked by their best token, sink and tail kept as ``gemfilter-span``.

    This project's rule, not a paper's: the window's rows are GemFilter's layer-r attention (Shi et al. 2024)
    from SnapKV's observation window (Li et al. 2024), reduced by max instead of SnapKV's sum, so that each key
    a multi-key question names can pull in its own sentence. Parameters as ``gemfilter-span``, plus
    ``window`` (default 48: the ``tail`` that is always kept, the question and the answer prefix).
    """

    window: int = 48
    name: ClassVar[str] = "gemfilter-span-qmax"
    description: ClassVar[str] = (
        "improvement: gemfilter-span's whole sentences, ranked by each token's largest "
        "softmax weight from any head and any of the last 48 query rows"
    )
    scores_last_row: ClassVar[bool] = False

    @property
    def query_rows(self) -> int:
        return self.window

    def score(self, query, key, valid):
        return window_max_scores(query, key, valid, self.window)

    def cached_scores(self, model, new_ids, cache, valid, tail=None):
        return window_cached_scores(self, model, new_ids, cache, valid, tail)
