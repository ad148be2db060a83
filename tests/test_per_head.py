"""Per-query-head SnapKV / H2O (the paper's baselines) and SnapKV's pooling edge.

References are built by hand: q and k re-derived from the hidden states (tests/reference.py), K
repeated to the query heads, fp32 softmax, explicit window sums for the pooling, plain sorting for
the top-k. Reading the h-head cache is checked against a second model: the same weights with K/V
projections repeated (multi-head attention, g = 1), where one set per KV head *is* one per query head.
"""

import pytest
import torch
from reference import qk_at_layer
from tiny_models import BUILDERS

import gemfilter
from gemfilter.compat import output_cache
from gemfilter.methods import get_method
from gemfilter.methods.cache import SnapKV

WINDOW = 32


pytestmark = pytest.mark.usefixtures("quiet_sliding_filter_layer")


def prompt(n, seed):
    return torch.randint(3, 96, (1, n), generator=torch.Generator().manual_seed(seed))


def dense_probs(model, ids, layer):
    """(h, n, n) causal fp32 softmax of hand-derived q and repeated k."""
    q, k = qk_at_layer(model, ids, layer)
    k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
    logits = (q.float() @ k.float().transpose(-1, -2)) * model.model.layers[layer].self_attn.scaling
    n = ids.shape[1]
    return logits.masked_fill(torch.triu(torch.ones(n, n, dtype=torch.bool), 1), float("-inf")).softmax(-1)[0]


def pool_prefix_by_hand(votes, window):
    """avg-pool 5, zero padding, over the first n - window columns only; (h, n - window)."""
    m = votes.shape[-1] - window
    return torch.stack([votes[:, max(0, j - 2) : min(j + 3, m)].sum(1) / 5 for j in range(m)], 1)


def top_plus_window(scores, n, budget, window):
    """One sorted kept list per row of ``scores`` (h, n - window): top (budget - window) + the window."""
    out = []
    for row in scores.tolist():
        top = sorted(range(len(row)), key=lambda j: -row[j])[: budget - window]
        out.append(sorted(top + list(range(n - window, n))))
    return out


def full_layers(model):
    types = getattr(model.config, "layer_types", None)
    return [i for i in range(model.config.num_hidden_layers) if types is None or types[i] == "full_attention"]


@pytest.mark.parametrize("family", ["llama", "gemma3"])
def test_per_head_kept_sets_equal_the_hand_reference(family):
    model = BUILDERS[family]()
    n, budget = 72, 44
    ids = prompt(n, seed=11)
    for name in ("snapkv-per-head", "h2o-per-head"):
        with gemfilter.apply(model, get_method(name, topk=budget)) as handle:
            model.generate(ids, max_new_tokens=1, do_sample=False)
        plans = handle.calls[-1].plans
        assert sorted(plans) == full_layers(model)
        for layer in full_layers(model):
            probs = dense_probs(model, ids, layer)  # (h, n, n)
            if name == "snapkv-per-head":
                scores = pool_prefix_by_hand(probs[:, -WINDOW:, :].sum(1), WINDOW)
            else:
                scores = probs.sum(1)[:, : n - WINDOW]  # heavy hitters: column sums, recent ones excluded
            ref = top_plus_window(scores, n, budget, WINDOW)
            got = plans[layer][0].tolist()
            assert len(got) == model.config.num_attention_heads  # h sets, not h_kv
            assert got == ref, (name, layer)
        # The query heads of one group really disagree somewhere, so per-head is not the group mean.
        assert any(plans[i][0, 0].tolist() != plans[i][0, 1].tolist() for i in plans), name


@pytest.mark.parametrize("family", ["llama", "gemma3"])
def test_after_prefill_the_cache_holds_h_heads_of_the_kept_rows(family):
    model = BUILDERS[family]()
    n, budget = 72, 40
    ids = prompt(n, seed=12)
    h, h_kv = model.config.num_attention_heads, model.config.num_key_value_heads
    with torch.no_grad():
        plain = output_cache(model(ids, use_cache=True))  # the un-evicted cache, (1, h_kv, n, d)
    for name, heads in (("snapkv-per-head", h), ("snapkv", h_kv), ("h2o-per-head", h)):
        with gemfilter.apply(model, get_method(name, topk=budget)) as handle:
            out = model.generate(ids, max_new_tokens=1, do_sample=False, return_dict_in_generate=True)
        plans = handle.calls[-1].plans
        for i, layer in enumerate(output_cache(out).layers):
            if getattr(layer, "sliding_window", None) is not None:
                assert layer.keys.shape[1] == h_kv  # sliding layers are not evicted
                continue
            assert layer.keys.shape == (1, heads, budget, plain.layers[i].keys.shape[-1]), (name, i)
            if heads == h:
                full_k = plain.layers[i].keys.repeat_interleave(h // h_kv, dim=1)
                full_v = plain.layers[i].values.repeat_interleave(h // h_kv, dim=1)
                for j in range(h):
                    idx = plans[i][0, j]
                    assert torch.allclose(layer.keys[0, j], full_k[0, j, idx], atol=1e-5), (name, i, j)
                    assert torch.allclose(layer.values[0, j], full_v[0, j, idx], atol=1e-5), (name, i, j)


def mha_twin(model):
    """The same network with K/V projections repeated per query head (h_kv = h): identical outputs."""
    h, h_kv = model.config.num_attention_heads, model.config.num_key_value_heads
    twin = type(model)(type(model.config)(**{**model.config.to_dict(), "num_key_value_heads": h})).eval()
    state = model.state_dict()
    for key, value in list(state.items()):
        if key.endswith(("k_proj.weight", "v_proj.weight")):
            d = value.shape[0] // h_kv
            state[key] = value.reshape(h_kv, d, -1).repeat_interleave(h // h_kv, dim=0).reshape(h * d, -1)
    twin.load_state_dict(state)
    twin.set_attn_implementation(model.config._attn_implementation)
    return twin


@pytest.mark.parametrize("attn", ["sdpa", "eager", "banded"])
@pytest.mark.parametrize("family", ["llama", "gemma3"])
def test_decoding_reads_the_h_head_cache_like_a_multi_head_twin(family, attn):
    model = BUILDERS[family]()
    if attn == "banded":  # the embedded model's default kernel (sliding layers; full layers go to sdpa)
        from gemfilter.banded import register

        register()
    model.set_attn_implementation(attn)
    twin = mha_twin(model)
    n, budget = 72, 40
    ids = prompt(n, seed=13)
    with torch.no_grad():  # the twin is the same function
        assert torch.allclose(model(ids).logits, twin(ids).logits, atol=1e-4)
    for per_head, twin_method in (("snapkv-per-head", "snapkv"), ("h2o-per-head", "h2o")):
        got = gemfilter.generate(
            model,
            ids,
            method=get_method(per_head, topk=budget),
            max_new_tokens=10,
            output_scores=True,
            return_dict_in_generate=True,
        )
        # In the twin every KV head serves one query head, so its one-set-per-KV-head cache is the
        # per-query-head cache, read by the unmodified kernel.
        ref = gemfilter.generate(
            twin,
            ids,
            method=get_method(twin_method, topk=budget),
            max_new_tokens=10,
            output_scores=True,
            return_dict_in_generate=True,
        )
        assert got.new_tokens.tolist() == ref.new_tokens.tolist(), (per_head, attn)
        for a, b in zip(got.output.scores, ref.output.scores):
            assert torch.allclose(a, b, atol=1e-4), (per_head, attn)
        group = gemfilter.generate(
            model,
            ids,
            method=get_method(twin_method, topk=budget),
            max_new_tokens=10,
            output_scores=True,
            return_dict_in_generate=True,
        )
        # and the group-mean cache gives other logits: the test can tell the two layouts apart
        assert not all(torch.allclose(a, b, atol=1e-4) for a, b in zip(got.output.scores, group.output.scores))


def test_per_head_cache_is_g_times_the_group_mean_cache():
    model = BUILDERS["llama"]()
    sizes = {}
    for name in ("snapkv", "snapkv-per-head", "h2o", "h2o-per-head"):
        with gemfilter.apply(model, get_method(name, topk=40)):
            out = model.generate(prompt(72, 14), max_new_tokens=1, do_sample=False, return_dict_in_generate=True)
        sizes[name] = sum(layer.keys.numel() + layer.values.numel() for layer in output_cache(out).layers)
    g = model.config.num_attention_heads // model.config.num_key_value_heads
    assert sizes["snapkv-per-head"] == g * sizes["snapkv"] and sizes["h2o-per-head"] == g * sizes["h2o"]


def test_snapkv_pools_only_the_scores_before_the_window():
    """The official copy and kvpress pool votes[..., :-window]; pooling all n would let the window's
    own (large) votes raise the two positions just before it."""
    g = torch.Generator().manual_seed(0)
    b, h, n, d, window = 1, 2, 40, 8, 8
    q = torch.randn(b, h, n, d, generator=g)
    k = torch.randn(b, h, n, d, generator=g)
    k[:, :, n - window :] = q[:, :, -1:].expand(-1, -1, window, -1) * 3  # the window votes for itself
    valid = torch.ones(b, n, dtype=torch.bool)
    budget = window + 6
    method = SnapKV(topk=budget, window=window, gqa="repeat-kv")
    got = method.plan(0, q, k, valid, 0.5)[0].tolist()
    logits = (q @ k.transpose(-1, -2))[0] * 0.5
    logits = logits.masked_fill(torch.triu(torch.ones(n, n, dtype=torch.bool), 1), float("-inf"))
    votes = logits.float().softmax(-1)[:, -window:, :].sum(1)  # (h, n)
    assert got == top_plus_window(pool_prefix_by_hand(votes, window), n, budget, window)
    # Pooling all n (the old edge) keeps the two positions before the window: a different set.
    all_n = torch.stack([votes[:, max(0, j - 2) : j + 3].sum(1) / 5 for j in range(n)], 1)[:, : n - window]
    old = top_plus_window(all_n, n, budget, window)
    assert old != got
    assert all({n - window - 2, n - window - 1} <= set(row) for row in old)


def test_bad_gqa_is_refused():
    with pytest.raises(ValueError, match="gqa must be one of group-mean, repeat-kv"):
        get_method("snapkv", gqa="per-head")
    with pytest.raises(ValueError, match="h2o: gqa must be one of"):
        get_method("h2o", gqa="mean")
    assert get_method("snapkv-per-head").gqa == "repeat-kv" and get_method("snapkv").gqa == "group-mean"


@pytest.mark.slow
def test_embedded_model_per_head_cache_reads_like_its_multi_head_twin():
    """The embedded Gemma 3 270M (4 query heads, 1 KV head; banded sliding layers): 4 sets per full
    layer, and the greedy answer with logits equal to a multi-head twin running group-mean SnapKV."""
    from gemfilter.toolkit.haystack import build_case

    model, tok = gemfilter.load_model()
    twin = mha_twin(model)
    ids = tok(build_case(tok, 1000, 50, haystack_dir=None).prompt, return_tensors="pt")["input_ids"]
    kw = dict(max_new_tokens=8, output_scores=True, return_dict_in_generate=True)
    with gemfilter.apply(model, get_method("snapkv-per-head", topk=256)):
        got = model.generate(ids, do_sample=False, **kw)
    heads = {layer.keys.shape[1] for layer in output_cache(got).layers if not getattr(layer, "is_sliding", False)}
    assert heads == {4}
    ref = gemfilter.generate(twin, ids, method=get_method("snapkv", topk=256), **kw)
    assert got.sequences[0, ids.shape[1] :].tolist() == ref.new_tokens[0].tolist()
    for a, b in zip(got.scores, ref.output.scores):
        assert torch.allclose(a, b, atol=1e-3)
