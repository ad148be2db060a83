"""Inspection and calibration on tiny models where the needle position is controlled."""

import json

import pytest
import torch
from reference import qk_at_layer, reference_indices
from tiny_models import BUILDERS

import gemfilter
from gemfilter.lab.inspection.calibrate import calibrate, coverage_table, format_table, recommend
from gemfilter.toolkit.trace import CAPTURE_NAMES, needle_distances, trace

N = 64


pytestmark = pytest.mark.usefixtures("quiet_sliding_filter_layer")


def prompt(seed=1):
    return torch.randint(4, 96, (1, N), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("family", ["llama", "gemma3"])
@pytest.mark.parametrize("span", [(20, 26), (3, 5), (50, 60)])
def test_distance_is_zero_exactly_where_reference_topk_covers_the_needle(family, span):
    model = BUILDERS[family]()
    ids = prompt()
    tr = trace(model, ids)
    for topk in (4, 12):
        dist = needle_distances(tr, span, topk)
        for layer in range(model.config.num_hidden_layers):
            ref, _ = reference_indices(model, ids, layer, topk)
            covered = any(span[0] <= i < span[1] for i in ref)
            expected = 0 if covered else min(min(abs(i - span[0]), abs(i - (span[1] - 1))) for i in ref)
            assert dist[layer] == expected, (layer, topk)
            assert (dist[layer] == 0) == covered


@pytest.mark.parametrize("family", ["mistral-sliding", "gemma3"])
def test_attention_rows_equal_the_models_own_eager_probabilities(family):
    model = BUILDERS[family]()
    model.set_attn_implementation("eager")
    ids = prompt(seed=2)
    tr = trace(model, ids, names=("attn_last_row",))
    with torch.no_grad():
        attn = model(ids, output_attentions=True).attentions
    for layer, a in enumerate(attn):
        assert torch.allclose(tr[("attn_last_row", layer)], a[0, :, -1, :].mean(0), atol=1e-5), layer


def test_qk_rows_match_hand_reference_and_memory_is_last_rows_only():
    model = BUILDERS["qwen2"]()
    ids = prompt(seed=3)
    tr = trace(model, ids)
    for layer in range(model.config.num_hidden_layers):
        q, k = qk_at_layer(model, ids, layer)
        raw = (q[0, :, -1:, :] * k[0].repeat_interleave(2, 0)).sum(-1).sum(0)
        assert torch.allclose(tr[("qk_last_row", layer)], raw, atol=1e-3, rtol=1e-4)
    assert set(tr.store) == {(n, i) for n in CAPTURE_NAMES for i in range(4)}
    assert all(t.shape == (N,) for t in tr.store.values())  # O(n * layers): no n x n map is kept


def test_recommend_follows_the_papers_rule_on_full_layers():
    table = {256: [1.0, 0.2, 0.9, 0.5], 1024: [1.0, 0.6, 1.0, 0.9]}
    sliding = [512, None, None, None]  # layer 0 is sliding: reported, never recommended
    assert recommend(table, sliding, 0.8) == (2, 256)
    assert recommend(table, sliding, 0.95) == (2, 1024)
    assert recommend({256: [0.1, 0.3, 0.2, 0.1]}, sliding, 0.8) == (1, 256)  # none passes: best full layer
    # a later layer that finds the needle at a smaller k wins over an earlier one that needs a larger k
    assert recommend({256: [0, 0.1, 0.9, 0], 1024: [0, 0.9, 1.0, 0]}, sliding, 0.8) == (2, 256)
    assert coverage_table([{4: [0, 3]}, {4: [0, 0]}], [4]) == {4: [1.0, 0.5]}


def test_calibration_is_stored_and_becomes_the_default(tiny_model_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("GEMFILTER_CACHE", str(tmp_path / "cache"))
    hay = tmp_path / "hay"
    hay.mkdir()
    (hay / "a.txt").write_text(" ".join(f"w{4 + i % 80}." if i % 9 == 8 else f"w{4 + i % 80}" for i in range(900)))
    model, tok = gemfilter.load_model(str(tiny_model_dir))
    before = gemfilter.default_layer(model)
    record = calibrate(model, tok, lengths=(300,), depths=(20, 80), ks=(8, 32), threshold=0.5, haystack_dir=hay)
    stored = json.loads(open(record["path"]).read())
    assert stored["layer"] == record["layer"] and len(stored["probes"]) == 2
    cov = stored["coverage"]
    for k in ("8", "32"):  # recompute coverage from the stored per-probe distances
        assert cov[k] == [sum(d[k][layer] == 0 for d in stored["distances"]) / 2 for layer in range(4)]
    assert gemfilter.default_layer(model) == record["layer"]
    assert "| layer | type | k=8 | k=32 |" in format_table(stored)
    assert before == 2  # rule: first full layer at or after ceil(0.4 * 4)
