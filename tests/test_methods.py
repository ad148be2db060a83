"""Method registry and baselines (issue 3) on tiny random models, against explicit references."""

import pytest
import torch
from reference import qk_at_layer
from tiny_models import BUILDERS, FILTER_LAYER, DotTokenizer, on

import gemfilter
from gemfilter.compat import cache_kwargs, output_cache
from gemfilter.methods import REGISTRY, get_method
from gemfilter.methods.cache import column_sums

N = 48


pytestmark = pytest.mark.usefixtures("quiet_sliding_filter_layer")


def prompt(n=N, seed=1):
    return torch.randint(3, 96, (1, n), generator=torch.Generator().manual_seed(seed))


def run(model, method, ids, **kw):
    return gemfilter.generate(model, ids, method=method, tokenizer=DotTokenizer(), max_new_tokens=8, **kw)


def test_registry_lists_every_method_with_a_description():
    expected = {
        "full",
        "gemfilter",
        "gemfilter-span",
        "snapkv",
        "h2o",
        "gemfilter-one-run",
        "middle-row",
        "largest-row",
    }
    assert expected <= set(REGISTRY)
    for name, desc in gemfilter.describe():
        assert desc and len(desc) > 20, name
    with pytest.raises(ValueError, match="unknown method 'snap'; allowed: .*snapkv"):
        get_method("snap")
    assert get_method("snapkv", layer=3, topk=64).topk == 64  # layer is ignored: snapkv has none


@pytest.mark.parametrize("family", ["llama", "mistral-sliding", "gemma3"])
def test_budget_ge_n_every_method_equals_full(family, device):
    model = on(BUILDERS[family](), device)
    ids = prompt().to(device)
    full = model.generate(ids, max_new_tokens=8, do_sample=False)
    for name in sorted(REGISTRY):
        params = {"topk": N, "layer": FILTER_LAYER[family]}
        out = run(model, get_method(name, **params), ids)
        assert torch.equal(out.sequences, full), name
        assert out.kept == [N], name


@pytest.mark.parametrize("family", ["llama", "gemma3"])
@pytest.mark.parametrize("name", ["snapkv", "h2o", "gemfilter-one-run"])
def test_cache_holds_exactly_the_budget_after_prefill(family, name, device):
    model = on(BUILDERS[family](), device)
    budget = 40
    method = get_method(name, topk=budget, layer=FILTER_LAYER[family])
    with gemfilter.apply(model, method):
        out = model.generate(prompt(n=64).to(device), max_new_tokens=1, do_sample=False, return_dict_in_generate=True)
    evicted = 0
    for layer in output_cache(out).layers:
        if getattr(layer, "sliding_window", None) is None:
            assert layer.keys.shape[-2] == budget and layer.values.shape[-2] == budget
            evicted += 1
        else:  # sliding layers keep their own window
            assert layer.keys.shape[-2] <= layer.sliding_window
    assert evicted >= 2


def _dense_probs(model, ids, layer):
    """Explicit (b, h, n, n) causal softmax of the hand-computed q, k at ``layer``."""
    q, k = qk_at_layer(model, ids, layer)
    g = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(g, dim=1)
    scaling = model.model.layers[layer].self_attn.scaling
    logits = (q @ k.transpose(-1, -2)) * scaling
    n = ids.shape[1]
    logits = logits.masked_fill(torch.triu(torch.ones(n, n, dtype=torch.bool), 1), float("-inf"))
    return logits.softmax(-1), g


def _ref_keep(scores_per_head, g, budget, recent):
    """Mean over GQA groups, top (budget - recent) of the old positions + the recent ones, per KV head."""
    h, n = scores_per_head.shape
    grouped = scores_per_head.reshape(h // g, g, n).mean(1)
    out = []
    for row in grouped:
        old = row[: n - recent].tolist()
        top = sorted(range(len(old)), key=lambda j: -old[j])[: budget - recent]
        out.append(sorted(top + list(range(n - recent, n))))
    return out


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_snapkv_and_h2o_plans_match_explicit_softmax(family):
    model = BUILDERS[family]()
    ids, budget, window = prompt(n=64, seed=3), 44, 32
    for name in ("snapkv", "h2o"):
        with gemfilter.apply(model, get_method(name, topk=budget)) as handle:
            model.generate(ids, max_new_tokens=1, do_sample=False)
        plans = handle.calls[-1].plans
        for layer in range(model.config.num_hidden_layers):
            probs, g = _dense_probs(model, ids, layer)
            if name == "snapkv":
                votes = probs[0, :, -window:, :].sum(1)  # (h, n)
                m = votes.shape[1] - window  # avg-pool 5 with zero padding, by hand, over the prefix only
                pooled = torch.stack([votes[:, max(0, j - 2) : min(j + 3, m)].sum(1) / 5 for j in range(m)], 1)
                ref = _ref_keep(torch.cat([pooled, torch.zeros(pooled.shape[0], window)], 1), g, budget, window)
            else:
                ref = _ref_keep(probs[0].sum(1), g, budget, window)  # column sums
            assert plans[layer][0].tolist() == ref, (name, layer)


@pytest.mark.parametrize("block", [1, 5, 16, 64, 1000])
def test_blockwise_column_sums_equal_dense(block):
    g = torch.Generator().manual_seed(0)
    b, h, h_kv, n, d = 2, 4, 2, 37, 8
    q, k = torch.randn(b, h, n, d, generator=g), torch.randn(b, h_kv, n, d, generator=g)
    valid = torch.ones(b, n, dtype=torch.bool)
    valid[1, :9] = False  # left padding on row 1
    kk = k.repeat_interleave(h // h_kv, dim=1)
    logits = (q @ kk.transpose(-1, -2)) * 0.3
    mask = torch.triu(torch.ones(n, n, dtype=torch.bool), 1)[None, None] | ~valid[:, None, None, :]
    dense = torch.nan_to_num(logits.masked_fill(mask, float("-inf")).softmax(-1), nan=0.0)
    dense = (dense * valid[:, None, :, None]).sum(2)
    assert torch.allclose(column_sums(q, k, valid, 0.3, block), dense, atol=1e-5)


def test_snapkv_decodes_at_original_positions():
    """Manual reference: full prefill, evict with the recorded plan, decode with positions n, n+1, ..."""
    model = BUILDERS["llama"]()
    ids, budget = prompt(n=64, seed=4), 40
    method = get_method("snapkv", topk=budget)
    with gemfilter.apply(model, method) as handle:
        got = model.generate(ids, max_new_tokens=6, do_sample=False)
    plans = handle.calls[-1].plans
    with torch.no_grad():
        out = model(ids, use_cache=True)
        cache = output_cache(out)
        for i, layer in enumerate(cache.layers):
            idx = plans[i][..., None].expand(-1, -1, -1, layer.keys.shape[-1])
            layer.keys, layer.values = layer.keys.gather(2, idx), layer.values.gather(2, idx)
        tokens = [int(out.logits[0, -1].argmax())]
        for t in range(5):
            step = model(
                torch.tensor([[tokens[-1]]]),
                **cache_kwargs(cache),
                use_cache=True,
                position_ids=torch.tensor([[64 + t]]),
            )
            tokens.append(int(step.logits[0, -1].argmax()))
    assert got[0, 64:].tolist() == tokens


@pytest.mark.parametrize("name", ["snapkv", "h2o", "gemfilter-one-run", "gemfilter", "gemfilter-span"])
def test_left_padded_batch_equals_rows_alone(name):
    model = BUILDERS["llama"]()
    short, long = prompt(n=40, seed=5)[0], prompt(n=N, seed=6)[0]
    ids = torch.zeros((2, N), dtype=torch.long)
    mask = torch.zeros((2, N), dtype=torch.long)
    ids[0, N - 40 :], mask[0, N - 40 :] = short, 1
    ids[1], mask[1] = long, 1
    for budget in (36, 44):  # 44: the short row has fewer real tokens than the budget
        method = get_method(name, topk=budget, layer=2)
        both = run(model, method, {"input_ids": ids, "attention_mask": mask})
        alone = [run(model, method, r[None]) for r in (short, long)]
        for i in range(2):
            assert both.new_tokens[i].tolist() == alone[i].new_tokens[0].tolist(), (name, budget, i)
            assert both.kept[i] == alone[i].kept[0]


def test_cache_methods_refuse_padded_batches_with_sliding_layers():
    model = BUILDERS["gemma3"]()
    ids = prompt(n=N)
    mask = torch.ones_like(ids)
    mask[0, :4] = 0
    with pytest.raises(ValueError, match="not supported for models with sliding-window layers"):
        run(model, get_method("snapkv", topk=40), {"input_ids": ids, "attention_mask": mask})


def test_span_keeps_sink_tail_and_whole_sentences():
    model = BUILDERS["llama"]()
    ids = prompt(n=96, seed=7)
    method = get_method("gemfilter-span", topk=40, layer=2, tail=8)
    sel = run(model, method, ids).selection
    kept = sel.indices[0].tolist()
    assert len(kept) <= 40
    assert kept[:4] == [0, 1, 2, 3] and kept[-8:] == list(range(88, 96))
    # every kept token outside sink/tail belongs to a fully kept sentence
    from gemfilter.methods.prompt import sentence_ends

    ends = sentence_ends(ids[0], DotTokenizer(), 64)
    begin, kept_set = 0, set(kept)
    for end in ends:
        inner = [j for j in range(begin, end + 1) if 4 <= j < 88]
        part = [j in kept_set for j in inner]
        assert all(part) or not any(part), (begin, end)
        begin = end + 1


def test_ablation_rows_score_the_chosen_query_row():
    model = BUILDERS["llama"]()
    ids = prompt(n=N, seed=8)
    q, k = qk_at_layer(model, ids, 2)
    kk = k.repeat_interleave(2, dim=1)
    norms = q[0].pow(2).sum(dim=(0, 2))
    for name, row in (("middle-row", N // 2), ("largest-row", int(norms.argmax()))):
        raw = (q[0, :, row][:, None, :] * kk[0]).sum(-1).sum(0)  # (n,)
        pooled = torch.nn.functional.avg_pool1d(raw[None, None], 5, 1, 2)[0, 0]
        ref = sorted(pooled.topk(10).indices.tolist())
        sel = run(model, get_method(name, topk=10, layer=2), ids).selection
        assert sel.indices[0].tolist() == ref, name


def test_bad_budgets_are_refused():
    model = BUILDERS["llama"]()
    with pytest.raises(ValueError, match="must exceed the window of 32"):
        run(model, get_method("snapkv", topk=32), prompt())
    with pytest.raises(ValueError, match="h2o: topk=0 must be >= 1"):
        run(model, get_method("h2o", topk=0), prompt())
    with pytest.raises(ValueError, match="pooling must be 'avg' or 'max'"):
        get_method("snapkv", pooling="mean")
    with pytest.raises(ValueError, match="needs the tokenizer"):
        gemfilter.generate(model, prompt(n=96), method=get_method("gemfilter-span", topk=20, layer=2), max_new_tokens=2)
