"""gemfilter-asl (ASL's adaptive layer, two-pass) against a hand transcription of the official rule, on a
tiny 8-layer Llama: per-layer ranks from each layer's q and k (re-derived from the hidden states), the
relative rank variance over the last L_obs layers, the first layer after L_min below tau."""

import pytest
import torch
from reference import qk_at_layer
from tiny_models import _build
from transformers import LlamaConfig, LlamaForCausalLM

import gemfilter
from gemfilter.methods import get_method, parse_method

N, W, KERNEL, L_OBS, L_MIN, TOPK = 40, 4, 3, 3, 3, 16


def deep():
    return _build(LlamaForCausalLM, LlamaConfig, num_hidden_layers=8)


def prompt(n=N, seed=1):
    return torch.randint(3, 96, (1, n), generator=torch.Generator().manual_seed(seed))


def hand_ranks(model, ids, layer):
    """(pooled, ranks) over the n - W prefix tokens, by loops: softmax of each window row over its keys."""
    q, k = qk_at_layer(model, ids, layer)
    k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
    n, d, p = ids.shape[1], q.shape[-1], ids.shape[1] - W
    votes = [0.0] * p
    for hh in range(q.shape[1]):
        for row in range(n - W, n):
            logits = torch.tensor(
                [float(q[0, hh, row] @ k[0, hh, j]) / d**0.5 for j in range(row + 1)], dtype=torch.float64
            )
            probs = logits.softmax(0)
            for j in range(p):
                votes[j] += float(probs[j])
    half = KERNEL // 2
    pooled = [sum(votes[i] for i in range(j - half, j + half + 1) if 0 <= i < p) / KERNEL for j in range(p)]
    order = sorted(range(p), key=lambda j: -pooled[j])
    ranks = [0] * p
    for r, j in enumerate(order):
        ranks[j] = r + 1
    return pooled, ranks


def hand_asl(model, ids, threshold):
    """(layer, kept indices) by the official rule, transcribed with plain lists."""
    n, p, m = ids.shape[1], ids.shape[1] - W, model.config.num_hidden_layers
    count = min(TOPK - W, p)
    per_layer = [hand_ranks(model, ids, i) for i in range(m)]
    base = None
    for layer in range(L_MIN, m):
        hist = [per_layer[i][1] for i in range(max(0, layer - L_OBS + 1), layer + 1)]
        union = sorted({j for h in hist for j in sorted(range(p), key=lambda j: h[j])[:count]})
        var = 0.0
        for j in union:
            mu = sum(h[j] for h in hist) / len(hist)
            var += sum((h[j] - mu) ** 2 for h in hist)
        var /= len(hist) * len(union)
        if base is None:
            base = var
        elif var / base < threshold or layer == m - 1:
            break
    ranks = per_layer[layer][1]
    kept = sorted(sorted(range(p), key=lambda j: ranks[j])[:count]) + list(range(p, n))
    return layer, kept


def method(threshold):
    return get_method(
        "gemfilter-asl", layer=L_MIN, topk=TOPK, window=W, kernel=KERNEL, layers=L_OBS, threshold=threshold
    )


@pytest.mark.parametrize("threshold", [1e-9, 0.9, 0.95, 50.0])
def test_the_layer_and_the_kept_tokens_follow_the_official_rule(threshold, device):
    model, ids = deep().to(device), prompt(seed=6).to(device)
    want_layer, want_kept = hand_asl(model, ids, threshold)
    sel = gemfilter.select_tokens(model, ids, layer=L_MIN, topk=TOPK, method=method(threshold))
    assert (sel.layer, sel.layers) == (want_layer, [want_layer])
    assert sel.indices[0].tolist() == want_kept


def test_thresholds_reach_different_layers():
    model, ids = deep(), prompt(seed=6)
    layers = [hand_asl(model, ids, t)[0] for t in (50.0, 0.95, 0.9, 1e-9)]
    assert layers == [4, 5, 6, 7]  # 50: the first layer after L_min; 1e-9: none triggers, the last selects


def test_the_target_generates_from_the_kept_tokens_and_k_ge_n_is_plain_generate(device):
    model, ids = deep().to(device), prompt(seed=2).to(device)
    out = gemfilter.generate(model, ids, method=method(0.9), max_new_tokens=5)
    kept = ids[0, out.selection.indices[0]]
    plain = model.generate(kept[None], max_new_tokens=5, do_sample=False)
    assert out.new_tokens[0].tolist() == plain[0, TOPK:].tolist()
    full = gemfilter.generate(
        model, ids, method=get_method("gemfilter-asl", layer=L_MIN, topk=N, window=W), max_new_tokens=5
    )
    assert torch.equal(full.sequences, model.generate(ids, max_new_tokens=5, do_sample=False))


def test_result_rows_record_the_layer_each_prompt_chose():
    """The benchmarks' rows (budget_fields) say where ASL stopped, against the official rule; a fixed-layer
    method's rows carry no such field (its ``layer`` already says it)."""
    from gemfilter.apply import budget_fields

    model, ids = deep(), prompt(seed=6)
    for threshold in (50.0, 0.9):
        out = gemfilter.generate(model, ids, method=method(threshold), max_new_tokens=1)
        assert budget_fields(out)["selected_layers"] == [hand_asl(model, ids, threshold)[0]]
    plain = gemfilter.generate(model, ids, method=get_method("gemfilter", layer=L_MIN, topk=TOPK), max_new_tokens=1)
    assert "selected_layers" not in budget_fields(plain)


def test_left_padded_rows_choose_their_own_layers():
    model = deep()
    short, long = prompt(n=32, seed=5)[0], prompt(seed=6)[0]
    ids, mask = torch.zeros((2, N), dtype=torch.long), torch.zeros((2, N), dtype=torch.long)
    ids[0, N - 32 :], mask[0, N - 32 :] = short, 1
    ids[1], mask[1] = long, 1
    both = gemfilter.select_tokens(model, ids, mask, layer=L_MIN, topk=TOPK, method=method(0.9))
    for i, row in enumerate((short, long)):
        alone = gemfilter.select_tokens(model, row[None], layer=L_MIN, topk=TOPK, method=method(0.9))
        assert both.layers[i] == alone.layer
        assert (both.indices[i] - (N - len(row))).tolist() == alone.indices[0].tolist()


def test_spec_and_refusals():
    assert parse_method("gemfilter-asl:k=2048,layer=10,threshold=0.3,layers=8,window=32") == get_method(
        "gemfilter-asl", topk=2048, layer=10
    )
    with pytest.raises(ValueError, match="topk=32 must exceed window=32"):
        parse_method("gemfilter-asl:k=32")
    with pytest.raises(ValueError, match="threshold=0.0 must be > 0"):
        parse_method("gemfilter-asl:threshold=0")
