"""The benchmark's stored rows: OUT/bench.jsonl read back for a resumed run or a report.

One row per (kernel, method, length, repeat); a row's settings (model, topk, dtype_arg, ...) must equal the
run's for it to count. Rows written by older releases are read in today's terms.
"""

from __future__ import annotations

import warnings
from pathlib import Path

from gemfilter.toolkit.io import read_jsonl


def key_of(row: dict) -> tuple:
    return (row.get("attn_arg"), row["method"], row["length"], row["repeat"])


ROW_FIELDS = ("method", "length", "repeat")
#: What a measured (not excluded) row holds besides ROW_FIELDS.
MEASURED = ("n", "kept", "prompt_s", "gen_s", "total_s", "prompt_peak_mib", "gen_peak_mib")


def load_rows(path: Path, meta: dict | None = None) -> list:
    """Finished measurements whose settings equal ``meta``, one per (method, length, repeat) (the first
    wins: a duplicate must not enter a median). A torn or incomplete line is skipped with a warning,
    and its cell is measured again."""
    rows = {}
    for row in read_jsonl(path, required=ROW_FIELDS, skip_note="that cell will be measured again"):
        if not row.get("excluded") and any(f not in row for f in MEASURED):
            warnings.warn(f"{path}: skipping an incomplete row for {key_of(row)}; that cell will be measured again")
            continue
        if "threads_arg" not in row:  # a row without threads_arg holds --threads in "threads"
            row = {**row, "threads_arg": row.get("threads"), "threads": None}
        if "dtype_arg" not in row:  # a row without dtype_arg holds --dtype in "dtype"
            row = {**row, "dtype_arg": row.get("dtype"), "dtype": _dtype_of(row)}
        if "compile" not in row:  # rows from before --compile decoded eagerly
            row = {**row, "compile": False}
        if meta is None or all(row.get(k) == v for k, v in meta.items()):
            rows.setdefault(key_of(row), row)
    return list(rows.values())


def _dtype_of(row: dict):
    """The dtype a row's worker ran in, for a row that kept only --dtype: resolve_dtype's rule where it does not
    depend on the machine (an explicit dtype; auto on CUDA is bf16), else None (auto on a CPU)."""
    from .archs import resolve_dtype

    arg, device = row.get("dtype"), str(row.get("device", ""))
    if arg in (None, "auto") and not device.startswith("cuda"):
        return None
    return str(resolve_dtype(arg, "cuda")).replace("torch.", "")
