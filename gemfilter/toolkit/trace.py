"""Inspection: what each layer's last query row looks at, stored as last rows only (never n x n).

Paper: Shi et al. 2024, Fig. 9.2 (last-row attention per layer), Fig. 9.5 (needle distance per
layer) and Fig. G.5 (kept indices per layer, GemFilter vs SnapKV).

One forward pass (no KV cache) fills named capture points, TransformerLens style:

- ``("qk_last_row", layer)``: raw sum_h q_last . k_j, GemFilter's score before pooling, (n,);
- ``("attn_last_row", layer)``: the last row's softmax attention as the kernel sees it (scaling,
  sliding window), averaged over heads, (n,);
- ``("snapkv_votes", layer)``: SnapKV's window votes, averaged over heads, (n,);
- ``("attn_last_row_heads", layer)``: the same last softmax row per head, (heads, n). Opt-in only
  (not in the default :data:`CAPTURE_NAMES`); used by the label-flip ablation (Shi 2024, Fig. 5.3).

Memory is O(n * layers) per capture name (O(heads * n * layers) for the per-head rows).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..attention import STATE_KWARG, wrapped_attention
from ..methods.cache import keep_indices, pool_prefix, window_votes
from ..selection import last_row_scores, num_layers, pool_scores, positions_from_mask, sliding_window_of, topk_sorted

CAPTURE_NAMES = ("qk_last_row", "attn_last_row", "snapkv_votes")
#: Capture points that are only filled when asked for by name (bigger: one row per head).
EXTRA_CAPTURE_NAMES = ("attn_last_row_heads",)


class _CaptureState:
    def __init__(self, names, valid, window: int):
        self.names, self.valid, self.window = names, valid, window
        self.store = {}

    def attention(self, module, query, key, value, attention_mask, kernel, **kwargs):
        layer = module.layer_idx
        scaling = kwargs.get("scaling") or module.scaling
        if "qk_last_row" in self.names:
            self.store[("qk_last_row", layer)] = last_row_scores(query, key)[0].cpu()
        if "attn_last_row" in self.names or "attn_last_row_heads" in self.names:
            b, h, n, d = query.shape
            k = key.float().repeat_interleave(h // key.shape[1], dim=1)
            logits = torch.einsum("bhd,bhnd->bhn", query[:, :, -1].float(), k) * scaling
            window = kwargs.get("sliding_window")
            if window:  # the last query sees only keys closer than the window
                logits[..., : max(0, n - window)] = float("-inf")
            logits = logits.masked_fill(~self.valid[:, None, :], float("-inf"))
            probs = logits.softmax(-1)
            if "attn_last_row" in self.names:
                self.store[("attn_last_row", layer)] = probs.mean(1)[0].cpu()
            if "attn_last_row_heads" in self.names:
                self.store[("attn_last_row_heads", layer)] = probs[0].cpu()
        if "snapkv_votes" in self.names:
            w = min(self.window, query.shape[2])
            self.store[("snapkv_votes", layer)] = window_votes(query, key, self.valid, scaling, w).mean(1)[0].cpu()
        return kernel(module, query, key, value, attention_mask, **kwargs)


@dataclass
class Trace:
    """Captured last rows of one prompt. ``store[(name, layer)]`` is a float32 (n,) tensor
    ((heads, n) for ``attn_last_row_heads``)."""

    n: int
    layers: int
    sliding: list  # per layer: window size or None
    store: dict = field(default_factory=dict)

    def __getitem__(self, point):
        return self.store[point]

    def stack(self, name: str) -> torch.Tensor:
        """(layers, n) for one capture name."""
        return torch.stack([self.store[(name, i)] for i in range(self.layers)])


def trace(model, input_ids, *, names=CAPTURE_NAMES, window: int = 32) -> Trace:
    """Run the whole model once on one prompt (b = 1) and fill the named capture points.

    input_ids: (1, n) long. names: a subset of :data:`CAPTURE_NAMES` + :data:`EXTRA_CAPTURE_NAMES`.
    """
    allowed = CAPTURE_NAMES + EXTRA_CAPTURE_NAMES
    bad = [n for n in names if n not in allowed]
    if bad:
        raise ValueError(f"unknown capture point(s) {bad}; allowed: {', '.join(allowed)}")
    if input_ids.dim() != 2 or input_ids.shape[0] != 1 or input_ids.shape[1] == 0:
        raise ValueError(f"trace needs input_ids of shape (1, n) with n >= 1, got {tuple(input_ids.shape)}")
    device = next(model.parameters()).device
    ids = input_ids.to(device)
    mask = torch.ones_like(ids)
    state = _CaptureState(tuple(names), mask.bool(), window)
    with wrapped_attention(model), torch.no_grad():
        model.base_model(input_ids=ids, position_ids=positions_from_mask(mask), use_cache=False, **{STATE_KWARG: state})
    m = num_layers(model)
    return Trace(n=ids.shape[1], layers=m, sliding=[sliding_window_of(model, i) for i in range(m)], store=state.store)


def span_distance(indices, span) -> int:
    """min |i - needle token| over kept indices i; 0 when one falls inside span = (start, end)."""
    start, end = span
    best = None
    for i in indices:
        i = int(i)
        d = 0 if start <= i < end else min(abs(i - start), abs(i - (end - 1)))
        best = d if best is None else min(best, d)
    return best


def gemfilter_kept(tr: Trace, layer: int, topk: int, kernel: int = 5) -> torch.Tensor:
    """GemFilter's sorted top-k at ``layer`` (paper-faithful pooling) from a trace."""
    valid = torch.ones(1, tr.n, dtype=torch.bool)
    pooled = pool_scores(tr[("qk_last_row", layer)][None], valid, kernel)
    return topk_sorted(pooled, valid, topk)[0]


def snapkv_kept(tr: Trace, layer: int, topk: int, window: int = 32, kernel: int = 5) -> torch.Tensor:
    """SnapKV's kept positions at ``layer`` for the head-averaged votes (one set, for plotting)."""
    if tr.n <= topk:
        return torch.arange(tr.n)
    votes = tr[("snapkv_votes", layer)][None, None]
    pooled = pool_prefix(votes, window, kernel)  # the official edge: only the n - window scores are pooled
    return keep_indices(pooled, torch.ones(1, tr.n, dtype=torch.bool), topk, window)[0, 0]


def needle_distances(tr: Trace, span, topk: int) -> list:
    """Fig. 9.5: per layer, min |top-k index - needle index| (0 = the layer's top-k reaches the needle)."""
    return [span_distance(gemfilter_kept(tr, layer, topk), span) for layer in range(tr.layers)]


def needle_token_span(tokenizer, prompt: str, needle: str):
    """(start, end) token positions of ``needle`` inside the tokenized ``prompt``.

    First looks for the needle's own token ids as a run inside the prompt's ids; if tokenization
    differs at the boundaries, falls back to the fast tokenizer's character offsets.
    """
    ids = tokenizer(prompt)["input_ids"]
    for variant in (needle, needle.strip(), " " + needle.strip()):
        sub = tokenizer.encode(variant, add_special_tokens=False)
        for i in range(len(ids) - len(sub) + 1):
            if sub and ids[i : i + len(sub)] == sub:
                return i, i + len(sub)
    text = needle.strip()
    at = prompt.find(text)
    if at < 0:
        raise ValueError("the needle text does not occur in the prompt")
    offsets = tokenizer(prompt, return_offsets_mapping=True)["offset_mapping"]
    tokens = [i for i, (a, b) in enumerate(offsets) if b > at and a < at + len(text) and b > a]
    return tokens[0], tokens[-1] + 1
