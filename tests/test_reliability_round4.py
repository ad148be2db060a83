"""Reliability round four: what a review found with bad input, interruption and concurrency, one test per item.

Each test's core is the review's reproduction; each failed on the code before its fix."""

import json

import pytest

from gemfilter.lab.bench import report as bench_report

pytestmark = pytest.mark.usefixtures("quiet")


def _never(*a, **k):
    raise AssertionError("a measurement ran before the options were checked")


@pytest.mark.parametrize("timeout", ["0", "nan", "inf", "-3"])
@pytest.mark.parametrize("route", [[], ["--turns", "2"]])
def test_bench_engine_refuses_a_timeout_that_is_no_time(tiny_model_dir, tmp_path, monkeypatch, timeout, route):
    """bench --engine (with and without --turns) took --timeout 0 and nan, then reported "engine unreachable:
    Operation now in progress" / "Invalid value NaN"."""
    monkeypatch.setattr("gemfilter.lab.bench.core.run_worker", _never)
    argv = [
        "--model",
        str(tiny_model_dir),
        "--engine",
        "http://127.0.0.1:9/v1",
        "--methods",
        "full,gemfilter",
        "--timeout",
        timeout,
        "--out",
        str(tmp_path / "out"),
        *route,
    ]
    with pytest.raises(SystemExit, match="--timeout must be > 0 seconds, finite and at most 86400"):
        bench_report.main(argv)


GOOD_TURN = {"turn_idx": 0, "prediction": "7", "ground_truth": "7", "score": 1.0, "ttft_s": 0.1}


@pytest.mark.parametrize(
    "line, problem",
    [
        (b"[1, 2]", "a row must be a JSON object, got list"),
        (
            json.dumps({"_id": "0", "turns": [{k: v for k, v in GOOD_TURN.items() if k != "prediction"}]}).encode(),
            "turns\\[0\\] lacks prediction",
        ),
        (json.dumps({"_id": "0", "turns": []}).encode(), "'turns' must be a non-empty list of turns"),
        (
            json.dumps({"_id": "0", "turns": [{**GOOD_TURN, "ttft_s": None}]}).encode(),
            "turns\\[0\\].ttft_s must be a number of seconds >= 0, got None",
        ),
        (b'{"_id": "0", "turns": [', "the line is not valid JSON"),
        (b'{"_id": "\xff"}', "the line is not UTF-8 text"),
    ],
)
def test_scbench_report_names_the_file_and_line_of_a_row_it_cannot_score(tmp_path, capsys, line, problem):
    """gemfilter-scbench report tracebacked on a row that is a list, a turn without prediction, empty turns or a
    null ttft_s; a non-JSON or non-UTF-8 line gave an error that named no file or line (item 9)."""
    from eval.scbench.cli import main

    folder = tmp_path / "run" / "multi-turn" / "4096" / "full"
    folder.mkdir(parents=True)
    good = json.dumps({"_id": "1", "turns": [GOOD_TURN]}).encode()
    (folder / "scbench_kv.jsonl").write_bytes(good + b"\n" + line + b"\n")
    assert main(["report", str(tmp_path / "run"), "--no-plot"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: ")
    assert "scbench_kv.jsonl:2: " in err
    import re

    assert re.search(problem, err), err


def test_the_cut_chunk_error_says_what_was_cut():
    """The proxy's cut-chunk error said "0 bytes, None more expected" (item 9)."""
    from engine_faults import FaultyEngine

    from gemfilter.toolkit.serving.upstream import Upstream, UpstreamError

    engine = FaultyEngine("cut-chunk")
    try:
        with pytest.raises(UpstreamError) as err:
            list(
                Upstream(engine.url, timeout=5).stream("/completions", {"prompt": [5], "max_tokens": 4, "stream": True})
            )
    finally:
        engine.close()
    message = str(err.value)
    assert "None" not in message and "cut its answer short: the connection closed" in message
    assert "into a chunk of its stream" in message


def test_a_write_that_fails_names_its_file(tmp_path, monkeypatch):
    """A full disk said "[Errno 27] File too large" without the file (item 9)."""
    import errno
    import os

    from gemfilter.toolkit.io import append_jsonl, write_json_atomic

    def full(fd):
        raise OSError(errno.EFBIG, os.strerror(errno.EFBIG))

    monkeypatch.setattr(os, "fsync", full)
    for write, name in (
        (lambda p: append_jsonl(p, {"a": 1}), "rows.jsonl"),
        (lambda p: write_json_atomic(p, {"a": 1}), "config.json"),
    ):
        with pytest.raises(OSError) as err:
            write(tmp_path / name)
        assert err.value.errno == errno.EFBIG
        assert str(err.value) == f"[Errno 27] could not write {tmp_path / name}: File too large"


@pytest.mark.parametrize("name", ["/nope/model", "./nope", "../nope", "~/nope-model", "a/b/c"])
def test_a_missing_local_model_path_is_named_as_one(name):
    """A missing local --model path said "Repo id must be in the form ..." (item 9)."""
    from gemfilter.models import load_config, model_path

    with pytest.raises(FileNotFoundError, match=f"no model folder at {name} "):
        model_path(name)
    with pytest.raises(OSError, match="no model folder at"):
        load_config(name)
    assert model_path("google/gemma-3-270m") == "google/gemma-3-270m"  # a hub id is left to the hub


def test_the_scbench_cli_names_a_missing_model_folder(tmp_path, capsys):
    from eval.scbench.cli import main

    assert main(["run", "--model", "./no-such-model", "--methods", "full", "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "no model folder at ./no-such-model" in err and "Repo id" not in err


def test_one_model_by_a_relative_and_an_absolute_path_is_one_setup(tiny_model_dir, tmp_path, monkeypatch):
    """The same model by a relative and an absolute path was refused as "another setup" (item 9)."""
    from eval.rundir import check_config, same_model
    from eval.scbench.runner import RunConfig

    out = tmp_path / "out"
    out.mkdir()
    check_config(out, RunConfig(model=str(tiny_model_dir)), write=True, model_config=None)
    monkeypatch.chdir(tiny_model_dir.parent)
    relative = RunConfig(model=f"./{tiny_model_dir.name}")
    check_config(out, relative, write=False, model_config=None)  # resumes: no "another setup"
    assert same_model(str(tiny_model_dir), f"./{tiny_model_dir.name}")
    assert not same_model(str(tiny_model_dir), str(tmp_path))
    with pytest.raises(ValueError, match="another setup"):
        check_config(out, RunConfig(model=str(tmp_path)), write=False, model_config=None)


@pytest.mark.slow
def test_lm_eval_names_a_missing_pretrained_folder(capsys):
    """gemfilter-lm-eval run --model_args pretrained=/nope ended in an OSError traceback (item 9)."""
    from eval.harness.cli import main

    code = main(["run", "--model", "gemfilter", "--model_args", "pretrained=/nope", "--tasks", "lambada_openai"])
    err = capsys.readouterr().err
    assert code == 2 and "error: " in err and "/nope" in err and "Traceback" not in err


@pytest.mark.parametrize("spec, n", [("fastkv:k=20,tsp_len=24,layer=2", 48), ("fastkv:k=20,tsp_len=64,layer=2", 48)])
def test_a_cache_method_reports_the_rows_its_cache_holds(spec, n):
    """fastkv on a model whose every layer slides (window 16 <= topk + 1) ran as full, correctly, but reported
    kept = topk where each layer holds window - 1 rows (the Methods item); with TSP firing and without."""
    import torch
    from tiny_models import BUILDERS

    import gemfilter
    from gemfilter.methods import parse_spec

    model = BUILDERS["mistral-sliding"]()
    ids = torch.randint(3, 96, (1, n), generator=torch.Generator().manual_seed(7))
    out = gemfilter.generate(model, ids, method=parse_spec(spec).method(n), max_new_tokens=3)
    assert set(out.budget.kv_rows) == {15}
    assert out.kept == [15]
