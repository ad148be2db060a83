"""Real-behaviour checks on the embedded Gemma 3 270M (slow: marked, and run in CI)."""

import pytest
import torch

import gemfilter
from eval.niah.haystack import build_case

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def embedded():
    torch.set_num_threads(2)
    model, tok = gemfilter.load_model()
    return model, tok


@pytest.fixture(autouse=True)
def documented_defaults(monkeypatch):
    """Test the documented default layer, whatever a local `gemfilter calibrate` may have stored."""
    monkeypatch.setattr("gemfilter.layers.load_calibration", lambda model: None)


def answer(model, tok, prompt, method=None, max_new_tokens=24):
    enc = tok(prompt, return_tensors="pt")
    if method is None:
        out = model.generate(**enc, max_new_tokens=max_new_tokens, do_sample=False)
        return tok.decode(out[0, enc["input_ids"].shape[1] :], skip_special_tokens=True), enc["input_ids"].shape[1]
    out = gemfilter.generate(model, enc, method=method, tokenizer=tok, max_new_tokens=max_new_tokens)
    return tok.decode(out.new_tokens[0], skip_special_tokens=True), out.kept[0]


def test_embedded_model_loads_offline_with_known_shape(embedded):
    model, tok = embedded
    cfg = model.config
    assert cfg.num_hidden_layers == 18
    full = [i for i, t in enumerate(cfg.layer_types) if t == "full_attention"]
    assert full == [5, 11, 17]
    assert gemfilter.default_layer(model) == 11
    from gemfilter.models import embedded_model_dir

    assert (embedded_model_dir() / "model.safetensors").exists()  # the cache later loads read


def test_needle_1500_tokens_full_and_gemfilter_default_layer(embedded):
    model, tok = embedded
    case = build_case(tok, 1500, 50)
    full, n = answer(model, tok, case.prompt)
    assert "Dolores Park" in full, full
    filtered, kept = answer(model, tok, case.prompt, gemfilter.GemFilter(topk=1024))  # layer: the default, 11
    assert "Dolores Park" in filtered, filtered
    assert kept == 1024 < n


@pytest.mark.parametrize("length", [2000, 4000])
def test_span_selection_finds_the_needle_at_every_depth(embedded, length):
    model, tok = embedded
    method = gemfilter.get_method("gemfilter-span", topk=256, layer=11)
    for depth in (10, 30, 50, 70, 90):
        case = build_case(tok, length, depth)
        text, kept = answer(model, tok, case.prompt, method, max_new_tokens=20)
        assert "Dolores Park" in text, (length, depth, text)
        assert kept <= 256


def test_sliding_filter_layer_warns(embedded):
    model, tok = embedded
    with pytest.warns(UserWarning, match="filter layer 4 is a sliding-window layer"):
        gemfilter.select_tokens(model, tok("hello world.", return_tensors="pt")["input_ids"], layer=4, topk=2)


def test_banded_default_and_sdpa_give_the_same_greedy_answer_at_2k(embedded):
    """The embedded model loads on the exact banded kernel; a 2K NIAH prompt gives the same
    greedy tokens on it as on stock sdpa (full generation, 24 tokens)."""
    model, tok = embedded
    assert model.config._attn_implementation == "banded"
    enc = tok(build_case(tok, 2000, 50).prompt, return_tensors="pt")
    outs = {}
    try:
        for kernel in ("sdpa", "banded"):
            gemfilter.set_attention(model, kernel)
            outs[kernel] = model.generate(**enc, max_new_tokens=24, min_new_tokens=24, do_sample=False)
    finally:
        gemfilter.set_attention(model, "banded")
    assert enc["input_ids"].shape[1] > 1800
    assert torch.equal(outs["sdpa"], outs["banded"])
