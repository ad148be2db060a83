"""On eval/: shared output folders lose no row, checks run before compute, reports tell the truth,
damaged files give clear errors. Tiny random Llama and word tokenizers only; two real processes for sharing."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from longbench_fixtures import write_words
from niah_fixtures import save_tiny_model, word_tokenizer, write_haystack
from tiny_models import BUILDERS

from eval.longbench.cli import main as lb_main
from eval.niah.cli import main as niah_main
from eval.niah.runner import RunConfig, run

ROOT = Path(__file__).resolve().parents[1]
NIAH_ROW = dict(
    method="full", depth=0, response="x", recall=0.0, rouge1=0.0, hit=0, kept=1, prompt_tokens=1, seconds=0.0
)

APPENDER = """
import sys, time
from pathlib import Path
out, kind, n = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
while not (out / "merger-ready").exists():
    time.sleep(0.01)
from eval.rundir import append_row
if kind == "niah":
    shard = out / "results.rank0.jsonl"
    rows = [dict(length=1000 + i, **{row}) for i in range(n)]
else:
    shard = out / "trec.jsonl.rank0"
    rows = [dict(_id=f"id{{i}}", pred="x", answers=["x"], length=1) for i in range(n)]
for row in rows:
    append_row(shard, row)
(out / "appender-done").touch()
""".format(row=NIAH_ROW)

MERGER = """
import sys
from pathlib import Path
out, kind = Path(sys.argv[1]), sys.argv[2]
if kind == "niah":
    from eval.niah.runner import merge
    go = lambda: merge(out)
else:
    from eval.longbench.runner import LongBench, RunConfig
    from eval.runner import Unit, merge
    go = lambda: merge(LongBench(RunConfig()), out, [Unit("trec.jsonl", None)])
(out / "merger-ready").touch()
while not (out / "appender-done").exists():
    go()
go()
"""


@pytest.mark.slow  # two runs in subprocesses (~7 s each)
@pytest.mark.parametrize("kind, merged", [("niah", "results.jsonl"), ("longbench", "trec.jsonl")])
def test_two_processes_sharing_one_out_lose_no_row(tmp_path, kind, merged):
    """One process appends rows through the runner's append_row while another merges over and over."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    n = 300
    merger = subprocess.Popen([sys.executable, "-c", MERGER, str(tmp_path), kind], env=env, stderr=subprocess.PIPE)
    appender = subprocess.Popen(
        [sys.executable, "-c", APPENDER, str(tmp_path), kind, str(n)], env=env, stderr=subprocess.PIPE
    )
    assert appender.wait(timeout=60) == 0, appender.stderr.read().decode()
    assert merger.wait(timeout=60) == 0, merger.stderr.read().decode()
    lines = (tmp_path / merged).read_text().splitlines()
    leftover = [x for p in tmp_path.glob("*rank*") for x in p.read_text().splitlines()]
    assert len(lines) + len(leftover) == n  # every row is in the merged file (the last merge took them all)
    assert len(lines) == n and not leftover


@pytest.fixture(scope="module")
def tiny():
    return BUILDERS["llama"](), word_tokenizer()


@pytest.fixture
def config(tmp_path):
    return RunConfig(
        model="tiny",
        methods=("full",),
        lengths=(240,),
        depths=(0, 100),
        topk=40,
        layer=2,
        max_new_tokens=2,
        haystack_dir=str(write_haystack(tmp_path / "hay")),
    )


def test_a_failed_first_niah_run_leaves_its_out_free(tiny, config, tmp_path):
    out = tmp_path / "out"
    bad_hay = RunConfig(**{**config.__dict__, "haystack_dir": str(tmp_path / "missing")})
    with pytest.raises(FileNotFoundError, match="haystack folder .*missing does not exist"):
        run(bad_hay, out, model_and_tokenizer=tiny, progress=False)
    bad_layer = RunConfig(**{**config.__dict__, "layer": 9})
    with pytest.raises(ValueError, match=r"--layer 9 is outside \[0, 4\)"):
        run(bad_layer, out, model_and_tokenizer=tiny, progress=False)
    assert not (out / "config.json").exists()
    assert len(run(config, out, model_and_tokenizer=tiny, progress=False)) == 2  # the corrected run is not refused


def test_a_failed_first_longbench_run_leaves_its_out_free(tiny_model_dir, tmp_path, capsys):
    data = write_words(tmp_path / "data", words=40)
    base = [
        "run",
        "--model",
        str(tiny_model_dir),
        "--tasks",
        "hotpotqa",
        "--limit",
        "1",
        "--methods",
        "full",
        "--max-length",
        "64",
        "--data-dir",
        str(data),
        "--out",
        str(tmp_path / "out"),
        "--no-progress",
    ]
    assert lb_main(base + ["--layer", "9"]) == 2
    assert "--layer 9 is outside [0, 4)" in capsys.readouterr().err
    assert lb_main(base + ["--layer", "2"]) == 0


def _no_model(*a, **k):
    raise AssertionError("the model was loaded before the options were checked")


@pytest.mark.parametrize(
    "argv, msg",
    [
        (["--layer", "4"], "--layer 4 is outside [0, 4)"),  # upper bound, from the config alone
        (["--lengths", "1k"], "--lengths: 1000 tokens exceed this model's context window of 512 tokens"),
        (["--lengths", "inf"], "--lengths: 'inf' is not a finite number"),
        (["--lengths", "1e9"], "more than any model's context window"),
        (["--lengths", "300.9"], "must be a positive whole number of tokens"),
    ],
)
def test_niah_checks_layer_and_lengths_before_the_model_loads(tmp_path, monkeypatch, capsys, argv, msg):
    model_dir = save_tiny_model(tmp_path / "model")
    monkeypatch.setattr("gemfilter.load_model", _no_model)
    out = tmp_path / "out"
    assert (
        niah_main(
            [
                "--model",
                str(model_dir),
                "--haystack-dir",
                str(write_haystack(tmp_path / "hay")),
                "--lengths",
                "240",
                "--depths",
                "0",
                "--out",
                str(out),
                "--no-progress",
                *argv,
            ]
        )
        == 2
    )
    assert msg in capsys.readouterr().err
    assert not (out / "config.json").exists()


def test_report_only_reports_the_stored_settings(tmp_path, capsys):
    model_dir = save_tiny_model(tmp_path / "model")
    out = tmp_path / "out"
    assert (
        niah_main(
            [
                "--model",
                str(model_dir),
                "--haystack-dir",
                str(write_haystack(tmp_path / "hay")),
                "--lengths",
                "240",
                "--depths",
                "0,100",
                "--methods",
                "full",
                "--topk",
                "40",
                "--layer",
                "2",
                "--max-new-tokens",
                "2",
                "--out",
                str(out),
                "--no-progress",
            ]
        )
        == 0
    )
    (out / "summary.md").unlink()
    assert niah_main(["--report-only", "--out", str(out)]) == 0  # the command line's defaults differ
    summary = (out / "summary.md").read_text()
    assert "topk 40, layer 2" in summary and "max_new_tokens 2" in summary
    assert "grid 1 lengths x 2 depths" in summary and "1024" not in summary


def test_null_or_incomplete_niah_rows_are_skipped_and_recomputed(tiny, config, tmp_path):
    out = tmp_path / "out"
    rows = run(config, out, model_and_tokenizer=tiny, progress=False)
    lines = [json.dumps(r) for r in rows]
    partial = {k: v for k, v in rows[1].items() if k != "recall"}
    (out / "results.jsonl").write_text("null\n" + lines[0] + "\n" + json.dumps(partial) + "\n[1, 2]\n")
    with pytest.warns(UserWarning, match=r"results.jsonl:3: skipping an incomplete row: the row lacks recall"):
        again = run(config, out, model_and_tokenizer=tiny, progress=False)
    assert [(r["depth"], "recall" in r) for r in again] == [(0, True), (100, True)]
    assert again[0] == rows[0]  # the good row was kept, not recomputed


def test_a_corrupt_niah_config_names_the_file_and_the_fix(tiny, config, tmp_path):
    out = tmp_path / "out"
    run(config, out, model_and_tokenizer=tiny, progress=False)
    (out / "config.json").write_text('{"model": "tiny", "topk"')
    with pytest.raises(ValueError, match=r"config.json: this run config is not valid JSON .*Delete .*config.json"):
        run(config, out, model_and_tokenizer=tiny, progress=False)


def test_non_utf8_haystack_data_and_results_files_are_named(tiny, config, tiny_model_dir, tmp_path, capsys):
    (Path(config.haystack_dir) / "c_latin1.txt").write_bytes("caf\xe9 .".encode("latin-1"))
    with pytest.raises(ValueError, match=r"c_latin1.txt: this haystack file is not UTF-8 text"):
        run(config, tmp_path / "out", model_and_tokenizer=tiny, progress=False)
    data = write_words(tmp_path / "data", words=40)
    (data / "hotpotqa.jsonl").write_bytes((data / "hotpotqa.jsonl").read_bytes() + b'{"input": "caf\xe9"}\n')
    assert (
        lb_main(
            [
                "run",
                "--model",
                str(tiny_model_dir),
                "--tasks",
                "hotpotqa",
                "--data-dir",
                str(data),
                "--layer",
                "2",
                "--out",
                str(tmp_path / "lb"),
                "--no-progress",
            ]
        )
        == 2
    )
    assert "hotpotqa.jsonl:4: not UTF-8 text" in capsys.readouterr().err
    folder = _preds(tmp_path / "pred" / "full", GOOD + "\n")
    (folder / "trec.jsonl").write_bytes(b'{"pred": "caf\xe9", "answers": ["x"]}\n')
    assert lb_main(["score", str(folder)]) == 2
    assert "trec.jsonl:1: the line is not UTF-8 text" in capsys.readouterr().err


def _preds(folder, rows_text):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "trec.jsonl").write_text(rows_text)
    return folder


GOOD = json.dumps({"pred": "Food", "answers": ["Food"], "all_classes": ["Food", "Other"], "length": 3})


@pytest.mark.parametrize(
    "bad, msg",
    [
        ('{"pred": "Food", "answers": ["Fo', "trec.jsonl:2: the line is not valid JSON"),
        ('{"pred": null, "answers": ["Food"]}', "trec.jsonl: row 2 cannot be scored: 'pred' is null, not a string"),
        ('["Food"]', "trec.jsonl:2: a row must be a JSON object, got list"),
        ("null", "trec.jsonl:2: a row must be a JSON object, got null"),
    ],
)
def test_longbench_score_refuses_an_unscorable_row(tmp_path, capsys, bad, msg):
    folder = _preds(tmp_path / "pred" / "full", GOOD + "\n" + bad + "\n")
    assert lb_main(["score", str(folder)]) == 2
    err = capsys.readouterr().err
    assert msg in err and "Fix or delete that line" in err and "will be rerun" not in err
    assert not (folder / "result.json").exists()  # no half-true score was written


@pytest.mark.parametrize(
    "value, msg",
    [
        ("1k", "--max-length: 1000 tokens exceed this model's context window of 512"),
        ("inf", "--max-length: 'inf' is not a finite number"),
        ("1e9", "more than any model's context window"),
    ],
)
def test_longbench_max_length_takes_the_same_forms_and_fits_the_window(
    tiny_model_dir, tmp_path, monkeypatch, capsys, value, msg
):
    monkeypatch.setattr("gemfilter.load_model", _no_model)
    data = write_words(tmp_path / "data", words=40)
    assert (
        lb_main(
            [
                "run",
                "--model",
                str(tiny_model_dir),
                "--tasks",
                "hotpotqa",
                "--data-dir",
                str(data),
                "--max-length",
                value,
                "--out",
                str(tmp_path / "out"),
                "--no-progress",
            ]
        )
        == 2
    )
    assert msg in capsys.readouterr().err
