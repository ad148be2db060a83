"""A chunked filter pass (``gemfilter:chunk=C``): layers 0..r run chunk by chunk with a cache, as chunked prefill
does, and must select what the paper's one pass selects, on every family, for any chunk size."""

import warnings

import pytest
import torch
from tiny_models import BUILDERS, FILTER_LAYER, DotTokenizer, on

import gemfilter
from gemfilter.methods import parse_spec

N = 48


@pytest.fixture(autouse=True)
def _quiet():
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="filter layer .* sliding-window")
        yield


@pytest.fixture(scope="module", params=sorted(BUILDERS))
def family(request):
    return request.param, BUILDERS[request.param]()


@pytest.mark.parametrize("spec", ["gemfilter:k=11", "gemfilter-span:k=16", "gemfilter-orig-pos:k=11"])
def test_chunked_selection_equals_one_pass(family, spec, device):
    name, model = family
    model = on(model, device)
    ids = torch.randint(3, 96, (2, N), generator=torch.Generator().manual_seed(4)).to(device)
    whole = parse_spec(spec).method(N, layer=FILTER_LAYER[name])
    one = whole.select(model, ids, tokenizer=DotTokenizer())
    if name == "mistral-sliding":  # every layer slides: the cache keeps only the window's keys
        with pytest.raises(ValueError, match="filter layer 2 has a sliding window"):
            parse_spec(f"{spec},chunk=8").method(N, layer=2).select(model, ids, tokenizer=DotTokenizer())
        return
    for chunk in (1, 7, 16, N - 1, N, 100):
        method = parse_spec(f"{spec},chunk={chunk}").method(N, layer=FILTER_LAYER[name])
        sel = method.select(model, ids, tokenizer=DotTokenizer())
        assert [i.tolist() for i in sel.indices] == [i.tolist() for i in one.indices], (name, spec, chunk)
        assert torch.allclose(sel.scores, one.scores, rtol=1e-4, atol=1e-5)


def test_chunked_generation_equals_one_pass(device):
    model = on(BUILDERS["llama"](), device)
    ids = torch.randint(3, 96, (1, N), generator=torch.Generator().manual_seed(5)).to(device)
    plain = gemfilter.generate(model, ids, method=gemfilter.GemFilter(layer=2, topk=16), max_new_tokens=8)
    chunked = gemfilter.generate(model, ids, method=gemfilter.GemFilter(layer=2, topk=16, chunk=10), max_new_tokens=8)
    assert torch.equal(chunked.sequences, plain.sequences)


def test_chunk_is_refused_where_it_cannot_hold():
    with pytest.raises(ValueError, match="gemfilter-qwin has no parameter .chunk."):
        parse_spec("gemfilter-qwin:chunk=8")
    with pytest.raises(ValueError, match="chunk=0 must be >= 1"):
        parse_spec("gemfilter:chunk=0")
    model = BUILDERS["llama"]()
    ids = torch.randint(3, 96, (2, N), generator=torch.Generator().manual_seed(6))
    mask = torch.ones_like(ids)
    mask[0, :3] = 0
    with pytest.raises(ValueError, match="chunk=8 runs unpadded prompts only"):
        gemfilter.GemFilter(layer=2, topk=16, chunk=8).select(model, ids, mask)
