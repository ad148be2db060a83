"""Probe output files: whole files replaced atomically, resumable JSONL rows, output paths checked up front.

Used by every ICL and feature probe. A probe run is one process that owns its output folder, so nothing
here locks. What the probes need from files:

- a whole file (results JSON, markdown table, PNG, checkpoint) replaces the old one only once it is
  complete (:func:`replacing`): a kill or a full disk leaves the old file, never half of a new one;
- one JSONL row per finished unit of work, appended and fsynced (:func:`append_jsonl`), so an interrupted
  run resumes; :func:`read_jsonl` skips a torn or foreign line with a warning, and that unit is redone;
- ``--out`` and figure paths are checked before any compute (:func:`check_out_dir`, :func:`check_png_path`);
- a damaged file raises :class:`BadFile`, a ValueError whose message names the file and the fix.

Nothing here imports torch or matplotlib at import time.
"""

from __future__ import annotations

import json
import os
import tempfile
import uuid
import warnings
from contextlib import contextmanager
from pathlib import Path


class BadFile(ValueError):
    """A file exists but cannot be read as what it should hold; the message names it and the fix."""

    def __init__(self, where, problem: str, fix: str):
        super().__init__(f"{where}: {problem}. {fix}")


# ---------------------------------------------------------------- whole files


@contextmanager
def replacing(path):
    """Yield a fresh temp path in ``path``'s folder (created if missing); when the block ends without an
    error the temp file is fsynced and renamed over ``path``, otherwise it is deleted.

    For writers that want a file name (``torch.save``, ``savefig``) as well as for text.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:12]}.part")
    # os.open applies the umask to 0o666, so the result gets a normal file's permissions.
    os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
    try:
        yield tmp
        fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(fd)  # the bytes reach the disk before the name points at them
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_text(path, text: str) -> Path:
    """``text`` as UTF-8 at ``path``, replacing any old file only once complete."""
    with replacing(path) as tmp:
        tmp.write_text(text, encoding="utf-8")
    return Path(path)


def write_json(path, obj) -> Path:
    """``obj`` as indented JSON at ``path``, replacing any old file only once complete."""
    return write_text(path, json.dumps(obj, indent=2) + "\n")


def read_text(path, what: str = "file") -> str:
    """The UTF-8 text of ``path``; :class:`BadFile` if it holds other bytes (FileNotFoundError if missing)."""
    data = Path(path).read_bytes()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise BadFile(
            path, f"this {what} is not UTF-8 text (byte {err.start})", "Save it as UTF-8 and run again"
        ) from None


def read_json(path, what: str = "results file") -> dict:
    """The JSON object written by :func:`write_json`; :class:`BadFile` saying to delete it if it is damaged."""
    fix = f"Delete {path} to recompute it (or fix it by hand)"
    try:
        value = json.loads(read_text(path, what))
    except json.JSONDecodeError as err:
        raise BadFile(path, f"this {what} is not valid JSON ({err.msg}, line {err.lineno})", fix) from None
    if not isinstance(value, dict):
        raise BadFile(path, f"this {what} holds a JSON {type(value).__name__}, not an object", fix)
    return value


def save_png(fig, path) -> Path:
    """The matplotlib figure ``fig`` as a PNG at ``path`` (120 dpi, tight box), replacing any old figure only
    once complete; the figure is closed even when the write fails."""
    import matplotlib.pyplot as plt

    try:
        with replacing(path) as tmp:
            fig.savefig(tmp, format="png", dpi=120, bbox_inches="tight")
    finally:
        plt.close(fig)
    return Path(path)


# ---------------------------------------------------------------- JSONL rows


def append_jsonl(path, row: dict) -> None:
    """Append ``row`` as one JSON line, flushed and fsynced: a kill loses at most this row.

    If the file ends inside a line (a kill cut an earlier append short), a newline goes first, so only that
    torn line is lost and this row stays readable.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "ab+") as f:
        f.seek(0, os.SEEK_END)
        torn = False
        if f.tell():
            f.seek(-1, os.SEEK_END)
            torn = f.read(1) != b"\n"
        f.write((b"\n" if torn else b"") + json.dumps(row).encode("utf-8") + b"\n")
        f.flush()
        os.fsync(f.fileno())


def read_jsonl(path, required=()) -> list:
    """The rows of a JSONL file, [] if there is none. A line that is torn, not JSON, not an object, or lacks
    a field of ``required`` is skipped with a warning: the unit it stood for is computed again."""
    path = Path(path)
    if not path.exists():
        return []
    rows = []
    for number, raw in enumerate(path.read_bytes().splitlines(), 1):
        if not raw.strip():
            continue
        try:
            row = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError):
            problem = "the line is not JSON; a write cut short by a kill?"
        else:
            lacking = [key for key in required if key not in row] if isinstance(row, dict) else []
            problem = (
                "a row must be a JSON object"
                if not isinstance(row, dict)
                else f"the row lacks {', '.join(lacking)}"
                if lacking
                else None
            )
        if problem is None:
            rows.append(row)
        else:
            warnings.warn(
                f"{path}:{number}: skipping an incomplete row: {problem}; it will be recomputed", stacklevel=2
            )
    return rows


def remove_jsonl_rows(path, drop) -> None:
    """Rewrite the JSONL ``path`` without the rows for which ``drop(row)`` is true (what ``--force``
    recomputes); every other row stays, and the file is replaced only once complete."""
    keep = [row for row in read_jsonl(path) if not drop(row)]
    write_text(path, "".join(json.dumps(row) + "\n" for row in keep))


# ---------------------------------------------------------------- output paths, checked before any compute


def check_out_dir(path, flag: str = "--out", files=()) -> Path:
    """Create the output folder and prove it writable; ValueError naming ``flag`` and what to give instead.

    files: names the command will write inside it; none of them may be a folder.
    """
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise ValueError(f"{flag} {path} is a file, not a folder; name a folder (it is created if missing)")
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as err:
        raise ValueError(
            f"{flag} {path} cannot be written ({err.strerror or err}); name a folder you can write to"
        ) from None
    taken = [name for name in files if (path / name).is_dir()]
    if taken:
        raise ValueError(
            f"{flag} {path}: {path / taken[0]} is a folder, but the command writes a file there; "
            f"remove or rename it, or use another {flag}"
        )
    return path


def check_png_path(path, flag: str = "--png") -> Path:
    """A figure path: a file name ending in ``.png`` (not a folder) whose folder can be written (created if
    missing); ValueError saying what is wrong and what is allowed."""
    path = Path(path)
    if path.is_dir():
        raise ValueError(f"{flag} {path} is a folder; give the PNG file to write, e.g. {path / 'figure.png'}")
    if path.suffix.lower() != ".png":
        raise ValueError(f"{flag} {path}: figures are written as PNG; give a file name ending in .png")
    check_out_dir(path.parent, flag=f"{flag} {path}: its folder")
    return path
