"""Safe result files for the plugin's commands and the eval runners (the probes have ``icl_probes.io``).

Why one module: a run must lose nothing and report nothing wrong when it is killed, when two runs
share one output folder, or when a file was damaged by hand. So every such command writes the same way:

- whole files (JSON results, configs, calibration, reports) are written to a temp file in the same
  folder, fsynced and renamed over the target (:func:`write_text_atomic`): a reader sees the old file
  or the new one, never half of one, and a crash or a full disk leaves the old file intact;
- JSONL rows are appended under a per-folder lock (:func:`folder_lock`), and shards
  are merged and removed under the same lock (:func:`merge_jsonl`), so no row appended by another
  process is ever deleted by a merge;
- a damaged file gives :class:`CorruptFileError`, which names the file (and line) and says how to fix it.

Command-line options are parsed and checked in ``gemfilter.toolkit.options``.

Nothing here imports torch or transformers at import time.
"""

from __future__ import annotations

import fcntl
import json
import os
import tempfile
import threading
import warnings
from contextlib import contextmanager
from pathlib import Path


class CorruptFileError(ValueError):
    """A file exists but cannot be read as what it should hold; the message names it and the fix."""


def corrupt(path, problem: str, fix: str) -> CorruptFileError:
    return CorruptFileError(f"{path}: {problem}. {fix}")


def _delete_fix(path) -> str:
    return f"Fix the file by hand, or delete it ({path}) to start over"


# ---------------------------------------------------------------- reading


def read_text(path, what: str = "file") -> str:
    """The UTF-8 text of ``path``; CorruptFileError (naming the file and byte offset) on other bytes."""
    path = Path(path)
    data = path.read_bytes()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise corrupt(
            path,
            f"this {what} is not UTF-8 text (byte {err.start}: {data[err.start : err.start + 4]!r})",
            "Re-save it as UTF-8 (e.g. iconv -f latin1 -t utf-8 FILE > NEW)",
        ) from None


def read_json(path, what: str = "JSON file", fix: str | None = None):
    """The JSON value stored in ``path``; CorruptFileError naming the file and how to fix it."""
    path = Path(path)
    text = read_text(path, what)
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise corrupt(
            path,
            f"this {what} is not valid JSON ({err.msg} at line {err.lineno}, column {err.colno})",
            fix or _delete_fix(path),
        ) from None


def read_json_object(path, what: str = "JSON file", fix: str | None = None) -> dict:
    """Like :func:`read_json`, but the value must be a JSON object."""
    value = read_json(path, what, fix)
    if not isinstance(value, dict):
        raise corrupt(
            path, f"this {what} must hold a JSON object, not {type(value).__name__}", fix or _delete_fix(path)
        )
    return value


def _row_problem(row, required) -> str | None:
    if not isinstance(row, dict):
        return f"a row must be a JSON object, got {'null' if row is None else type(row).__name__}"
    missing = [k for k in required if k not in row]
    return f"the row lacks {', '.join(missing)}" if missing else None


def jsonl_lines(path):
    """(line number, value, problem) for each non-blank line of a JSONL file, numbered from 1.

    problem: None, or why the line could not be read ("not UTF-8 text", "not valid JSON (<why>)"),
    in which case value is None.
    """
    with open(path, "rb") as f:
        for i, raw in enumerate(f, 1):
            if not raw.strip():
                continue
            try:
                yield i, json.loads(raw.decode("utf-8")), None
            except UnicodeDecodeError:
                yield i, None, "not UTF-8 text"
            except json.JSONDecodeError as err:
                yield i, None, f"not valid JSON ({err.msg})"


def read_jsonl(
    path, *, required=(), strict: bool = False, skip_note: str = "that row will be recomputed", fix: str | None = None
) -> list:
    """The rows (JSON objects) of a JSONL file; [] if it does not exist. Blank lines are ignored.

    A line that is not UTF-8, not JSON (e.g. cut short by a kill), not an object, or lacks a field of
    ``required``: with ``strict`` raises CorruptFileError naming the file, the line and ``fix``;
    otherwise it is skipped with a warning ending in ``skip_note``.
    """
    path = Path(path)
    if not path.exists():
        return []
    rows = []
    for i, row, unreadable in jsonl_lines(path):
        # A killed append leaves a line cut short: bad JSON, or bad UTF-8 if cut inside a character.
        problem = (
            _row_problem(row, required)
            if unreadable is None
            else f"the line is {unreadable}; a write cut short by a kill?"
        )
        if problem is None:
            rows.append(row)
        elif strict:
            raise corrupt(f"{path}:{i}", problem, fix or f"Fix or delete line {i} of {path}")
        else:
            warnings.warn(f"{path}:{i}: skipping an incomplete row: {problem}; {skip_note}", stacklevel=2)
    return rows


# ---------------------------------------------------------------- writing


def _umask() -> int:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except OSError:
        pass
    return 0o022


@contextmanager
def atomic_path(path):
    """Yield a temp path next to ``path``; on success it replaces ``path`` (fsynced), on error it is removed.

    For writers that want a file name (torch.save, savefig). Permissions: the old file's, else the umask's.
    A failed write (a full disk) names ``path`` (:func:`naming`).
    """
    path = Path(path)
    with naming(path):
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        os.close(fd)
        try:
            yield Path(tmp)
            mode = path.stat().st_mode & 0o777 if path.exists() else 0o666 & ~_umask()
            os.chmod(tmp, mode)
            with open(tmp, "rb+") as f:
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise


@contextmanager
def naming(path):
    """Inside the block, an OSError that names no file (a full disk's "[Errno 28] No space left on device", a
    file-size limit's "[Errno 27] File too large") is raised again naming ``path``, the file being written."""
    try:
        yield
    except OSError as err:
        if err.filename is not None or err.errno is None:
            raise
        raise OSError(err.errno, f"could not write {path}: {err.strerror or err}") from err


def save_png(fig, path, **kwargs) -> Path:
    """Write the matplotlib figure ``fig`` as a PNG at ``path`` atomically, then close it; returns ``path``.

    The PNG goes to a temp file in the same folder, renamed over ``path`` only once complete (:func:`atomic_path`),
    so a full disk or a kill leaves the old figure, never a truncated one. kwargs: ``savefig``'s (dpi 120 unless
    given, e.g. ``bbox_inches="tight"``). Every figure of the plugin and the evals is written through this function.
    """
    import matplotlib.pyplot as plt

    path = Path(path)
    try:
        with atomic_path(path) as tmp:
            fig.savefig(tmp, format="png", **{"dpi": 120, **kwargs})
    finally:
        plt.close(fig)
    return path


def write_text_atomic(path, text: str) -> Path:
    """Write ``text`` (UTF-8) to ``path`` atomically: readers see the old file or the new one, never half."""
    path = Path(path)
    with atomic_path(path) as tmp:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
    return path


def write_json_atomic(path, obj, *, indent: int | None = 1, ensure_ascii: bool = True) -> Path:
    """``json.dumps(obj)`` (plus a newline) written atomically to ``path``."""
    return write_text_atomic(path, json.dumps(obj, indent=indent, ensure_ascii=ensure_ascii) + "\n")


_held = threading.local()


@contextmanager
def folder_lock(folder):
    """An exclusive lock on ``folder`` between processes (``fcntl.flock`` on the folder itself, so no
    lock file is left behind).

    Re-entrant within a process: an inner ``folder_lock`` of a folder already held just proceeds (a
    second flock from the same process on a new descriptor would wait for itself).
    """
    folder = Path(folder).resolve()
    held = _held.__dict__.setdefault("counts", {})
    if held.get(folder):
        held[folder] += 1
        try:
            yield
        finally:
            held[folder] -= 1
        return
    folder.mkdir(parents=True, exist_ok=True)
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        held[folder] = 1
        try:
            yield
        finally:
            held[folder] = 0
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def append_jsonl(path, row: dict, *, ensure_ascii: bool = True) -> None:
    """Append one row under the folder lock, flushed and fsynced (a kill loses at most this row).

    A line cut short by an earlier kill is first ended with a newline, so only that line is lost.
    """
    path = Path(path)
    line = json.dumps(row, ensure_ascii=ensure_ascii) + "\n"
    with naming(path), folder_lock(path.parent):
        torn = False
        if path.exists() and path.stat().st_size:
            with open(path, "rb") as f:
                f.seek(-1, os.SEEK_END)
                torn = f.read(1) != b"\n"
        with open(path, "a", encoding="utf-8") as f:
            f.write(("\n" if torn else "") + line)
            f.flush()
            os.fsync(f.fileno())


def merge_jsonl(target, shard_pattern: str, key, sort_key=None, *, required=(), ensure_ascii: bool = True) -> list:
    """Merge ``target`` and the shards ``target.parent.glob(shard_pattern)`` into ``target``, then drop the shards.

    Runs under :func:`folder_lock`, which :func:`append_jsonl` also takes, so a row appended by a
    concurrent writer is either read here (and kept) or lands in a fresh shard after the merge; it is
    never deleted unread. Rows are de-duplicated by ``key(row)`` (first one wins: target, then the
    shards in name order) and sorted by ``sort_key``. Returns the merged rows.
    """
    target = Path(target)
    with folder_lock(target.parent):
        shards = sorted(target.parent.glob(shard_pattern))
        rows = {}
        for path in [target, *shards]:
            for row in read_jsonl(path, required=required, skip_note="it is left out of the merged file"):
                rows.setdefault(key(row), row)
        merged = list(rows.values())
        if sort_key is not None:
            merged.sort(key=sort_key)
        write_text_atomic(target, "".join(json.dumps(r, ensure_ascii=ensure_ascii) + "\n" for r in merged))
        for shard in shards:  # every row of theirs is in target now
            shard.unlink()
    return merged


def remove_jsonl_rows(path, drop) -> None:
    """Rewrite the JSONL ``path`` without the rows for which ``drop(row)`` is true (a ``--force`` rerun).

    Under :func:`folder_lock`, as appends and merges, and written atomically: a row another process
    appends meanwhile is kept, and a crash leaves the old file. Unreadable lines are left out with a warning.
    """
    path = Path(path)
    with folder_lock(path.parent):
        keep = [r for r in read_jsonl(path) if not drop(r)]
        write_text_atomic(path, "".join(json.dumps(r) + "\n" for r in keep))


def check_out_dir(path, flag: str = "--out", files=()) -> Path:
    """Create the output folder and prove it writable before any compute; ValueError saying what is wrong.

    files: names inside it that the command will write; each must not be a folder.
    """
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise ValueError(f"{flag} {path} is a file, not a folder; name a folder (it is created if missing)")
    try:
        path.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(dir=path, prefix=".write-test.")
        os.close(fd)
        os.unlink(probe)
    except OSError as err:
        raise ValueError(
            f"{flag} {path} cannot be written ({err.strerror or err}); name a folder you can write to"
        ) from None
    for name in files:
        if (path / name).is_dir():
            raise ValueError(
                f"{flag} {path}: {path / name} is a folder, but the command writes a file there; "
                "remove or rename it, or use another --out"
            )
    return path


def check_png_path(path, flag: str = "--png") -> Path:
    """Check a figure's path before any work: a ``.png`` file name whose folder can be written (created if
    missing), not a folder; ValueError saying what is wrong and what is allowed."""
    path = Path(path)
    if path.is_dir():
        raise ValueError(f"{flag} {path} is a folder; give the PNG file to write, e.g. {path / 'figure.png'}")
    if path.suffix.lower() != ".png":
        raise ValueError(f"{flag} {path}: figures are written as PNG; give a file name ending in .png")
    check_out_dir(path.parent, flag=f"{flag} {path}: its folder")
    return path
