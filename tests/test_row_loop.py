"""The one row loop (``gemfilter.toolkit.loop``): what is missing, each result written as it comes, a failure that
keeps what was written, and a command on it that resumes (the conversation bench; the benchmarks', ``gemfilter
bench``'s and ``--engine``'s resume tests are their own files')."""

import json

import pytest

from gemfilter.toolkit.loop import Unit, compute, missing


def test_missing_keeps_the_order_and_reads_each_file_s_keys():
    units = [Unit("a", 1), Unit("b", 1), Unit("a", 2), Unit("a", 3)]
    assert missing(units, {"a": {2}, "c": {1}}) == [Unit("a", 1), Unit("b", 1), Unit("a", 3)]


def test_each_result_is_written_before_the_next_unit_runs_and_a_failure_keeps_them():
    log = []

    def predict(unit):
        log.append(("predict", unit.key))
        if unit.key == 3:
            raise RuntimeError("cell 3 broke")
        return None if unit.key == 2 else {"k": unit.key}  # 2: nothing to store (a failed cell gone past)

    def write(unit, row):
        log.append(("write", row["k"]))

    with pytest.raises(RuntimeError, match="cell 3 broke"):
        compute([Unit("f", k) for k in (1, 2, 3, 4)], predict, write, desc="t", noun="x", progress=False)
    assert log == [("predict", 1), ("write", 1), ("predict", 2), ("predict", 3)]
    assert compute([Unit("f", 1)], lambda u: {"k": 1}, lambda u, r: None, desc="t", noun="x", progress=False) == [
        {"k": 1}
    ]


def test_the_conversation_bench_resumes_through_the_loop(tmp_path):
    from gemfilter.lab.bench import conversation

    out = tmp_path / "turns.jsonl"
    common = ["--model", "config:llama-3.1-8b", "--test-shrink", "--layers", "4", "--layer", "2", "--context", "128"]
    common += ["--turns", "2", "--question-tokens", "8", "--answer-tokens", "2", "--topk", "48", "--out", str(out)]
    assert conversation.main([*common, "--runs", "full,reselect:gemfilter"]) == 0
    first = [json.loads(x) for x in out.read_text().splitlines()]
    assert [(r["protocol"], r["method"]) for r in first] == [("full", "full")] * 2 + [("reselect", "gemfilter")] * 2
    assert conversation.main([*common, "--runs", "full,reselect:gemfilter,reuse:gemfilter"]) == 0
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert rows[:4] == first and [(r["protocol"], r["method"]) for r in rows[4:]] == [("reuse", "gemfilter")] * 2
    assert all(r["kept"] == 48 for r in rows if r["protocol"] != "full" and r["turn"] == 1)  # --topk reached them


def test_the_decode_probe_appends_a_row_per_path_through_the_loop(tmp_path):
    from gemfilter.lab.bench import decode

    out = tmp_path / "decode.jsonl"
    argv = ["--model", "config:llama-3.1-8b", "--test-shrink", "--layers", "2", "--k", "32", "--gen-tokens", "3"]
    assert decode.main([*argv, "--paths", "generate,apply-full", "--out", str(out)]) == 0
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert [r["path"] for r in rows] == ["generate", "apply-full"] and all(r["decode_ms"] > 0 for r in rows)
    assert all(r["model"] == "config:llama-3.1-8b" and r["layers"] == 2 for r in rows)


def test_every_row_keeps_stored_rows_and_appends_the_missing_in_order():
    from gemfilter.toolkit.loop import every_row

    appended, asked = [], []

    def predict(key):
        asked.append(key)
        return {"k": key, "new": True}

    rows = every_row([1, 2, 3], {2: {"k": 2}}, predict, appended.append, desc="t", noun="x", progress=False)
    assert rows == [{"k": 1, "new": True}, {"k": 2}, {"k": 3, "new": True}]
    assert asked == [1, 3] and appended == [rows[0], rows[2]]
    assert every_row([1], {}, lambda k: {"k": k}, None, desc="t", noun="x", progress=False) == [{"k": 1}]


def test_stored_rows_are_those_of_the_setting(tmp_path):
    from gemfilter.toolkit.loop import stored_rows

    path = tmp_path / "rows.jsonl"
    assert stored_rows(path, {"a": 1}) == []  # no file yet
    path.write_text('{"a": 1, "k": 1}\n{"a": 2, "k": 2}\n{"k": 3}\n')
    assert stored_rows(path, {"a": 1}) == [{"a": 1, "k": 1}]
    assert stored_rows(path, {}) == [{"a": 1, "k": 1}, {"a": 2, "k": 2}, {"k": 3}]
