"""Log-likelihood scoring with a method: select from the context only, then score the continuation.

What lm-evaluation-harness's ``loglikelihood`` requests need: log p(continuation | context) in
forward passes, with no ``generate``. A faithful GemFilter (Shi et al. 2024, Algorithm 2) selects from
the **context only**, never from the continuation, then runs the full model once on the kept context
followed by the continuation, at positions 0..k+c-1, and reads the continuation's log-probabilities.

Two paths, by what the method's call does:

- one pass (``gemfilter``, ``gemfilter-span``, ``middle-row``, ``largest-row``: methods with
  ``one_pass_scoring``): select on the context, then one forward of the plain model on kept context +
  continuation. With k >= the context length this is exactly the plain model's forward.
- through the cache (every other method: the KV-cache ones, ``fastkv``, ``gemfilter-orig-pos``, ``full``):
  inside :func:`gemfilter.apply`, a prefill forward on the context (the method selects, evicts or
  propagates as in ``generate``), then one forward of the continuation against that cache at positions
  n..n+c-2, as ``generate`` would decode them all at once.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .apply import apply, resolve
from .compat import cache_kwargs, dynamic_cache


@dataclass
class Scored:
    """What :func:`score` returns for one (context, continuation) pair.

    logprobs: (c,) float32 log p(continuation_j | kept context, continuation_<j);
    greedy: every continuation token is the argmax of its distribution;
    kept: context tokens the continuation was scored against (per-layer cache budget for cache methods);
    indices: kept context positions for methods that keep one index set, else None.
    """

    logprobs: torch.Tensor
    greedy: bool
    kept: int
    indices: torch.Tensor | None

    @property
    def total(self) -> float:
        return float(self.logprobs.sum())


def _as_ids(x, what: str) -> torch.Tensor:
    ids = torch.as_tensor(x, dtype=torch.long)
    if ids.dim() == 2 and ids.shape[0] == 1:
        ids = ids[0]
    if ids.dim() != 1 or ids.numel() == 0:
        raise ValueError(f"{what} must be a non-empty 1-D list or tensor of token ids, got shape {tuple(ids.shape)}")
    return ids


def continuation_logits(model, context, fed, method, tokenizer=None):
    """Logits (c, V) predicting each continuation token, where ``fed`` is the continuation without its last
    token (c - 1 ids, possibly none): row j predicts continuation token j. Returns (logits, kept, indices).

    context: (n,) long; fed: (c - 1,) long; method: a resolved method object.
    """
    device = next(model.parameters()).device
    context, fed = context.to(device), fed.to(device)
    n, c = len(context), len(fed) + 1
    with torch.no_grad():
        if method.one_pass_scoring:
            sel = method.select(model, context[None], None, tokenizer)
            kept = context[sel.indices[0]]
            ids = torch.cat([kept, fed])[None]
            logits = model(input_ids=ids, logits_to_keep=c).logits[0]
            return logits, len(kept), sel.indices[0]
        with apply(model, method, tokenizer=tokenizer) as handle:
            cache = dynamic_cache(model.config)
            out = model(
                input_ids=context[None],
                attention_mask=torch.ones(1, n, dtype=torch.long, device=device),
                position_ids=torch.arange(n, device=device)[None],
                use_cache=True,
                logits_to_keep=1,
                **cache_kwargs(cache),
            )
            parts = [out.logits[0, -1:]]
            if len(fed):
                out = model(
                    input_ids=fed[None],
                    attention_mask=torch.ones(1, n + c - 1, dtype=torch.long, device=device),
                    position_ids=torch.arange(n, n + c - 1, device=device)[None],
                    use_cache=True,
                    **cache_kwargs(cache),
                )
                parts.append(out.logits[0])
        call = handle.calls[-1]
        sel = call.selection
        return torch.cat(parts), call.kept[0], (sel.indices[0] if sel is not None else None)


def score(model, context_ids, continuation_ids, method=None, tokenizer=None) -> Scored:
    """log p(continuation | context) under ``method``, which selects from the context only.

    Parameters
    ----------
    model: a transformers causal LM whose attention dispatches through AttentionInterface.
    context_ids: (n,) token ids, n >= 1; continuation_ids: (c,) token ids, c >= 1.
    method: a registered method object (default: ``full``, the plain model).
    tokenizer: for methods that read token text (``gemfilter-span``).
    """
    from .methods import Full

    context, continuation = _as_ids(context_ids, "context_ids"), _as_ids(continuation_ids, "continuation_ids")
    method = resolve(model, method if method is not None else Full())
    logits, kept, indices = continuation_logits(model, context, continuation[:-1], method, tokenizer)
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    target = continuation.to(logprobs.device)
    picked = logprobs.gather(1, target[:, None])[:, 0]
    return Scored(
        logprobs=picked.cpu(),
        greedy=bool((logits.argmax(-1) == target).all()),
        kept=kept,
        indices=indices.cpu() if indices is not None else None,
    )
