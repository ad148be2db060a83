"""Selection variants (gemfilter-qwin, gemfilter-claa, gemfilter-span-qwin, gemfilter-span-claa,
gemfilter-span-qmax) against hand references built from each layer's q and k, re-derived from the hidden
states of a plain forward (tests/reference.py)."""

import pytest
import torch
from reference import qk_at_layer
from tiny_models import BUILDERS, FILTER_LAYER, DotTokenizer

import gemfilter
from gemfilter.methods import REGISTRY, get_method, parse_method
from gemfilter.methods.variants import claa_layers

N = 48
VARIANTS = ["gemfilter-qwin", "gemfilter-claa", "gemfilter-span-qwin", "gemfilter-span-claa", "gemfilter-span-qmax"]

pytestmark = pytest.mark.usefixtures("quiet_sliding_filter_layer")


def prompt(n=N, seed=1):
    return torch.randint(3, 96, (1, n), generator=torch.Generator().manual_seed(seed))


def run(model, method, ids, **kw):
    return gemfilter.generate(model, ids, method=method, tokenizer=DotTokenizer(), max_new_tokens=6, **kw)


def _softmax_rows(model, ids, layer, rows, reduce="sum"):
    """(n,) sum (or max) over heads and the given query rows of softmax_j(q_row . k_j / sqrt(d)), j <= row,
    by loops; a key a row cannot see counts 0."""
    q, k = qk_at_layer(model, ids, layer)
    g = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(g, dim=1)  # GQA: each query head reads its group's key head
    d, n = q.shape[-1], ids.shape[1]
    out = torch.zeros(n, dtype=torch.float64)
    for hh in range(q.shape[1]):
        for r in rows:
            logits = torch.tensor(
                [float(q[0, hh, r] @ k[0, hh, j]) / d**0.5 for j in range(r + 1)], dtype=torch.float64
            )
            p = logits.softmax(0)
            out[: r + 1] = out[: r + 1] + p if reduce == "sum" else torch.maximum(out[: r + 1], p)
    return out


def _pooled_topk(raw, topk, kernel=5):
    n, half = len(raw), kernel // 2
    pooled = [sum(float(raw[i]) for i in range(j - half, j + half + 1) if 0 <= i < n) / kernel for j in range(n)]
    return sorted(sorted(range(n), key=lambda j: -pooled[j])[:topk])


@pytest.mark.parametrize("family", ["llama", "qwen2", "gemma3"])
@pytest.mark.parametrize("window", [1, 8, 16])
def test_qwin_keeps_the_top_k_of_the_window_votes(family, window, device):
    model, ids, layer = BUILDERS[family]().to(device), prompt(seed=3).to(device), FILTER_LAYER[family]
    raw = _softmax_rows(model, ids, layer, range(N - window, N))
    sel = run(model, get_method("gemfilter-qwin", topk=12, layer=layer, window=window), ids).selection
    assert sel.indices[0].tolist() == _pooled_topk(raw, 12)


def test_qwin_with_window_one_ranks_as_the_last_row_softmax():
    model, ids = BUILDERS["llama"](), prompt(seed=4)
    one = run(model, get_method("gemfilter-qwin", topk=12, layer=2, window=1), ids).selection
    claa1 = run(model, get_method("gemfilter-claa", topk=12, layer=2, layers=1), ids).selection
    assert one.indices[0].tolist() == claa1.indices[0].tolist()
    torch.testing.assert_close(one.scores, claa1.scores)


@pytest.mark.parametrize("family", ["llama", "phi3", "gemma3"])
@pytest.mark.parametrize("count", [1, 2, 3])
def test_claa_averages_the_last_row_softmax_over_layers(family, count, device):
    model, ids = BUILDERS[family]().to(device), prompt(seed=5).to(device)
    layer = 3  # on gemma3 layers 1 and 3 are full, 2 slides (skipped)
    layers = claa_layers(model, layer, count)
    expected = {"gemma3": {1: [3], 2: [3], 3: [1, 3]}}.get(family, {}).get(count, list(range(4 - count, 4)))
    assert layers == expected
    raw = sum(_softmax_rows(model, ids, i, [N - 1]) for i in layers) / len(layers)
    sel = run(model, get_method("gemfilter-claa", topk=12, layer=layer, layers=count), ids).selection
    assert sel.indices[0].tolist() == _pooled_topk(raw, 12)


def test_span_qwin_ranks_sentences_by_the_window_votes():
    model, ids = BUILDERS["llama"](), prompt(n=96, seed=7)
    raw = _softmax_rows(model, ids, 2, range(96 - 8, 96))
    sel = run(model, get_method("gemfilter-span-qwin", topk=40, layer=2, tail=8, window=8), ids).selection
    torch.testing.assert_close(sel.scores[0].double(), raw, rtol=1e-4, atol=1e-5)
    kept = sel.indices[0].tolist()
    assert len(kept) <= 40 and kept[:4] == [0, 1, 2, 3] and kept[-8:] == list(range(88, 96))


@pytest.mark.parametrize("family", ["llama", "qwen2", "gemma3"])
def test_span_qmax_ranks_sentences_by_the_window_max(family, device):
    model, ids, layer = BUILDERS[family]().to(device), prompt(n=96, seed=8).to(device), FILTER_LAYER[family]
    raw = _softmax_rows(model, ids, layer, range(96 - 12, 96), reduce="max")
    assert not torch.allclose(raw, _softmax_rows(model, ids, layer, range(96 - 12, 96)) / 12)  # not a mean
    sel = run(model, get_method("gemfilter-span-qmax", topk=40, layer=layer, tail=8, window=12), ids).selection
    torch.testing.assert_close(sel.scores[0].double().cpu(), raw, rtol=1e-4, atol=1e-6)
    kept = sel.indices[0].tolist()
    assert len(kept) <= 40 and kept[:4] == [0, 1, 2, 3] and kept[-8:] == list(range(88, 96))


def test_window_max_and_sum_reduce_the_same_row_softmaxes():
    """Two window rows, by hand: row 8 spreads its weight evenly over keys 0-8, row 9 looks at key 2. The max
    (gemfilter-span-qmax) and the sum (gemfilter-span-qwin) reduce the same two causal softmaxes."""
    from gemfilter.methods.variants import window_max_scores, window_scores

    d, n = 4, 10
    key = torch.zeros(1, 1, n, d)
    key[0, 0, 2, 0] = 8.0  # token 2 answers row 9's query sharply
    query = torch.zeros(1, 1, n, d)
    query[0, 0, 9, 0] = 1.0
    valid = torch.ones(1, n, dtype=torch.bool)
    mx, sm = window_max_scores(query, key, valid, 2), window_scores(query, key, valid, 2)
    row9 = (torch.tensor([0.0] * n).index_fill(0, torch.tensor([2]), 8.0 / 2)).softmax(0)
    row8 = torch.tensor([1 / 9] * 9 + [0.0])
    torch.testing.assert_close(mx[0], torch.maximum(row8, row9))
    torch.testing.assert_close(sm[0], row8 + row9)


def test_span_claa_ranks_sentences_by_the_layer_mean():
    model, ids = BUILDERS["llama"](), prompt(n=96, seed=7)
    raw = sum(_softmax_rows(model, ids, i, [95]) for i in (1, 2, 3)) / 3
    sel = run(model, get_method("gemfilter-span-claa", topk=40, layer=3, layers=3, tail=8), ids).selection
    torch.testing.assert_close(sel.scores[0].double(), raw, rtol=1e-4, atol=1e-6)
    assert sel.indices[0].tolist()[-8:] == list(range(88, 96))


@pytest.mark.parametrize("family", ["llama", "gemma3", "mistral-sliding"])
@pytest.mark.parametrize("name", VARIANTS)
def test_budget_ge_n_equals_plain_generate(family, name, device):
    model, ids = BUILDERS[family]().to(device), prompt().to(device)
    full = model.generate(ids, max_new_tokens=6, do_sample=False)
    out = run(model, get_method(name, topk=N, layer=FILTER_LAYER[family]), ids)
    assert torch.equal(out.sequences, full) and out.kept == [N]


@pytest.mark.parametrize("name", VARIANTS)
def test_left_padded_batch_equals_rows_alone(name):
    model = BUILDERS["llama"]()
    short, long = prompt(n=40, seed=5)[0], prompt(n=N, seed=6)[0]
    ids, mask = torch.zeros((2, N), dtype=torch.long), torch.zeros((2, N), dtype=torch.long)
    ids[0, N - 40 :], mask[0, N - 40 :] = short, 1
    ids[1], mask[1] = long, 1
    method = (
        get_method(name, topk=36, layer=2, window=44)
        if "claa" not in name
        else get_method(name, topk=36, layer=3, layers=3)
    )
    both = run(model, method, {"input_ids": ids, "attention_mask": mask})
    alone = [run(model, method, r[None]) for r in (short, long)]
    for i in range(2):
        assert both.new_tokens[i].tolist() == alone[i].new_tokens[0].tolist()
        pad = N - alone[i].prompt_len
        assert (both.selection.indices[i] - pad).tolist() == alone[i].selection.indices[0].tolist()


def test_specs_parse_and_the_registry_shows_them(capsys):
    from gemfilter.lab.cli import main

    assert parse_method("gemfilter-qwin:k=256,window=16") == REGISTRY["gemfilter-qwin"](topk=256, window=16)
    assert parse_method("gemfilter-claa:k=64,layers=6,layer=13").layers == 6
    with pytest.raises(ValueError, match="window=0 must be >= 1"):
        parse_method("gemfilter-qwin:window=0")
    with pytest.raises(ValueError, match="layers=0 must be >= 1"):
        parse_method("gemfilter-claa:layers=0")
    for name in VARIANTS:
        assert main(["methods", name]) == 0
        out = capsys.readouterr().out
        assert name in out and ("window" in out or "layers" in out)
