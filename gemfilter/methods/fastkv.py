"""FastKV: token-selective propagation (TSP) with a KV budget set apart from it.

Paper: Jo, Song, Kim, Kim 2025, "FastKV: Decoupling of Context Reduction and KV Cache Compression for
Prefill-Decoding Acceleration", arXiv 2502.01068; official code dongwonjo/FastKV (``FastKVCluster.update_kv``
in ``baselines/fastkv/utils.py``, v1 defaults in ``eval/longbench/main.py``).

What the official code does, and what this module does the same way:

- Every layer up to and including the TSP layer ``layer`` runs on all n prompt tokens.
- Scores, at every layer: the last ``window`` (8) post-RoPE queries, K repeated to every query head,
  fp32 softmax over all keys (causal inside the window), summed over the window's queries, on the n - 8
  columns before the window only, then 1-D pooling (kernel 7, ``avg``) per query head.
- KV cache of each layer: scores summed over each GQA group (one set per KV head); the top
  (``topk`` - 8) plus the 8 window tokens are stored. A layer compresses only if it sees at least
  ``topk`` tokens (official: ``q_len >= max_capacity_prompt``); the layer's own attention uses all of them.
- TSP: the TSP layer's scores summed over all heads; the top (``tsp_len`` - 8) plus the window, in order.
  Only those tokens' hidden states (the TSP layer's output) go on through the later layers, at their
  **original position ids** (RoPE recomputed from them). It fires when n > ``tsp_len`` (and, as in the
  official code, only in a layer that compresses, n >= ``topk``).
- Later layers compress their own cache again to ``topk`` over the propagated tokens.
- Decoding continues at the true absolute positions n, n+1, ...

How it runs through the attention seam (no model code copied, no forward patched), and what it costs:

1. Pass 1 (in ``begin``): the base model on all n tokens, stopped inside the TSP layer's attention once
   its query and key exist. The wrapper keeps every early layer's K/V (n tokens) and keep plan.
2. Pass 2 (generate's prefill forward): the model on the ``tsp_len`` kept tokens at their original
   positions. In layers <= TSP layer each kept query attends to pass 1's K/V of all n tokens, so its
   hidden state equals the full-context one; later layers attend among the kept tokens. Masks are built
   here from positions (causal, and sliding windows measured in original positions).
3. After the prefill, early layers store their plan's rows of pass 1's K/V (sliding layers: the last
   window - 1 tokens, as plain generation), later layers their plan's rows of the propagated K/V.

The price of the seam: layers 0..TSP run again on the kept tokens (pass 2), a prompt cost of
(r+1)/m * k/n beyond FastKV's own (r+1)/m + (1 - (r+1)/m) * k/n; ``gemfilter bench`` prints both.
Scores follow the official casts by default (``score_dtype="model"``): logits in the model's dtype, the
softmax in fp32 cast back, the window sum, pooling and GQA/head sums in the model's dtype. In fp16/bf16 that
decides ties and near-ties differently from an all-fp32 computation, which ``score_dtype="fp32"`` keeps as a
named choice (the two agree in fp32). Other differences from the official code:
the temperature is the model's own attention scaling (official: 1/sqrt(head_dim), the same on
Llama/Mistral/Qwen/Gemma 3), and left-padded batches are refused when TSP fires.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from ..attention import STATE_KWARG, FilterLayerReached, wrapped_attention
from ..continuation import Continuation, NotContinuable
from ..selection import Selection, check_mask_kernel, layer_windows, num_layers, position_mask, sliding_window_of
from .cache import CacheCall, group_mean, held_rows, keep_indices, pool_prefix, window_votes
from .registry import register
from .spec import CacheMethod

SCORE_DTYPES = ("model", "fp32")


def window_votes_official(query, key, valid, scaling: float, window: int):
    """FastKV's window votes with the official casts: (b, h, n) in the model's dtype.

    query (b, h, n, d) and key (b, h_kv, n, d) in the model's dtype; K repeated to every query head, logits
    (last ``window`` queries) in that dtype, future keys inside the window masked, softmax in fp32 cast back,
    summed over the window's queries in that dtype. Padding keys get no weight (the official code has none).
    """
    n = key.shape[2]
    k = key.repeat_interleave(query.shape[1] // key.shape[1], dim=1)
    # Official: "/ math.sqrt(head_dim)"; dividing by 1/scaling gives that same divisor for the usual scaling.
    logits = torch.matmul(query[:, :, -window:], k.transpose(2, 3)) / (1.0 / scaling)
    qpos = torch.arange(n - window, n, device=key.device)
    blocked = torch.arange(n, device=key.device)[None, :] > qpos[:, None]  # (w, n): future keys
    logits = logits.masked_fill(blocked | ~valid[:, None, None, :], float("-inf"))
    weights = torch.softmax(logits, dim=-1, dtype=torch.float32).to(query.dtype)
    return weights.sum(dim=-2)


def group_sum(scores, h_kv: int):
    """(b, h, n) -> (b, h_kv, n): the official GQA reduction, a sum over each query group in its dtype."""
    b, h, n = scores.shape
    return scores.reshape(b, h_kv, h // h_kv, n).sum(2)


def tsp_default_layer(model) -> int:
    """FastKV's TSP layer: the first full-attention layer at or after m/2 - 1. That is the official choice
    for Llama 3.1 8B (15 of 32), Ministral 8B (17 of 36) and Mistral Nemo 12B (19 of 40); model: a model
    or its config."""
    m = num_layers(model)
    start = max(m // 2 - 1, 0)
    for layer in range(start, m):
        if sliding_window_of(model, layer) is None:
            return layer
    return start


class FastKVCall:
    """Per-call state of a FastKV prefill whose TSP fires (see the module docstring for the passes).

    input_ids (b, n) without padding. After ``begin``: ``selection.indices`` the propagated positions,
    ``plans`` {layer: (b, h_kv, topk) kept rows} for every full-attention layer that compresses.
    """

    def __init__(self, method, model, input_ids):
        b, self.n = input_ids.shape
        self.method = method
        self.tsp = method.layer
        self.windows = layer_windows(model)
        self.stored, self.plans, self.masks = {}, {}, {}
        self.mode = "pass1"
        device = input_ids.device
        with wrapped_attention(model), torch.no_grad():
            try:
                model.base_model(
                    input_ids=input_ids,
                    position_ids=torch.arange(self.n, device=device).expand(b, -1),
                    use_cache=False,
                    **{STATE_KWARG: self},
                )
            except FilterLayerReached as stop:
                self.kept_idx, scores = stop.payload
            else:
                raise TypeError(
                    f"{type(model).__name__} finished the forward pass without reaching TSP layer "
                    f"{self.tsp}'s attention: it does not pass keyword arguments to its attention kernel"
                )
        self.ids = input_ids.gather(1, self.kept_idx)
        self.selection = Selection(indices=list(self.kept_idx), scores=scores, layer=self.tsp, kept_ids=list(self.ids))
        self.kept = [min(self.n, method.topk)] * b
        self.decoded = self.kept_idx.new_zeros((b, 0))

    def prefill(self, kwargs, cache):
        self.mode = "pass2"
        kwargs["input_ids"] = self.ids
        kwargs["attention_mask"] = None  # masks come from positions, in attention()
        kwargs["position_ids"] = self.kept_idx
        kwargs[STATE_KWARG] = self
        return kwargs

    def attention(self, module, query, key, value, attention_mask, kernel, **kwargs):
        i = module.layer_idx
        scaling = kwargs.get("scaling") or module.scaling
        window = self.windows[i]
        if self.mode == "pass1":
            self.stored[i] = (key, value)
            valid = torch.ones(key.shape[0], key.shape[2], dtype=torch.bool, device=key.device)
            compresses = window is None and self.n > self.method.topk
            if compresses or i == self.tsp:  # the TSP layer's scores serve its cache plan and TSP alike
                pooled = self.method.scores(query, key, valid, scaling)
                if compresses:
                    self.plans[i] = self.method.keep_plan(pooled, key.shape[1], valid)
                if i == self.tsp:
                    raise FilterLayerReached(self.method.propagate(pooled, key.shape[1], valid))
            return kernel(module, query, key, value, attention_mask, **kwargs)
        if self.mode == "pass2":
            if i <= self.tsp:  # kept queries against the full context's K/V (pass 1)
                key, value = self.stored[i]
                k_pos = torch.arange(self.n, device=key.device)[None]
            else:
                k_pos = self.kept_idx
                if window is None and key.shape[2] > self.method.topk:
                    valid = torch.ones(key.shape[0], key.shape[2], dtype=torch.bool, device=key.device)
                    self.plans[i] = self.method.plan(i, query, key, valid, scaling)
            stage = (i <= self.tsp, window)  # every layer of a stage and window has the same mask: build it once
            if stage not in self.masks:
                self.masks[stage] = position_mask(self.kept_idx, k_pos, window, query.dtype)
            return kernel(module, query, key, value, self.masks[stage], **kwargs)
        # decode: full layers see every stored key (causal among the new ones); sliding layers by positions.
        # Layers of one stage, window and cache length share a mask: built once per step (cleared in decode()).
        q, L = query.shape[2], key.shape[2]
        stage = (i <= self.tsp, window, L)
        if stage not in self.masks:
            q_pos = self.decoded[:, -q:]
            if window is None:
                slots = torch.arange(L, device=key.device)
                mask = None if q == 1 else position_mask(slots[None, L - q :], slots[None], None, query.dtype)
            else:
                prompt = (
                    self.kept_idx
                    if i > self.tsp
                    else torch.arange(self.n, device=key.device)[None].expand(q_pos.shape[0], -1)
                )
                k_pos = torch.cat([prompt, self.decoded], dim=1)[:, -L:]
                mask = position_mask(q_pos, k_pos, window, query.dtype)
            self.masks[stage] = mask
        return kernel(module, query, key, value, self.masks[stage], **kwargs)

    def after_prefill(self, cache):
        for i, layer in enumerate(cache.layers):
            if i <= self.tsp:
                keys, values = self.stored.pop(i)
                if self.windows[i] is not None:  # what plain generation stores: the last window - 1 tokens
                    start = max(self.n - (self.windows[i] - 1), 0)
                    keys, values = keys[:, :, start:], values[:, :, start:]
            else:
                keys, values = layer.keys, layer.values
            if i in self.plans:
                idx = self.plans[i][..., None].expand(-1, -1, -1, keys.shape[-1])
                keys, values = keys.gather(2, idx), values.gather(2, idx)
            layer.keys, layer.values = keys, values
        self.stored.clear()
        self.masks.clear()
        self.mode = "decode"
        self.kept = held_rows(cache, self.kept)

    def continuation(self) -> Continuation:
        """Decoding goes on at n over the kept rows; full-attention layers then need no mask but causality."""
        if any(w is not None for w in self.windows):
            raise NotContinuable(
                "fastkv on a model with sliding-window layers masks those layers by original "
                "positions at every decode step"
            )
        return Continuation(positions=self.kept_idx.new_full((self.kept_idx.shape[0],), self.n), valid=None)

    def decode(self, kwargs, cache, past):
        q = kwargs["input_ids"].shape[1]
        start = self.n + self.decoded.shape[1]
        pos = torch.arange(start, start + q, device=self.decoded.device).expand(self.decoded.shape[0], -1)
        self.decoded = torch.cat([self.decoded, pos], dim=1)
        self.masks.clear()
        kwargs["attention_mask"] = None
        kwargs["position_ids"] = pos
        kwargs[STATE_KWARG] = self
        return kwargs


@register
@dataclass(frozen=True)
class FastKV(CacheMethod):
    """FastKV, constant mode with the v1 defaults of the official code (``--max_capacity_prompt 512 --tsp_len
    2048 --window_size 8 --kernel_size 7 --pooling avgpool``).

    layer: 0-based TSP layer (None: :func:`tsp_default_layer`, the official choice on its three models);
    topk: KV budget per layer (official ``max_capacity_prompt``); tsp_len: tokens propagated past the TSP
    layer; window: observation window of recent queries, always kept; kernel: pooling width;
    pooling: "avg" (v1) or "max" (v3's argparse default); score_dtype: "model" (the official casts: logits,
    window sums, pooling and head sums in the model's dtype, softmax in fp32) or "fp32" (every step in
    float32; the same in an fp32 model).

    TSP fires when the prompt has more than ``tsp_len`` tokens and at least ``topk`` (as officially);
    otherwise every layer just keeps ``topk`` rows. On a command line: ``fastkv:k=512,tsp_len=2048,layer=11``,
    or ``--topk`` / ``--layer`` for every method whose spec sets none.
    """

    layer: int | None = None
    topk: int = 512
    tsp_len: int = 2048
    window: int = 8
    kernel: int = 7
    pooling: str = "avg"
    score_dtype: str = "model"
    shared: ClassVar[bool] = False
    name: ClassVar[str] = "fastkv"
    description: ClassVar[str] = (
        "FastKV (Jo et al. 2025): all tokens to TSP layer, top tsp_len=2048 by last-8-query "
        "softmax (pool 7) go on at original positions; full-attention layers cache topk"
    )

    def __post_init__(self):
        super().__post_init__()
        if self.pooling not in ("avg", "max"):
            raise ValueError(f"fastkv: pooling must be 'avg' (v1) or 'max' (v3), got {self.pooling!r}")
        if self.score_dtype not in SCORE_DTYPES:
            raise ValueError(
                f"fastkv: score_dtype must be 'model' (the official casts) or 'fp32', got {self.score_dtype!r}"
            )
        if self.tsp_len <= self.window:
            raise ValueError(
                f"fastkv: tsp_len={self.tsp_len} must exceed the window of {self.window} always-kept tokens"
            )

    def default_layer(self, model) -> int:
        return tsp_default_layer(model)

    def longest_budget(self) -> int:
        return max(self.topk, self.tsp_len)  # TSP fires only past tsp_len: a shorter warm-up never runs it

    def fires(self, n: int) -> bool:
        """Whether TSP runs on an n-token prompt (official: n > tsp_len, in a layer that compresses, n >= topk)."""
        return n > self.tsp_len and n >= self.topk

    def prompt_cost(self, n: int, m: int) -> tuple:
        """Prompt-phase cost as a fraction of a full prefill, counting per-token layer work (the linear layers).

        Returns (FastKV's own, this implementation's): (r+1)/m + (1 - (r+1)/m) k/n, and that plus (r+1)/m k/n
        for pass 2's rerun of layers 0..r on the k propagated tokens; (1, 1) when TSP does not fire."""
        if not self.fires(n):
            return 1.0, 1.0
        early, share = (self.layer + 1) / m, self.tsp_len / n
        own = early + (1 - early) * share
        return own, own + early * share

    def check_model(self, config, prompt_tokens: int) -> None:
        """Refuse a budget that does not exceed the window (the official code asserts the same), and a model
        whose every layer slides with a window wider than ``topk`` + 1, on prompts longer than ``topk``: only
        full-attention layers compress, so every layer would cache window - 1 rows, more than the budget the
        rows report. (The official code ignores the window and compresses such layers; not built here.)
        config: a model or its transformers config."""
        if self.topk <= self.window:
            raise ValueError(
                f"fastkv: topk={self.topk} (the KV budget) must exceed the window of {self.window} "
                "always-kept recent tokens"
            )
        windows = [sliding_window_of(config, i) for i in range(num_layers(config))]
        if prompt_tokens > self.topk and None not in windows and max(windows) - 1 > self.topk:
            raise ValueError(
                f"fastkv compresses only full-attention layers, and every layer of this model has a sliding window "
                f"({', '.join(map(str, sorted(set(windows))))}): each would cache {max(windows) - 1} rows, more than "
                f"topk={self.topk}. Give topk >= {max(windows) - 1}, or use a method that selects prompt tokens "
                "(gemfilter, gemfilter-span, gemfilter-orig-pos)"
            )

    def scores(self, query, key, valid, scaling):
        """Pooled window votes per query head (b, h, n): query (b, h, n, d), key (b, h_kv, n, d)."""
        votes = (window_votes if self.score_dtype == "fp32" else window_votes_official)(
            query, key, valid, scaling, self.window
        )  # (b, h, n)
        return pool_prefix(votes, self.window, self.kernel, self.pooling)

    def per_kv_head(self, pooled, h_kv: int):
        """(b, h, n) -> (b, h_kv, n): the official group sum, or fp32's group mean (the same ranking)."""
        return group_mean(pooled, h_kv) if self.score_dtype == "fp32" else group_sum(pooled, h_kv)

    def keep_plan(self, pooled, h_kv: int, valid):
        """The rows a layer caches, from :meth:`scores`: (b, h_kv, topk) sorted, one set per KV head."""
        return keep_indices(self.per_kv_head(pooled, h_kv), valid, self.topk, self.window)

    def plan(self, layer_idx, query, key, valid, scaling):
        """The rows a layer caches: (b, h_kv, topk) sorted; query (b, h, n, d), key (b, h_kv, n, d)."""
        return self.keep_plan(self.scores(query, key, valid, scaling), key.shape[1], valid)

    def propagate(self, pooled, h_kv: int, valid):
        """TSP from :meth:`scores`: (positions (b, tsp_len) sorted, per-token scores (b, n), the window at +inf)."""
        # Over every query head; officially the sum of the KV heads' group sums, in that order.
        total = pooled.sum(1) if self.score_dtype == "fp32" else group_sum(pooled, h_kv).sum(1)
        idx = keep_indices(total[:, None], valid, self.tsp_len, self.window)[:, 0]
        total[:, -self.window :] = float("inf")
        return idx, total

    def begin(self, model, input_ids, valid, tokenizer=None):
        self.check_model(model, input_ids.shape[1])
        n = input_ids.shape[1]
        if self.fires(n):
            if not bool(valid.all()):
                raise ValueError(
                    "fastkv: left-padded batches are not supported when token-selective propagation "
                    f"fires (prompt longer than tsp_len={self.tsp_len}): run the rows one at a time"
                )
            check_mask_kernel(model, "fastkv: its second prefill pass")
            return FastKVCall(self, model, input_ids)
        return CacheCall(self, model, input_ids, valid)  # no propagation: only each layer's KV budget
