"""Phi-3's LongRoPE switch inside apply() (found by the GPU run: Phi 3.5 Mini at 120K failed for every method).

Phi-3's generate step passes no cache once the sequence is longer than original_max_position_embeddings while
the cache holds no more than that. Inside apply() a method's cache is shorter than the sequence, so every
method failed on a long prompt. References: plain generate (k >= n), and a hand-written greedy loop that
passes the cache itself (the step that drops it never runs).
"""

import pytest
import torch
from tiny_models import COMMON, DotTokenizer
from transformers import Phi3Config, Phi3ForCausalLM

import gemfilter
from gemfilter.compat import cache_in, cache_kwargs, dynamic_cache
from gemfilter.methods import REGISTRY, get_method

SWITCH = 48  # original_max_position_embeddings: the RoPE factors switch beyond it
N = 72

pytestmark = pytest.mark.usefixtures("quiet")


@pytest.fixture(scope="module")
def phi():
    torch.manual_seed(0)
    half = 8  # head_dim 16 / 2
    cfg = Phi3Config(
        **{**COMMON, "pad_token_id": 0},
        original_max_position_embeddings=SWITCH,
        rope_scaling={"type": "longrope", "short_factor": [1.0] * half, "long_factor": [1.0 + i for i in range(half)]},
    )
    model = Phi3ForCausalLM(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "qkv_proj" in name:
                p.mul_(4.0)
    return model


def prompt(n):
    return torch.randint(3, 96, (1, n), generator=torch.Generator().manual_seed(n))


def test_the_factors_really_switch(phi):
    """The reference model is a real LongRoPE model: a long prompt's logits depend on the long factors."""
    ids = prompt(N)
    with torch.no_grad():
        long = phi(input_ids=ids).logits[0, SWITCH - 1]
        short = phi(input_ids=ids[:, :SWITCH]).logits[0, -1]
    assert not torch.allclose(long, short, atol=1e-4)


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_every_method_with_k_ge_n_equals_plain_generate_past_the_switch(phi, name):
    ids = prompt(N)
    plain = phi.generate(ids, max_new_tokens=6, do_sample=False)
    out = gemfilter.generate(
        phi, ids, method=get_method(name, topk=N, layer=2), tokenizer=DotTokenizer(), max_new_tokens=6, min_new_tokens=6
    )
    assert torch.equal(out.sequences, plain), name


def greedy_by_hand(model, method, ids, steps):
    """Prefill and decode inside apply() with the cache passed explicitly at each step."""
    n, tokens = ids.shape[1], []
    with gemfilter.apply(model, method, tokenizer=DotTokenizer()):
        cache = dynamic_cache(model.config)
        with torch.no_grad():
            out = model(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=True, **cache_kwargs(cache))
            for step in range(steps):
                tokens.append(out.logits[:, -1].argmax(-1))
                if step == steps - 1:
                    break
                out = model(
                    input_ids=tokens[-1][:, None],
                    attention_mask=torch.ones(1, n + step + 1, dtype=torch.long),
                    position_ids=torch.tensor([[n + step]]),
                    use_cache=True,
                    **cache_kwargs(cache),
                )
    return torch.stack(tokens, 1)


@pytest.mark.parametrize("name", ["gemfilter", "snapkv", "h2o", "fastkv", "gemfilter-orig-pos"])
def test_compressing_methods_past_the_switch_decode_on_their_own_cache(phi, name):
    ids = prompt(N)
    method = get_method(name, topk=40, layer=2, **({"tsp_len": 56} if name == "fastkv" else {}))
    out = gemfilter.generate(phi, ids, method=method, tokenizer=DotTokenizer(), max_new_tokens=6, min_new_tokens=6)
    assert out.kept == [40] or name == "fastkv"
    assert torch.equal(out.new_tokens, greedy_by_hand(phi, method, ids, 6)), name


@pytest.mark.parametrize("name", ["snapkv", "gemfilter-orig-pos"])
def test_a_generation_that_crosses_the_switch_with_a_compressed_cache_is_refused(phi, name):
    ids = prompt(SWITCH - 2)  # the prefill is below the switch; the third new token crosses it
    with pytest.raises(
        ValueError, match=f"across the model's RoPE switch at original_max_position_embeddings={SWITCH}"
    ):
        gemfilter.generate(phi, ids, method=get_method(name, topk=40, layer=2), max_new_tokens=6, min_new_tokens=6)


def inputs_when_dropped(model, ids):
    """Lengths of the decode inputs that the installed release's generate sends without a cache: the whole
    sequence (releases from 5.24) or only the new token (5.17, cut at its cache_position)."""
    seen = []
    hook = model.register_forward_pre_hook(
        lambda module, args, kw: seen.append((cache_in(kw)[1] is None, kw["input_ids"].shape[1])), with_kwargs=True
    )
    try:
        model.generate(ids, max_new_tokens=6, do_sample=False)
    finally:
        hook.remove()
    return [n for dropped, n in seen[1:] if dropped]


@pytest.mark.parametrize("name", ["full", "snapkv"])
def test_a_cache_that_holds_every_token_crosses_the_switch_as_the_model_does_or_is_refused(phi, name):
    """Given the whole sequence, the block recomputes it as plain generate does; given only the new token, there
    is nothing to recompute from (plain generate then runs that token alone), so the step is refused."""
    ids = prompt(SWITCH - 2)
    dropped = inputs_when_dropped(phi, ids)
    assert dropped, "Phi-3 no longer drops its cache at the switch: this test has nothing to check"
    method = get_method(name, topk=SWITCH + 16)
    if min(dropped) > 1:
        out = gemfilter.generate(phi, ids, method=method, max_new_tokens=6, min_new_tokens=6)
        assert torch.equal(out.sequences, phi.generate(ids, max_new_tokens=6, do_sample=False))
    else:
        with pytest.raises(ValueError, match="across the model's RoPE switch"):
            gemfilter.generate(phi, ids, method=method, max_new_tokens=6, min_new_tokens=6)
