"""LongBench v1 records: from the Hugging Face hub through ``datasets``, or from a local folder.

Source: THUDM/LongBench (v1) ``pred.py`` loads ``load_dataset("THUDM/LongBench", config, split="test")``
(``<task>_e`` for LongBench-E); the hub repo serves Parquet, so no loading script runs. The official
``data.zip`` unpacks to one ``<config>.jsonl`` per config, which ``--data-dir`` reads directly.

Each record has ``input``, ``context``, ``answers`` (list), ``length``, ``dataset``, ``language``,
``all_classes`` (list or null) and ``_id``; a local record without ``_id`` gets ``<config>#<line>``
so that results stay resumable.
"""

from __future__ import annotations

from pathlib import Path

from gemfilter.toolkit.io import jsonl_lines

HUB_REPO = "THUDM/LongBench"
REQUIRED = ("input", "context", "answers", "length")


def _check(record, where: str, config: str, index: int) -> dict:
    """Validate one record and fill ``all_classes`` / ``_id``; ValueError says what is wrong and where."""
    if not isinstance(record, dict):
        raise ValueError(f"{where}: a LongBench record must be a JSON object, got {type(record).__name__}")
    missing = [k for k in REQUIRED if k not in record]
    if missing:
        raise ValueError(
            f"{where}: record lacks {', '.join(missing)}; LongBench records have the fields "
            "input, context, answers (list), length, dataset, language, all_classes, _id"
        )
    if not isinstance(record["answers"], list):
        raise ValueError(f"{where}: 'answers' must be a list of strings, got {record['answers']!r}")
    if isinstance(record["length"], bool) or not isinstance(record["length"], (int, float)):
        raise ValueError(
            f"{where}: 'length' must be a number (words or characters of the context), got {record['length']!r}"
        )
    out = dict(record)
    out.setdefault("all_classes", None)
    if out.get("_id") in (None, ""):
        out["_id"] = f"{config}#{index}"
    return out


def read_jsonl_records(path: Path, config: str) -> list:
    """Records of a local ``<config>.jsonl`` file (one JSON object per line, blank lines skipped)."""
    records = []
    for i, raw, problem in jsonl_lines(path):
        if problem is not None:
            raise ValueError(
                f"{path}:{i}: {problem}; LongBench data files are UTF-8 JSON Lines, one record "
                f"per line: re-save the file as UTF-8 or fix line {i}"
            )
        records.append(_check(raw, f"{path}:{i}", config, i))
    return records


def load_local(config: str, data_dir) -> list:
    """Records from ``<data_dir>/<config>.jsonl``; FileNotFoundError lists the files that are there."""
    folder = Path(data_dir)
    if not folder.is_dir():
        raise FileNotFoundError(
            f"--data-dir {folder} is not a folder; it must hold <config>.jsonl files "
            "(e.g. the unpacked LongBench data.zip)"
        )
    path = folder / f"{config}.jsonl"
    if not path.is_file():
        have = sorted(p.name for p in folder.glob("*.jsonl"))
        raise FileNotFoundError(
            f"{path} not found; --data-dir must hold one <config>.jsonl per task "
            f"(found: {', '.join(have) or 'no .jsonl files'})"
        )
    return read_jsonl_records(path, config)


def load_hub(config: str) -> list:
    """Records of ``load_dataset("THUDM/LongBench", config, split="test")``.

    Offline, or when the hub cannot be reached, raises ConnectionError (an OSError) that points to
    ``--data-dir`` instead of ``datasets``' bare message.
    """
    import datasets

    try:
        ds = datasets.load_dataset(HUB_REPO, config, split="test")
    except Exception as err:  # noqa: BLE001 - connection, offline mode, missing cache: all get the same advice
        raise ConnectionError(
            f"could not load {HUB_REPO} config {config!r} from the Hugging Face hub ({type(err).__name__}: {err}). "
            f"Without the hub, download LongBench's data.zip elsewhere, unpack it, and pass --data-dir FOLDER "
            f"(a local folder of <config>.jsonl files, here {config}.jsonl)."
        ) from err
    return [_check(dict(r), f"{HUB_REPO}/{config}[{i}]", config, i) for i, r in enumerate(ds)]


def load_records(config: str, data_dir=None, limit: int | None = None) -> list:
    """A config's records, in dataset order, the first ``limit`` of them if given.

    Parameters: config: a LongBench config (``hotpotqa``, ``hotpotqa_e``); data_dir: local folder of
    ``<config>.jsonl`` files, None for the hub; limit: keep the first n records (n >= 1).
    Raises ValueError on duplicate ``_id`` values (results are keyed by ``_id``).
    """
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise ValueError(f"--limit must be an int >= 1 (or omitted for every sample), got {limit!r}")
    records = load_local(config, data_dir) if data_dir is not None else load_hub(config)
    seen = set()
    for r in records:
        if r["_id"] in seen:
            raise ValueError(
                f"{config}: _id {r['_id']!r} appears twice; results are keyed by _id, so it must be unique"
            )
        seen.add(r["_id"])
    return records[:limit] if limit is not None else records
