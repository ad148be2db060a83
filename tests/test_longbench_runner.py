"""LongBench runner, report and CLI on the tiny random Llama (``tiny_model_dir``) and hand-made prediction folders."""

import csv
import json

import pytest
from longbench_fixtures import TASKS, word_records, write_words

from eval.longbench import report
from eval.longbench.cli import main
from eval.longbench.runner import RunConfig, run
from eval.longbench.tasks import PAPER_TASKS
from gemfilter.toolkit.io import read_jsonl

FAST = ["--topk", "8", "--layer", "2", "--max-length", "64", "--threads", "1", "--no-progress"]


@pytest.fixture(scope="module")
def tiny(tiny_model_dir):
    import gemfilter

    return gemfilter.load_model(str(tiny_model_dir))


@pytest.fixture
def words(tmp_path):
    return write_words(tmp_path / "data", e=True, words=80)


def config(words, tiny_model_dir, **over):
    base = dict(
        model=str(tiny_model_dir),
        methods=("full", "gemfilter"),
        tasks=TASKS,
        limit=2,
        topk=8,
        layer=2,
        max_length=64,
        data_dir=str(words),
    )
    return RunConfig(**{**base, **over})


def test_cli_run_writes_the_official_layout_and_a_report(tiny_model_dir, words, tmp_path, capsys):
    out = tmp_path / "out"
    rc = main(
        [
            "run",
            "--model",
            str(tiny_model_dir),
            "--data-dir",
            str(words),
            "--tasks",
            ",".join(TASKS),
            "--limit",
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
    for method in ("full", "gemfilter"):
        for task in TASKS:
            rows = read_jsonl(out / "pred" / method / f"{task}.jsonl")
            expected = word_records(task, words=80)[:2]
            assert [r["_id"] for r in rows] == [r["_id"] for r in expected]  # dataset order, --limit 2
            assert [r["answers"] for r in rows] == [r["answers"] for r in expected]
            assert all(
                set(r)
                == {
                    "pred",
                    "answers",
                    "all_classes",
                    "length",
                    "_id",
                    "kept",
                    "prompt_tokens",
                    "layer",
                    "kv_rows",
                    "propagated",
                }
                for r in rows
            )
            # measured from the cache: every layer of the tiny Llama holds what its prefill ran (no sliding window)
            assert all(r["kv_rows"] == [r["propagated"]] * 4 and r["propagated"] == r["kept"] for r in rows)
            # Middle truncation: the prompt holds at most 64 tokens (fewer: template words are <unk>, skipped).
            assert all(0 < r["prompt_tokens"] <= 64 for r in rows)
            if task == "triviaqa":  # untruncated: 80 context + 4 input words (+ <unk>s) -> it was cut
                assert all(r["prompt_tokens"] < 84 for r in rows)
            if method == "gemfilter":
                assert all(r["kept"] == min(8, r["prompt_tokens"]) and r["layer"] == 2 for r in rows)
            else:
                assert all(r["kept"] == r["prompt_tokens"] and r["layer"] is None for r in rows)
        assert set(json.loads((out / "pred" / method / "result.json").read_text())) == set(TASKS)
    table = (out / "report.md").read_text()
    assert "| **Method** | **HotpotQA** | **TriviaQA** | **PRe** | **Average** |" in table
    assert "| Multi-Document QA | Few-shot Learning | Synthetic |" in table and table in printed
    with open(out / "report.csv") as f:
        rows = list(csv.DictReader(f))
    assert [r["method"] for r in rows] == ["full", "gemfilter"] and rows[0]["average"] == ""  # not all 14 tasks
    result = json.loads((out / "pred" / "gemfilter" / "result.json").read_text())
    assert [float(rows[1][t]) for t in TASKS] == [result[t] for t in TASKS]
    # `score` on the same folder reproduces the report and names the recorded settings.
    (out / "report.md").unlink()
    assert main(["score", str(out)]) == 0
    assert "Settings (config.json): model" in (out / "report.md").read_text()


def test_resume_computes_only_missing_samples_and_repairs_a_cut_line(tiny, tiny_model_dir, words, tmp_path):
    out = tmp_path / "out"
    full = run(config(words, tiny_model_dir), out, model_and_tokenizer=tiny, progress=False)
    assert sorted(full) == sorted((m, t) for m in ("full", "gemfilter") for t in TASKS)

    again = tmp_path / "again"
    run(config(words, tiny_model_dir, limit=1), again, model_and_tokenizer=tiny, progress=False)
    folder = again / "pred" / "full"
    first = read_jsonl(folder / "hotpotqa.jsonl")
    first[0]["pred"] = "KEPT"  # a finished row is never recomputed, so this marker must survive
    (folder / "hotpotqa.jsonl").write_text(json.dumps(first[0]) + "\n")
    (folder / "hotpotqa.jsonl.rank0").write_text('{"pred": "cut sho')  # a row cut short by a kill
    with pytest.warns(UserWarning, match="incomplete row"):
        rows = run(config(words, tiny_model_dir), again, model_and_tokenizer=tiny, progress=False)
    assert rows["full", "hotpotqa"][0]["pred"] == "KEPT"
    assert rows["full", "hotpotqa"][1] == full["full", "hotpotqa"][1]
    assert rows["gemfilter", "triviaqa"] == full["gemfilter", "triviaqa"]  # greedy: same rows as one run
    assert not list(again.rglob("*.rank*"))  # shards merged and removed

    with pytest.raises(ValueError, match=r"holds results of another setup \(topk: 8 there, 16 now\)"):
        run(config(words, tiny_model_dir, topk=16), again, model_and_tokenizer=tiny, progress=False)


def test_longbench_e_writes_pred_e_and_scores_per_length_bucket(tiny, tiny_model_dir, words, tmp_path):
    out = tmp_path / "out"
    rows = run(
        config(words, tiny_model_dir, e=True, limit=None, methods=("full",), tasks=("hotpotqa",)),
        out,
        model_and_tokenizer=tiny,
        progress=False,
    )
    assert [r["length"] for r in rows["full", "hotpotqa"]] == [1200, 5000, 9000]  # from hotpotqa_e.jsonl
    paths = report.write_report(out)
    assert [p.name for p in paths] == ["report_e.md", "report_e.csv"]
    assert set(json.loads((out / "pred_e" / "full" / "result.json").read_text())["hotpotqa"]) == {"0-4k", "4-8k", "8k+"}
    assert "| full | 8k+ |" in (out / "report_e.md").read_text()


def _write_preds(folder, rows_by_task):
    folder.mkdir(parents=True, exist_ok=True)
    for task, rows in rows_by_task.items():
        (folder / f"{task}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def _row(pred, answer, classes=None, length=100):
    return {"pred": pred, "answers": [answer], "all_classes": classes, "length": length}


def test_report_layout_and_average_of_the_14_paper_tasks(tmp_path):
    right = {
        "classification": ("Food", "Food", ["Animal", "Food"]),
        "count": ("3", "3", None),
        "retrieval": ("Paragraph 2", "Paragraph 2", None),
    }
    from eval.longbench.tasks import BY_NAME

    def perfect(task):
        pred, answer, classes = right.get(BY_NAME[task].metric, ("Paris here", "Paris here", None))
        return _row(pred, answer, classes)

    # m1: every paper task right (rouge of identical text is 2/(2+1e-8) -> 100.0) except narrativeqa,
    # which is wrong -> 0. Average = (13 * 100 + 0) / 14 = 92.857 -> 92.86.
    m1 = {t: [perfect(t)] for t in PAPER_TASKS}
    m1["narrativeqa"] = [_row("London", "Paris")]
    # m2: hotpotqa 1 right + 1 wrong -> 50.00; passage_count "3 3 4" vs 3 -> 2/3 -> 66.67; no average.
    m2 = {"hotpotqa": [_row("Paris", "Paris"), _row("Rome", "Paris")], "passage_count": [_row("3 3 4", "3")]}
    _write_preds(tmp_path / "pred" / "m1", m1)
    _write_preds(tmp_path / "pred" / "m2", m2)
    (tmp_path / "pred" / "m2" / "lsht.jsonl").write_text(json.dumps(_row("x", "y")) + "\n")
    with pytest.warns(UserWarning, match="lsht.jsonl: not an English LongBench v1 task"):
        assert main(["score", str(tmp_path / "pred")]) == 0
    md = (tmp_path / "pred" / "report.md").read_text().splitlines()
    assert md[2] == (
        "|  | Single-Document QA |  |  | Multi-Document QA |  |  | Summarization |  |  "
        "| Few-shot Learning |  |  | Synthetic |  |  |"
    )
    assert md[4] == (
        "| **Method** | **NrtvQA** | **Qasper** | **MF-en** | **HotpotQA** | **2WikiMQA** | **Musique** "
        "| **GovReport** | **QMSum** | **MultiNews** | **TREC** | **TriviaQA** | **SAMSum** | **PCount** "
        "| **PRe** | **Average** |"
    )
    assert md[5] == "| m1 | 0.00 |" + " 100.00 |" * 13 + " 92.86 |"
    assert md[6] == "| m2 | - | - | - | 50.00 | - | - | - | - | - | - | - | - | 66.67 | - | - |"
    with open(tmp_path / "pred" / "report.csv") as f:
        rows = list(csv.reader(f))
    assert rows[0] == ["method", *PAPER_TASKS, "average"]
    assert rows[2][:5] == ["m2", "", "", "", "50.00"] and rows[1][-1] == "92.86"


def test_score_accepts_one_method_folder_and_forces_e(tmp_path, capsys):
    folder = tmp_path / "mine"
    # passage_count, lengths 100 and 5000: "7" vs 7 -> 1 in 0-4k; "1 2" vs 7 -> 0 in 4-8k; 8k+ empty.
    _write_preds(folder, {"passage_count": [_row("7", "7"), _row("1 2", "7", length=5000)]})
    assert main(["score", str(folder), "--e"]) == 0
    assert "| mine | 0-4k | 100.00 |" in capsys.readouterr().out
    assert json.loads((folder / "result.json").read_text()) == {
        "passage_count": {"0-4k": 100.0, "4-8k": 0.0, "8k+": None}
    }
    assert main(["score", str(folder)]) == 0
    assert json.loads((folder / "result.json").read_text()) == {"passage_count": 50.0}  # (1 + 0) / 2


@pytest.mark.parametrize(
    "args, message",
    [
        (["run", "--methods", "full,magic"], "unknown method 'magic'; allowed: fastkv, full, gemfilter"),
        (["run", "--tasks", "hotpotqa,lsht"], "unknown LongBench task 'lsht'; allowed: narrativeqa"),
        (["run", "--e", "--tasks", "narrativeqa"], "--e: narrativeqa has no LongBench-E variant"),
        (["run", "--tasks", "hotpotqa", "--limit", "0"], "--limit must be an int >= 1"),
        (["run", "--tasks", "hotpotqa", "--max-length", "1"], "--max-length must be an int >= 2"),
        (["run", "--tasks", "hotpotqa", "--topk", "0"], "gemfilter: topk=0 must be >= 1"),
        (["run", "--tasks", "hotpotqa", "--threads", "-1"], "--threads must be >= 0"),
        (["score", "nowhere"], "nowhere is not a folder"),
    ],
)
def test_cli_errors_say_what_is_wrong(args, message, tmp_path, capsys):
    args = [a if a != "nowhere" else str(tmp_path / "nowhere") for a in args]
    if args[0] == "run":
        args += ["--out", str(tmp_path / "out"), "--data-dir", str(tmp_path / "none")]
    assert main(args) == 2
    assert message in capsys.readouterr().err


def test_cli_reports_a_missing_data_file_and_an_empty_prediction_folder(tiny_model_dir, words, tmp_path, capsys):
    (words / "triviaqa.jsonl").unlink()
    assert (
        main(
            [
                "run",
                "--model",
                str(tiny_model_dir),
                "--data-dir",
                str(words),
                "--tasks",
                "triviaqa",
                "--out",
                str(tmp_path / "out"),
                *FAST,
            ]
        )
        == 2
    )
    assert "triviaqa.jsonl not found; --data-dir must hold one <config>.jsonl per task" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert main(["score", str(tmp_path / "empty")]) == 2
    assert "no predictions under" in capsys.readouterr().err
    _write_preds(tmp_path / "bad", {"trec": [{"pred": "Food", "length": 3}]})
    assert main(["score", str(tmp_path / "bad")]) == 2
    assert "trec.jsonl:1: the row lacks answers" in capsys.readouterr().err


def test_a_full_run_on_incomplete_data_warns_that_scores_are_not_comparable(tiny, tiny_model_dir, words, tmp_path):
    with pytest.warns(UserWarning, match=r"sizes differ.*passage_retrieval_en \(3 of 200\)"):
        rows = run(
            config(words, tiny_model_dir, limit=None, methods=("full",), tasks=("passage_retrieval_en",)),
            tmp_path / "out",
            model_and_tokenizer=tiny,
            progress=False,
        )
    assert len(rows["full", "passage_retrieval_en"]) == 3


@pytest.mark.parametrize(
    "command, needles",
    [
        ([], ["run", "score", "examples:"]),
        (
            ["run"],
            [
                "passage_retrieval_en  synthetic, retrieval, 32 *",
                "aliases: all",
                "gemfilter-span",
                "accelerate launch --multi_gpu",
                "pred/<method>/<task>.jsonl",
            ],
        ),
        (["score"], ["one method folder of <task>.jsonl files", "per length bucket 0-4k, 4-8k, 8k+"]),
    ],
)
def test_every_command_has_a_help_that_teaches(command, needles, capsys):
    with pytest.raises(SystemExit) as exit_:
        main([*command, "--help"])
    assert exit_.value.code == 0
    text = capsys.readouterr().out
    assert all(n in text for n in needles), [n for n in needles if n not in text]


def test_fastkv_and_orig_pos_run_through_the_registry(tiny, words, tiny_model_dir, tmp_path):
    """The new methods need no runner code; each row records the method's budget."""
    cfg = config(words, tiny_model_dir, methods=("fastkv", "gemfilter-orig-pos"), tasks=TASKS[:1], limit=1, topk=16)
    run(cfg, tmp_path / "out", model_and_tokenizer=tiny, progress=False)
    for method in ("fastkv", "gemfilter-orig-pos"):
        rows = read_jsonl(tmp_path / "out" / "pred" / method / f"{TASKS[0]}.jsonl")
        assert len(rows) == 1 and rows[0]["kept"] == 16
