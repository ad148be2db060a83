"""A sliding window that can never bind (Phi 3.5: 262144 >= 131072 positions) is dropped at load time.

Left in place, transformers makes every layer a sliding-window layer and the cache methods, which
evict only full-attention layers, would keep everything while reporting the budget. Checked on a tiny
Phi 3 saved with sliding_window 1024 >= its 512 positions, against transformers' own loading of it.
"""

import shutil

import pytest
import torch
from tiny_models import COMMON, _build
from transformers import AutoModelForCausalLM, Phi3Config, Phi3ForCausalLM

import gemfilter
from gemfilter.compat import output_cache
from gemfilter.models import load_config

N, BUDGET = 64, 40


@pytest.fixture(scope="module")
def phi_dir(tiny_model_dir, tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny-phi3-window")
    _build(Phi3ForCausalLM, Phi3Config, original_max_position_embeddings=512, sliding_window=1024).save_pretrained(path)
    for f in tiny_model_dir.iterdir():  # the tiny tokenizer (words w4..w95)
        if "token" in f.name:
            shutil.copy(f, path / f.name)
    return path


def _ids():
    return torch.randint(4, COMMON["vocab_size"], (1, N), generator=torch.Generator().manual_seed(0))


def test_load_drops_the_window_and_attention_is_unchanged(phi_dir):
    stock = AutoModelForCausalLM.from_pretrained(phi_dir).eval()  # transformers' loading: the window stays
    assert stock.config.sliding_window == 1024
    with pytest.warns(UserWarning, match="sliding_window 1024 >= max_position_embeddings 512 dropped"):
        model, _ = gemfilter.load_model(str(phi_dir))
    assert model.config.sliding_window is None
    assert model.config.gemfilter_changes == [
        "sliding_window 1024 >= max_position_embeddings 512 dropped (never binds)"
    ]
    assert load_config(str(phi_dir)).sliding_window is None  # what the runners check options against
    with pytest.warns(UserWarning, match="dropped"):  # a config keyword still reaches the config
        assert gemfilter.load_model(str(phi_dir), use_cache=False)[0].config.use_cache is False
    with torch.no_grad():
        assert torch.allclose(model(_ids()).logits, stock(_ids()).logits, atol=1e-5)


@pytest.mark.parametrize("name", ["snapkv", "h2o", "gemfilter-one-run"])
def test_cache_methods_evict_after_the_drop_and_refuse_an_all_sliding_model(phi_dir, name):
    with pytest.warns(UserWarning):
        model, _ = gemfilter.load_model(str(phi_dir))
    method = gemfilter.get_method(name, topk=BUDGET, layer=2)
    with gemfilter.apply(model, method):
        out = model.generate(_ids(), max_new_tokens=1, do_sample=False, return_dict_in_generate=True)
    assert [layer.keys.shape[-2] for layer in output_cache(out).layers] == [BUDGET] * COMMON["num_hidden_layers"]

    stock = AutoModelForCausalLM.from_pretrained(phi_dir).eval()
    with pytest.raises(
        ValueError, match=r"every layer of this model has a sliding window \(1024\).*gemfilter.load_model"
    ):
        with gemfilter.apply(stock, method):
            stock.generate(_ids(), max_new_tokens=1, do_sample=False)


def test_a_window_in_layer_types_is_left_alone(tmp_path):
    """Gemma 3's layer_types also pick each layer's RoPE, so an unreachable window there is not rewritten."""
    from transformers import Gemma3TextConfig

    from gemfilter.models import drop_unreachable_window

    cfg = Gemma3TextConfig(
        **{**COMMON, "sliding_window": 4096, "layer_types": ["sliding_attention", "full_attention"] * 2}
    )
    assert drop_unreachable_window(cfg) is None and cfg.sliding_window == 4096


def test_an_eval_folder_made_before_the_drop_is_not_resumed_after_it(phi_dir, tmp_path):
    """Rows made with the window in place (cache methods kept everything) must not mix with rows after
    the drop: the runners keep the model's gemfilter_changes in the folder's identity."""
    import json

    from transformers import AutoTokenizer

    from eval.ruler.prepare import data_file, write_rows
    from eval.ruler.runner import RunConfig, run
    from gemfilter.methods.spec import expand_budgets

    rows = [
        {
            "index": 0,
            "input": "w4 w5 w6",
            "answer_prefix": " w9",
            "outputs": ["w5"],
            "length": 4,
            "length_w_model_temp": 4,
        }
    ]
    write_rows(data_file(tmp_path, 512, "vt"), rows)
    cfg = RunConfig(
        model=str(phi_dir), methods=expand_budgets(("full",)), tasks=("vt",), lengths=(512,), num_samples=1, layer=2
    )
    stock = AutoModelForCausalLM.from_pretrained(phi_dir).eval()  # as a folder from before the drop was made
    run(cfg, tmp_path, model_and_tokenizer=(stock, AutoTokenizer.from_pretrained(phi_dir)), progress=False)
    assert json.loads((tmp_path / "config.json").read_text()).get("model_changes") == []

    with pytest.raises(ValueError, match=r"another setup \(model_changes: \[\] there, \['sliding_window 1024"):
        run(cfg, tmp_path, progress=False)  # gemfilter.load_config drops the window: refused before any weights load
    legacy = json.loads((tmp_path / "config.json").read_text())
    del legacy["model_changes"]  # a folder written before the key existed reads as "no changes"
    (tmp_path / "config.json").write_text(json.dumps(legacy))
    with pytest.raises(ValueError, match="model_changes"):
        run(cfg, tmp_path, progress=False)
    assert run(cfg, tmp_path, model_and_tokenizer=(stock, None), progress=False)[512, "full", "vt"][0]["index"] == 0
