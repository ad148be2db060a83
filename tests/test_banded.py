"""The exact block-banded kernel against stock sdpa and eager, on tiny sliding-window models.

Mistral: every layer slides (window 16); Gemma3: sliding (window 8) and full layers mixed. Prompts are
shorter than, equal to and longer than the window, single rows and left-padded batches, with prefill and
decode steps; every registered method runs on both kernels and must produce the same logits and tokens.
"""

import pytest
import torch
from tiny_models import BUILDERS, FILTER_LAYER, DotTokenizer, on
from transformers import Gemma2Config, Gemma2ForCausalLM

import gemfilter
from gemfilter.banded import BandedMask, banded_mask
from gemfilter.compat import cache_kwargs
from gemfilter.methods import REGISTRY, get_method
from gemfilter.toolkit.trace import trace

FAMILIES = ["mistral-sliding", "gemma3"]
WINDOW = {"mistral-sliding": 16, "gemma3": 8}
TOL = 1e-4


pytestmark = pytest.mark.usefixtures("quiet")


@pytest.fixture(scope="module")
def models():
    return {f: BUILDERS[f]() for f in FAMILIES}


def batch(n, pad=0, rows=1, seed=0):
    """(ids, mask): ``rows`` random rows of n tokens, the last one left-padded by ``pad``."""
    ids = torch.randint(3, 96, (rows, n), generator=torch.Generator().manual_seed(seed))
    mask = torch.ones_like(ids)
    if pad:
        ids[-1, :pad] = 0
        mask[-1, :pad] = 0
    return ids, mask


def logits_on(model, kernel, **inputs):
    gemfilter.set_attention(model, kernel)
    with torch.no_grad():
        return model(**inputs).logits


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("base", ["sdpa", "eager"])
def test_prefill_logits_match_stock_kernels(models, family, base, device):
    model, w = on(models[family], device), WINDOW[family]
    for n in (w // 2, w, w + 1, 2 * w, 2 * w + 1, 5 * w + 3):
        for rows, pad in ((1, 0), (3, min(5, n - 1))):
            ids, mask = (t.to(device) for t in batch(n, pad, rows, seed=n))
            ref = logits_on(model, base, input_ids=ids, attention_mask=mask)
            got = logits_on(model, "banded", input_ids=ids, attention_mask=mask)
            real = mask.bool()  # a padding row's logits are never read
            assert (got - ref)[real].abs().max() < TOL, (n, rows, pad)


@pytest.mark.parametrize("family", FAMILIES)
def test_decode_steps_of_several_tokens_against_a_cache(models, family):
    """Prefill, then chunks of 3 and 1 tokens against the (sliding) cache: q > 1 and q = 1 decode."""
    from transformers import DynamicCache

    model, w = models[family], WINDOW[family]
    ids, mask = batch(3 * w + 5, pad=4, rows=2, seed=7)
    outs = {}
    for kernel in ("sdpa", "banded"):
        gemfilter.set_attention(model, kernel)
        cache = DynamicCache(config=model.config)
        chunks, start, m = [], 0, mask
        with torch.no_grad():
            for size in (ids.shape[1], 3, 1, 3, 1):
                new = torch.randint(3, 96, (2, size), generator=torch.Generator().manual_seed(size)) if start else ids
                m = mask if not start else torch.cat([m, torch.ones_like(new)], 1)
                chunks.append(model(input_ids=new, attention_mask=m, **cache_kwargs(cache), use_cache=True).logits)
                start += size
        outs[kernel] = chunks
    for ref, got in zip(outs["sdpa"], outs["banded"]):
        assert (got[-1] - ref[-1]).abs().max() < TOL  # row 0 unpadded
        assert (got[0] - ref[0]).abs().max() < TOL


def _generate(model, kernel, name, ids, mask, family):
    gemfilter.set_attention(model, kernel)
    method = get_method(name, topk=40, layer=FILTER_LAYER[family])
    return gemfilter.generate(
        model,
        {"input_ids": ids, "attention_mask": mask},
        method=method,
        tokenizer=DotTokenizer(),
        max_new_tokens=20,
        min_new_tokens=20,
        return_dict_in_generate=True,
        output_logits=True,
    )


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_every_method_generates_the_same_on_banded(models, family, name, device):
    """Prefill + 20 decode steps: per-step logits within 1e-4 and identical greedy tokens, one row and a
    left-padded batch (cache methods refuse padded batches on sliding models, and any batch on a model
    whose every layer is windowed, on both kernels alike)."""
    import re

    model = on(models[family], device)
    refused = "left-padded|every layer of this model has a sliding window"
    for rows, pad in ((1, 0), (2, 6)):
        ids, mask = (t.to(device) for t in batch(72, pad, rows, seed=3))
        try:
            ref = _generate(model, "sdpa", name, ids, mask, family)
        except ValueError as err:
            with pytest.raises(ValueError, match=refused):
                _generate(model, "banded", name, ids, mask, family)
            assert re.search(refused, str(err))
            continue
        got = _generate(model, "banded", name, ids, mask, family)
        assert torch.equal(got.sequences, ref.sequences), (name, rows)
        assert got.kept == ref.kept
        for a, b in zip(got.output.logits, ref.output.logits):
            assert (a - b).abs().max() < TOL, (name, rows)
        if ref.selection is not None:
            assert [i.tolist() for i in got.selection.indices] == [i.tolist() for i in ref.selection.indices]


@pytest.mark.parametrize("family", FAMILIES)
def test_inspection_rows_are_the_same_on_banded(models, family):
    model = models[family]
    ids, _ = batch(60, seed=5)
    traces = {}
    for kernel in ("sdpa", "banded"):
        gemfilter.set_attention(model, kernel)
        traces[kernel] = trace(model, ids)
    for key, value in traces["sdpa"].store.items():
        assert torch.allclose(traces["banded"].store[key], value, atol=1e-5), key


def test_sliding_mask_is_banded_not_n_by_n():
    """The builder never materialises n x n: (b, n/W, W, 2W) booleans, equal to the dense mask's band."""
    from transformers.masking_utils import sdpa_mask, sliding_window_causal_mask_function

    n, w, b = 256, 8, 2
    pad = torch.ones(b, n, dtype=torch.bool)
    pad[1, :5] = False
    fn = sliding_window_causal_mask_function(w)
    m = banded_mask(batch_size=b, q_length=n, kv_length=n, mask_function=fn, attention_mask=pad, local_size=w)
    assert isinstance(m, BandedMask) and m.blocked
    assert m.allowed.numel() == b * (n // w) * w * 2 * w  # 8,192 instead of n^2 b = 131,072
    dense = sdpa_mask(
        batch_size=b,
        q_length=n,
        kv_length=n,
        mask_function=fn,
        attention_mask=pad,
        local_size=w,
        allow_is_causal_skip=False,
    )[:, 0]
    for t in range(n // w):  # block t: queries tW..tW+W-1 against keys (t-1)W..(t+1)W-1
        lo = (t - 1) * w
        ref = torch.zeros(b, w, 2 * w, dtype=torch.bool)
        ref[:, :, max(0, -lo) :] = dense[:, t * w : (t + 1) * w, max(0, lo) : (t + 1) * w]
        assert torch.equal(m.allowed[:, t], ref), t
    # full-attention layers (no window) still get SDPA's own mask
    assert banded_mask(batch_size=1, q_length=n, kv_length=n, attention_mask=None) is None


@pytest.mark.parametrize("q_offset,q_length,kv_length", [(0, 64, 64), (20, 6, 26)])
def test_a_banded_mask_hides_keys_from_its_first_rows_as_the_dense_mask_would(q_offset, q_length, kv_length):
    """BandedMask.without(rows, keys) (stable-gap's one-forward write): the first rows lose exactly those keys, in the
    blocked layout (q > W, kv > 2W) and in the single small block; checked against the dense sliding mask with the
    same entries cleared."""
    from transformers.masking_utils import sdpa_mask, sliding_window_causal_mask_function

    w = 8
    fn = sliding_window_causal_mask_function(w)
    sizes = dict(batch_size=1, q_length=q_length, kv_length=kv_length, q_offset=q_offset, mask_function=fn)
    m = banded_mask(**sizes, attention_mask=None, local_size=w)
    rows, keys = 5, torch.tensor([1, 3, 4, 9, 19, 21])
    hidden = m.without(rows, keys)
    assert m.blocked == (q_length > w) and hidden.sizes() == m.sizes()
    dense = sdpa_mask(**sizes, attention_mask=None, local_size=w, allow_is_causal_skip=False)[0, 0].clone()
    dense[:rows, keys] = False
    if not m.blocked:
        assert torch.equal(hidden.allowed[0], dense) and not torch.equal(m.allowed[0], dense)
        return
    changed = False
    for t in range(q_length // w):  # block t: queries tW..tW+W-1 against keys (t-1)W..(t+1)W-1
        lo = (t - 1) * w
        ref = torch.zeros(w, 2 * w, dtype=torch.bool)
        ref[:, max(0, -lo) :] = dense[t * w : (t + 1) * w, max(0, lo) : (t + 1) * w]
        assert torch.equal(hidden.allowed[0, t], ref), t
        changed |= not torch.equal(m.allowed[0, t], ref)
    assert changed


def test_soft_capped_models_are_refused_with_the_fallback_named():
    cfg = Gemma2Config(
        vocab_size=96,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        sliding_window=8,
        attn_logit_softcapping=50.0,
    )
    model = Gemma2ForCausalLM(cfg).eval()
    with pytest.raises(ValueError, match="soft-capped.*attn='eager'"):
        gemfilter.set_attention(model, "banded")
    with pytest.raises(ValueError, match="unknown attention kernel 'band'; allowed: banded, sdpa"):
        gemfilter.set_attention(model, "band")


def test_apply_wraps_banded_and_restores_it(models):
    model = models["gemma3"]
    gemfilter.set_attention(model, "banded")
    ids, _ = batch(40, seed=2)
    with gemfilter.apply(model, get_method("gemfilter", topk=16, layer=1)):
        assert model.config._attn_implementation == "gemfilter_banded"
        model.generate(ids, max_new_tokens=2, do_sample=False)
    assert model.config._attn_implementation == "banded"
