"""GemFilter as a transformers ``custom_generate`` method: ``model.generate(..., custom_generate=REPO)``.

Paper: Shi, Ming, Nguyen, Liang, Joty 2024, "Discovering the Gems in Early Layers: Accelerating Long-Context
LLMs with 1000x Input Token Reduction", Algorithm 2: run the first r decoder layers on the prompt, keep the
top-k prompt tokens by layer r's last-row attention (smoothed, in their original order), and generate from
those k tokens at new positions 0..k-1.

transformers loads this file from a Hub repo (or a local folder) laid out as ``custom_generate/generate.py``
and calls :func:`generate` with the model and every argument of ``model.generate``. The method itself is the
``gemfilter`` package (``pip install gemfilter-lab``): this file maps ``generate``'s arguments onto
``gemfilter.generate`` and returns what ``model.generate`` returns.
"""

import torch

import gemfilter
from gemfilter.methods import parse_method


def generate(
    model,
    inputs=None,
    gemfilter_method="gemfilter",
    gemfilter_tokenizer=None,
    gemfilter_selector=None,
    gemfilter_output=False,
    **kwargs,
):
    """``model.generate`` with the prompt filtered by GemFilter (or another registered method).

    Parameters
    ----------
    model: the causal LM ``model.generate`` was called on (transformers passes it).
    inputs: the prompt ids, as ``generate``'s first argument; else ``input_ids`` (and ``attention_mask``) in kwargs.
    gemfilter_method: a method spec, ``NAME[:key=value,...]`` (default ``"gemfilter"``: the paper's filter at the
        model's default layer, k=1024), e.g. ``"gemfilter:k=1024"``, ``"gemfilter-span:k=256,layer=11"``,
        ``"snapkv:ratio=0.1"``; or a method object (``gemfilter.GemFilter(layer=13, topk=1024)``).
    gemfilter_tokenizer: the model's tokenizer, for methods that read token text (``gemfilter-span``).
    gemfilter_selector: a smaller model with the same tokenizer that makes the selection (a draft selector).
    gemfilter_output: True returns ``gemfilter.GemFilterOutput`` (the kept indices and counts with the output)
        instead of what ``model.generate`` returns.
    kwargs: every other ``generate`` argument (``max_new_tokens``, ``generation_config``, ``streamer``, ...),
        passed on; decoding is greedy unless they say otherwise, as in the paper.
    """
    args = {k: v for k, v in kwargs.items() if v is not None}  # transformers passes every named argument, most None
    ids = inputs if inputs is not None else args.pop("input_ids", None)
    if ids is None:
        raise ValueError(
            "GemFilter needs the prompt's token ids: call model.generate(input_ids=...) or "
            "model.generate(**tokenizer(prompt, return_tensors='pt'), ...)"
        )
    prompt = {"input_ids": ids, "attention_mask": args.pop("attention_mask", None)}
    if isinstance(gemfilter_method, str):
        method = parse_method(gemfilter_method, prompt_tokens=int(torch.as_tensor(ids).shape[-1]))
    else:
        method = gemfilter_method
    # A repo that holds both weights and this folder makes from_pretrained(..., trust_remote_code=True) set
    # model.generate to this function: gemfilter.generate calls model.generate, so the class's own is restored
    # for the call (else it would call itself).
    own = model.__dict__.pop("generate", None)
    try:
        out = gemfilter.generate(
            model, prompt, method=method, tokenizer=gemfilter_tokenizer, selector=gemfilter_selector, **args
        )
    finally:
        if own is not None:
            model.generate = own
    return out if gemfilter_output else out.output
