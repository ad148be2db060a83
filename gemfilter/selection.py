"""GemFilter's filter pass: run the first r layers, score tokens from layer r's q and k, keep top-k.

Paper: Shi et al. 2024, "Discovering the Gems in Early Layers", Algorithm 2, steps 1-4.
The pass stops *inside* layer r, as soon as its post-RoPE query and key exist, and keeps no KV
cache: layers r+1..m-1 and layer r's own attention kernel never run.
"""

from __future__ import annotations

import dataclasses
import warnings
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .attention import STATE_KWARG, FilterLayerReached, wrapped_attention
from .compat import cache_kwargs, text_config


@dataclass
class Selection:
    """Result of a filter pass.

    indices: one ascending LongTensor per batch row, positions into that row of ``input_ids``.
    scores: (b, n) float32 pooled scores; padding positions are -inf.
    layer: the filter layer used.
    kept_ids: one LongTensor of kept token ids per row.
    layers: per row, the layer that row selected at, for methods that choose it per prompt (``gemfilter-asl``;
        ``layer`` is then the deepest); None for the others.
    """

    indices: list
    scores: torch.Tensor
    layer: int
    kept_ids: list
    layers: list | None = None

    def kept_text(self, tokenizer) -> list:
        return [tokenizer.decode(ids, skip_special_tokens=False) for ids in self.kept_ids]


def last_row_scores(query: torch.Tensor, key: torch.Tensor) -> torch.Tensor:
    """Raw score_j = sum_h q_last,h . k_j,h, no softmax, no 1/sqrt(d).

    query: (b, h, n, d) post-RoPE; key: (b, h_kv, n, d) post-RoPE, h = g * h_kv (GQA).
    Returns (b, n) float32. Summing the g query heads of a group before the dot product equals
    repeating the keys to h heads, and needs no (b, h, n, d) copy of the keys.
    """
    b, h, _, d = query.shape
    h_kv = key.shape[1]
    q_last = query[:, :, -1, :].float().reshape(b, h_kv, h // h_kv, d).sum(2)  # (b, h_kv, d)
    return torch.einsum("bkd,bknd->bn", q_last, key.float())


def pool_scores(scores: torch.Tensor, valid: torch.Tensor, kernel: int) -> torch.Tensor:
    """avg_pool1d with stride 1 and zero padding kernel//2, per row; padding tokens end at -inf.

    scores: (b, n); valid: (b, n) bool. Padding scores are zeroed before pooling so a left-padded row
    pools exactly as it would alone (where the padding of avg_pool1d supplies the zeros).
    """
    x = scores.masked_fill(~valid, 0.0)
    if kernel > 1:
        x = F.avg_pool1d(x.unsqueeze(1), kernel_size=kernel, stride=1, padding=kernel // 2).squeeze(1)
    return x.masked_fill(~valid, float("-inf"))


def topk_sorted(scores: torch.Tensor, valid: torch.Tensor, topk: int) -> list:
    """Per row: indices of the top min(topk, #valid) scores, sorted ascending."""
    out = []
    for row, ok in zip(scores, valid):
        k = min(topk, int(ok.sum()))
        out.append(torch.topk(row, k).indices.sort().values)
    return out


def num_layers(model) -> int:
    return int(text_config(model).num_hidden_layers)


def sliding_window_of(model, layer: int):
    """The window of ``layer`` if it is a sliding-window layer, else None. model: a model or its config."""
    cfg = text_config(model)
    window = getattr(cfg, "sliding_window", None)
    types = getattr(cfg, "layer_types", None)
    if window is None:
        return None
    if types is not None:
        return window if types[layer] == "sliding_attention" else None
    return window  # e.g. Mistral: one window for every layer


def as_batch(input_ids, attention_mask=None):
    """Turn a (b, n) tensor, a 1-D tensor or a list of token lists into a (b, n) LongTensor.

    Rows of unequal length are refused: padding is the tokenizer's job (padding_side='left'), and it
    must come with the attention_mask that says which tokens are padding.
    """
    if isinstance(input_ids, (list, tuple)):
        rows = (
            [list(r) for r in input_ids] if input_ids and isinstance(input_ids[0], (list, tuple)) else [list(input_ids)]
        )
        lengths = sorted({len(r) for r in rows})
        if len(lengths) > 1 and attention_mask is None:
            raise ValueError(
                f"batch rows have unequal lengths {lengths} and no attention_mask: left-pad them "
                "(tokenizer(..., padding=True) with padding_side='left') and pass the attention_mask"
            )
        if len(lengths) > 1:
            raise ValueError(f"batch rows have unequal lengths {lengths}: pad them to one length first")
        input_ids = torch.tensor(rows, dtype=torch.long)
    if torch.is_tensor(input_ids) and input_ids.dim() == 1:
        input_ids = input_ids.unsqueeze(0)
    if torch.is_tensor(attention_mask) and attention_mask.dim() == 1:
        attention_mask = attention_mask.unsqueeze(0)
    return input_ids, attention_mask


def check_prompt(input_ids, attention_mask) -> None:
    """Validate a (b, n) prompt batch; raise ValueError/TypeError saying what is wrong and what is allowed."""
    if not torch.is_tensor(input_ids) or input_ids.dtype not in (torch.long, torch.int, torch.int32):
        raise TypeError(
            f"input_ids must be an integer torch.Tensor of shape (batch, seq), got {type(input_ids).__name__}"
        )
    if input_ids.dim() != 2:
        raise ValueError(f"input_ids must have shape (batch, seq); got shape {tuple(input_ids.shape)}")
    if input_ids.shape[1] == 0:
        raise ValueError("the prompt is empty: input_ids has 0 tokens; give at least one token")
    if attention_mask is not None:
        if tuple(attention_mask.shape) != tuple(input_ids.shape):
            raise ValueError(
                f"attention_mask shape {tuple(attention_mask.shape)} must equal input_ids shape "
                f"{tuple(input_ids.shape)}"
            )
        valid = attention_mask.bool()
        if (valid.sum(1) == 0).any():
            raise ValueError("the prompt is empty: a batch row has no real tokens in attention_mask")
        if not valid[:, -1].all():
            raise ValueError(
                "padding must be on the left (tokenizer.padding_side = 'left'): the last token of every row must be "
                "real"
            )


def check_causal_decoder(model, need_generate: bool = False) -> None:
    """TypeError unless ``model`` is a causal decoder (every attention module causal), with ``generate``
    if ``need_generate``. An encoder such as BERT sees the whole prompt from every token, so "the last
    query row" means nothing there and GemFilter's selection would be silently meaningless."""
    if getattr(model, "config", None) is None:
        raise TypeError(
            f"{type(model).__name__} has no .config: pass a transformers causal LM, not a bare torch module"
        )
    bidirectional = [type(mod).__name__ for mod in model.modules() if getattr(mod, "is_causal", None) is False]
    if getattr(text_config(model), "is_causal", True) is False:  # transformers then builds bidirectional masks
        bidirectional.insert(0, "config (is_causal=False)")
    if bidirectional or getattr(model.config, "is_encoder_decoder", False):
        why = f"its {bidirectional[0]} attends both ways" if bidirectional else "it is an encoder-decoder"
        raise TypeError(
            f"{type(model).__name__} is not a causal decoder ({why}); GemFilter needs a decoder-only "
            "causal LM such as Llama, Mistral, Qwen2, Phi3 or Gemma3"
        )
    if need_generate and not callable(getattr(model, "generate", None)):
        raise TypeError(
            f"{type(model).__name__} has no generate(): load the model with AutoModelForCausalLM "
            "(a causal LM head), not AutoModel"
        )


def check_params(model, layer, topk, kernel=5) -> int:
    """Validate filter parameters against the model; warn for a sliding-window filter layer. Returns m."""
    m = num_layers(model)
    if isinstance(layer, bool) or not isinstance(layer, int):
        raise TypeError(f"layer must be an int in [0, {m}), got {layer!r}")
    if not 0 <= layer < m:
        raise ValueError(f"layer={layer} is outside [0, {m}): this model has {m} decoder layers (0-based)")
    if isinstance(topk, bool) or not isinstance(topk, int):
        raise TypeError(f"topk must be an int >= 1, got {topk!r}")
    if topk < 1:
        raise ValueError(f"topk={topk} must be >= 1 (the number of prompt tokens to keep)")
    if isinstance(kernel, bool) or not isinstance(kernel, int) or kernel < 1 or kernel % 2 == 0:
        raise ValueError(f"kernel={kernel!r} must be an odd int >= 1 (the paper uses 5)")
    window = sliding_window_of(model, layer)
    if window is not None:
        warnings.warn(
            f"filter layer {layer} is a sliding-window layer (window {window}). It was trained to attend only to "
            f"the last {window} tokens, so its q.k for farther tokens is not a learned relevance signal and the "
            "selection may miss distant evidence. Prefer a full-attention layer.",
            stacklevel=3,
        )
    return m


class _SelectState:
    """Per-call state of one filter pass: stops the forward inside ``layer``; ``observe(layer_idx, query, key)``,
    if given, sees every earlier layer's q and k before its kernel runs (for scores over several layers)."""

    def __init__(self, layer: int, score_fn, observe=None):
        self.layer = layer
        self.score_fn = score_fn
        self.observe = observe

    def attention(self, module, query, key, value, attention_mask, kernel, **kwargs):
        idx = getattr(module, "layer_idx", None)
        if idx == self.layer:
            raise FilterLayerReached(self.score_fn(query, key))
        if self.observe is not None:
            self.observe(idx, query, key)
        return kernel(module, query, key, value, attention_mask, **kwargs)


def positions_from_mask(mask: torch.Tensor) -> torch.Tensor:
    """Position ids as ``generate`` makes them: 0.. over real tokens, 0 on left padding."""
    return (mask.long().cumsum(-1) - 1).clamp(min=0)


def layer_windows(model) -> list:
    """The sliding window of every decoder layer (None for full attention). model: a model or its config."""
    return [sliding_window_of(model, i) for i in range(num_layers(model))]


def check_mask_kernel(model, who: str) -> None:
    """Refuse a flash-attention kernel for a method that hands the kernel its own position masks (``who``:
    the method, as the message names it); flash kernels take no explicit masks."""
    if "flash" in str(model.config._attn_implementation):
        raise ValueError(
            f"{who} needs position-based masks, which flash attention kernels do not take; load the "
            "model with attn='sdpa', 'eager' or 'banded'"
        )


def position_mask(q_pos, k_pos, window, dtype, key_valid=None):
    """Additive mask (b, 1, q, L) from absolute positions: key allowed iff k_pos <= q_pos and, for a
    sliding window w, k_pos > q_pos - w (transformers' window predicate), and ``key_valid``.

    q_pos (b, q), k_pos (b or 1, L) long; key_valid (b, L) bool or None. 0 where allowed, the dtype's
    minimum elsewhere: a float mask is what eager adds and SDPA accepts, so the model's own kernel runs it,
    and a row with no allowed key stays finite."""
    qp, kp = q_pos[:, None, :, None], k_pos[:, None, None, :]
    ok = kp <= qp
    if window is not None:
        ok = ok & (kp > qp - window)
    if key_valid is not None:
        ok = ok & key_valid[:, None, None, :]
    return torch.zeros(ok.shape, dtype=dtype, device=ok.device).masked_fill(~ok, torch.finfo(dtype).min)


def decode_mask(kept_mask: torch.Tensor, past: int, q: int) -> torch.Tensor:
    """(b, past + q) mask for a decode step: the kept prompt slots, then ones for every token after
    the prompt (generate extends its own mask with ones). kept_mask: (b, k) 0/1, left padding."""
    b, k = kept_mask.shape
    return torch.cat([kept_mask, kept_mask.new_ones((b, past + q - k))], dim=1)


def filter_pass(model, input_ids, mask, layer, score_fn, cache=None, observe=None):
    """Run ``model`` up to ``layer``'s attention and return ``score_fn(query, key)`` there.

    input_ids, mask: (b, n) on the model's device. Layers after ``layer`` never run, and layer ``layer``
    stops before its attention kernel. With no ``cache`` none is made (use_cache=False). With a KV cache
    (one row, no padding) that holds layers 0..layer of the tokens before these, the new tokens run at the
    positions after them, layers 0..layer append their K/V to it, and ``key`` holds every token's.
    observe: optional ``(layer_idx, query, key) -> None``, called in each layer before ``layer``.
    """
    if cache is None:
        extra = dict(
            attention_mask=None if bool(mask.all()) else mask, position_ids=positions_from_mask(mask), use_cache=False
        )
    else:
        start = cache.get_seq_length()
        positions = torch.arange(start, start + input_ids.shape[1], device=input_ids.device)[None]
        extra = dict(position_ids=positions, use_cache=True, **cache_kwargs(cache))
    with wrapped_attention(model), torch.no_grad():
        try:
            model.base_model(input_ids=input_ids, **extra, **{STATE_KWARG: _SelectState(layer, score_fn, observe)})
        except FilterLayerReached as stop:
            return stop.payload
    raise TypeError(
        f"the forward pass finished without reaching filter layer {layer}'s attention: "
        f"{type(model).__name__} does not pass keyword arguments through to its attention kernel, "
        "so GemFilter cannot hook it"
    )


def paper_pick(raw, valid, topk: int, kernel: int):
    """Algorithm 2, steps 3-4: avg-pool then sorted top-k. Returns (indices per row, pooled (b, n))."""
    pooled = pool_scores(raw.float(), valid, kernel)
    return topk_sorted(pooled, valid, topk), pooled


class QueryTail:
    """The post-RoPE query rows of the last ``rows`` tokens each layer has seen, kept between cached passes.

    A method that scores with the last W query rows (``gemfilter-qwin``, ``gemfilter-span-qmax``, ``gemfilter-asl``)
    needs, on a pass that runs only a turn's new tokens, the rows of tokens an earlier pass ran: the cache holds
    their keys and values, not their queries. :meth:`extend` appends a pass's new rows and gives back every row
    it has (at least the last ``rows``). Memory: (b, h, rows, d) per layer read.
    """

    def __init__(self, rows: int):
        self.rows = rows
        self.by_layer = {}

    def extend(self, layer: int, query):
        """``query`` (b, h, t, d), the new tokens' rows at ``layer``, after the kept ones: (b, h, t', d)."""
        kept = self.by_layer.get(layer)
        full = query if kept is None else torch.cat([kept, query], dim=2)
        self.by_layer[layer] = full[:, :, -self.rows :]
        return full

    def copy(self) -> "QueryTail":
        twin = QueryTail(self.rows)
        twin.by_layer = dict(self.by_layer)
        return twin


def select_cached(model, method, input_ids, cache, tokenizer=None, tail: QueryTail | None = None) -> Selection:
    """A prompt method's selection over ``input_ids`` (1, n), running only the tokens ``cache`` lacks.

    cache: a KV cache holding the layers the method reads of ``input_ids[:, :c]`` (c < n, possibly 0; layers
    0..``method.layer``, or every layer for ``gemfilter-asl``); the rest run at positions c..n-1 and are appended
    to it. tail: the :class:`QueryTail` of the same tokens, for methods that read more than the last query row
    (``method.query_rows`` > 1; None for the others). Equals :func:`select_tokens` with ``method`` for every method
    whose ``selects_from_cache`` is true (``method.cached_scores`` says how).
    """
    seen = cache.get_seq_length()
    new = input_ids[:, seen:]
    if new.shape[1] == 0:
        raise ValueError(f"select_cached: the cache already holds all {seen} tokens; at least one must be new")
    if method.query_rows > 1 and tail is None:
        raise ValueError(
            f"select_cached: {method.name} reads the last {method.query_rows} query rows; give the "
            "QueryTail of the tokens the cache holds"
        )
    valid = torch.ones_like(input_ids, dtype=torch.bool)
    raw = method.cached_scores(model, new, cache, valid, tail)
    raw, rows = raw if isinstance(raw, tuple) else (raw, None)
    indices, scores = method.pick(raw.float(), valid, input_ids, tokenizer)
    kept = [row[idx] for row, idx in zip(input_ids, indices)]
    if rows is not None:
        return Selection(indices=indices, scores=scores, layer=max(rows), layers=list(rows), kept_ids=kept)
    return Selection(indices=indices, scores=scores, layer=method.layer, kept_ids=kept)


def select_chunked(model, method, input_ids, attention_mask, chunk: int, tokenizer=None) -> Selection:
    """``method``'s selection with the filter pass run over the prompt in chunks of ``chunk`` tokens.

    Each chunk runs layers 0..r at its positions and appends its K/V to a cache (layers after r never run, as in
    the one-pass filter); the last chunk's last row then scores every token at layer r (:func:`select_cached`).
    The peak holds that cache (layers 0..r of all n tokens) and one chunk's activations, instead of the whole
    prompt's activations in one layer. Equal to :func:`select_tokens` for methods that read the last query row,
    up to floating-point order in attention. input_ids: (b, n) without padding; attention_mask: None or all ones.
    """
    from .compat import dynamic_cache

    input_ids, attention_mask = as_batch(input_ids, attention_mask)
    check_prompt(input_ids, attention_mask)
    check_causal_decoder(model)
    check_params(model, method.layer, method.topk, method.kernel)
    if sliding_window_of(model, method.layer) is not None:
        raise ValueError(
            f"{method.name}: chunk={chunk}: filter layer {method.layer} has a sliding window, so its cache "
            "keeps only the window's keys and the last chunk could not score the whole prompt; choose a "
            "full-attention layer, or leave chunk unset"
        )
    if attention_mask is not None and not bool(attention_mask.bool().all()):
        raise ValueError(
            f"{method.name}: chunk={chunk} runs unpadded prompts only (each chunk's positions follow the "
            "last): give the rows one at a time, or leave chunk unset"
        )
    device = next(model.parameters()).device
    input_ids = input_ids.to(device)
    cache = dynamic_cache(model.config)
    last = input_ids.shape[1] - (input_ids.shape[1] - 1) % chunk - 1  # the final chunk: at least one token
    for start in range(0, last, chunk):
        piece = input_ids[:, start : min(start + chunk, last)]
        filter_pass(model, piece, torch.ones_like(piece), method.layer, lambda q, k: None, cache=cache)
    return select_cached(model, method, input_ids, cache, tokenizer)


def select_tokens(
    model,
    input_ids,
    attention_mask=None,
    *,
    layer: int,
    topk: int,
    kernel: int = 5,
    method=None,
    tokenizer=None,
    selector=None,
):
    """GemFilter selection (Algorithm 2, steps 1-4).

    Parameters
    ----------
    model: a transformers causal LM whose attention dispatches through AttentionInterface.
    input_ids: (b, n) long. Rows of unequal length must be left-padded and come with attention_mask.
    attention_mask: (b, n) 0/1 or None.
    layer: 0-based filter layer r in [0, m).
    topk: tokens to keep per row (capped at the row's length).
    kernel: odd avg-pool width (paper: 5).
    method: optional selection method with ``score(query (b,h,n,d), key (b,h_kv,n,d), valid (b,n)) -> (b,n)``
        and ``pick(raw, valid, input_ids, tokenizer) -> (indices, scores)``; default: paper-faithful
        last-row q.k, avg-pool, top-k (then ``topk``/``kernel`` are used). A method that scores from several
        layers defines ``score_pass(model, input_ids (b,n), mask (b,n), layer, valid (b,n)) -> raw (b,n)``,
        which then runs instead of the one-layer :func:`filter_pass`; it may return ``(raw, layers)``, each
        row's own layer, when it chooses the layer per prompt.
    tokenizer: needed only by methods that read token text (e.g. sentence spans).
    selector: optional draft model with ``model``'s tokenizer: the pass runs on its layers 0..``layer``
        instead (``layer`` is the selector's), and the result lies on ``model``'s device, ready for it.

    Returns a :class:`Selection`.
    """
    if selector is not None:
        check_selector(selector, model)
        sel = select_tokens(
            selector,
            input_ids,
            attention_mask,
            layer=layer,
            topk=topk,
            kernel=kernel,
            method=method,
            tokenizer=tokenizer,
        )
        return to_device(sel, next(model.parameters()).device)
    input_ids, attention_mask = as_batch(input_ids, attention_mask)
    check_prompt(input_ids, attention_mask)
    check_causal_decoder(model)
    check_params(model, layer, topk, kernel)
    device = next(model.parameters()).device
    input_ids = input_ids.to(device)
    mask = torch.ones_like(input_ids) if attention_mask is None else attention_mask.to(device).long()
    valid = mask.bool()
    if method is None:  # Algorithm 2 itself (what the ``gemfilter`` method runs)
        raw = filter_pass(model, input_ids, mask, layer, last_row_scores)
        indices, scores = paper_pick(raw.float(), valid, topk, kernel)
    elif method.own_score_pass:
        raw = method.score_pass(model, input_ids, mask, layer, valid)
        raw, rows = raw if isinstance(raw, tuple) else (raw, None)
        indices, scores = method.pick(raw.float(), valid, input_ids, tokenizer)
        if rows is not None:
            return Selection(
                indices=indices,
                scores=scores,
                layer=max(rows),
                layers=list(rows),
                kept_ids=[row[idx] for row, idx in zip(input_ids, indices)],
            )
    else:
        raw = filter_pass(model, input_ids, mask, layer, lambda q, k: method.score(q, k, valid))
        indices, scores = method.pick(raw.float(), valid, input_ids, tokenizer)
    kept_ids = [row[idx] for row, idx in zip(input_ids, indices)]
    return Selection(indices=indices, scores=scores, layer=layer, kept_ids=kept_ids)


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
            "(e.g. Llama 3.2 1B selecting for Llama 3.1 8B)"
        )


def to_device(selection: Selection, device) -> Selection:
    """``selection`` with its tensors on ``device`` (the target's, when the draft sits elsewhere)."""
    return dataclasses.replace(
        selection,
        indices=[i.to(device) for i in selection.indices],
        scores=selection.scores.to(device),
        kept_ids=[k.to(device) for k in selection.kept_ids],
    )
