"""Prompt-filtering methods: pick tokens at a filter layer, then generate from those tokens only.

Paper: Shi et al. 2024, Algorithm 2 (``gemfilter``) and the row-selection ablations of Fig. G.3
(``middle-row``, ``largest-row``). ``gemfilter-span`` is this project's named improvement: whole
sentences ranked by their best softmax score, plus the first tokens and the question tail.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from ..attention import STATE_KWARG
from ..continuation import Continuation, NotContinuable, real_rows
from ..selection import (
    check_mask_kernel,
    decode_mask,
    filter_pass,
    last_row_scores,
    layer_windows,
    paper_pick,
    position_mask,
    positions_from_mask,
    select_chunked,
    select_tokens,
)
from .registry import register
from .spec import PromptMethod


def pad_left(rows: list, pad_id: int):
    """Stack 1-D tensors, left-padded to the longest; returns (ids (b, L), mask (b, L))."""
    width = max(len(r) for r in rows)
    ids = rows[0].new_full((len(rows), width), pad_id)
    mask = torch.zeros_like(ids)
    for i, r in enumerate(rows):
        if len(r):
            ids[i, width - len(r) :] = r
            mask[i, width - len(r) :] = 1
    return ids, mask


def pad_id_of(model) -> int:
    for cfg in (model.generation_config, model.config):
        pid = getattr(cfg, "pad_token_id", None)
        if isinstance(pid, (list, tuple)):
            pid = pid[0] if pid else None
        if pid is not None:
            return int(pid)
    return 0


class PromptCall:
    """Feeds only the kept tokens at positions 0..k-1, then maps decode steps onto them."""

    def __init__(self, model, selection):
        self.selection = selection
        self.ids, self.kept_mask = pad_left(selection.kept_ids, pad_id_of(model))
        self.kept = [len(i) for i in selection.indices]

    def prefill(self, kwargs, cache):
        kwargs["input_ids"] = self.ids
        kwargs["attention_mask"] = None if self.kept_mask.all() else self.kept_mask
        kwargs["position_ids"] = positions_from_mask(self.kept_mask)
        return kwargs

    def after_prefill(self, cache):
        pass

    def continuation(self) -> Continuation:
        """The kept tokens sit at 0..k-1, so decoding goes on at k (per row: its kept count)."""
        return Continuation(positions=self.kept_mask.sum(1), valid=real_rows(self.kept_mask))

    def decode(self, kwargs, cache, past):
        q = kwargs["input_ids"].shape[1]
        new_mask = decode_mask(self.kept_mask, past, q)
        kwargs["attention_mask"] = None if self.kept_mask.all() else new_mask
        kwargs["position_ids"] = positions_from_mask(new_mask)[:, -q:]
        return kwargs


class _FilterMethod(PromptMethod):
    """Shared by the prompt filters: run :func:`select_tokens` with this method, then a PromptCall."""

    # gemfilter.score: kept context + continuation at positions 0..k+c-1 is one forward of the plain model
    one_pass_scoring: ClassVar[bool] = True
    separable: ClassVar[bool] = True
    # score() reads only the last query row, so a cache of the earlier tokens' layers 0..r gives the same
    # scores as a fresh pass (gemfilter.Conversation's "reselect" protocol relies on it)
    scores_last_row: ClassVar[bool] = True
    # a field (None: one pass) of the methods whose filter pass can run in chunks (select_chunked); None elsewhere
    chunk: ClassVar[int | None] = None
    # its selection can run only a conversation's new tokens on a cache of the earlier ones (select_cached), equal
    # to a pass over the whole history: gemfilter.Conversation's "reselect" protocol relies on it
    selects_from_cache: ClassVar[bool] = True
    # query rows its scores read (the last ones): more than 1 needs a QueryTail between cached passes
    query_rows: ClassVar[int] = 1
    # its scores read every key at sliding-window layers too: a cache of the earlier tokens must keep them all
    scores_sliding_layers: ClassVar[bool] = False

    def __post_init__(self):
        super().__post_init__()
        if self.chunk is not None and not self.scores_last_row:
            raise ValueError(
                f"{self.name}: chunk={self.chunk}: a chunked filter pass keeps only the K/V of earlier "
                "chunks, which scores alike only for methods that read the last query row (gemfilter, "
                "gemfilter-span, gemfilter-orig-pos); leave chunk unset"
            )

    def select(self, model, input_ids, attention_mask=None, tokenizer=None):
        """This method's selection (Algorithm 2, steps 1-4) of ``input_ids`` (b, n).

        attention_mask: (b, n) 0/1 or None; tokenizer: for methods that read token text. With ``chunk`` set, the
        filter pass runs the prompt in chunks of that many tokens (:func:`gemfilter.selection.select_chunked`)."""
        if self.chunk is not None:
            return select_chunked(model, self, input_ids, attention_mask, self.chunk, tokenizer)
        return select_tokens(
            model,
            input_ids,
            attention_mask,
            layer=self.layer,
            topk=self.topk,
            kernel=self.kernel,
            method=self,
            tokenizer=tokenizer,
        )

    def cached_scores(self, model, new_ids, cache, valid, tail=None):
        """Raw scores (b, n) over every token, running only ``new_ids`` (b, t) on ``cache`` (the earlier tokens'
        layers 0..r); valid: (b, n) bool over every token; tail: the earlier rows for window scores."""
        return filter_pass(
            model, new_ids, torch.ones_like(new_ids), self.layer, lambda q, k: self.score(q, k, valid), cache=cache
        )

    def begin(self, model, input_ids, valid, tokenizer=None):
        return self.start(model, self.select(model, input_ids, None if valid.all() else valid.long(), tokenizer), valid)

    def start(self, model, selection, valid):
        """The per-call state that generates from ``selection`` (valid: (b, n) bool, the prompt's real tokens)."""
        return PromptCall(model, selection)

    def pick(self, raw, valid, input_ids, tokenizer):
        return paper_pick(raw, valid, self.topk, self.kernel)


@dataclass(frozen=True)
class PaperFilter(_FilterMethod):
    """GemFilter's parameters, score and pick (Algorithm 2), without a name: the base of ``gemfilter`` and of the
    ablations and variants that score with other query rows or layers (and so cannot chunk their pass).

    layer: 0-based filter layer (None: the model's default); topk: tokens kept; kernel: pool width.
    """

    layer: int | None = None
    topk: int = 1024
    kernel: int = 5

    def score(self, query, key, valid):
        return last_row_scores(query, key)


@register
@dataclass(frozen=True)
class GemFilter(PaperFilter):
    """Paper-faithful GemFilter: raw last-row q.k summed over heads, avg-pool, top-k (Algorithm 2).

    layer: 0-based filter layer (None: the model's default); topk: tokens kept; kernel: pool width;
    chunk: None (the paper's one pass, no cache), or run the filter pass over the prompt in chunks of this many
    tokens with a cache of layers 0..r, as chunked prefill does: the same selection, with one chunk's
    activations instead of the whole prompt's at the peak (:func:`gemfilter.selection.select_chunked`).
    """

    chunk: int | None = None
    name: ClassVar[str] = "gemfilter"
    description: ClassVar[str] = "paper-faithful: raw last-row q.k at the filter layer, avg-pool 5, top-k, regenerate"


class OrigPosCall(PromptCall):
    """Like :class:`PromptCall`, but each kept token sits at its original position: RoPE position ids and,
    on sliding-window layers, the window, which is measured in original positions through a position mask
    (a window counted in kept tokens would show those layers keys farther back than they were trained on).
    Decoding continues at the prompt's true length."""

    def __init__(self, model, selection, valid):
        super().__init__(model, selection)
        start = (~valid).sum(1)  # left padding per row
        self.real = valid.sum(1)
        self.positions = pad_left([idx - s for idx, s in zip(selection.indices, start)], 0)[0]
        self.windows = layer_windows(model)
        self.windowed = any(w is not None for w in self.windows)
        if self.windowed:
            check_mask_kernel(model, "gemfilter-orig-pos on a model with sliding-window layers")
        self.decoded = self.positions.new_zeros((len(self.kept), 0))
        self.masks = {}  # (window, q, L) -> the mask every sliding layer of this forward shares

    def prefill(self, kwargs, cache):
        kwargs = super().prefill(kwargs, cache)
        kwargs["position_ids"] = self.positions
        self.masks.clear()
        if self.windowed:
            kwargs[STATE_KWARG] = self
        return kwargs

    def continuation(self) -> Continuation:
        """Decoding goes on at the prompt's true length; sliding windows need this call's position masks."""
        if self.windowed:
            raise NotContinuable(
                "gemfilter-orig-pos on a model with sliding-window layers measures each window "
                "in original positions through its own masks at every decode step"
            )
        return Continuation(positions=self.real, valid=real_rows(self.kept_mask))

    def decode(self, kwargs, cache, past):
        kwargs = super().decode(kwargs, cache, past)
        q, k = kwargs["input_ids"].shape[1], self.ids.shape[1]
        steps = torch.arange(past - k, past - k + q, device=self.real.device)
        kwargs["position_ids"] = self.real[:, None] + steps[None]
        if self.windowed:
            self.decoded = torch.cat([self.decoded, kwargs["position_ids"]], dim=1)
            self.masks.clear()
            kwargs[STATE_KWARG] = self
        return kwargs

    def attention(self, module, query, key, value, attention_mask, kernel, **kwargs):
        window = self.windows[module.layer_idx]
        if window is None:  # causal over the kept slots is causal over their (increasing) positions
            return kernel(module, query, key, value, attention_mask, **kwargs)
        L, q = key.shape[2], query.shape[2]
        if (window, q, L) not in self.masks:  # the same for every sliding layer of this forward: built once
            pos = torch.cat([self.positions, self.decoded], dim=1)
            valid = torch.cat([self.kept_mask.bool(), torch.ones_like(self.decoded, dtype=torch.bool)], dim=1)
            self.masks[window, q, L] = position_mask(
                pos[:, -q:], pos[:, -L:], window, query.dtype, key_valid=valid[:, -L:]
            )
        return kernel(module, query, key, value, self.masks[window, q, L], **kwargs)


@register
@dataclass(frozen=True)
class GemFilterOrigPos(GemFilter):
    """Ablation: GemFilter's selection, but the kept tokens keep their original position ids in the second
    prefill (as speculative prefill, SpecPrefill, does) and decoding goes on at positions n, n+1, ...

    Sliding windows are measured in original positions too (as in ``fastkv``); on models without them only
    the RoPE ids differ from ``gemfilter``. Set beside ``fastkv`` it tells whether FastKV's gain comes from
    the positions or from the full-context early layers.
    """

    one_pass_scoring: ClassVar[bool] = False  # its positions and windows need the call's masks: apply()
    name: ClassVar[str] = "gemfilter-orig-pos"
    description: ClassVar[str] = (
        "ablation: gemfilter's selection, kept tokens keep their original position ids "
        "(SpecPrefill-style), decoding at n, n+1, ..."
    )

    def start(self, model, selection, valid):
        return OrigPosCall(model, selection, valid)


def row_scores(query, key, rows):
    """Raw q.k of one chosen query row per batch row, summed over heads. rows: (b,) long -> (b, n)."""
    b, h, _, d = query.shape
    h_kv = key.shape[1]
    q = query[torch.arange(b, device=query.device), :, rows].float().reshape(b, h_kv, h // h_kv, d).sum(2)
    return torch.einsum("bkd,bknd->bn", q, key.float())


@register
@dataclass(frozen=True)
class MiddleRow(PaperFilter):
    """Fig. G.3 ablation: score with the middle real token's query row instead of the last one."""

    name: ClassVar[str] = "middle-row"
    description: ClassVar[str] = "ablation (Fig. G.3): like gemfilter, but scored with the middle query row"
    scores_last_row: ClassVar[bool] = False
    selects_from_cache: ClassVar[bool] = False  # its row moves with the history: every query row would be kept

    def score(self, query, key, valid):
        n = valid.shape[1]
        real = valid.sum(1)
        return row_scores(query, key, (n - real) + real // 2)


@register
@dataclass(frozen=True)
class LargestRow(PaperFilter):
    """Fig. G.3 ablation: score with the query row of largest l2 norm (all heads together)."""

    name: ClassVar[str] = "largest-row"
    description: ClassVar[str] = "ablation (Fig. G.3): like gemfilter, but scored with the largest-norm query row"
    scores_last_row: ClassVar[bool] = False
    selects_from_cache: ClassVar[bool] = False  # any row may be the largest: every query row would be kept

    def score(self, query, key, valid):
        norms = query.float().pow(2).sum(dim=(1, 3)).masked_fill(~valid, -1.0)  # (b, n)
        return row_scores(query, key, norms.argmax(1))


def softmax_last_row(query, key, valid):
    """Softmax over keys of the last query row, per head, summed over heads: (b, n).

    query (b, h, n, d), key (b, h_kv, n, d); padding keys get zero weight.
    """
    b, h, _, d = query.shape
    h_kv = key.shape[1]
    q = query[:, :, -1, :].float().reshape(b, h_kv, h // h_kv, d)
    logits = torch.einsum("bkgd,bknd->bkgn", q, key.float()) / d**0.5
    logits = logits.masked_fill(~valid[:, None, None, :], float("-inf"))
    return logits.softmax(-1).sum(dim=(1, 2))


_BOUNDARY_CHARS = (".", "!", "?", "\n", "。")


def sentence_ends(ids, tokenizer, max_span: int) -> list:
    """Boundaries: positions that end a sentence (text has . ! ? or newline), plus every ``max_span``
    tokens, so tokenizers with no such tokens still give spans. Returns a sorted list of end positions."""
    texts = {}
    ends, last = [], -1
    for j, t in enumerate(ids.tolist()):
        if t not in texts:
            texts[t] = tokenizer.decode([t]) if tokenizer is not None else ""
        if any(c in texts[t] for c in _BOUNDARY_CHARS) or j - last >= max_span:
            ends.append(j)
            last = j
    if not ends or ends[-1] != len(ids) - 1:
        ends.append(len(ids) - 1)
    return ends


@dataclass(frozen=True)
class SpanFilter(_FilterMethod):
    """``gemfilter-span``'s parameters, score and whole-sentence pick, without a name: the base of it and of its
    variants that rank sentences by other query rows or layers (and so cannot chunk their pass)."""

    layer: int | None = None
    topk: int = 1024
    kernel: int = 5  # unused: spans replace pooling
    sink: int = 4
    # 48 covers the GemFilter NIAH question (~30 tokens) plus the words before it; with 32 the
    # embedded model missed the needle at 2K/10-30% although the needle sentence was kept.
    tail: int = 48
    max_span: int = 64

    def score(self, query, key, valid):
        return softmax_last_row(query, key, valid)

    def pick(self, raw, valid, input_ids, tokenizer):
        if tokenizer is None:
            raise ValueError("gemfilter-span needs the tokenizer to find sentence boundaries: pass tokenizer=...")
        out = []
        for row, ok, ids in zip(raw, valid, input_ids):
            start = int((~ok).sum())
            n = len(ids) - start
            if n <= self.topk:
                out.append(torch.arange(start, len(ids), device=ids.device))
                continue
            sink = min(self.sink, self.topk)
            tail = min(self.tail, self.topk - sink)
            keep = set(range(sink)) | set(range(n - tail, n))
            budget = self.topk - len(keep)
            local = row[start:]
            spans, begin = [], 0
            for end in sentence_ends(ids[start:], tokenizer, self.max_span):
                span = [j for j in range(begin, end + 1) if j not in keep]
                if span:
                    spans.append((float(local[span].max()), span))
                begin = end + 1
            for _, span in sorted(spans, key=lambda s: -s[0]):
                if len(span) <= budget:
                    keep.update(span)
                    budget -= len(span)
                if budget == 0:
                    break
            out.append(torch.tensor(sorted(keep), device=ids.device) + start)
        return out, raw.masked_fill(~valid, float("-inf"))


@register
@dataclass(frozen=True)
class GemFilterSpan(SpanFilter):
    """Sentence-span GemFilter (this project's improvement, measured in docs/evals.md).

    Scores: softmax per head of the last query row, summed over heads. Always keeps the first
    ``sink`` tokens and the last ``tail`` tokens (the question/instruction). The rest of the budget
    is filled with whole sentences, best first by their best token score, skipping any that would
    overflow ``topk``. Sentences end at . ! ? or newline tokens, or after ``max_span`` tokens.
    chunk: as :class:`GemFilter`'s.
    """

    chunk: int | None = None
    name: ClassVar[str] = "gemfilter-span"
    description: ClassVar[str] = "improvement: whole sentences by best softmax score + first 4 tokens + question tail"
