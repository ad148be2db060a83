"""gemfilter-ruler failures on a hand-made prediction folder: which samples a method misses that full passes."""

import json

import pytest

from eval.ruler.cli import main
from eval.ruler.failures import find_misses


def _write(folder, task, rows):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{task}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def _row(i, pred, outputs, kept=None):
    return {"index": i, "pred": pred, "outputs": outputs, "answers_kept": kept}


@pytest.fixture
def folder(tmp_path):
    pred = tmp_path / "4096" / "pred"
    # full passes S1 samples 0 and 2 (1: wrong number), and MV sample 1 only (0 finds one of two values)
    _write(pred / "full", "niah_single_1", [_row(0, "7531", ["7531"]), _row(1, "99", ["1234"]),
                                            _row(2, " The number is 4242.\n", ["4242"])])
    _write(pred / "full", "niah_multivalue", [_row(0, "11 and 3", ["11", "22"]), _row(1, "11, 22", ["11", "22"])])
    # m: written out of order; misses S1 sample 2 (answer dropped: kept 0.0) and MV 1 (half found, all kept);
    # passes S1 0 (a control character does not matter: "\x00" becomes a newline) and S1 1, which
    # full does not pass, so it is no miss either way
    _write(pred / "m_k8", "niah_single_1", [_row(2, "12", ["4242"], 0.0), _row(1, "1234", ["1234"], 1.0),
                                            _row(0, "x\x007531", ["7531"], 1.0)])
    _write(pred / "m_k8", "niah_multivalue", [_row(1, "22|", ["11", "22"], 1.0), _row(0, "", ["11", "22"], 0.5)])
    # a cache method: no answers_kept; it has only sample 0 of S1, which it passes
    _write(pred / "c_k8", "niah_single_1", [_row(0, "7531", ["7531"])])
    return tmp_path


def test_lists_exactly_the_samples_full_passes_and_the_method_misses(folder):
    with pytest.warns(UserWarning, match="1 of the first 2 samples are there"):  # c_k8 has S1 sample 0 only
        assert [(x.task, x.index) for x in find_misses(folder, num_samples=2).misses] == [("niah_multivalue", 1)]
    c = find_misses(folder)
    assert c.compared == {("4096", "c_k8"): 1, ("4096", "m_k8"): 3}
    assert c.passed == {("4096", "niah_single_1"): (2, 3), ("4096", "niah_multivalue"): (1, 2)}
    assert c.methods == {"4096": ["c_k8", "m_k8"]}
    assert [(x.method, x.task, x.index, x.score, x.answers_kept) for x in c.misses] == [
        ("m_k8", "niah_single_1", 2, 0.0, 0.0), ("m_k8", "niah_multivalue", 1, 0.5, 1.0)]
    assert c.kept == {("4096", "m_k8", "niah_single_1"): pytest.approx(2 / 3),
                      ("4096", "m_k8", "niah_multivalue"): 0.75}


def test_cli_writes_failures_md_and_refuses_an_unknown_reference(folder, capsys):
    assert main(["failures", str(folder)]) == 0
    text = (folder / "failures.md").read_text()
    assert "`full` passes: S1 2/3, MV 1/2." in text
    assert "### m_k8: misses 2 of the 3 samples `full` passes that it has" in text
    assert "| MV | 1 | 0.50 | 1.00 | 22\\| | 11, 22 |" in text  # a | in a prediction cannot break the table
    assert "### c_k8: misses 0 of the 1 samples `full` passes that it has" in text
    assert main(["failures", str(folder), "--against", "nope"]) == 2
    assert "--against takes one of the method folders there: c_k8, full, m_k8" in capsys.readouterr().err
    assert main(["failures", str(folder), "--num-samples", "0"]) == 2
    capsys.readouterr()
    _write(folder / "4096" / "pred" / "m_k8", "vt", [{"pred": "x", "outputs": ["y"]}])  # no index
    assert main(["failures", str(folder)]) == 2
    assert "vt.jsonl: row 1 has no integer index, so it cannot be matched" in capsys.readouterr().err
