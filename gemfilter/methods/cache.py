"""KV-cache baselines: full prefill, then evict the cache to a budget. Decoding keeps original positions.

- SnapKV (Li et al. 2024), as in GemFilter's official copy: the last 32 queries vote with fp32
  softmax attention, kernel-5 pooling over the n - 32 scores before the window (the official copy and
  kvpress pool only those, so the window's own votes never leak into its neighbours), top (k - 32)
  keys plus the window.
- H2O (Zhang et al. 2023), one-shot at prefill: the 32 most recent tokens plus (k - 32) heavy hitters
  ranked by column sums of the prefill softmax, computed blockwise so no n x n matrix is built.
- GemFilter-One-Run (Shi et al. 2024, App. G.4.5): GemFilter's single index set applied to every
  layer's cache after a full prefill.

GQA, a parameter of SnapKV and H2O (``gqa``):

- ``"group-mean"`` (default of ``snapkv`` / ``h2o``; kvpress's convention): scores are averaged over
  each query group, so the cache keeps one index set per KV head and stays at h_kv heads.
- ``"repeat-kv"`` (default of ``snapkv-per-head`` / ``h2o-per-head``; the paper's baselines): as the
  official copies, K/V are repeated to every query head before compressing; each query head keeps
  its own set and the cache holds h heads (see :mod:`gemfilter.methods.per_head`).

Only full-attention layers are evicted: a sliding-window layer already holds at most its window,
and its mask offsets are computed from a token counter that eviction would break. A model with no
full-attention layer is refused for prompts longer than the budget (nothing would be evicted), by
``check_model``, which needs only the config; ``gemfilter.load_model`` drops a window that can never
bind (Phi 3.5's), see :func:`gemfilter.models.drop_unreachable_window`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn.functional as F

from ..attention import STATE_KWARG
from ..continuation import Continuation, NotContinuable, real_rows
from ..selection import decode_mask, last_row_scores, num_layers, pool_scores, sliding_window_of
from .per_head import attend, per_head_layer
from .registry import register
from .spec import CacheMethod

GQA_MODES = ("group-mean", "repeat-kv")


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


def pool_prefix(votes, window: int, kernel: int, pooling: str = "avg"):
    """Pool SnapKV votes over the n - window positions before the observation window only.

    votes (b, h, n) -> (b, h, n): the window's own columns are returned as 0 (they are always kept;
    :func:`keep_indices` never ranks them). Zero padding at both ends of the prefix, as
    ``avg_pool1d(..., padding=kernel // 2)`` on ``votes[..., :-window]`` in the official copy.
    """
    b, h, n = votes.shape
    prefix = votes[..., : n - window].reshape(b * h, 1, n - window)
    pool = F.avg_pool1d if pooling == "avg" else F.max_pool1d
    pooled = pool(prefix, kernel_size=kernel, stride=1, padding=kernel // 2).reshape(b, h, n - window)
    return torch.cat([pooled, votes.new_zeros(b, h, window)], dim=-1)


def held_rows(cache, kept: list) -> list:
    """``kept`` (prompt tokens per row) capped at the most rows any layer of ``cache`` holds: what a cache method that
    evicts reports is what its cache holds (sliding-window layers keep window - 1, whatever the budget)."""
    rows = [int(layer.keys.shape[-2]) for layer in cache.layers if getattr(layer, "keys", None) is not None]
    return [min(k, max(rows)) for k in kept] if rows else kept


def check_gqa(name: str, gqa: str) -> None:
    if gqa not in GQA_MODES:
        raise ValueError(
            f"{name}: gqa must be one of {', '.join(GQA_MODES)} (group-mean: one set per KV head, "
            f"kvpress; repeat-kv: one set per query head, the paper's baselines), got {gqa!r}"
        )


def per_gqa(scores, h_kv: int, gqa: str):
    """(b, h, n) scores -> the rows that get index sets: (b, h_kv, n) group means or (b, h, n) as they are."""
    return group_mean(scores, h_kv) if gqa == "group-mean" else scores


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
        self.prefilled = False
        self.per_head = method.gqa == "repeat-kv"
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
        # Decode steps come here only for per-query-head caches, whose K/V must not be repeated again.
        out = attend(module, query, key, value, attention_mask, kernel, **kwargs)
        # Prefill only (all n queries present); sliding layers are not evicted, so need no plan,
        # except One-Run's filter layer, whose single plan serves every layer.
        if not self.prefilled and (self.method.shared or kwargs.get("sliding_window") is None):
            plan = self.method.plan(module.layer_idx, query, key, self.valid, kwargs.get("scaling") or module.scaling)
            if plan is not None:
                self.plans["shared" if self.method.shared else module.layer_idx] = plan
        return out

    def after_prefill(self, cache):
        self.prefilled = True
        self._evict(cache)
        if not self.skip:  # a budget >= n keeps every token, as full does, and says so
            self.kept = held_rows(cache, self.kept)

    def _evict(self, cache):
        if self.skip:
            return
        shared = self.plans.get("shared")
        for i, layer in enumerate(cache.layers):
            if getattr(layer, "sliding_window", None) is not None:
                continue
            idx = shared if shared is not None else self.plans[i]
            if idx.shape[1] > layer.keys.shape[1]:  # one set per query head: the cache grows to h heads
                cache.layers[i] = per_head_layer(layer, idx, idx.shape[1] // layer.keys.shape[1])
                continue
            idx = idx.expand(-1, layer.keys.shape[1], -1)[..., None].expand(-1, -1, -1, layer.keys.shape[-1])
            layer.keys = layer.keys.gather(2, idx)
            layer.values = layer.values.gather(2, idx)

    def continuation(self) -> Continuation:
        """Decoding keeps original positions (after each row's real tokens) over the evicted rows."""
        if self.per_head:
            raise NotContinuable(
                f"{self.method.name} keeps one set per query head, so its cache holds h heads that "
                "its own attention reads without repeating them"
            )
        real = self.valid.sum(1)
        return Continuation(positions=real, valid=real_rows(self.valid if self.skip else self.kept_mask))

    def decode(self, kwargs, cache, past):
        if self.skip:
            return kwargs
        q = kwargs["input_ids"].shape[1]
        kwargs["attention_mask"] = decode_mask(self.kept_mask, past, q) if self.padded else None
        if self.per_head:
            kwargs[STATE_KWARG] = self  # so attention() reads the h-head cache without repeating it
        return kwargs


class _CacheMethod(CacheMethod):
    window: int = 32
    shared: ClassVar[bool] = False

    def check_model(self, config, prompt_tokens: int) -> None:
        """Refuse what this method cannot run on prompts of ``prompt_tokens`` tokens (padding included)
        under a model's ``config`` (a model or its transformers config: no weights needed, so the eval
        runners call it before loading any).

        A budget must exceed the recent-token window. A prompt longer than the budget needs a
        full-attention layer to evict; when it fits, nothing is evicted and any model will do.
        """
        if self.topk <= self.window:
            raise ValueError(
                f"{self.name}: topk={self.topk} must exceed the window of {self.window} kept recent tokens"
            )
        windows = {sliding_window_of(config, i) for i in range(num_layers(config))}
        if prompt_tokens > self.topk and None not in windows:
            raise ValueError(
                f"{self.name} evicts only full-attention layers, and every layer of this model has a sliding "
                f"window ({', '.join(map(str, sorted(windows)))}), so on prompts longer than topk={self.topk} it "
                "would keep the whole cache and equal `full` while reporting the budget. If the window can never "
                "bind (at least max_position_embeddings, as Phi 3.5's), load the model with gemfilter.load_model, "
                "which drops it; otherwise use a method that selects prompt tokens (gemfilter, gemfilter-span)"
            )

    def begin(self, model, input_ids, valid, tokenizer=None):
        self.check_model(model, input_ids.shape[1])
        return CacheCall(self, model, input_ids, valid)


@register
@dataclass(frozen=True)
class SnapKV(_CacheMethod):
    """SnapKV: observation window of the last ``window`` queries; top (topk - window) per set + the window.

    topk: cache budget per layer; kernel: pooling width; pooling: "avg" (official default) or "max";
    gqa: "group-mean" (one set per KV head, kvpress) or "repeat-kv" (one per query head, the paper's).
    """

    topk: int = 1024
    window: int = 32
    kernel: int = 5
    pooling: str = "avg"
    gqa: str = "group-mean"
    name: ClassVar[str] = "snapkv"
    description: ClassVar[str] = (
        "baseline: last-32-query softmax votes, pool 5, top (k-32) + window; "
        "gqa=group-mean: one set per KV head, cache h_kv heads (kvpress)"
    )

    def __post_init__(self):
        super().__post_init__()
        if self.pooling not in ("avg", "max"):
            raise ValueError(f"{self.name}: pooling must be 'avg' or 'max', got {self.pooling!r}")
        check_gqa(self.name, self.gqa)

    def plan(self, layer_idx, query, key, valid, scaling):
        votes = window_votes(query, key, valid, scaling, self.window)  # (b, h, n)
        pooled = pool_prefix(votes, self.window, self.kernel, self.pooling)
        return keep_indices(per_gqa(pooled, key.shape[1], self.gqa), valid, self.topk, self.window)


@register
@dataclass(frozen=True)
class SnapKVPerHead(SnapKV):
    """SnapKV as the paper's baseline ran it: K/V repeated to every query head, one set per query head."""

    gqa: str = "repeat-kv"
    name: ClassVar[str] = "snapkv-per-head"
    description: ClassVar[str] = (
        "paper's baseline: snapkv with gqa=repeat-kv, one set per query head, cache h heads (official copy)"
    )


@register
@dataclass(frozen=True)
class H2O(_CacheMethod):
    """H2O one-shot at prefill: ``window`` recent tokens + (topk - window) heavy hitters per set.

    block: query block size of the blockwise column sums; gqa: as for :class:`SnapKV`.
    """

    topk: int = 1024
    window: int = 32
    block: int = 256
    gqa: str = "group-mean"
    name: ClassVar[str] = "h2o"
    description: ClassVar[str] = (
        "baseline: 32 recent + (k-32) heavy hitters by blockwise prefill column sums; "
        "gqa=group-mean: one set per KV head (kvpress)"
    )

    def __post_init__(self):
        super().__post_init__()
        check_gqa(self.name, self.gqa)

    def scoring_bytes(self, config, n: int) -> int:
        """Its blockwise column sums hold about 4 fp32 (heads x block x n) tensors per layer (logits, two masked
        copies, softmax) on top of the model's forward."""
        return 4 * config.get_text_config().num_attention_heads * min(self.block, n) * n * 4

    def plan(self, layer_idx, query, key, valid, scaling):
        sums = column_sums(query, key, valid, scaling, self.block)
        return keep_indices(per_gqa(sums, key.shape[1], self.gqa), valid, self.topk, self.window)


@register
@dataclass(frozen=True)
class H2OPerHead(H2O):
    """H2O as the paper's baseline ran it: K/V repeated to every query head, one set per query head."""

    gqa: str = "repeat-kv"
    name: ClassVar[str] = "h2o-per-head"
    description: ClassVar[str] = (
        "paper's baseline: h2o with gqa=repeat-kv, one set per query head, cache h heads (official copy)"
    )


@register
@dataclass(frozen=True)
class OneRun(_CacheMethod):
    """GemFilter-One-Run: GemFilter's index set (filter layer ``layer``) evicts every layer's cache."""

    layer: int | None = None
    topk: int = 1024
    kernel: int = 5
    window: ClassVar[int] = 0  # no always-kept recent window: GemFilter's index set alone
    shared: ClassVar[bool] = True
    name: ClassVar[str] = "gemfilter-one-run"
    description: ClassVar[str] = "ablation (App. G.4.5): full prefill, GemFilter's one index set evicts every layer"

    def plan(self, layer_idx, query, key, valid, scaling):
        if layer_idx != self.layer:
            return None
        pooled = pool_scores(last_row_scores(query, key), valid, self.kernel)
        return keep_indices(pooled[:, None, :], valid, self.topk, 0)  # (b, 1, budget), shared by all heads
