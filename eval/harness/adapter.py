"""The harness model ``gemfilter``: lm-evaluation-harness's ``hf`` model with a gemfilter method applied.

Paper: Shi et al. 2024 (GemFilter); every method of ``gemfilter methods`` runs the same way.

- ``generate_until``: the harness's own batched, left-padded ``generate``, inside :func:`gemfilter.apply`.
  Methods that refuse left-padded batches (``fastkv`` when it propagates; cache methods on sliding-window
  models) refuse them here too: use ``batch_size=1``.
- ``loglikelihood`` / ``loglikelihood_rolling``: the harness batches, truncates and slices as for ``hf``;
  each row's logits come from :func:`gemfilter.score.continuation_logits`, which selects from the
  context only (the split is the request's own) and scores the continuation.

``model_args`` (``--model_args`` or ``simple_evaluate(model="gemfilter", model_args=...)``):
``pretrained`` (``embedded`` for the embedded Gemma 3 270M, the default), ``method`` (a registry name,
default ``gemfilter``), ``topk`` (tokens kept or cache budget) or ``ratio`` (topk = ratio x the prompt's
tokens), ``layer`` (filter / TSP layer; default the model's), ``attn`` (``banded``, ``sdpa``, ``eager``),
and every argument of the harness's ``hf`` model (``dtype``, ``device``, ``batch_size``, ...).
"""

from __future__ import annotations

import torch
from lm_eval.api.registry import register_model
from lm_eval.models.huggingface import HFLM

import gemfilter
from gemfilter.apply import resolve
from gemfilter.methods import REGISTRY
from gemfilter.score import continuation_logits

DEFAULT_TOPK = 1024


@register_model("gemfilter")
class GemFilterLM(HFLM):
    """``hf`` plus a method: ``method``, ``topk`` or ``ratio``, ``layer``, ``attn`` (see the module docstring)."""

    def __init__(self, pretrained="embedded", method="gemfilter", topk=None, ratio=None, layer=None, attn=None,
                 **kwargs):
        if method not in REGISTRY:
            raise ValueError(f"model_args method={method!r} is not a registered method; allowed: "
                             f"{', '.join(sorted(REGISTRY))}")
        if topk is not None and ratio is not None:
            raise ValueError("model_args: give topk or ratio, not both")
        if ratio is not None and not (isinstance(ratio, (int, float)) and 0 < float(ratio) <= 1):
            raise ValueError(f"model_args ratio={ratio!r} must be a number in (0, 1] (topk = ratio x prompt tokens)")
        if topk is not None and (isinstance(topk, bool) or not isinstance(topk, int) or topk < 1):
            raise ValueError(f"model_args topk={topk!r} must be an int >= 1")
        if pretrained == "embedded":
            from gemfilter.models import embedded_model_dir

            pretrained = str(embedded_model_dir())
        kwargs.setdefault("device", "cuda" if torch.cuda.is_available() else "cpu")
        super().__init__(pretrained=pretrained, **kwargs)
        if attn is not None:
            gemfilter.set_attention(self.model, attn)
        self.method_name, self.topk, self.ratio, self.layer = method, topk, ratio, layer
        self._splits: dict = {}  # while a loglikelihood run lasts: row tokens -> context length
        self._lengths: list = []  # their distinct lengths, longest first
        self.method_for(1)  # refuse a bad layer or budget before any request runs

    def method_for(self, prompt_tokens: int):
        """The resolved method for a prompt of ``prompt_tokens`` tokens (``ratio`` scales with it)."""
        topk = self.topk if self.ratio is None else max(1, round(float(self.ratio) * prompt_tokens))
        return resolve(self.model, gemfilter.get_method(self.method_name, layer=self.layer,
                                                       topk=topk if topk is not None else DEFAULT_TOPK))

    def _model_generate(self, context, max_length, stop, **generation_kwargs):
        with gemfilter.apply(self.model, self.method_for(context.shape[1]), tokenizer=self.tokenizer):
            return super()._model_generate(context, max_length, stop, **generation_kwargs)

    def _loglikelihood_tokens(self, requests, disable_tqdm=False, override_bs=None):
        # The harness hands _model_call only the padded token rows; remember where each row's context ends
        # (after the harness's own left truncation to max_length + 1 tokens).
        splits = {}
        for _, context, continuation in requests:
            whole = (context + continuation)[-(self.max_length + 1):]
            key, ctx_len = tuple(whole[:-1]), len(whole) - len(continuation)
            if splits.setdefault(key, ctx_len) != ctx_len:
                raise ValueError("two loglikelihood requests have the same tokens but split them differently into "
                                 "context and continuation; the gemfilter adapter cannot tell which row is which")
        self._splits, self._lengths = splits, sorted({len(k) for k in splits}, reverse=True)
        try:
            return super()._loglikelihood_tokens(requests, disable_tqdm=disable_tqdm, override_bs=override_bs)
        finally:
            self._splits, self._lengths = {}, []

    def _row(self, row):
        """(tokens, context length) of one right-padded input row, from the requests' own splits."""
        ids = row.tolist()
        for n in (n for n in self._lengths if n <= len(ids)):
            if not any(ids[n:]) and tuple(ids[:n]) in self._splits:
                return ids[:n], self._splits[tuple(ids[:n])]
        raise RuntimeError("gemfilter adapter: an input row matches no loglikelihood request")

    def _model_call(self, inps, attn_mask=None, labels=None):
        if not self._splits:  # not a loglikelihood batch (e.g. the harness's batch-size probe): plain model
            return super()._model_call(inps, attn_mask=attn_mask, labels=labels)
        out = None
        for i, row in enumerate(inps):
            ids, ctx_len = self._row(row)
            tokens = torch.tensor(ids, dtype=torch.long)
            if ctx_len == 0:  # the context was truncated away: nothing to select from
                logits = super()._model_call(tokens[None].to(inps.device))[0]
            else:
                method = self.method_for(ctx_len)
                logits, _, _ = continuation_logits(self.model, tokens[:ctx_len], tokens[ctx_len:], method,
                                                   self.tokenizer)
            if out is None:
                out = logits.new_zeros(inps.shape + (logits.shape[-1],))
            out[i, len(ids) - len(logits):len(ids)] = logits  # the harness reads positions ctx_len - 1 .. n - 1
        return out
