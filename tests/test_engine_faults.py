"""``gemfilter bench --engine`` and the three
runners' ``--engine`` against an engine that fails in each named way (tests/engine_faults.py). A broken answer
is one ``error:`` line and exit 2, or an error row that a rerun retries; never a stored result or a traceback.
"""

import json

import pytest
from engine_faults import FaultyEngine
from niah_fixtures import save_tiny_model, word_tokenizer, write_haystack

from eval.niah.cli import main as niah_main
from gemfilter.lab.bench import report as bench_report
from gemfilter.toolkit.io import read_jsonl
from gemfilter.toolkit.serving.upstream import PROBE

pytestmark = pytest.mark.usefixtures("quiet")

STREAM_FAULTS = ["html", "500", "cut-stream", "no-done", "cut-chunk", "error-event", "stall"]
ANSWER_FAULTS = ["html", "empty", "no-choices", "cut-body", "500"]


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp("tiny-word"))


def engine_for(fault=None, after=0):
    return FaultyEngine(fault, after=after, tokens=word_tokenizer()(PROBE)["input_ids"])


def bench_args(model_dir, url, out, *extra):
    return [
        "--engine",
        url,
        "--model",
        str(model_dir),
        "--methods",
        "gemfilter",
        "--lengths",
        "300",
        "--topk",
        "16",
        "--layer",
        "2",
        "--gen-tokens",
        "4",
        "--timeout",
        "1",
        "--out",
        str(out),
        *extra,
    ]


@pytest.mark.parametrize("fault", STREAM_FAULTS)
def test_bench_engine_stores_no_broken_stream_and_a_rerun_measures_it(tiny_dir, tmp_path, capsys, fault):
    engine = engine_for(fault, after=4)  # the 3 warm-up requests and the first timed run are healthy
    try:
        with pytest.raises(SystemExit) as exit_:
            bench_report.main(bench_args(tiny_dir, engine.url, tmp_path))
        assert exit_.value.code == 2
        err = capsys.readouterr().err
        assert [line for line in err.splitlines() if line.startswith("error:")] == [str(exit_.value)]
        # (the in-process proxy's own log of a cut upstream body is the proxy's item 10, not bench's)
        assert "full, proxy at length 300 (repeat 0)" in str(exit_.value) and "serve/bench.py" not in err
        rows = read_jsonl(tmp_path / "bench-engine.jsonl")
        assert [r["route"] for r in rows] == ["full, direct", "full, proxy"] and "error" in rows[1]
        assert not (tmp_path / "bench-engine.md").exists()  # no table from a broken run
        engine.fault = None  # the engine is healthy again: the rerun measures what failed, and only that
        before = engine.completions
        assert bench_report.main(bench_args(tiny_dir, engine.url, tmp_path)) == 0
        assert engine.completions - before == 3 + 2  # warm-up, then full, proxy and gemfilter, proxy
    finally:
        engine.close()
    timed = [r for r in read_jsonl(tmp_path / "bench-engine.jsonl") if "error" not in r]
    assert sorted(r["route"] for r in timed) == ["full, direct", "full, proxy", "gemfilter, proxy"]
    for row in timed:  # the proof that each stream completed: 4 tokens by the engine's usage, finish, [DONE]
        assert (row["done"], row["finish_reason"], row["tokens"], row["tokens_from"]) == (True, "length", 4, "usage")
    summary = json.loads((tmp_path / "bench-engine.json").read_text())["lengths"][0]
    assert summary["total_full"] == next(r["total"] for r in timed if r["route"] == "full, direct")


def test_bench_engine_on_an_html_engine_is_one_error_line_and_no_rows(tiny_dir, tmp_path):
    engine = engine_for("html")
    try:
        with pytest.raises(SystemExit) as exit_:
            bench_report.main(bench_args(tiny_dir, engine.url, tmp_path))
    finally:
        engine.close()
    assert exit_.value.code == 2 and "not a stream (Content-Type 'text/html')" in str(exit_.value)
    assert read_jsonl(tmp_path / "bench-engine.jsonl") == []


def test_bench_engine_rows_without_the_proof_are_measured_again(tiny_dir, tmp_path):
    """Rows written before the proof existed (no done/finish_reason/tokens) are not taken as timings."""
    engine = engine_for()
    try:
        assert bench_report.main(bench_args(tiny_dir, engine.url, tmp_path)) == 0
        path = tmp_path / "bench-engine.jsonl"
        old = [
            {k: v for k, v in r.items() if k not in ("done", "finish_reason", "tokens", "tokens_from")}
            for r in read_jsonl(path)
        ]
        path.write_text("".join(json.dumps(r) + "\n" for r in old))
        before = engine.completions
        assert bench_report.main(bench_args(tiny_dir, engine.url, tmp_path)) == 0
    finally:
        engine.close()
    assert engine.completions - before == 3 + 3  # warm-up, then the three routes again


def test_bench_engine_says_which_of_several_methods_it_measures(tiny_dir, tmp_path, capsys):
    engine = engine_for()
    try:
        args = bench_args(tiny_dir, engine.url, tmp_path)
        args[args.index("--methods") + 1] = "gemfilter-span,gemfilter"
        assert bench_report.main(args) == 0
    finally:
        engine.close()
    assert (
        "measures full against one prompt method, the last of --methods: gemfilter (not gemfilter-span)"
        in capsys.readouterr().err
    )


@pytest.mark.parametrize("fault", ANSWER_FAULTS)
def test_niah_engine_fault_is_one_error_line_and_the_cell_is_retried(tiny_dir, tmp_path, capsys, fault):
    hay = write_haystack(tmp_path / "hay")
    args = [
        "--model",
        str(tiny_dir),
        "--methods",
        "full,gemfilter",
        "--lengths",
        "260",
        "--depths",
        "0,100",
        "--topk",
        "40",
        "--layer",
        "2",
        "--max-new-tokens",
        "3",
        "--haystack-dir",
        str(hay),
        "--out",
        str(tmp_path / "out"),
        "--no-progress",
    ]
    engine = engine_for(fault, after=1)
    try:
        assert niah_main(args + ["--engine", engine.url]) == 2
        err = capsys.readouterr().err
        assert len([line for line in err.splitlines() if line.startswith("error:")]) == 1 and "Traceback" not in err
        assert "error: the engine" in err
        stored = [r for p in (tmp_path / "out").glob("results*.jsonl") for r in read_jsonl(p)]
        assert len(stored) == 1  # the healthy first answer; the faulty one is no row
        engine.fault = None
        assert niah_main(args + ["--engine", engine.url]) == 0
    finally:
        engine.close()
    assert len(read_jsonl(tmp_path / "out" / "results.jsonl")) == 4


@pytest.mark.parametrize("fault", ["empty", "no-choices", "cut-body"])
@pytest.mark.parametrize("runner", ["ruler", "longbench"])
def test_ruler_and_longbench_engine_faults_are_an_error_and_no_row(tiny_model_dir, tmp_path, runner, fault):
    from longbench_fixtures import write_words
    from test_ruler_runner import TASKS, write_samples

    import gemfilter
    from eval.longbench.runner import RunConfig as LongBenchConfig
    from eval.longbench.runner import run as run_longbench
    from eval.ruler.runner import RunConfig as RulerConfig
    from eval.ruler.runner import run as run_ruler
    from gemfilter.methods.spec import expand_budgets
    from gemfilter.toolkit.serving.upstream import UpstreamError

    model, tok = gemfilter.load_model(str(tiny_model_dir))
    engine = FaultyEngine(fault, after=1, tokens=tok(PROBE)["input_ids"])
    out = tmp_path / "out"
    try:
        with pytest.raises(UpstreamError, match="the engine") as err:  # an OSError: one 'error:' line in the CLIs
            if runner == "ruler":
                config = RulerConfig(
                    model=str(tiny_model_dir),
                    methods=expand_budgets(("full",), (8,)),
                    tasks=TASKS[:1],
                    lengths=(512,),
                    num_samples=2,
                    layer=2,
                    engine=engine.url,
                )
                run_ruler(config, write_samples(out), model_and_tokenizer=(model, tok), progress=False)
            else:
                config = LongBenchConfig(
                    model=str(tiny_model_dir),
                    methods=("full",),
                    tasks=("hotpotqa",),
                    limit=2,
                    max_length=400,
                    data_dir=str(write_words(tmp_path / "data")),
                    engine=engine.url,
                )
                run_longbench(config, out, model_and_tokenizer=(model, tok), progress=False)
    finally:
        engine.close()
    assert err.value.status == 502
    rows = [r for p in out.rglob("*.jsonl*") if "pred" in str(p) or runner == "longbench" for r in read_jsonl(p)]
    assert len([r for r in rows if "engine" in r]) == 1  # the healthy first answer only
