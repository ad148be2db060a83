"""KV-cache baselines: full prefill, then evict the cache to a budget. Decoding keeps original positions.

- SnapKV (Li et al. 2024), as in GemFilter's official copy: the last 32 queries vote with fp32
  softmax attention, kernel-5 pooling, top (k - 32) keys per KV head plus the window.
- H2O (Zhang et al. 2023), one-shot at prefill: the 32 most recent tokens plus (k - 32) heavy hitters
  ranked by column sums of the prefill softmax, computed blockwise so no n x n matrix is built.
- GemFilter-One-Run (Shi et al. 2024, App. G.4.5): GemFilter's single index set applied to every
  layer's cache after a full prefill.

GQA: scores are averaged over each query group, so the cache keeps one index set per KV head and
stays at the KV-head count (the official copy repeats KV heads before caching; we do not).
Only full-attention layers are evicted: a sliding-window layer already holds at most its window,
and its mask offsets are computed from a token counter that eviction would break.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn.functional as F

from ..attention import STATE_KWARG
from ..selection import decode_mask, last_row_scores, pool_scores
from .registry import register


def keep_indices(scores, valid, budget: int, keep_last: int):
    """Sorted kept positions per row and head: top (budget - keep_last) of the first n - keep_last
    positions, plus the last ``keep_last``. Rows with no more than ``budget`` real tokens keep the
    last ``budget`` positions (all real tokens, padding first), the same for every head.

    scores: (b, H, n); valid: (b, n) bool. Returns (b, H, budget) long.
    """
    b, heads, n = scores.shape
    tail = torch.arange(n - keep_last, n, device=scores.device).expand(heads, keep_last)
    out = []
    for i in range(b):
        if int(valid[i].sum()) <= budget:
            idx = torch.arange(n - budget, n, device=scores.device).expand(heads, budget)
        else:
            s = scores[i, :, : n - keep_last].masked_fill(~valid[i, : n - keep_last], float("-inf"))
            idx = torch.cat([s.topk(budget - keep_last, dim=-1).indices, tail], dim=-1)
        out.append(idx.sort(-1).values)
    return torch.stack(out)


def _grouped(query, key):
    """query (b, h, q, d) -> (b, h_kv, g, q, d) float32; key -> float32."""
    b, h, q, d = query.shape
    h_kv = key.shape[1]
    return query.float().reshape(b, h_kv, h // h_kv, q, d), key.float()


def window_votes(query, key, valid, scaling: float, window: int):
    """SnapKV votes: sum over the last ``window`` queries of softmax(q k^T * scaling), fp32, causal.

    Returns (b, h, n). Padding keys get no weight.
    """
    n = key.shape[2]
    q, k = _grouped(query[:, :, -window:], key)
    logits = torch.einsum("bkgwd,bknd->bkgwn", q, k) * scaling
    qpos = torch.arange(n - window, n, device=key.device)
    blocked = torch.arange(n, device=key.device)[None, :] > qpos[:, None]  # (w, n): future keys
    logits = logits.masked_fill(blocked, float("-inf"))
    logits = logits.masked_fill(~valid[:, None, None, None, :], float("-inf"))
    votes = logits.softmax(-1).sum(3)  # (b, h_kv, g, n)
    return votes.reshape(votes.shape[0], -1, n)


def column_sums(query, key, valid, scaling: float, block: int = 256):
    """H2O accumulated attention: column sums of the causal prefill softmax, in query blocks.

    query (b, h, n, d), key (b, h_kv, n, d), valid (b, n). Memory is O(b h block n), never n x n.
    Padding queries contribute nothing and padding keys get no weight. Returns (b, h, n) float32.
    """
    if block < 1:
        raise ValueError(f"block must be >= 1, got {block}")
    b, h, n, d = query.shape
    q, k = _grouped(query, key)
    total = torch.zeros(q.shape[:3] + (n,), device=key.device)
    keys = torch.arange(n, device=key.device)
    for s in range(0, n, block):
        e = min(s + block, n)
        logits = torch.einsum("bkgqd,bknd->bkgqn", q[:, :, :, s:e], k) * scaling
        logits = logits.masked_fill(keys[None, :] > torch.arange(s, e, device=key.device)[:, None], float("-inf"))
        logits = logits.masked_fill(~valid[:, None, None, None, :], float("-inf"))
        # A left-padding query sees only padding keys, so its row is all -inf and softmax gives NaN:
        # zeroing NaN is exactly "padding queries contribute nothing".
        total += torch.nan_to_num(logits.softmax(-1), nan=0.0).sum(3)
    return total.reshape(b, h, n)


def group_mean(scores, h_kv: int):
    """(b, h, n) -> (b, h_kv, n): average each GQA query group."""
    b, h, n = scores.shape
    return scores.reshape(b, h_kv, h // h_kv, n).mean(2)


class CacheCall:
    """Full prefill; each full-attention layer records a keep plan; the cache is evicted after prefill."""

    selection = None

    def __init__(self, method, model, input_ids, valid):
        self.method, self.valid, self.budget = method, valid, method.topk
        b, self.n = input_ids.shape
        self.skip = self.n <= self.budget
        self.plans = {}
        real = valid.sum(1)
        self.kept = [int(r) if self.skip else min(int(r), self.budget) for r in real]
        self.padded = not bool(valid.all())
        slots = torch.arange(self.budget, device=valid.device)
        self.kept_mask = (slots[None, :] >= self.budget - real.clamp(max=self.budget)[:, None]).long()
        cfg = model.config.get_text_config()
        if self.padded and not self.skip and getattr(cfg, "sliding_window", None) is not None:
            raise ValueError(
                f"{method.name} on a left-padded batch is not supported for models with sliding-window layers "
                "(their cache keeps original positions, the evicted layers do not): run the rows one at a time"
            )

    def prefill(self, kwargs, cache):
        if not self.skip:
            kwargs[STATE_KWARG] = self
        return kwargs

    def attention(self, module, query, key, value, attention_mask, kernel, **kwargs):
        out = kernel(module, query, key, value, attention_mask, **kwargs)
        # Prefill only (all n queries present); sliding layers are not evicted, so need no plan,
        # except One-Run's filter layer, whose single plan serves every layer.
        if query.shape[2] == self.n and (self.method.shared or kwargs.get("sliding_window") is None):
            plan = self.method.plan(module.layer_idx, query, key, self.valid, kwargs.get("scaling") or module.scaling)
            if plan is not None:
                self.plans["shared" if self.method.shared else module.layer_idx] = plan
        return out

    def after_prefill(self, cache):
        if self.skip:
            return
        shared = self.plans.get("shared")
        for i, layer in enumerate(cache.layers):
            if getattr(layer, "sliding_window", None) is not None:
                continue
            idx = shared if shared is not None else self.plans[i]
            idx = idx.expand(-1, layer.keys.shape[1], -1)[..., None].expand(-1, -1, -1, layer.keys.shape[-1])
            layer.keys = layer.keys.gather(2, idx)
            layer.values = layer.values.gather(2, idx)

    def decode(self, kwargs, cache, past):
        if self.skip:
            return kwargs
        q = kwargs["input_ids"].shape[1]
        kwargs["attention_mask"] = decode_mask(self.kept_mask, past, q) if self.padded else None
        return kwargs


class _CacheMethod:
    window: int = 32
    shared: ClassVar[bool] = False

    def begin(self, model, input_ids, valid, tokenizer=None):
        if self.topk <= self.window:
            raise ValueError(f"{self.name}: topk={self.topk} must exceed the window of {self.window} kept recent tokens")
        return CacheCall(self, model, input_ids, valid)


@register
@dataclass(frozen=True)
class SnapKV(_CacheMethod):
    """SnapKV: observation window of the last ``window`` queries; top (topk - window) per KV head.

    topk: cache budget per layer; kernel: pooling width; pooling: "avg" (official default) or "max".
    """

    topk: int = 1024
    window: int = 32
    kernel: int = 5
    pooling: str = "avg"
    name: ClassVar[str] = "snapkv"
    description: ClassVar[str] = "baseline: last-32-query softmax votes, pool 5, top (k-32) per KV head + window"

    def __post_init__(self):
        if self.pooling not in ("avg", "max"):
            raise ValueError(f"pooling must be 'avg' or 'max', got {self.pooling!r}")

    def plan(self, layer_idx, query, key, valid, scaling):
        votes = window_votes(query, key, valid, scaling, self.window)  # (b, h, n)
        b, h, n = votes.shape
        x = votes.reshape(b * h, 1, n)
        pool = F.avg_pool1d if self.pooling == "avg" else F.max_pool1d
        x = pool(x, kernel_size=self.kernel, stride=1, padding=self.kernel // 2).reshape(b, h, n)
        return keep_indices(group_mean(x, key.shape[1]), valid, self.topk, self.window)


@register
@dataclass(frozen=True)
class H2O(_CacheMethod):
    """H2O one-shot at prefill: ``window`` recent tokens + (topk - window) heavy hitters per KV head.

    block: query block size of the blockwise column sums.
    """

    topk: int = 1024
    window: int = 32
    block: int = 256
    name: ClassVar[str] = "h2o"
    description: ClassVar[str] = "baseline: 32 recent + (k-32) heavy hitters by blockwise prefill column sums"

    def plan(self, layer_idx, query, key, valid, scaling):
        sums = column_sums(query, key, valid, scaling, self.block)
        return keep_indices(group_mean(sums, key.shape[1]), valid, self.topk, self.window)


@register
@dataclass(frozen=True)
class OneRun(_CacheMethod):
    """GemFilter-One-Run: GemFilter's index set (filter layer ``layer``) evicts every layer's cache."""

    layer: int | None = None
    topk: int = 1024
    kernel: int = 5
    window: int = 0
    shared: ClassVar[bool] = True
    name: ClassVar[str] = "gemfilter-one-run"
    description: ClassVar[str] = "ablation (App. G.4.5): full prefill, GemFilter's one index set evicts every layer"

    def plan(self, layer_idx, query, key, valid, scaling):
        if layer_idx != self.layer:
            return None
        pooled = pool_scores(last_row_scores(query, key), valid, self.kernel)
        return keep_indices(pooled[:, None, :], valid, self.topk, 0)  # (b, 1, budget), shared by all heads
