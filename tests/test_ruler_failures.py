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
    _write(
        pred / "full",
        "niah_single_1",
        [_row(0, "7531", ["7531"]), _row(1, "99", ["1234"]), _row(2, " The number is 4242.\n", ["4242"])],
    )
    _write(pred / "full", "niah_multivalue", [_row(0, "11 and 3", ["11", "22"]), _row(1, "11, 22", ["11", "22"])])
    # m: written out of order; misses S1 sample 2 (answer dropped: kept 0.0) and MV 1 (half found, all kept);
    # passes S1 0 (a control character does not matter: "\x00" becomes a newline) and S1 1, which
    # full does not pass, so it is no miss either way
    _write(
        pred / "m_k8",
        "niah_single_1",
        [_row(2, "12", ["4242"], 0.0), _row(1, "1234", ["1234"], 1.0), _row(0, "x\x007531", ["7531"], 1.0)],
    )
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
        ("m_k8", "niah_single_1", 2, 0.0, 0.0),
        ("m_k8", "niah_multivalue", 1, 0.5, 1.0),
    ]
    assert c.kept == {
        ("4096", "m_k8", "niah_single_1"): pytest.approx(2 / 3),
        ("4096", "m_k8", "niah_multivalue"): 0.75,
    }


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


def test_num_samples_per_length_scopes_each_length_on_its_own(folder, capsys):
    """--num-samples 4096=1: sample 0 only at 4096, every row at a length it does not name (8192)."""
    import shutil

    from eval.ruler.report import collect, parse_scope

    shutil.copytree(folder / "4096", folder / "8192")
    scope = parse_scope("4k=1")
    assert scope == {"4096": 1}
    c = find_misses(folder, num_samples=scope)
    assert c.compared == {("4096", "c_k8"): 1, ("4096", "m_k8"): 1, ("8192", "c_k8"): 1, ("8192", "m_k8"): 3}
    assert [(x.length, x.method, x.task, x.index) for x in c.misses] == [
        ("8192", "m_k8", "niah_single_1", 2),
        ("8192", "m_k8", "niah_multivalue", 1),
    ]
    assert {k: {t: e["n"] for t, e in v.items()} for k, v in collect(folder, scope).items()} == {
        ("4096", "full"): {"niah_single_1": 1, "niah_multivalue": 1},
        ("4096", "c_k8"): {"niah_single_1": 1},
        ("4096", "m_k8"): {"niah_single_1": 1, "niah_multivalue": 1},
        ("8192", "full"): {"niah_single_1": 3, "niah_multivalue": 2},
        ("8192", "c_k8"): {"niah_single_1": 1},
        ("8192", "m_k8"): {"niah_single_1": 3, "niah_multivalue": 2},
    }
    with pytest.warns(UserWarning, match="8192/pred/c_k8/niah_single_1.jsonl: 1 of the first 2 samples"):
        assert main(["failures", str(folder), "--num-samples", "4096=1,8k=2"]) == 0
    text = (folder / "failures.md").read_text()
    assert "Scope: samples 0..0 at 4096, 0..1 at 8192 of each task (every sample at any other length)." in text
    assert "## Length 8192\n\n`full` passes: S1 1/2, MV 1/2." in text
    assert main(["score", str(folder), "--num-samples", "4096=1"]) == 0
    assert "Samples per task: 1, 2, 3." in (folder / "report.md").read_text()


@pytest.mark.parametrize(
    "text, error",
    [
        ("0", "--num-samples must be >= 1"),
        ("4k=0", "got '4k=0'; allowed"),
        ("x", "'x' is not a sample count"),
        ("4k=x", "'4k=x' is not a sample count"),
        ("=3", "'=3' is not LENGTH=N"),
        ("4k=2,3", "'3' is not LENGTH=N"),
        ("4k=2,4096=3", "names length 4096 twice"),
        ("100=2", "'100=2': '100' is too small"),
    ],
)
def test_num_samples_scope_refuses_bad_input_and_says_what_is_allowed(text, error):
    from eval.ruler.report import parse_scope

    with pytest.raises(ValueError) as e:
        parse_scope(text)
    assert error in str(e.value)


def test_num_samples_scope_reads_one_count_or_none():
    from eval.ruler.report import parse_scope, scope_text

    assert parse_scope(None) is None and parse_scope("") is None and parse_scope(" 20 ") == 20
    assert parse_scope("4k=20,8192=2") == {"4096": 20, "8192": 2}
    assert scope_text(20) == "samples 0..19 of each task" and scope_text(None) == "every sample of each task"
