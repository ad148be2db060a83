"""Score LongBench prediction folders (official layout) and render the GemFilter paper's Table 9.1 layout.

Source: THUDM/LongBench (v1) ``eval.py`` scores every ``<task>.jsonl`` of ``pred/<model>/`` (or
``pred_e/<model>/`` with length buckets) and writes ``result.json`` there; the table layout (methods
as rows, tasks as columns grouped by category, "Average" = plain mean of the 14 paper tasks) is
Table 9.1 of Shi et al. 2024.

Folders accepted by :func:`find_runs`: an output folder holding ``pred/`` and/or ``pred_e/``; a
``pred``-style folder of method sub-folders; or one method folder of ``<task>.jsonl`` files.
"""

from __future__ import annotations

import csv
import io
import json
import math
import warnings
from pathlib import Path

from eval.rundir import rows_to_score, task_names
from gemfilter.toolkit.io import CorruptFileError, read_json_object, read_jsonl, write_text_atomic

from .metrics import BUCKETS, score_rows
from .tasks import BY_NAME, CATEGORIES, PAPER_TASKS, TASKS

KINDS = ("pred", "pred_e")


def _has_jsonl(folder: Path) -> bool:
    return bool(task_names(folder))


def find_runs(root, e: bool | None = None) -> list:
    """[(kind, method, folder)] under ``root``; kind is "pred" or "pred_e".

    In a ``run`` output folder the sub-folder names (pred/, pred_e/) give the kind; elsewhere ``e``
    does (None: LongBench-E only if the folder is named pred_e, like the official pred_e/).

    ValueError if ``root`` holds no prediction files in any accepted layout.
    """
    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"{root} is not a folder; give a LongBench output or prediction folder")
    found = []
    if any((root / k).is_dir() for k in KINDS):  # a `run` output folder: the folder names tell the kind
        for kind in KINDS:
            if (root / kind).is_dir():
                found += [(kind, d.name, d) for d in sorted((root / kind).iterdir()) if d.is_dir() and _has_jsonl(d)]
    else:
        kind = "pred_e" if (root.name == "pred_e" if e is None else e) else "pred"
        if _has_jsonl(root):
            found = [(kind, root.name, root)]
        else:
            found = [(kind, d.name, d) for d in sorted(root.iterdir()) if d.is_dir() and _has_jsonl(d)]
    if not found:
        raise ValueError(
            f"no predictions under {root}: expected pred/<method>/<task>.jsonl (or pred_e/...), "
            "a folder of method folders, or one folder of <task>.jsonl files"
        )
    return found


def score_folder(folder, e: bool = False, write: bool = True) -> dict:
    """Official ``eval.py`` on one method folder: {task: score} or, with ``e``, {task: {bucket: score}}.

    Files whose name is not a task of the table (e.g. Chinese tasks) are skipped with a warning.
    write: also write ``result.json`` there, as eval.py does (an empty bucket is written as null).
    """
    folder = Path(folder)
    scores = {}
    for name in sorted(task_names(folder), key=lambda n: (_order(n), n)):
        task, path = BY_NAME.get(name), folder / f"{name}.jsonl"
        if task is None:
            warnings.warn(f"{path.name}: not an English LongBench v1 task; skipped (known: {', '.join(BY_NAME)})")
            continue
        # each sample once (by this project's _id; official pred files have none), pending shards included
        rows = rows_to_score(
            path,
            lambda p: read_prediction_rows(p, e),
            lambda r: r.get("_id"),
            required=("pred", "answers", "length") if e else ("pred", "answers"),
        )
        if rows:
            scores[task.config] = score_rows(task, rows, e=e)
    if write:
        clean = {
            k: ({b: _json_num(s) for b, s in v.items()} if isinstance(v, dict) else _json_num(v))
            for k, v in scores.items()
        }
        write_text_atomic(folder / "result.json", json.dumps(clean, ensure_ascii=False, indent=4) + "\n")
    return scores


ROW_HELP = (
    "prediction rows are JSON objects holding pred (a string), answers (a list of strings), all_classes and "
    "length (official pred.py output)"
)


def read_prediction_rows(path: Path, e: bool = False) -> list:
    """The rows of one ``<task>.jsonl``; CorruptFileError on any row that cannot be scored.

    A row that is not JSON, not an object, or lacks a field would otherwise be skipped and the task
    scored over the rest, which is a wrong number; so scoring stops and names the line.
    """
    need = ("pred", "answers", "length") if e else ("pred", "answers")
    fix = (
        f"{ROW_HELP}. Fix or delete that line; in a `run` output folder, deleting it and rerunning the same "
        "`run` command recomputes that sample"
    )
    rows = read_jsonl(path, required=need, strict=True, fix=fix)
    for i, row in enumerate(rows, 1):
        bad = None
        if not isinstance(row["pred"], str):
            bad = f"'pred' is {json.dumps(row['pred'])}, not a string"
        elif not isinstance(row["answers"], list) or not all(isinstance(a, str) for a in row["answers"]):
            bad = f"'answers' is {json.dumps(row['answers'])[:80]}, not a list of strings"
        elif e and (isinstance(row["length"], bool) or not isinstance(row["length"], (int, float))):
            bad = f"'length' is {json.dumps(row['length'])}, not a number"
        if bad:
            raise CorruptFileError(f"{path}: row {i} cannot be scored: {bad}. {fix}")
    return rows


def _json_num(x):
    return None if isinstance(x, float) and math.isnan(x) else x


def _order(config: str) -> int:
    return list(BY_NAME).index(config) if config in BY_NAME else len(BY_NAME)


def paper_average(scores: dict) -> float:
    """Plain mean of the 14 paper tasks, rounded to 2 places; NaN unless all 14 were scored."""
    if not all(t in scores for t in PAPER_TASKS):
        return math.nan
    return round(sum(scores[t] for t in PAPER_TASKS) / len(PAPER_TASKS), 2)


def _fmt(x) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.2f}"


def _columns(results: dict) -> list:
    """Task rows that any method scored, in table order."""
    present = {t for scores in results.values() for t in scores}
    return [t for t in TASKS if t.config in present]


def table_rows(results: dict, e: bool = False) -> tuple:
    """(header labels, rows of cells) for {method: scores}; E rows are (method, bucket)."""
    cols = _columns(results)
    if not e:
        header = ["Method"] + [t.short for t in cols] + ["Average"]
        rows = [[m] + [_fmt(s.get(t.config)) for t in cols] + [_fmt(paper_average(s))] for m, s in results.items()]
    else:
        header = ["Method", "Length"] + [t.short for t in cols]
        rows = [
            [m, b] + [_fmt(s.get(t.config, {}).get(b)) for t in cols] for m, s in results.items() for b, _ in BUCKETS
        ]
    return header, rows, cols


def markdown(results: dict, e: bool = False, title: str = "LongBench v1", settings: str = "") -> str:
    """Markdown table: a category row on top (as Table 9.1's grouped header), then the task names."""
    header, rows, cols = table_rows(results, e)
    lead = 2 if e else 1
    groups = [""] * lead
    for i, t in enumerate(cols):
        groups.append(CATEGORIES[t.category] if i == 0 or cols[i - 1].category != t.category else "")
    groups += [""] * (len(header) - len(groups))
    lines = [f"# {title}", ""] + ([settings, ""] if settings else [])
    lines += [
        "| " + " | ".join(groups) + " |",
        "|" + "---|" * len(header),
        "| " + " | ".join(f"**{h}**" for h in header) + " |",
    ]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    if not e:
        lines += [
            "",
            "Average: plain mean of the paper's 14 tasks (NrtvQA to PRe), shown only when all 14 were "
            "scored. Scores: round(100 x mean, 2) per task, official LongBench metrics.",
        ]
    else:
        lines += ["", "LongBench-E: scores bucketed by the record's length (0-4k, 4-8k, 8k+); '-' = no sample."]
    return "\n".join(lines) + "\n"


def csv_text(results: dict, e: bool = False) -> str:
    """CSV with one header row of task configs (machine-readable), same rows as the markdown."""
    header, rows, cols = table_rows(results, e)
    names = ["method"] + (["length"] if e else []) + [t.config for t in cols] + ([] if e else ["average"])
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(names)
    writer.writerows([[("" if c == "-" else c) for c in r] for r in rows])
    return buf.getvalue()


def write_report(root, e: bool | None = None, settings: str = "") -> list:
    """Score every method folder under ``root`` and write report.md / report.csv (report_e.* for
    LongBench-E) into ``root``; returns the paths written. e: None = by folder name (pred / pred_e)."""
    root = Path(root)
    paths = []
    runs = find_runs(root, e)
    if not settings and (root / "config.json").is_file():  # a `run` folder scored later: say its setup
        config = read_json_object(
            root / "config.json",
            "LongBench run config",
            fix=f"Delete {root / 'config.json'} to score without it (the report then names no settings)",
        )
        settings = "Settings (config.json): " + ", ".join(f"{k} {v}" for k, v in config.items()) + "."
    for kind in KINDS:
        mine = [(m, d) for k, m, d in runs if k == kind]
        if not mine:
            continue
        is_e = kind == "pred_e"
        results = {m: score_folder(d, e=is_e) for m, d in mine}
        suffix = "_e" if is_e else ""
        md = root / f"report{suffix}.md"
        write_text_atomic(md, markdown(results, is_e, "LongBench-E" if is_e else "LongBench v1", settings))
        cv = root / f"report{suffix}.csv"
        write_text_atomic(cv, csv_text(results, is_e))
        paths += [md, cv]
    return paths
