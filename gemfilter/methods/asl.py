"""ASL's adaptive selection layer in front of GemFilter's regeneration (``gemfilter-asl``).

Paper: Taniguchi, Dong, Onizuka, Xiao 2026, "ASL: Adaptive Layer Selection for Layer-Wise Token Pruning in
LLM Inference" (arXiv 2601.07667); written from the official code (TANIGUCHIREI/ASL:
``baseline/asl/customized_cache.py`` ``sum_attn_cache`` and ``selecting_select_layer``,
``adaptive_select_layer_utils.relative_normalized_variance``, and the two-pass GemFilter use of them,
``baseline/gemfilter/gemfilter_utils.get_layer_context_asl``, which its scripts call "ASL_2pass").

Every layer from the first on ranks the prompt's tokens (SnapKV-style window votes); from layer ``layer``
(L_min) on, the ranks of the last ``layers`` layers (L_obs) are compared on the union of their top sets:
their variance across layers, relative to its value at L_min, falls below ``threshold`` (tau) once the
ranking has settled, and that layer selects. The pass stops there, inside the layer's attention.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from ..attention import FilterLayerReached
from ..selection import filter_pass, num_layers, pool_scores, topk_sorted
from .prompt import PaperFilter
from .registry import register
from .variants import window_scores


def prefix_ranks(query, key, valid, window: int, kernel: int):
    """(pooled (b, n), ranks (b, n)): the window's summed softmax votes on the prefix (the tokens before the
    last ``window``), avg-pooled per row over the prefix alone, and their descending ranks 1, 2, ... among the
    row's real prefix tokens (the window and padding rank last, as n + 1).

    query (b, h, n, d), key (b, h_kv, n, d) post-RoPE; valid (b, n) bool. Official ``sum_attn_cache``: logits of
    the last ``window`` queries / sqrt(d), causal inside the window, fp32 softmax, summed over the window rows,
    prefix columns only, ``avg_pool1d`` (kernel, zero padding) per head, summed over heads (pooling is linear,
    so summing first gives the same), ranked by ``argsort(descending)``.
    """
    n = valid.shape[1]
    w = min(window, n)
    votes = window_scores(query, key, valid, w)
    prefix = valid.clone()
    prefix[:, n - w :] = False
    pooled = pool_scores(votes, prefix, kernel)  # -inf off the prefix
    order = pooled.argsort(dim=1, descending=True)
    ranks = torch.empty_like(order)
    ranks.scatter_(1, order, torch.arange(1, n + 1, device=order.device).expand_as(order))
    ranks = ranks.float().masked_fill(~prefix, float(n + 1))
    return pooled, ranks


def rank_variance(history: torch.Tensor, count: int) -> torch.Tensor:
    """Official ``relative_normalized_variance`` before the division: the mean over layers and tokens of the
    squared deviation of each token's rank from its mean over the layers, on the union of every layer's top
    ``count`` (smallest ranks). history: (L_obs, p) ranks of one row's p prefix tokens. Returns a scalar."""
    top = torch.topk(history, k=count, dim=-1, largest=False).indices.reshape(-1).unique()
    x = history[:, top]
    return ((x - x.mean(0)) ** 2).mean()


@register
@dataclass(frozen=True)
class GemFilterASL(PaperFilter):
    """GemFilter at an adaptive layer (ASL, two-pass): select where the token ranking has stopped changing.

    Paper: Taniguchi et al. 2026 (arXiv 2601.07667), official TANIGUCHIREI/ASL (see the module docstring).
    layer: L_min, the first layer that may select (None: the model's GemFilter layer; the official scripts use
    10 on Llama 3.1 8B); layers: L_obs, layers whose ranks are compared (official 8); threshold: tau, the
    relative variance that triggers selection (official 0.3); window: query rows that vote (official 32);
    kernel: avg-pool width (official 7); topk: tokens kept, ``topk - window`` by rank plus the window.
    If no layer triggers, the last layer selects.
    """

    layers: int = 8
    threshold: float = 0.3
    window: int = 32
    kernel: int = 7
    own_score_pass: ClassVar[bool] = True
    name: ClassVar[str] = "gemfilter-asl"
    description: ClassVar[str] = (
        "variant (ASL): the filter layer chosen per prompt, where the rank variance of "
        "the window votes over 8 layers drops below 0.3 of L_min's; top-k + window"
    )
    scores_last_row: ClassVar[bool] = False
    scores_sliding_layers: ClassVar[bool] = True  # it ranks at every layer, windowed ones included

    def __post_init__(self):
        super().__post_init__()
        if self.topk <= self.window:
            raise ValueError(f"{self.name}: topk={self.topk} must exceed window={self.window} (the window is kept)")
        if not self.threshold > 0:
            raise ValueError(f"{self.name}: threshold={self.threshold} must be > 0")

    def score(self, query, key, valid):  # pragma: no cover - score_pass replaces the one-layer pass
        return prefix_ranks(query, key, valid, self.window, self.kernel)[0]

    @property
    def query_rows(self) -> int:
        return self.window

    def cached_scores(self, model, new_ids, cache, valid, tail=None):
        """On a cached pass the new tokens run through every layer (the chosen one differs between turns, so the
        cache keeps them all), each layer's window rows after the earlier ones ``tail`` kept."""
        return self.score_pass(model, new_ids, torch.ones_like(new_ids), self.layer, valid, cache=cache, tail=tail)

    def score_pass(self, model, input_ids, mask, layer, valid, cache=None, tail=None):
        """Layers 0.. until every row has chosen its layer (or the last layer); returns (scores (b, n), layers):
        each row's pooled prefix scores at its layer with +inf on the window (always kept), and the layers.
        cache, tail: a cached pass (see :meth:`cached_scores`), which runs to the last layer."""
        b, n = valid.shape
        last = num_layers(model) - 1
        history, base = [], [None] * b
        chosen, scores = [None] * b, torch.full((b, n), float("-inf"), device=valid.device)
        w = min(self.window, n)

        def observe(idx, query, key):
            if tail is not None:
                query = tail.extend(idx, query)
            pooled, ranks = prefix_ranks(query, key, valid, self.window, self.kernel)
            history.append(ranks)
            for r in range(b):
                if chosen[r] is not None:
                    continue
                prefix = valid[r].clone()
                prefix[n - w :] = False
                p = int(prefix.sum())
                if idx >= layer and p > 0:
                    stack = torch.stack([h[r, prefix] for h in history[max(0, idx - self.layers + 1) :]])
                    var = rank_variance(stack, min(self.topk - self.window, p))
                    if base[r] is None:  # L_min sets the scale (official: ratio 1 there, so never selects)
                        base[r] = var
                    elif var / base[r] < self.threshold if base[r] > 0 else True:
                        chosen[r] = idx
                if chosen[r] is None and (idx == last or p == 0):
                    chosen[r] = idx  # no layer triggered: the last one selects (nothing to rank: keep all)
                if chosen[r] is not None:
                    scores[r] = pooled[r].masked_fill(valid[r] & ~prefix, float("inf"))
            if all(c is not None for c in chosen) and cache is None:
                raise FilterLayerReached(None)

        filter_pass(model, input_ids, mask, last, lambda q, k: observe(last, q, k), observe=observe, cache=cache)
        return scores, chosen

    def pick(self, raw, valid, input_ids, tokenizer):
        return topk_sorted(raw, valid, self.topk), raw
