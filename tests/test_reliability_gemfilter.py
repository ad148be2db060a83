"""On gemfilter/: misuse is refused, options are checked before any model load or measurement,
bench reports true numbers and resumes, JSON results are written atomically. Tiny models, no real weights."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from tiny_models import BUILDERS

import gemfilter
from gemfilter import GemFilter, apply
from gemfilter.lab.bench import report as bench_report
from gemfilter.lab.cli import main as gf_main

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def llama():
    return BUILDERS["llama"]()


# ---------------------------------------------------------------- API misuse


def test_nested_apply_is_refused_not_silently_wrong(llama):
    ids = torch.randint(4, 90, (1, 40), generator=torch.Generator().manual_seed(0))
    with apply(llama, GemFilter(layer=2, topk=8)):
        with pytest.raises(
            RuntimeError, match=r"already inside `with apply\(model, \.\.\.\)`; nesting is not supported"
        ):
            gemfilter.generate(llama, ids, layer=2, topk=20, max_new_tokens=2)
        with pytest.raises(RuntimeError, match="nesting is not supported"):
            with apply(llama, gemfilter.get_method("snapkv", topk=16)):
                pass
    out = gemfilter.generate(llama, ids, layer=2, topk=20, max_new_tokens=2)  # after the block: fine again
    assert out.kept == [20] and len(out.selection.indices[0]) == 20


def test_apply_refuses_a_name_a_bare_module_and_an_encoder(llama):
    with pytest.raises(TypeError, match=r"got 'gemfilter'; build one by name with gemfilter.get_method"):
        with apply(llama, "gemfilter"):
            pass
    with pytest.raises(TypeError, match="Linear has no .config"):
        with apply(torch.nn.Linear(2, 2), GemFilter(layer=1, topk=2)):
            pass
    from transformers import BertConfig, BertModel

    bert = BertModel(
        BertConfig(vocab_size=96, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=32)
    ).eval()
    ids = torch.randint(4, 90, (1, 20))
    for call in (
        lambda: gemfilter.select_tokens(bert, ids, layer=1, topk=5),
        lambda: gemfilter.generate(bert, ids, layer=1, topk=5, max_new_tokens=2),
    ):
        with pytest.raises(TypeError, match="BertModel is not a causal decoder"):
            call()


# ---------------------------------------------------------------- checks before the model loads


class Loaded(Exception):
    """Raised by the patched loader: reaching it means every option check passed."""


@pytest.fixture
def no_model(monkeypatch):
    def refuse(*a, **k):
        raise Loaded

    monkeypatch.setattr("gemfilter.load_model", refuse)
    monkeypatch.setattr("gemfilter.models.load_model", refuse)


@pytest.mark.parametrize(
    "argv, msg",
    [
        (["--threads", "-2"], "--threads must be a whole number >= 0, got -2"),
        (["--topk", "0"], "gemfilter: topk=0 must be >= 1"),  # the method checks its own budget
        (["--layer", "4"], "--layer 4 is outside [0, 4)"),
        (["--method", "gemfilter:layer=4"], "gemfilter:layer=4: layer=4 is outside [0, 4)"),
    ],
)
def test_generate_checks_options_before_loading(tiny_model_dir, tmp_path, capsys, no_model, argv, msg):
    prompt = tmp_path / "p.txt"
    prompt.write_text("w4 w5 w6")
    assert gf_main(["generate", "--model", str(tiny_model_dir), "--prompt-file", str(prompt), *argv]) == 2
    assert msg in capsys.readouterr().err


def test_generate_names_a_prompt_file_that_is_not_utf8(tiny_model_dir, tmp_path, capsys, no_model):
    prompt = tmp_path / "p.txt"
    prompt.write_bytes("w4 caf\xe9".encode("latin-1"))
    assert gf_main(["generate", "--model", str(tiny_model_dir), "--prompt-file", str(prompt)]) == 2
    assert "p.txt: this prompt file is not UTF-8 text" in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv, msg",
    [
        (["inspect", "--topk", "0"], "--topk must be a whole number >= 1"),
        (["inspect", "--length", "inf"], "--length: 'inf' is not a finite number"),
        (["inspect", "--length", "1k"], "--length: 1000 tokens exceed this model's context window of 512"),
        (["inspect", "--print-selection", "4"], "--print-selection 4 is outside [0, 4)"),
        (["calibrate", "--threshold", "1.5"], "--threshold 1.5 is outside (0, 1]"),
        (["calibrate", "--topk-grid", "256,0"], "--topk-grid: '0' must be a whole number >= 1"),
        (["calibrate", "--depths", "10,120"], "--depths: '120' is outside [0, 100]"),
        (["calibrate", "--lengths", "300.9"], "--lengths: '300.9' must be a positive whole number of tokens"),
        (["calibrate", "--lengths", "1e9"], "more than any model's context window"),
    ],
)
def test_inspect_and_calibrate_check_options_before_loading(tiny_model_dir, tmp_path, capsys, no_model, argv, msg):
    extra = ["--out", str(tmp_path / "out")] if argv[0] == "inspect" else ["--dry-run"]
    assert (
        gf_main(
            [
                argv[0],
                "--model",
                str(tiny_model_dir),
                "--length" if argv[0] == "inspect" else "--lengths",
                "300",
                *extra,
                *argv[1:],
            ]
        )
        == 2
    )
    assert msg in capsys.readouterr().err


@pytest.mark.parametrize("argv", [["inspect", "--length", "0.3k"], ["calibrate", "--lengths", "0.3k,400", "--dry-run"]])
def test_every_length_option_takes_the_same_forms(tiny_model_dir, tmp_path, no_model, argv):
    with pytest.raises(Loaded):  # '0.3k' passed every check: the model load is next
        gf_main([*argv, "--model", str(tiny_model_dir)] + (["--out", str(tmp_path)] if argv[0] == "inspect" else []))


def test_a_corrupt_calibration_file_names_the_file_and_the_fix(llama, tmp_path, monkeypatch):
    from gemfilter.layers import calibration_path, model_key

    monkeypatch.setenv("GEMFILTER_CACHE", str(tmp_path))
    path = calibration_path(model_key(llama))
    path.parent.mkdir(parents=True)
    path.write_text('{"layer": 2, "topk"')
    with pytest.raises(ValueError, match=r"calibration file is not valid JSON .*Delete .* rerun 'gemfilter calibrate'"):
        gemfilter.default_layer(llama)


# ---------------------------------------------------------------- bench


def _bench_args(model_dir, out, *extra):
    return [
        "--model",
        str(model_dir),
        "--methods",
        "full",
        "--lengths",
        "300",
        "--gen-tokens",
        "2",
        "--topk",
        "16",
        "--out",
        str(out),
        *extra,
    ]


def _never(*a, **k):
    raise AssertionError("a measurement ran before the options were checked")


@pytest.mark.parametrize(
    "extra, msg",
    [
        (["--methods", "gemfilter", "--topk", "0"], "gemfilter: topk=0 must be >= 1"),
        (["--threads", "-1"], "--threads must be a whole number >= 0"),
        (["--lengths", "inf"], "--lengths: 'inf' is not a finite number"),
        (["--lengths", "300.9"], "--lengths: '300.9' must be a positive whole number"),
        (["--lengths", "1k"], "1000 tokens exceed this model's context window of 512"),
        (["--timeout", "0"], "--timeout must be > 0"),
    ],
)
def test_bench_checks_options_before_measuring(tiny_model_dir, tmp_path, monkeypatch, extra, msg):
    monkeypatch.setattr("gemfilter.lab.bench.core.run_worker", _never)
    with pytest.raises(SystemExit, match=msg.replace("(", r"\(").replace(")", r"\)")):
        bench_report.main(_bench_args(tiny_model_dir, tmp_path / "out", *extra))


def test_bench_checks_out_before_measuring(tiny_model_dir, tmp_path, monkeypatch):
    monkeypatch.setattr("gemfilter.lab.bench.core.run_worker", _never)
    (tmp_path / "file").write_text("x")
    with pytest.raises(SystemExit, match="is a file, not a folder"):
        bench_report.main(_bench_args(tiny_model_dir, tmp_path / "file"))
    (tmp_path / "out" / "bench.jsonl").mkdir(parents=True)  # today found only after the first cell
    with pytest.raises(SystemExit, match=r"bench.jsonl is a folder, but the command writes a file there"):
        bench_report.main(_bench_args(tiny_model_dir, tmp_path / "out"))


def _row(model_dir, prompt_s, repeat=0, method="full", length=300):
    return dict(
        method=method,
        length=length,
        repeat=repeat,
        n=length,
        kept=length,
        layer=None,
        m=4,
        prompt_s=prompt_s,
        gen_s=1.0,
        total_s=prompt_s + 1.0,
        prompt_peak_mib=10.0,
        gen_peak_mib=5.0,
        new_tokens=2,
        device="cpu",
        threads=0,
        model=str(model_dir),
        topk=16,
        gen_tokens=2,
        layer_arg=None,
        threads_arg=0,
        layers=None,
        dtype=None,
        device_arg=None,
        test_shrink=False,
        attn_arg=None,
    )


def test_bench_counts_a_duplicated_row_once(tiny_model_dir, tmp_path, monkeypatch):
    monkeypatch.setattr("gemfilter.lab.bench.core.run_worker", _never)
    out = tmp_path / "out"
    out.mkdir()
    other_setup = {**_row(tiny_model_dir, 5.0), "topk": 99}  # the same cell, measured with another --topk
    rows = [other_setup, _row(tiny_model_dir, 1.0), _row(tiny_model_dir, 9.0), _row(tiny_model_dir, 9.0)]
    (out / "bench.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert bench_report.main(_bench_args(tiny_model_dir, out)) == 0
    cell = json.loads((out / "bench.json").read_text())["cells"][0]
    assert cell["repeats"] == 1 and cell["prompt_s"] == 1.0  # not the median 9.0 of three copies
    assert "medians of 1 run(s)" in (out / "bench.md").read_text()


def test_bench_resumes_past_a_torn_last_line(tiny_model_dir, tmp_path, monkeypatch):
    out = tmp_path / "out"
    out.mkdir()
    good = json.dumps(_row(tiny_model_dir, 1.0, length=300))
    (out / "bench.jsonl").write_text(good + "\n" + good[:50])  # the kill came while writing the 400 row
    measured = []

    def fake_worker(spec, timeout=None):
        measured.append((spec["method_name"], spec["length"]))
        return {k: v for k, v in _row(tiny_model_dir, 2.0, length=spec["length"]).items() if k not in ("repeat",)}

    monkeypatch.setattr("gemfilter.lab.bench.core.run_worker", fake_worker)
    with pytest.warns(UserWarning, match=r"bench.jsonl:2: skipping an incomplete row"):
        assert bench_report.main(_bench_args(tiny_model_dir, out, "--lengths", "300,400")) == 0
    assert measured == [("full", 400)]
    assert len((out / "bench.jsonl").read_text().splitlines()) == 3  # good, torn (isolated), new


def test_bench_timeout_is_a_clear_message(tiny_model_dir, tmp_path):
    with pytest.raises(SystemExit, match=r"ran past --timeout 0.01 s and was stopped.*larger --timeout"):
        bench_report.main(_bench_args(tiny_model_dir, tmp_path / "out", "--timeout", "0.01"))


# ---------------------------------------------------------------- atomic writes


WRITERS = """
import json, resource, signal, sys
from pathlib import Path
import torch
root = Path(sys.argv[1])
sys.path.insert(0, sys.argv[2])
from eval.niah.runner import RunConfig
from eval.rundir import check_config
from eval.longbench.report import score_folder
from gemfilter.lab.inspection.calibrate import calibrate
from icl_probes.io import write_json
from niah_fixtures import word_tokenizer, write_haystack
from tiny_models import BUILDERS
model, tok, hay = BUILDERS["llama"](), word_tokenizer(), write_haystack(root / "hay")
preds = root / "pred" / "full"
preds.mkdir(parents=True)
(preds / "trec.jsonl").write_text(json.dumps({"pred": "Food", "answers": ["Food"], "all_classes": ["Food"]}) + "\\n")
(root / "probe.json").write_text("{}")  # the old, valid versions
(preds / "result.json").write_text("{}")
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (16, 16))  # a full disk: no file may grow past 16 bytes
big = {"x": "y" * 500}
jobs = {
    "niah config": lambda: check_config(root / "niah", RunConfig(model="tiny", extra=big), write=True,
                                          model_config=None),
    "calibration": lambda: calibrate(model, tok, lengths=(240,), depths=(50,), ks=(8,), haystack_dir=hay),
    "longbench result": lambda: score_folder(preds),
    "probe result": lambda: write_json(root / "probe.json", big),
}
for name, job in jobs.items():
    try:
        job()
        print(name, "wrote")
    except OSError as err:
        print(name, "failed:", err.strerror)
"""


@pytest.mark.slow  # commands in subprocesses (~9 s)
def test_json_results_survive_a_failed_write(tmp_path):
    """A write that fails half-way (here: a full disk) must leave the old file, or none, never half of one."""
    (tmp_path / "niah").mkdir()
    cache = tmp_path / "cache"
    env = dict(os.environ, PYTHONPATH=str(ROOT), GEMFILTER_CACHE=str(cache), OMP_NUM_THREADS="1")
    (cache / "calibration").mkdir(parents=True)
    (cache / "calibration" / "model.json").write_text("{}")
    proc = subprocess.run(
        [sys.executable, "-c", WRITERS, str(tmp_path), str(ROOT / "tests")],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.splitlines()
    assert len(lines) == 4 and all(" failed: " in ln and ln.endswith("File too large") for ln in lines), proc.stdout
    for path in (
        tmp_path / "niah" / "config.json",
        cache / "calibration" / "model.json",
        tmp_path / "pred" / "full" / "result.json",
        tmp_path / "probe.json",
    ):
        if path.exists():
            assert json.loads(path.read_text()) == {}, path  # the old file, intact
    assert not (tmp_path / "niah" / "config.json").exists()
    assert not [p for p in tmp_path.rglob("*.tmp")] and not [p for p in cache.rglob("*.tmp")]  # no temp left
