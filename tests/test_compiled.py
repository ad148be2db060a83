"""Compiled generation (gemfilter.generate(..., compile=True)): a static cache and a compiled decode step after
each method's own prefill must give generate's greedy tokens, token for token, on CPU and CUDA."""

import warnings

import pytest
import torch
from tiny_models import BUILDERS, FILTER_LAYER, DotTokenizer, on

import gemfilter
from gemfilter.compiled import StaticDecoder, decoder_for, release
from gemfilter.measure import FirstTokenClock
from gemfilter.methods import parse_spec

pytestmark = pytest.mark.slow  # torch.compile: tens of seconds per model on two cores

N, NEW = 48, 12


@pytest.fixture(autouse=True)
def _fp32_exact():
    """Exact fp32 on CUDA (no TF32), and no warning about sliding filter layers of the tiny models."""
    before = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="filter layer .* sliding-window")
        yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before


@pytest.fixture(scope="module")
def llama():
    model = BUILDERS["llama"]()
    yield model
    release(model)
    torch._dynamo.reset()


def padded_batch(device, seed=1):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, 96, (2, N), generator=g)
    mask = torch.ones_like(ids)
    ids[0, :9], mask[0, :9] = 0, 0  # row 0 left-padded by 9
    return {"input_ids": ids.to(device), "attention_mask": mask.to(device)}


SPECS = [
    "full",
    "gemfilter:k=16",
    "gemfilter:k=64",
    "gemfilter-span:k=16",
    "gemfilter-orig-pos:k=16",
    "snapkv:k=36",
    "h2o:k=36",
    "gemfilter-claa:k=16",
]


def test_compiled_equals_eager_on_a_padded_batch(llama, device):
    """Every method whose cache can go on statically: the same tokens as generate, k < n and k >= n, one
    decoder (one capacity) for all of them on each device."""
    model = on(llama, device)
    batch = padded_batch(device)
    decoder = StaticDecoder(model, capacity=N + NEW)
    for spec in SPECS:
        method = parse_spec(spec).method(N, layer=FILTER_LAYER["llama"])
        kw = dict(method=method, tokenizer=DotTokenizer(), max_new_tokens=NEW, min_new_tokens=4)
        eager = gemfilter.generate(model, batch, **kw)
        fast = gemfilter.generate(model, batch, compile=decoder, **kw)
        assert torch.equal(fast.sequences, eager.sequences), spec
        assert fast.kept == eager.kept, spec
        if eager.selection is not None:
            assert [i.tolist() for i in fast.selection.indices] == [i.tolist() for i in eager.selection.indices]


def test_fastkv_compiled_equals_eager(llama, device):
    """FastKV with TSP firing: every layer caches topk rows, decoding at original positions n, n+1, ..."""
    model = on(llama, device)
    ids = padded_batch(device)["input_ids"][1:]
    method = parse_spec("fastkv:k=24,tsp_len=32,window=4").method(N, layer=FILTER_LAYER["llama"])
    eager = gemfilter.generate(model, ids, method=method, max_new_tokens=NEW, min_new_tokens=NEW)
    fast = gemfilter.generate(model, ids, method=method, max_new_tokens=NEW, min_new_tokens=NEW, compile=True)
    assert eager.budget.kv_rows == (24,) * 4
    assert torch.equal(fast.sequences, eager.sequences)


@pytest.mark.parametrize("family", ["gemma3", "mistral-sliding"])
def test_compiled_on_sliding_window_models(family, device):
    """Sliding layers hold their window (fewer rows than the full layers): the static cache rolls them."""
    model = on(BUILDERS[family](), device)
    ids = padded_batch(device, seed=2)["input_ids"][1:]
    specs = ["full", "gemfilter:k=16", "gemfilter:k=40"] + (["snapkv:k=40"] if family == "gemma3" else [])
    for spec in specs:
        method = parse_spec(spec).method(N, layer=FILTER_LAYER[family])
        eager = gemfilter.generate(model, ids, method=method, max_new_tokens=NEW, min_new_tokens=NEW)
        fast = gemfilter.generate(model, ids, method=method, max_new_tokens=NEW, min_new_tokens=NEW, compile=True)
        assert torch.equal(fast.sequences, eager.sequences), (family, spec)
    release(model)
    torch._dynamo.reset()


def test_one_compilation_serves_prompts_of_any_length(llama):
    """k is fixed, so the decoder of capacity k + t is reused at every prompt length: no new graph."""
    from torch._dynamo.utils import counters

    release(llama)
    method = gemfilter.GemFilter(layer=2, topk=16)
    graphs = []
    for n in (24, 40, 48):
        ids = padded_batch("cpu", seed=n)["input_ids"][1:, :n]
        eager = gemfilter.generate(llama, ids, method=method, max_new_tokens=NEW, min_new_tokens=NEW)
        fast = gemfilter.generate(llama, ids, method=method, max_new_tokens=NEW, min_new_tokens=NEW, compile=True)
        assert torch.equal(fast.sequences, eager.sequences)
        graphs.append(counters["stats"]["unique_graphs"])
    assert graphs[1] == graphs[2] == graphs[0], graphs
    assert decoder_for(llama, 16 + NEW - 1).capacity == 16 + NEW - 1


def test_eos_stops_and_pads_as_generate_does(llama):
    """A row that writes EOS stops; the other goes on, the finished one gets pad tokens; generation ends when
    every row has finished. EOS is made the token each row writes second, so it really fires."""
    batch = padded_batch("cpu", seed=3)
    method = gemfilter.GemFilter(layer=2, topk=16)
    free = gemfilter.generate(llama, batch, method=method, max_new_tokens=NEW)
    eos = [int(free.new_tokens[0, 1]), int(free.new_tokens[1, 4])]
    kw = dict(method=method, max_new_tokens=NEW, eos_token_id=eos, pad_token_id=0)
    eager = gemfilter.generate(llama, batch, **kw)
    fast = gemfilter.generate(llama, batch, compile=True, **kw)
    assert eager.new_tokens.shape[1] < NEW  # both rows stopped early
    assert torch.equal(fast.sequences, eager.sequences)


def test_streamer_sees_the_prompt_then_each_token(llama):
    clock = FirstTokenClock(None)
    ids = padded_batch("cpu")["input_ids"][1:]
    out = gemfilter.generate(
        llama,
        ids,
        method=gemfilter.GemFilter(layer=2, topk=16),
        max_new_tokens=5,
        min_new_tokens=5,
        compile=True,
        streamer=clock,
    )
    assert clock.calls == 1 + 5 and clock.first_token is not None
    assert out.new_tokens.shape == (1, 5)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(do_sample=True), "greedily"),
        (dict(num_beams=2), "greedily"),
        (dict(max_new_tokens=None), "max_new_tokens"),
        (dict(output_scores=True), "output_scores"),
        (dict(repetition_penalty=1.2), "repetition_penalty"),
    ],
)
def test_refusals_name_the_keyword(llama, kwargs, message):
    ids = padded_batch("cpu")["input_ids"][1:]
    kw = {"max_new_tokens": 4, **kwargs}
    with pytest.raises(ValueError, match=message):
        gemfilter.generate(llama, ids, method=gemfilter.GemFilter(layer=2, topk=16), compile=True, **kw)


def test_refusals_name_the_method_and_the_capacity(llama):
    ids = padded_batch("cpu")["input_ids"][1:]
    with pytest.raises(ValueError, match="snapkv-per-head keeps one set per query head"):
        gemfilter.generate(
            llama, ids, method=parse_spec("snapkv-per-head:k=36").method(N), max_new_tokens=4, compile=True
        )
    small = StaticDecoder(llama, capacity=10, compile=False)
    with pytest.raises(ValueError, match="holds 10 rows per layer.*capacity >= 19"):
        gemfilter.generate(llama, ids, method=gemfilter.GemFilter(layer=2, topk=16), max_new_tokens=4, compile=small)
    with pytest.raises(TypeError, match="compile must be False, True or a gemfilter.compiled.StaticDecoder"):
        gemfilter.generate(llama, ids, method=gemfilter.GemFilter(layer=2, topk=16), max_new_tokens=4, compile="yes")
    with pytest.raises(ValueError, match="capacity must be an int >= 1"):
        StaticDecoder(llama, capacity=0)
