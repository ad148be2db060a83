"""``--engine URL`` on the NIAH, RULER and LongBench runners: the selection runs here, the generation on the
engine (a stub on localhost that records what it was sent), and the rows record the engine.

What the engine receives is compared with ``gemfilter.select_tokens`` on the same tiny model (prompt
methods) or with the whole prompt (``full``). The real engine is exercised in tests/test_serve_vllm.py.
"""

import pytest
import torch
from niah_fixtures import word_tokenizer, write_haystack
from serve_fixtures import StubEngine
from test_ruler_runner import TASKS, write_samples
from tiny_models import BUILDERS

import gemfilter
from eval.longbench.runner import RunConfig as LongBenchConfig
from eval.longbench.runner import run as run_longbench
from eval.niah.runner import RunConfig as NiahConfig
from eval.niah.runner import run as run_niah
from eval.ruler.runner import RunConfig as RulerConfig
from eval.ruler.runner import run as run_ruler
from gemfilter.methods.spec import expand_budgets
from gemfilter.toolkit.serving.upstream import PROBE


@pytest.fixture
def niah_setup(tmp_path):
    tok = word_tokenizer()
    engine = StubEngine(tokens=tok(PROBE)["input_ids"])
    yield (BUILDERS["llama"](), tok), engine, str(write_haystack(tmp_path / "hay"))
    engine.close()


def niah_config(hay, engine=None, methods=("full", "gemfilter")):
    return NiahConfig(
        model="tiny",
        methods=methods,
        lengths=(260,),
        depths=(0, 100),
        topk=40,
        layer=2,
        max_new_tokens=3,
        haystack_dir=hay,
        engine=engine,
    )


def test_niah_sends_the_kept_ids_to_the_engine_and_records_it(niah_setup, tmp_path):
    tiny, engine, hay = niah_setup
    rows = run_niah(niah_config(hay, engine.url), tmp_path / "out", model_and_tokenizer=tiny, progress=False)
    assert [r["engine"] for r in rows] == [engine.url] * 4
    completions = [b for b, p in zip(engine.bodies, engine.paths) if p == "/v1/completions"]
    assert len(completions) == 4  # 2 methods x 2 depths, one request each
    model, tok = tiny
    from eval.niah.haystack import build_case, make_haystack

    haystack = make_haystack(tok, 260, haystack_dir=hay)
    sent = iter(completions)
    for row in rows:
        case = build_case(tok, 260, row["depth"], haystack=haystack)
        ids = tok(case.prompt, add_special_tokens=case.add_special_tokens)["input_ids"]
        body = next(sent)
        if row["method"] == "full":
            assert body["prompt"] == ids and row["kept"] == len(ids)
        else:
            ref = gemfilter.select_tokens(model, torch.tensor([ids]), layer=2, topk=40).kept_ids[0].tolist()
            assert body["prompt"] == ref and row["kept"] == 40
        assert (body["max_tokens"], body["temperature"], body["model"]) == (3, 0, "stub-model")


def test_an_engine_folder_and_a_local_folder_do_not_mix(niah_setup, tmp_path):
    tiny, engine, hay = niah_setup
    run_niah(niah_config(hay, methods=("full",)), tmp_path / "out", model_and_tokenizer=tiny, progress=False)
    with pytest.raises(ValueError, match=r"another setup \(engine: None there, 'http://127.0.0.1:\d+/v1' now\)"):
        run_niah(
            niah_config(hay, engine.url, methods=("full",)), tmp_path / "out", model_and_tokenizer=tiny, progress=False
        )


@pytest.mark.parametrize("runner", ["niah", "ruler", "longbench"])
def test_kv_cache_methods_are_refused_with_an_engine_before_any_request(niah_setup, tmp_path, tiny_model_dir, runner):
    tiny, engine, hay = niah_setup
    pattern = "--engine runs the selection here .* not snapkv"
    with pytest.raises(ValueError, match=pattern):
        if runner == "niah":
            run_niah(
                niah_config(hay, engine.url, methods=("full", "snapkv")),
                tmp_path / "o",
                model_and_tokenizer=tiny,
                progress=False,
            )
        elif runner == "ruler":
            run_ruler(
                RulerConfig(
                    model=str(tiny_model_dir),
                    methods=expand_budgets(("snapkv",), (40,)),
                    tasks=TASKS,
                    lengths=(512,),
                    num_samples=1,
                    layer=2,
                    engine=engine.url,
                ),
                tmp_path / "o",
                model_and_tokenizer=tiny,
                progress=False,
            )
        else:
            run_longbench(
                LongBenchConfig(
                    model=str(tiny_model_dir),
                    methods=("snapkv",),
                    tasks=("hotpotqa",),
                    limit=1,
                    max_length=400,
                    engine=engine.url,
                ),
                tmp_path / "o",
                model_and_tokenizer=tiny,
                progress=False,
            )
    assert engine.bodies == []


def test_ruler_sends_the_kept_ids_and_records_the_engine(tmp_path, tiny_model_dir):
    model, tok = gemfilter.load_model(str(tiny_model_dir))
    engine = StubEngine(tokens=tok(PROBE)["input_ids"])
    try:
        out = write_samples(tmp_path / "out")
        config = RulerConfig(
            model=str(tiny_model_dir),
            methods=expand_budgets(("full", "gemfilter"), (8,)),
            tasks=TASKS,
            lengths=(512,),
            num_samples=2,
            layer=2,
            engine=engine.url,
        )
        merged = run_ruler(config, out, model_and_tokenizer=(model, tok), progress=False)
    finally:
        engine.close()
    completions = [b for b, p in zip(engine.bodies, engine.paths) if p == "/v1/completions"]
    assert len(completions) == 2 * len(TASKS) * 2
    rows = [r for rs in merged.values() for r in rs]
    assert len(rows) == 12 and all(r["engine"] == engine.url for r in rows)
    kept = {r["kept"] for (_, label, _), rs in merged.items() for r in rs if label == "gemfilter_k8"}
    assert kept == {8}
    from eval.ruler.prepare import data_file, prepared_rows

    expected = []
    for task in TASKS:
        for row in prepared_rows(data_file(out, 512, task))[:2]:
            ids = tok(row["input"] + row["answer_prefix"])["input_ids"]
            ref = gemfilter.select_tokens(model, torch.tensor([ids]), layer=2, topk=8).kept_ids[0].tolist()
            expected += [tuple(ids), tuple(ref)]
    assert sorted(tuple(b["prompt"]) for b in completions) == sorted(expected)
