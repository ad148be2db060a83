"""icl_probes.common and icl_probes.io: resumable JSONL survives a torn last line, a failed write keeps the old
file, damaged files and bad paths are errors that say what to do; device names are checked."""

import json
import os

import pytest

from icl_probes.common import resolve_device
from icl_probes.io import append_jsonl, read_jsonl


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

    from icl_probes.common import as_stored
    from icl_probes.io import write_json

    @dataclass(frozen=True)
    class Cfg:
        ns: tuple = (16, 32)
        inner: dict = field(default_factory=lambda: {"pair": (1, 2)})

    write_json(tmp_path / "c.json", as_stored(Cfg()))
    assert as_stored(Cfg()) == {"ns": [16, 32], "inner": {"pair": [1, 2]}}
    assert json.loads((tmp_path / "c.json").read_text()) == as_stored(Cfg())


def test_a_failed_write_keeps_the_old_file_and_leaves_no_temp_file(tmp_path):
    from icl_probes.io import replacing, write_text

    path = write_text(tmp_path / "table.md", "old\n")
    with pytest.raises(RuntimeError):
        with replacing(path) as tmp:
            tmp.write_text("half a ne")
            raise RuntimeError("killed")
    assert path.read_text() == "old\n" and [p.name for p in tmp_path.iterdir()] == ["table.md"]
    umask = os.umask(0o022)
    os.umask(umask)
    assert path.stat().st_mode & 0o777 == 0o666 & ~umask  # a normal file's permissions, not the temp file's 0600


def test_rows_are_dropped_by_predicate_and_incomplete_rows_are_skipped(tmp_path):
    from icl_probes.io import remove_jsonl_rows

    path = tmp_path / "rows.jsonl"
    path.write_text('{"k": 1}\n{"k": 2}\n{"other": 3}\n[4]\n')
    with pytest.warns(UserWarning, match=r"rows.jsonl:4: skipping an incomplete row: a row must be a JSON object"):
        remove_jsonl_rows(path, lambda r: r.get("k") == 1)  # the unreadable line goes too
    with pytest.warns(UserWarning, match=r"rows.jsonl:2: skipping an incomplete row: the row lacks k"):
        assert read_jsonl(path, required=("k",)) == [{"k": 2}]


def test_damaged_files_and_bad_paths_are_errors_that_say_what_to_do(tmp_path):
    from icl_probes.io import BadFile, check_out_dir, check_png_path, read_json

    (tmp_path / "r.json").write_text("[1]")
    with pytest.raises(BadFile, match=r"r.json: this results file holds a JSON list, not an object\. Delete"):
        read_json(tmp_path / "r.json")
    (tmp_path / "out").write_text("")
    with pytest.raises(ValueError, match="--out .*out is a file, not a folder"):
        check_out_dir(tmp_path / "out")
    (tmp_path / "sub").mkdir()
    with pytest.raises(ValueError, match="sub is a folder, but the command writes a file there"):
        check_out_dir(tmp_path, files=("sub",))
    with pytest.raises(ValueError, match="give a file name ending in .png"):
        check_png_path(tmp_path / "fig.jpg")
    assert check_png_path(tmp_path / "new" / "fig.png") == tmp_path / "new" / "fig.png" and (tmp_path / "new").is_dir()
