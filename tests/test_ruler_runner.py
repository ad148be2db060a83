"""RULER runner, report and CLI on the tiny random Llama (``tiny_model_dir``) with prepared samples written here.

The tiny model's tokenizer knows only the words w4..w95, so the samples are word lists in RULER's row
layout (input, answer_prefix, outputs, ...) rather than generated prompts (tests/test_ruler_generators.py
covers those with the embedded tokenizer).
"""

import csv
import json
import random

import pytest

from eval.ruler.cli import main
from eval.ruler.prepare import data_file, write_rows
from eval.ruler.runner import RunConfig, run
from gemfilter.methods.spec import expand_budgets
from gemfilter.toolkit.io import read_jsonl

TASKS = ("niah_single_1", "vt", "fwe")
FAST = ["--topk", "8,16", "--layer", "2", "--threads", "1", "--no-progress", "--lengths", "512"]


def write_samples(out, n=3, words=60, length=512):  # the tiny model's whole window: RULER refuses lengths beyond it
    rnd = random.Random(0)
    for task in TASKS:
        rows = []
        for i in range(n):
            text = " ".join(f"w{rnd.randrange(4, 96)}" for _ in range(words))
            rows.append(
                {
                    "index": i,
                    "input": text,
                    "answer_prefix": " w9 w10",
                    "outputs": [f"w{4 + i}", "w5"],
                    "length": words + 2,
                    "length_w_model_temp": words + 2,
                }
            )
        write_rows(data_file(out, length, task), rows)
    return out


@pytest.fixture(scope="module")
def tiny(tiny_model_dir):
    import gemfilter

    return gemfilter.load_model(str(tiny_model_dir))


def config(tiny_model_dir, **over):
    base = dict(
        model=str(tiny_model_dir),
        methods=expand_budgets(("full", "gemfilter"), (8,)),
        tasks=TASKS,
        lengths=(512,),
        num_samples=2,
        layer=2,
    )
    return RunConfig(**{**base, **over})


def _official_score(rows):
    """string_match_all, written out here: strip, control chars -> newline, strip; share found; x100, 2 places."""
    import re

    total = 0.0
    for r in rows:
        pred = re.sub(r"[\x00-\x1f]", "\n", r["pred"].strip()).strip().lower()
        total += sum(o.lower() in pred for o in r["outputs"]) / len(r["outputs"])
    return round(total / len(rows) * 100, 2)


@pytest.mark.slow  # a run through the command (~12 s)
def test_cli_run_writes_rulers_layout_and_a_report(tiny, tiny_model_dir, tmp_path, capsys):
    out = write_samples(tmp_path / "out")
    rc = main(
        [
            "run",
            "--model",
            str(tiny_model_dir),
            "--tasks",
            ",".join(TASKS),
            "--num-samples",
            "2",
            "--methods",
            "full,gemfilter",
            "--out",
            str(out),
            *FAST,
        ]
    )
    assert rc == 0, capsys.readouterr().err
    printed = capsys.readouterr().out
    model, tok = tiny
    labels = ("full", "gemfilter_k8", "gemfilter_k16")
    for label in labels:
        for task in TASKS:
            rows = read_jsonl(out / "512" / "pred" / label / f"{task}.jsonl")
            samples = read_jsonl(data_file(out, 512, task))[:2]
            assert [r["index"] for r in rows] == [0, 1] and [r["outputs"] for r in rows] == [
                s["outputs"] for s in samples
            ]
            assert all(
                set(r)
                == {
                    "index",
                    "pred",
                    "outputs",
                    "length",
                    "others",
                    "truncation",
                    "_id",
                    "kept",
                    "prompt_tokens",
                    "layer",
                    "topk",
                    "answers_kept",
                    "seconds",
                    "attn",
                    "dtype",
                    "kv_rows",
                    "propagated",
                }
                for r in rows
            )
            assert {r["dtype"] for r in rows} == {"float32"}
            ttg = {"niah_single_1": 128, "vt": 30, "fwe": 50}[task]
            for r, s in zip(rows, samples):
                enc = tok(s["input"] + s["answer_prefix"], return_tensors="pt")
                assert (
                    r["prompt_tokens"] == enc["input_ids"].shape[1] == 62
                )  # 60 words + 2 (this tokenizer adds no BOS)
                if label == "full":  # independent: plain greedy generate on input + answer_prefix
                    gen = model.generate(**enc, max_new_tokens=ttg, do_sample=False)
                    assert r["pred"] == tok.decode(gen[0, enc["input_ids"].shape[1] :], skip_special_tokens=True)
                    assert r["kept"] == 62 and r["layer"] is None and r["topk"] is None and r["answers_kept"] is None
                else:
                    k = int(label.split("_k")[1])
                    assert r["kept"] == k == r["topk"] and r["layer"] == 2
                    # independent: the kept tokens (selection indices) decoded, searched for each expected output
                    import gemfilter

                    sel = gemfilter.select_tokens(model, enc["input_ids"], layer=2, topk=k)
                    kept_text = tok.decode(enc["input_ids"][0, sel.indices[0].sort().values]).lower()
                    assert r["answers_kept"] == sum(o in kept_text for o in s["outputs"]) / len(s["outputs"])
    with open(out / "report.csv") as f:
        table = list(csv.DictReader(f))
    assert [(r["length"], r["method"]) for r in table] == [("512", label) for label in labels]  # full, k8, k16
    for r in table:
        for task in TASKS:
            assert float(r[task]) == _official_score(read_jsonl(out / "512" / "pred" / r["method"] / f"{task}.jsonl"))
        assert r["avg_offline"] == "" and r["avg_all"] == ""  # 3 of 11 tasks: no suite average
    assert (out / "report.png").stat().st_size > 0
    md = (out / "report.md").read_text()
    assert "| **Length** | **Method** | **S1** | **VT** | **FWE** | **Avg (11 offline)** | **Avg (13)** |" in md
    assert md in printed
    # `score` on RULER's own layout: one method folder of <task>.jsonl files
    single = out / "512" / "pred" / "full"
    assert main(["score", str(single)]) == 0
    assert "| ? | full |" in (single / "report.md").read_text()


@pytest.mark.slow  # a run, then its resume (~9 s)
def test_resume_computes_only_missing_samples_and_repairs_a_cut_line(tiny, tiny_model_dir, tmp_path, capsys):
    first = write_samples(tmp_path / "first")
    full = run(config(tiny_model_dir), first, model_and_tokenizer=tiny, progress=False)
    assert sorted(full) == sorted((512, label, t) for label in ("full", "gemfilter_k8") for t in TASKS)

    again = write_samples(tmp_path / "again")
    run(config(tiny_model_dir, num_samples=1), again, model_and_tokenizer=tiny, progress=False)
    folder = again / "512" / "pred" / "full"
    kept = read_jsonl(folder / "vt.jsonl")
    kept[0]["pred"] = "KEPT"  # a finished row is never recomputed, so this marker must survive
    (folder / "vt.jsonl").write_text(json.dumps(kept[0]) + "\n")
    (folder / "vt.jsonl.rank0").write_text('{"pred": "cut sho')  # a row cut short by a kill
    with pytest.warns(UserWarning, match="incomplete row"):
        rows = run(config(tiny_model_dir), again, model_and_tokenizer=tiny, progress=True)
    assert "6 already done, 6 to compute over 1 process(es)" in capsys.readouterr().out
    assert rows[512, "full", "vt"][0]["pred"] == "KEPT"
    strip = lambda rs: [{k: v for k, v in r.items() if k != "seconds"} for r in rs]  # noqa: E731
    assert strip(rows[512, "full", "vt"][1:]) == strip(full[512, "full", "vt"][1:])
    assert strip(rows[512, "gemfilter_k8", "fwe"]) == strip(full[512, "gemfilter_k8", "fwe"])
    assert not list(again.rglob("*.rank*"))  # shards merged and removed

    with pytest.raises(ValueError, match=r"holds results of another setup \(layer: 2 there, 1 now\)"):
        run(config(tiny_model_dir, layer=1), again, model_and_tokenizer=tiny, progress=False)


def test_a_cut_off_run_has_given_every_method_the_same_samples(tiny, tiny_model_dir, tmp_path, monkeypatch):
    """Sample-major order: 5 of 12 predictions done means sample 0 only, never sample 1 of one method."""
    import eval.ruler.runner as runner

    out = write_samples(tmp_path / "out")
    real, calls = runner.predict, []

    def predict_then_stop(*a, **kw):
        if len(calls) == 5:
            raise KeyboardInterrupt  # the user's Ctrl-C after five predictions
        calls.append(1)
        return real(*a, **kw)

    monkeypatch.setattr(runner, "predict", predict_then_stop)
    with pytest.raises(KeyboardInterrupt):
        run(config(tiny_model_dir), out, model_and_tokenizer=tiny, progress=False)
    rows = [
        (p.parent.name, p.name.split(".")[0], r["index"])
        for p in (out / "512" / "pred").rglob("*.rank0")
        for r in read_jsonl(p)
    ]
    assert len(rows) == 5 and {i for _, _, i in rows} == {0}
    assert len({(label, task) for label, task, _ in rows}) == 5


@pytest.mark.slow  # two runs through the command (~12 s)
def test_a_smaller_run_reports_only_its_first_samples(tiny, tiny_model_dir, tmp_path, capsys):
    """After a 3-sample run, a 1-sample run's table (and `score --num-samples 1`) covers sample 0 only."""
    out = write_samples(tmp_path / "out")
    run(
        config(tiny_model_dir, num_samples=3, methods=expand_budgets(("full", "gemfilter"), (8, 16))),
        out,
        model_and_tokenizer=tiny,
        progress=False,
    )
    args = [
        "--model",
        str(tiny_model_dir),
        "--tasks",
        ",".join(TASKS),
        "--methods",
        "full,gemfilter",
        "--out",
        str(out),
    ]
    assert main(["run", "--num-samples", "1", *args, *FAST]) == 0
    capsys.readouterr()
    assert main(["score", str(out), "--num-samples", "1"]) == 0  # the same table from `score`
    for rc_out in (capsys.readouterr().out, (out / "report.md").read_text()):
        assert "Samples per task: 1." in rc_out
    with open(out / "report.csv") as f:
        for r in csv.DictReader(f):
            for task in TASKS:
                rows = read_jsonl(out / "512" / "pred" / r["method"] / f"{task}.jsonl")
                assert len(rows) == 3 and float(r[task]) == _official_score([x for x in rows if x["index"] == 0])
    # Samples are chosen by index, not by line: the same table from a file whose rows are reversed
    path = out / "512" / "pred" / "full" / "vt.jsonl"
    lines = path.read_text().splitlines(keepends=True)
    path.write_text("".join(reversed(lines)))
    before = (out / "report.csv").read_text()
    assert main(["score", str(out), "--num-samples", "1"]) == 0 and (out / "report.csv").read_text() == before
    with pytest.warns(UserWarning) as warned:
        main(["score", str(out), "--num-samples", "4"])
    assert len(warned) == 9 and all("3 of the first 4 samples are there" in str(w.message) for w in warned)
    capsys.readouterr()
    assert main(["score", str(out)]) == 0 and "Samples per task: 3." in (out / "report.md").read_text()
    assert main(["score", str(out), "--num-samples", "0"]) == 2
    assert "--num-samples must be >= 1" in capsys.readouterr().err


@pytest.mark.slow  # runs at two lengths (~11 s)
def test_a_run_at_another_length_reports_the_earlier_lengths_rows_in_full(tiny, tiny_model_dir, tmp_path):
    """A 1-sample run at 256 in a folder with a 3-sample run at 512: its report has 512 at 3 samples."""
    out = write_samples(write_samples(tmp_path / "out"), length=256, words=30)
    run(config(tiny_model_dir, num_samples=3), out, model_and_tokenizer=tiny, progress=False)
    args = [
        "--model",
        str(tiny_model_dir),
        "--tasks",
        ",".join(TASKS),
        "--methods",
        "full,gemfilter",
        "--out",
        str(out),
    ]
    assert main(["run", "--num-samples", "1", *args, *FAST[:-1], "256"]) == 0
    with open(out / "report.csv") as f:
        rows = {(r["length"], r["method"]): r for r in csv.DictReader(f)}
    assert set(rows) == {(L, m) for L in ("256", "512") for m in ("full", "gemfilter_k8", "gemfilter_k16")} - {
        ("512", "gemfilter_k16")
    }  # the 3-sample run had k=8 only
    for (L, method), r in rows.items():
        for task in TASKS:
            kept = read_jsonl(out / L / "pred" / method / f"{task}.jsonl")
            assert len(kept) == (1 if L == "256" else 3) and float(r[task]) == _official_score(kept)
    assert "Samples per task: 1, 3." in (out / "report.md").read_text()


def test_processes_share_every_method_evenly():
    """2 processes, 2 methods: each process gets half of every method's predictions, not all of one."""
    from collections import Counter

    from eval.ruler.runner import plan, share

    cfg = RunConfig(methods=expand_budgets(("full", "gemfilter"), (8,)), tasks=TASKS, lengths=(512,), num_samples=4)
    samples = {(512, t): [{"index": i} for i in range(4)] for t in TASKS}
    done = {(512, s.label, t): {} for s in cfg.methods for t in TASKS}
    todo = plan(cfg, samples, done)
    parts = [share(cfg, todo, p, 2) for p in range(2)]
    assert sorted(map(id, parts[0] + parts[1])) == sorted(map(id, todo))  # a partition of the work
    for part in parts:
        assert Counter((s.label, t) for _, s, t, _ in part) == Counter(
            {(s.label, t): 2 for s in cfg.methods for t in TASKS}
        )


def test_ratio_budget_and_bad_input(tiny, tiny_model_dir, tmp_path, capsys):
    out = write_samples(tmp_path / "out")
    specs = expand_budgets(("full", "snapkv"), ratio=0.75)
    assert [s.label for s in specs] == ["full", "snapkv_r0.75"]
    rows = run(
        config(tiny_model_dir, methods=(expand_budgets(("h2o",), ratio=0.75)[0],), tasks=("vt",), num_samples=1),
        out,
        model_and_tokenizer=tiny,
        progress=False,
    )
    assert [(r["topk"], r["kept"]) for r in rows[512, "h2o_r0.75", "vt"]] == [(46, 46)]  # round(0.75 * 62)
    base = ["run", "--model", str(tiny_model_dir), "--out", str(out), "--tasks", "vt", "--lengths", "512"]
    for extra, msg in [
        (["--methods", "full,nope"], "unknown method 'nope'; allowed:"),
        (["--topk", "8,x"], "--topk: 'x' is not a whole number; give budgets like 256,512"),
        (["--topk", "0"], "gemfilter: topk=0 must be >= 1"),
        (["--ratio", "1.5"], "--ratio must be a fraction in (0, 1]"),
        (["--num-samples", "0"], "--num-samples must be an int >= 1"),
        (["--lengths", "4x"], "--lengths: '4x' is not a whole number"),
        (["--tasks", "qa_3"], "unknown RULER task 'qa_3'"),
    ]:
        assert main([*base, *extra]) == 2
        assert msg in capsys.readouterr().err, extra
    with pytest.raises(ValueError, match="no predictions under"):
        from eval.ruler.report import write_report

        write_report(tmp_path / "out" / "512" / "data")


def test_options_are_checked_against_the_model_before_anything_is_written(tiny_model_dir, tmp_path, capsys):
    out = write_samples(tmp_path / "out")
    base = ["run", "--model", str(tiny_model_dir), "--out", str(out), "--tasks", "vt", "--no-progress"]
    for extra, msg in [
        (["--lengths", "1k"], "1024 tokens exceed this model's context window of 512"),
        (["--lengths", "512", "--layer", "4"], "--layer 4 is outside [0, 4)"),
        (["--lengths", "20000k"], "more than any model's context window"),
    ]:
        assert main([*base, *extra]) == 2
        assert msg in capsys.readouterr().err, extra
    assert not (out / "config.json").exists()  # the corrected command may still use this folder
    assert not (out / "512" / "pred").exists()


def test_a_damaged_prediction_row_stops_scoring_and_is_named(tiny, tiny_model_dir, tmp_path, capsys):
    out = write_samples(tmp_path / "out")
    run(config(tiny_model_dir, tasks=("vt",)), out, model_and_tokenizer=tiny, progress=False)
    path = out / "512" / "pred" / "full" / "vt.jsonl"
    lines = path.read_text().splitlines()
    path.write_text(lines[0] + "\n" + lines[1][:20] + "\n")  # the second row cut short
    assert main(["score", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"{path}:2" in err and "not valid JSON" in err
    path.write_text(lines[0] + "\n" + json.dumps({"pred": 3, "outputs": ["w5"], "_id": "1"}) + "\n")
    assert main(["score", str(out)]) == 2
    assert "pred must be a string" in capsys.readouterr().err


def test_fastkv_and_orig_pos_run_through_the_registry(tiny, tiny_model_dir, tmp_path):
    """The new methods need no runner code; labels and budgets come from the registry."""
    out = write_samples(tmp_path / "out", n=1)
    rows = run(
        config(
            tiny_model_dir,
            methods=expand_budgets(("fastkv", "gemfilter-orig-pos"), (16,)),
            tasks=("vt",),
            num_samples=1,
        ),
        out,
        model_and_tokenizer=tiny,
        progress=False,
    )
    assert sorted(label for _, label, _ in rows) == ["fastkv_k16", "gemfilter-orig-pos_k16"]
    assert all(r["kept"] == 16 for found in rows.values() for r in found)
