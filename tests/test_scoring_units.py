"""The RULER and LongBench scorers count each sample once (duplicated rows are
dropped by key with a warning), RULER's ``--num-samples`` limits what is scored, and the rows an interrupted
run left in unmerged shards are scored (with a warning) instead of "no predictions".

Expected scores are worked out by hand from the rows written here.
"""

import json

import pytest

from eval.longbench.report import score_folder as longbench_score
from eval.ruler.cli import main as ruler_main
from eval.ruler.report import collect

PASS = {"pred": "the number is 7", "outputs": ["7"]}
FAIL = {"pred": "no idea", "outputs": ["8"]}


def write(path, rows):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def ruler_rows(*kinds):
    return [dict(kind, index=i, _id=str(i)) for i, kind in enumerate(kinds)]


def niah_score(root, num_samples=None):
    return collect(root, num_samples)[("4096", "full")]["niah_single_1"]


def test_ruler_counts_a_duplicated_row_once(tmp_path):
    path = tmp_path / "4096" / "pred" / "full" / "niah_single_1.jsonl"
    rows = ruler_rows(PASS, FAIL, FAIL)  # 1 of 3 samples pass: 100/3
    write(path, rows)
    assert niah_score(tmp_path)["score"] == pytest.approx(100 / 3, abs=0.01)
    write(path, rows + [rows[0], rows[0]])  # the passing row three times
    with pytest.warns(UserWarning, match="2 row\\(s\\) repeat a sample"):
        entry = niah_score(tmp_path)
    assert entry["score"] == pytest.approx(100 / 3, abs=0.01) and entry["n"] == 3


def test_ruler_num_samples_limits_the_scored_rows_even_with_duplicates(tmp_path):
    path = tmp_path / "4096" / "pred" / "full" / "niah_single_1.jsonl"
    rows = ruler_rows(FAIL, PASS, FAIL, PASS, PASS)
    write(path, rows + [rows[1], rows[1], rows[1]])
    with pytest.warns(UserWarning, match="repeat a sample"):
        entry = niah_score(tmp_path, 3)  # samples 0..2: 1 of 3 pass
    assert entry["n"] == 3 and entry["score"] == pytest.approx(100 / 3, abs=0.01)


def test_ruler_score_reports_the_rows_of_a_killed_run(tmp_path, capsys):
    folder = tmp_path / "4096" / "pred" / "full"
    rows = ruler_rows(PASS, FAIL, PASS, FAIL)
    write(folder / "niah_single_1.jsonl.rank0", rows[:2])
    write(folder / "niah_single_1.jsonl.rank1", rows[2:] + [rows[0]])  # and a repeat across shards
    with pytest.warns(UserWarning, match="5 row\\(s\\) of niah_single_1 are in unmerged shards"):
        assert ruler_main(["score", str(tmp_path)]) == 0
    report = (tmp_path / "report.csv").read_text()
    assert "50.0" in report  # 2 of the 4 samples pass


def test_longbench_counts_a_duplicated_row_once(tmp_path):
    good = {"pred": "Paris", "answers": ["Paris"], "all_classes": None, "length": 100}
    bad = {"pred": "Rome", "answers": ["Berlin"], "all_classes": None, "length": 100}
    rows = [dict(good, _id="a"), dict(bad, _id="b")]  # 1 of 2: 50.0
    write(tmp_path / "hotpotqa.jsonl", rows)
    assert longbench_score(tmp_path, write=False) == {"hotpotqa": 50.0}
    write(tmp_path / "hotpotqa.jsonl", rows + [rows[0], rows[0]])
    with pytest.warns(UserWarning, match="repeat a sample"):
        assert longbench_score(tmp_path, write=False) == {"hotpotqa": 50.0}
    (tmp_path / "hotpotqa.jsonl").unlink()  # only a killed run's shard: scored, not "no predictions"
    write(tmp_path / "hotpotqa.jsonl.rank0", rows + [rows[0]])
    with pytest.warns(UserWarning, match="unmerged shards"):
        assert longbench_score(tmp_path, write=False) == {"hotpotqa": 50.0}
