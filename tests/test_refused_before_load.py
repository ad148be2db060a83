"""A KV-cache method on a model whose every layer is windowed is refused before any weights load.

SnapKV, H2O and One-Run evict only full-attention layers, so on such a model they would keep the
whole cache and report the budget. The eval runners check the config before the model loads, so the
refusal does not wait for the first ``generate``. The model folders here hold a config.json and no
weights, so a refusal that came any later would be a loading error instead.
"""

import json

import pytest
from tiny_models import COMMON
from transformers import LlamaConfig, MistralConfig

from gemfilter import get_method
from gemfilter.methods import check_for_model
from gemfilter.models import load_config

WINDOW, BUDGET = 64, 40
REFUSED = rf"every layer of this model has a sliding window \({WINDOW}\).*longer than topk={BUDGET}"


@pytest.fixture(scope="module")
def windowed_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("mistral-config-only")
    MistralConfig(**COMMON, sliding_window=WINDOW).save_pretrained(path)  # a window that binds (64 < 512)
    return path


@pytest.mark.parametrize("name", ["snapkv", "h2o", "gemfilter-one-run", "snapkv-per-head"])
def test_cache_methods_need_a_full_attention_layer_only_when_they_evict(windowed_dir, name):
    cfg = load_config(str(windowed_dir))
    method = get_method(name, topk=BUDGET, layer=1)
    with pytest.raises(ValueError, match=REFUSED):
        check_for_model(method, cfg, BUDGET + 1)
    check_for_model(method, cfg, BUDGET)  # the prompt fits the budget: nothing is evicted, any model will do
    check_for_model(method, LlamaConfig(**COMMON), 10 * BUDGET)  # full-attention layers: evicts


def test_other_methods_and_bad_budgets():
    cfg = MistralConfig(**COMMON, sliding_window=WINDOW)
    for name in ("full", "gemfilter", "gemfilter-span"):
        check_for_model(get_method(name, topk=BUDGET, layer=1), cfg, 10 * BUDGET)  # they select prompt tokens
    with pytest.raises(ValueError, match="topk=32 must exceed the window of 32"):
        check_for_model(get_method("snapkv", topk=32), LlamaConfig(**COMMON), 16)


def test_niah_refuses_before_loading(windowed_dir, tmp_path):
    from eval.niah.runner import RunConfig, run

    cfg = RunConfig(
        model=str(windowed_dir), methods=("full", "snapkv"), lengths=(128,), depths=(50,), topk=BUDGET, layer=1
    )
    with pytest.raises(ValueError, match=REFUSED):
        run(cfg, tmp_path / "niah", progress=False)
    assert not (tmp_path / "niah" / "config.json").exists()  # nothing pinned


def test_ruler_refuses_before_loading(windowed_dir, tmp_path):
    from eval.ruler.runner import RunConfig, run
    from gemfilter.methods.spec import expand_budgets

    cfg = RunConfig(
        model=str(windowed_dir),
        methods=expand_budgets(("full", "h2o"), topks=(BUDGET,)),
        tasks=("vt",),
        lengths=(128,),
        num_samples=1,
        layer=1,
    )
    with pytest.raises(ValueError, match=REFUSED):
        run(cfg, tmp_path / "ruler", progress=False)
    assert not (tmp_path / "ruler" / "config.json").exists()
    # A ratio budget is a share of each length: 0.5 x 128 = 64 tokens, checked against that length.
    ratio = RunConfig(
        model=str(windowed_dir),
        methods=expand_budgets(("snapkv",), ratio=0.5),
        tasks=("vt",),
        lengths=(128,),
        num_samples=1,
        layer=1,
    )
    with pytest.raises(ValueError, match=r"every layer of this model has a sliding window \(64\).*topk=64"):
        run(ratio, tmp_path / "ruler", progress=False)


def test_longbench_refuses_before_loading(windowed_dir, tmp_path):
    from eval.longbench.runner import RunConfig, run

    data = tmp_path / "data"
    data.mkdir()
    (data / "hotpotqa.jsonl").write_text(json.dumps({"_id": "a"}) + "\n")
    cfg = RunConfig(
        model=str(windowed_dir),
        methods=("snapkv",),
        tasks=("hotpotqa",),
        topk=BUDGET,
        layer=1,
        max_length=100,
        data_dir=str(data),
    )
    with pytest.raises(ValueError, match=REFUSED):
        run(cfg, tmp_path / "lb", progress=False)
    fits = RunConfig(
        model=str(windowed_dir),
        methods=("snapkv",),
        tasks=("hotpotqa",),
        topk=BUDGET,
        layer=1,
        max_length=BUDGET,
        data_dir=str(data),
    )  # prompts are cut to the budget: nothing to evict
    with pytest.raises(ValueError, match="record lacks"):  # past the check: it fails later, on the data
        run(fits, tmp_path / "lb2", progress=False)
