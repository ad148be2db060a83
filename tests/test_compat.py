"""The integration seam under both spellings of the KV-cache keyword (transformers 5.24 renamed
``past_key_values`` to ``cache``; the old name stays a deprecated alias until 5.40).

Each test drives the model's forward directly, as generate would (prefill on an empty cache, then one
token at a time with a growing mask and explicit positions), under one spelling, inside ``apply()``,
and compares the greedy tokens with ``gemfilter.generate``, which goes through ``generate`` and hence
through whichever spelling the installed transformers passes.
"""

import pytest
import torch
from tiny_models import BUILDERS, FILTER_LAYER

import gemfilter
from gemfilter import compat
from gemfilter.methods import get_method

STEPS = 5


def _spelling_accepted(name: str) -> bool:
    return name == "past_key_values" or compat.cache_kwarg() == "cache"


@pytest.fixture(scope="module")
def models():
    return {f: BUILDERS[f]() for f in ("llama", "gemma3")}


def _manual_greedy(model, ids, keyword):
    """Greedy decoding through model(...) with the cache under ``keyword``; returns the new tokens."""
    cache = compat.dynamic_cache(model.config)
    mask = torch.ones_like(ids)
    step_ids, tokens = ids, []
    with torch.no_grad():
        for _ in range(STEPS):
            positions = (mask.cumsum(1) - 1)[:, -step_ids.shape[1] :]
            out = model(
                input_ids=step_ids, attention_mask=mask, position_ids=positions, use_cache=True, **{keyword: cache}
            )
            nxt = out.logits[:, -1].argmax(-1, keepdim=True)
            tokens.append(int(nxt))
            step_ids, mask = nxt, torch.cat([mask, torch.ones_like(nxt)], 1)
    return tokens, cache


@pytest.mark.parametrize("keyword", compat.CACHE_KWARGS)
@pytest.mark.parametrize("family", ["llama", "gemma3"])
@pytest.mark.parametrize("name", ["gemfilter", "snapkv", "gemfilter-one-run"])
def test_hooks_work_with_the_cache_under_either_keyword(models, family, name, keyword):
    if not _spelling_accepted(keyword):
        pytest.skip(f"transformers {compat._version()} has no `{keyword}` forward keyword")
    model = models[family]
    ids = torch.randint(3, 96, (1, 48), generator=torch.Generator().manual_seed(3))
    kw = {"layer": FILTER_LAYER[family]} if name != "snapkv" else {}
    method = get_method(name, topk=40, **kw)
    ref = gemfilter.generate(model, ids, method=method, max_new_tokens=STEPS).new_tokens[0].tolist()
    with gemfilter.apply(model, method) as handle:
        got, cache = _manual_greedy(model, ids, keyword)
    assert len(handle.calls) == 1, "the prefill under this keyword did not start the method"
    assert got == ref
    # The method really ran: the full-attention layers hold the budget, not the prompt.
    full = [layer for layer in cache.layers if getattr(layer, "sliding_window", None) is None]
    # (gemfilter prefills its 40 kept tokens; the cache methods evict to 40; then STEPS - 1 fed tokens)
    assert {layer.keys.shape[-2] for layer in full} == {40 + STEPS - 1}


def test_full_generation_under_either_keyword_equals_plain_forward(models):
    """Outside apply(): the two spellings give the same tokens on the bare model (what the seam relies on)."""
    model = models["llama"]
    ids = torch.randint(3, 96, (1, 20), generator=torch.Generator().manual_seed(4))
    spellings = [k for k in compat.CACHE_KWARGS if _spelling_accepted(k)]
    results = {k: _manual_greedy(model, ids, k)[0] for k in spellings}
    plain = model.generate(ids, max_new_tokens=STEPS, do_sample=False)[0, 20:].tolist()
    assert all(r == plain for r in results.values()), results


def test_cache_in_reads_either_keyword_and_refuses_both():
    c = object()
    assert compat.cache_in({"cache": c}) == ("cache", c)
    assert compat.cache_in({"past_key_values": c}) == ("past_key_values", c)
    assert compat.cache_in({"past_key_values": None, "input_ids": 1}) == (None, None)
    with pytest.raises(ValueError, match="both `cache` and `past_key_values`"):
        compat.cache_in({"cache": c, "past_key_values": c})


def test_cache_kwargs_and_output_cache_use_this_release_spelling(models):
    model = models["llama"]
    out = model(torch.tensor([[5, 6, 7]]), use_cache=True)
    cache = compat.output_cache(out)
    assert cache is not None and cache.get_seq_length() == 3
    assert list(compat.cache_kwargs(cache)) == [compat.cache_kwarg()]
    import transformers

    major, minor = (int(x) for x in transformers.__version__.split(".")[:2])
    assert compat.cache_kwarg() == ("cache" if (major, minor) >= (5, 24) else "past_key_values")
