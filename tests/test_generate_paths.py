"""apply() and the banded kernel under generate's less common paths.

Each case is either exact (compared with plain ``generate`` or stock SDPA) or refused with a message
that names what is supported: speculative decoding and prompt lookup, a cache filled outside the block,
static caches, bidirectional sliding windows, ``output_attentions`` and a window of 1 with a cache.
"""

import warnings

import pytest
import torch
from tiny_models import BUILDERS, FILTER_LAYER, _build
from transformers import MistralConfig, MistralForCausalLM

import gemfilter
from gemfilter import compat
from gemfilter.methods import get_method

PROMPT = 48
NEW = 6


pytestmark = pytest.mark.usefixtures("quiet")


@pytest.fixture(scope="module")
def models():
    return {f: BUILDERS[f]() for f in ("llama", "mistral-sliding", "gemma3")}


def ids_of(n=PROMPT, seed=3):
    return torch.randint(3, 96, (1, n), generator=torch.Generator().manual_seed(seed))


def method_for(name, family):
    return get_method(name, topk=20, **({"layer": FILTER_LAYER[family]} if "gemfilter" in name else {}))


SPECULATIVE = {
    "assistant_model": lambda: {"assistant_model": BUILDERS["llama"]()},
    "prompt_lookup_num_tokens": lambda: {"prompt_lookup_num_tokens": 3},
    "assistant_early_exit": lambda: {"assistant_early_exit": 1},
}


@pytest.mark.parametrize("option", sorted(SPECULATIVE))
@pytest.mark.parametrize("name", ["gemfilter", "h2o", "gemfilter-one-run", "snapkv", "full"])
def test_speculative_decoding_is_refused_inside_apply(models, name, option):
    model = models["llama"]
    prompt = torch.tensor([[5, 6, 7, 8, 9] * 10])  # repetitive: prompt lookup finds candidates
    with gemfilter.apply(model, method_for(name, "llama")) as handle:
        with pytest.raises(ValueError, match="assisted generation, prompt lookup and assistant early exit"):
            model.generate(prompt, max_new_tokens=NEW, do_sample=False, **SPECULATIVE[option]())
    assert handle.calls == []  # refused before any forward ran
    # Outside the block the model is as it was: the same option runs again.
    assert "_supported_generation_modes" not in vars(model)
    out = model.generate(prompt, max_new_tokens=NEW, do_sample=False, **SPECULATIVE[option]())
    assert out.shape == (1, 50 + NEW)


def test_the_refusal_keeps_greedy_sampling_and_beams(models):
    model = models["llama"]
    ids = ids_of()
    method = method_for("gemfilter", "llama")
    with gemfilter.apply(model, method):
        greedy = model.generate(ids, max_new_tokens=NEW, do_sample=False)
        beams = model.generate(ids, max_new_tokens=NEW, do_sample=False, num_beams=2)
        torch.manual_seed(0)
        sampled = model.generate(ids, max_new_tokens=NEW, do_sample=True, top_k=5)
    assert greedy.shape == beams.shape == sampled.shape == (1, PROMPT + NEW)
    ref = gemfilter.generate(model, ids, method=method, max_new_tokens=NEW).sequences
    assert torch.equal(greedy, ref)


def _prefilled(model, n=20):
    cache = compat.dynamic_cache(model.config)
    with torch.no_grad():
        model(ids_of()[:, :n], use_cache=True, **compat.cache_kwargs(cache))
    return cache


@pytest.mark.parametrize("name", ["gemfilter", "snapkv", "full"])
def test_a_cache_filled_outside_the_block_is_refused(models, name):
    model = models["llama"]
    cache = _prefilled(model)
    with gemfilter.apply(model, method_for(name, "llama")) as handle:
        with pytest.raises(ValueError, match="already holds 20 tokens and was not filled inside this apply"):
            model.generate(ids_of(), max_new_tokens=NEW, do_sample=False, **compat.cache_kwargs(cache))
    assert handle.calls == []
    with pytest.raises(ValueError, match="already holds 20 tokens"):
        gemfilter.generate(
            model,
            ids_of(),
            method=method_for(name, "llama"),
            max_new_tokens=NEW,
            **compat.cache_kwargs(_prefilled(model)),
        )


def test_an_empty_cache_passed_in_still_runs_the_method(models):
    model = models["llama"]
    method = method_for("gemfilter", "llama")
    ref = gemfilter.generate(model, ids_of(), method=method, max_new_tokens=NEW).sequences
    got = gemfilter.generate(
        model, ids_of(), method=method, max_new_tokens=NEW, **compat.cache_kwargs(compat.dynamic_cache(model.config))
    )
    assert torch.equal(got.sequences, ref) and got.kept == [20]


@pytest.mark.parametrize("family", ["mistral-sliding", "gemma3"])
@pytest.mark.parametrize("n", [10, PROMPT])  # shorter than Mistral's window of 16, and past both windows
def test_banded_with_a_static_cache_equals_sdpa(models, family, n):
    model = models[family]
    ids = ids_of(n)
    outs = {}
    try:
        for kernel in ("sdpa", "banded"):
            gemfilter.set_attention(model, kernel)
            outs[kernel] = model.generate(
                ids,
                max_new_tokens=NEW,
                do_sample=False,
                cache_implementation="static",
                output_logits=True,
                return_dict_in_generate=True,
            )
    finally:
        gemfilter.set_attention(model, "sdpa")
    assert torch.equal(outs["banded"].sequences, outs["sdpa"].sequences)
    for ref, got in zip(outs["sdpa"].logits, outs["banded"].logits):
        assert (got - ref).abs().max() < 1e-4
    plain = model.generate(ids, max_new_tokens=NEW, do_sample=False)
    assert torch.equal(outs["banded"].sequences, plain)


@pytest.mark.parametrize("family", ["mistral-sliding", "gemma3"])
def test_apply_with_a_static_cache_is_refused_by_name(models, family):
    model = models[family]
    with gemfilter.apply(model, method_for("gemfilter", family)):
        with pytest.raises(ValueError, match="needs a dynamic KV cache, got StaticCache"):
            model.generate(ids_of(), max_new_tokens=NEW, do_sample=False, cache_implementation="static")


def test_a_mask_that_is_not_a_tensor_is_refused_by_type(models):
    """The type is checked before the shape: a dict of prebuilt masks gets the same clear refusal."""
    model = models["llama"]
    with gemfilter.apply(model, method_for("gemfilter", "llama")):
        with pytest.raises(ValueError, match="only 2-D .batch, seq. attention masks are supported, got a dict"):
            model(
                input_ids=ids_of(),
                attention_mask={"full_attention": None},
                use_cache=True,
                **compat.cache_kwargs(compat.dynamic_cache(model.config)),
            )


@pytest.fixture(scope="module")
def bidirectional():
    return _build(MistralForCausalLM, MistralConfig, sliding_window=16, head_dim=16, is_causal=False)


def test_banded_on_a_bidirectional_sliding_model_equals_sdpa(bidirectional):
    """config.is_causal=False: transformers' sliding mask lets each query see W keys ahead, outside the band."""
    ids = ids_of(PROMPT)
    logits = {}
    for kernel in ("sdpa", "banded"):
        gemfilter.set_attention(bidirectional, kernel)
        with torch.no_grad():
            logits[kernel] = bidirectional(ids).logits
    gemfilter.set_attention(bidirectional, "sdpa")
    assert (logits["banded"] - logits["sdpa"]).abs().max() < 1e-4


def test_apply_refuses_a_bidirectional_config(bidirectional):
    with pytest.raises(TypeError, match=r"not a causal decoder \(its config \(is_causal=False\) attends both ways"):
        with gemfilter.apply(bidirectional, get_method("gemfilter", layer=2, topk=20)):
            pass


def test_banded_warns_that_it_returns_no_attention_weights(models):
    model = models["mistral-sliding"]
    gemfilter.set_attention(model, "banded")
    try:
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            with torch.no_grad():
                model(ids_of(), output_attentions=True)
    finally:
        gemfilter.set_attention(model, "sdpa")
    assert any("returns no attention weights" in str(w.message) and "attn='eager'" in str(w.message) for w in seen)


def test_window_of_one_with_a_cache_is_refused_with_the_reason():
    model = _build(MistralForCausalLM, MistralConfig, sliding_window=1, head_dim=16)
    gemfilter.set_attention(model, "banded")
    cache = compat.dynamic_cache(model.config)
    ids = ids_of(12)
    with torch.no_grad():
        model(ids, use_cache=True, **compat.cache_kwargs(cache))
        with pytest.raises(ValueError, match="with sliding_window=1, transformers' sliding cache layer keeps every"):
            model(
                ids_of(1, seed=9),
                attention_mask=torch.ones(1, 13, dtype=torch.long),
                use_cache=True,
                **compat.cache_kwargs(cache),
            )
