"""GemFilter core on tiny random models of five families (issue 2, acceptance a-e)."""

import warnings

import pytest
import torch
from reference import reference_indices
from tiny_models import BUILDERS, FILTER_LAYER, on
from torch import nn
from transformers import LlamaConfig, PreTrainedModel

import gemfilter
from gemfilter.compat import cache_in

N = 48
FAMILIES = sorted(BUILDERS)


@pytest.fixture(scope="module", params=FAMILIES)
def family(request):
    return request.param, BUILDERS[request.param]()


def prompt(n=N, seed=1, b=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, 96, (b, n), generator=g)


@pytest.fixture(autouse=True)
def _quiet_sliding_warning():
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="filter layer .* sliding-window")
        yield


def test_a_topk_ge_n_matches_plain_generate(family, device):
    name, model = family
    model, ids = on(model, device), prompt().to(device)
    plain = model.generate(ids, max_new_tokens=10, do_sample=False)
    for k in (N, N + 50):
        out = gemfilter.generate(model, ids, layer=FILTER_LAYER[name], topk=k, max_new_tokens=10)
        assert torch.equal(out.sequences, plain)
        assert out.selection.indices[0].tolist() == list(range(N))
    # The same through a plain model.generate inside apply()
    with gemfilter.apply(model, gemfilter.GemFilter(layer=FILTER_LAYER[name], topk=N)) as handle:
        inside = model.generate(ids, max_new_tokens=10, do_sample=False)
    assert torch.equal(inside, plain)
    assert handle.selection is not None


@pytest.mark.parametrize("topk", [4, 11])
def test_b_selection_matches_hand_reference(family, topk, device):
    name, model = family
    model, layer = on(model, device), FILTER_LAYER[name]
    for seed in (1, 2):
        ids = prompt(seed=seed).to(device)
        sel = gemfilter.select_tokens(model, ids, layer=layer, topk=topk)
        ref, pooled = reference_indices(model, ids, layer, topk)
        assert sel.indices[0].tolist() == ref
        assert torch.allclose(sel.scores[0].cpu(), torch.tensor(pooled), rtol=1e-4, atol=1e-4)


def test_b_other_layers_differ_and_still_match(family):
    """The filter layer matters: layer 0 gives its own (still reference-exact) selection."""
    name, model = family
    ids = prompt(seed=3)
    sel0 = gemfilter.select_tokens(model, ids, layer=0, topk=6)
    assert sel0.indices[0].tolist() == reference_indices(model, ids, 0, 6)[0]


def test_generation_from_kept_tokens_equals_generate_on_them(family, device):
    """Step 5: after selection, the output equals plain generate on the kept tokens at new positions."""
    name, model = family
    model, ids = on(model, device), prompt(seed=4).to(device)
    out = gemfilter.generate(model, ids, layer=FILTER_LAYER[name], topk=12, max_new_tokens=8)
    kept = ids[0, out.selection.indices[0]].unsqueeze(0)
    direct = model.generate(kept, max_new_tokens=8, do_sample=False)
    assert torch.equal(out.new_tokens, direct[:, kept.shape[1] :])


def test_c_stops_inside_filter_layer_without_cache(family):
    name, model = family
    layer = FILTER_LAYER[name]
    entered = [0] * model.config.num_hidden_layers
    finished = [0] * model.config.num_hidden_layers
    seen_kwargs = {}
    hooks = []
    for i, block in enumerate(model.model.layers):
        hooks.append(block.register_forward_pre_hook(lambda m, a, i=i: entered.__setitem__(i, entered[i] + 1)))
        hooks.append(block.register_forward_hook(lambda m, a, o, i=i: finished.__setitem__(i, finished[i] + 1)))
    hooks.append(model.model.register_forward_pre_hook(lambda m, a, kw: seen_kwargs.update(kw), with_kwargs=True))
    try:
        gemfilter.select_tokens(model, prompt(), layer=layer, topk=8)
    finally:
        for h in hooks:
            h.remove()
    assert entered == [1] * (layer + 1) + [0] * (len(entered) - layer - 1)
    assert finished == [1] * layer + [0] * (len(entered) - layer)  # layer r itself never completes
    assert seen_kwargs["use_cache"] is False and cache_in(seen_kwargs) == (None, None)


def test_d_left_padded_batch_equals_rows_alone(family):
    name, model = family
    layer = FILTER_LAYER[name]
    short, long = prompt(n=30, seed=5)[0], prompt(n=N, seed=6)[0]
    ids = torch.zeros((2, N), dtype=torch.long)
    mask = torch.zeros((2, N), dtype=torch.long)
    ids[0, N - 30 :], mask[0, N - 30 :] = short, 1
    ids[1], mask[1] = long, 1
    for topk in (8, 40):  # 40: the short row keeps all 30, so the kept batch itself is padded
        sel = gemfilter.select_tokens(model, ids, mask, layer=layer, topk=topk)
        alone0 = gemfilter.select_tokens(model, short[None], layer=layer, topk=topk)
        alone1 = gemfilter.select_tokens(model, long[None], layer=layer, topk=topk)
        assert (sel.indices[0] - (N - 30)).tolist() == alone0.indices[0].tolist()
        assert sel.indices[1].tolist() == alone1.indices[0].tolist()
        # pooled scores of the padded row equal the row alone (padding pools as zeros, ends at -inf)
        assert torch.allclose(sel.scores[0, N - 30 :], alone0.scores[0], atol=1e-4, rtol=1e-4)
        assert torch.isinf(sel.scores[0, : N - 30]).all()
        out = gemfilter.generate(
            model, {"input_ids": ids, "attention_mask": mask}, layer=layer, topk=topk, max_new_tokens=6
        )
        g0 = gemfilter.generate(model, short[None], layer=layer, topk=topk, max_new_tokens=6)
        g1 = gemfilter.generate(model, long[None], layer=layer, topk=topk, max_new_tokens=6)
        assert out.new_tokens[0].tolist() == g0.new_tokens[0].tolist()
        assert out.new_tokens[1].tolist() == g1.new_tokens[0].tolist()


def test_apply_restores_model_even_on_error(family):
    name, model = family
    before = model.config._attn_implementation
    n_hooks = len(model._forward_pre_hooks)
    with pytest.raises(RuntimeError, match="boom"):
        with gemfilter.apply(model, gemfilter.GemFilter(layer=FILTER_LAYER[name], topk=4)):
            assert model.config._attn_implementation == f"gemfilter_{before}"
            raise RuntimeError("boom")
    assert model.config._attn_implementation == before
    assert len(model._forward_pre_hooks) == n_hooks
    # and the model still computes exactly what it computed before
    ids = prompt(seed=7)
    a = model(ids).logits
    with gemfilter.apply(model, gemfilter.GemFilter(layer=FILTER_LAYER[name], topk=4)):
        pass
    assert torch.equal(a, model(ids).logits)


def test_wrapper_without_state_is_exact_for_eager_and_sdpa():
    """Under the wrapper with no per-call state, logits equal the base kernel's, for both kernels."""
    from gemfilter.attention import wrapped_attention

    for impl in ("eager", "sdpa"):
        model = BUILDERS["gemma3"]()
        model.set_attn_implementation(impl)
        ids = prompt(seed=8)
        ref = model(ids).logits
        with wrapped_attention(model):
            assert torch.equal(model(ids).logits, ref)


def test_selections_in_threads_that_share_a_model_each_reach_their_layer(family):
    """Two threads selecting on one model at once (a serving selector's workers) share the kernel switch: neither
    block restores the model while the other runs, and each selection equals the one made alone."""
    import threading

    name, model = family
    before = model.config._attn_implementation
    method = gemfilter.GemFilter(layer=FILTER_LAYER[name], topk=5)
    prompts = [prompt(seed=s) for s in range(6)]
    alone = [gemfilter.select_tokens(model, ids, layer=method.layer, topk=5, method=method).kept_ids for ids in prompts]
    got, errors, start = {}, [], threading.Barrier(2)

    def work(part):
        start.wait()
        try:
            for i in range(part, len(prompts), 2):
                for _ in range(3):
                    got[i] = gemfilter.select_tokens(
                        model, prompts[i], layer=method.layer, topk=5, method=method
                    ).kept_ids
        except Exception as err:  # noqa: BLE001 - reported below
            errors.append(err)

    threads = [threading.Thread(target=work, args=(p,)) for p in (0, 1)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors, errors[0]
    assert all([r.tolist() for r in got[i]] == [r.tolist() for r in alone[i]] for i in range(len(prompts)))
    assert model.config._attn_implementation == before


# ---- (e) bad input ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def llama():
    return BUILDERS["llama"]()


@pytest.mark.parametrize(
    "layer, msg",
    [(-1, r"layer=-1 (must be >= 0|is outside \[0, 4\))"), (4, r"outside \[0, 4\)"), (100, r"outside \[0, 4\)")],
)
def test_e_layer_out_of_range(llama, layer, msg):
    # a negative layer is refused where the method is built; one past the model's layers, against the model
    with pytest.raises(ValueError, match=msg):
        gemfilter.select_tokens(llama, prompt(), layer=layer, topk=4)
    with pytest.raises(ValueError, match=msg):
        gemfilter.generate(llama, prompt(), layer=layer, topk=4, max_new_tokens=2)


@pytest.mark.parametrize("topk", [0, -3])
def test_e_topk_below_one(llama, topk):
    with pytest.raises(ValueError, match="must be >= 1"):
        gemfilter.select_tokens(llama, prompt(), layer=1, topk=topk)
    with pytest.raises(ValueError, match="must be >= 1"):
        gemfilter.generate(llama, prompt(), layer=1, topk=topk, max_new_tokens=2)


def test_e_wrong_types(llama):
    with pytest.raises(TypeError, match="layer must be an int"):
        gemfilter.select_tokens(llama, prompt(), layer=1.5, topk=4)
    with pytest.raises(TypeError, match="topk must be an int"):
        gemfilter.select_tokens(llama, prompt(), layer=1, topk="8")


def test_e_empty_prompt(llama):
    with pytest.raises(ValueError, match="prompt is empty"):
        gemfilter.select_tokens(llama, torch.zeros((1, 0), dtype=torch.long), layer=1, topk=4)
    with pytest.raises(ValueError, match="prompt is empty"):
        gemfilter.generate(llama, torch.zeros((1, 0), dtype=torch.long), layer=1, topk=4)
    with pytest.raises(ValueError, match="prompt is empty"):
        ids = prompt(n=5, b=2)
        gemfilter.select_tokens(llama, ids, torch.tensor([[0] * 5, [1] * 5]), layer=1, topk=4)


def test_e_unequal_lengths_without_mask(llama):
    with pytest.raises(ValueError, match="unequal lengths"):
        gemfilter.select_tokens(llama, [[5, 6, 7], [5, 6]], layer=1, topk=4)
    with pytest.raises(ValueError, match="unequal lengths"):
        gemfilter.generate(llama, [[5, 6, 7], [5, 6]], layer=1, topk=4)


def test_e_right_padding_is_refused(llama):
    ids = prompt(n=6, b=2)
    mask = torch.tensor([[1] * 6, [1] * 4 + [0] * 2])
    with pytest.raises(ValueError, match="padding must be on the left"):
        gemfilter.select_tokens(llama, ids, mask, layer=1, topk=4)


class LegacyAttention(nn.Module):
    """An attention that computes softmax itself and never consults AttentionInterface."""

    def __init__(self, dim):
        super().__init__()
        self.qkv = nn.Linear(dim, 3 * dim)

    def forward(self, x):
        q, k, v = self.qkv(x).chunk(3, -1)
        return torch.softmax(q @ k.transpose(-1, -2), -1) @ v


class LegacyModel(PreTrainedModel):
    config_class = LlamaConfig

    def __init__(self, config):
        super().__init__(config)
        self.attn = LegacyAttention(config.hidden_size)


def test_e_model_without_attention_interface():
    model = LegacyModel(LlamaConfig(hidden_size=16, num_hidden_layers=2, num_attention_heads=2, vocab_size=32))
    with pytest.raises(TypeError, match="does not dispatch its attention through"):
        gemfilter.select_tokens(model, prompt(n=5), layer=0, topk=2)


def test_apply_passes_streamers_and_stopping_criteria_through():
    from transformers import StoppingCriteria, StoppingCriteriaList

    model = BUILDERS["llama"]()
    ids = prompt(seed=9)

    class Collect:
        def __init__(self):
            self.chunks, self.ended = [], False

        def put(self, value):
            self.chunks.append(value.reshape(-1).tolist())

        def end(self):
            self.ended = True

    class StopAfter(StoppingCriteria):
        def __init__(self, n):
            self.n, self.calls = n, 0

        def __call__(self, input_ids, scores, **kw):
            self.calls += 1
            return torch.full((input_ids.shape[0],), self.calls >= self.n, dtype=torch.bool)

    streamer, stop = Collect(), StopAfter(3)
    with gemfilter.apply(model, gemfilter.GemFilter(layer=2, topk=10)):
        out = model.generate(
            ids, max_new_tokens=20, do_sample=False, streamer=streamer, stopping_criteria=StoppingCriteriaList([stop])
        )
    assert out.shape[1] == N + 3  # our criterion stopped it, not max_new_tokens
    assert streamer.chunks[0] == ids[0].tolist()  # generate streams the original prompt first
    assert [c[0] for c in streamer.chunks[1:]] == out[0, N:].tolist() and streamer.ended
