"""icl_probes.common: resumable JSONL survives a torn last line; device names are checked."""

import json

import pytest

from icl_probes.common import append_jsonl, read_jsonl, resolve_device


def test_append_after_torn_line_keeps_rows_apart(tmp_path):
    path = tmp_path / "sub" / "rows.jsonl"
    append_jsonl(path, {"i": 0})
    with open(path, "a", encoding="utf-8") as f:
        f.write('{"i": 1, "trunc')  # a crash mid-write: no closing brace, no newline
    append_jsonl(path, {"i": 2})
    lines = path.read_text(encoding="utf-8").split("\n")
    assert lines == ['{"i": 0}', '{"i": 1, "trunc', '{"i": 2}', ""]
    assert [json.loads(x)["i"] for x in (lines[0], lines[2])] == [0, 2]
    assert read_jsonl(path) == [{"i": 0}, {"i": 2}]


def test_read_missing_file_is_empty(tmp_path):
    assert read_jsonl(tmp_path / "none.jsonl") == []


def test_resolve_device_rejects_unknown_names():
    assert resolve_device("cpu").type == "cpu"
    with pytest.raises(ValueError, match="allowed"):
        resolve_device("tpu")


def test_as_stored_equals_what_a_json_file_gives_back(tmp_path):
    from dataclasses import dataclass, field

    from icl_probes.common import as_stored, write_json

    @dataclass(frozen=True)
    class Cfg:
        ns: tuple = (16, 32)
        inner: dict = field(default_factory=lambda: {"pair": (1, 2)})

    write_json(tmp_path / "c.json", as_stored(Cfg()))
    assert as_stored(Cfg()) == {"ns": [16, 32], "inner": {"pair": [1, 2]}}
    assert json.loads((tmp_path / "c.json").read_text()) == as_stored(Cfg())
