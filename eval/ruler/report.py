"""Score RULER prediction folders and write the task x method table (markdown, CSV) and a PNG.

Source: NVIDIA/RULER ``scripts/eval/evaluate.py`` (per task file: postprocess, metric, score, nulls)
and the RULER paper's tables (tasks as columns, the suite average). Folder layout: ``DIR/<L>/pred/<label>/
<task>.jsonl`` as written by ``run``; ``DIR`` may also be one ``pred`` folder of method folders, or one
method folder of ``<task>.jsonl`` files (RULER's own ``pred/``), scored as length "?".
"""

from __future__ import annotations

import csv
import io
import math
import re
import warnings
from pathlib import Path

from eval.rundir import rows_to_score, task_names
from gemfilter.toolkit.io import read_json_object, read_jsonl, save_png, write_text_atomic

from .metrics import postprocess_pred, suite_average, task_score
from .tasks import BY_NAME, OFFLINE, TASKS, parse_lengths


def _has_jsonl(folder: Path) -> bool:
    return bool(task_names(folder) & set(BY_NAME))


def _label_order(folder: Path) -> tuple:
    """full first, then by method name and numeric budget (gemfilter_k256 before gemfilter_k1024)."""
    m = re.fullmatch(r"(.+)_([kr])([0-9.]+)", folder.name)
    base, budget = (m.group(1), float(m.group(3))) if m else (folder.name, -1.0)
    return folder.name != "full", base, budget


def find_runs(root) -> list:
    """[(length label, method label, folder)] under ``root`` (see the module docstring)."""
    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"{root} is not a folder; give a RULER output folder (holding <length>/pred/)")
    found = []
    for length_dir in sorted((d for d in root.iterdir() if d.is_dir() and d.name.isdigit()), key=lambda d: int(d.name)):
        pred = length_dir / "pred"
        if pred.is_dir():
            found += [
                (length_dir.name, d.name, d)
                for d in sorted(pred.iterdir(), key=_label_order)
                if d.is_dir() and _has_jsonl(d)
            ]
    if not found and _has_jsonl(root):
        found = [("?", root.name, root)]
    elif not found:
        found = [("?", d.name, d) for d in sorted(root.iterdir(), key=_label_order) if d.is_dir() and _has_jsonl(d)]
    if not found:
        raise ValueError(
            f"no predictions under {root}: expected <length>/pred/<method>/<task>.jsonl, a folder of "
            "method folders, or one folder of <task>.jsonl files (rows with pred and outputs)"
        )
    return found


def score_folder(folder, num_samples: int | None = None) -> dict:
    """{task: {"score", "nulls", "n"}} for one method folder (official evaluate.py per task file).

    num_samples: score only the rows with ``index`` < n (this project's index is the sample number), so
    a folder that also holds a larger run's samples still gives the table of the first n, whatever the
    rows' order; a task with fewer of them gets a warning. None: every row.
    """
    folder = Path(folder)
    out = {}
    for task in TASKS:
        rows = read_rows(folder / f"{task.name}.jsonl", num_samples)
        if rows:
            preds = [r["pred"] for r in rows]
            out[task.name] = {
                "score": task_score(task.spec.metric, preds, [r["outputs"] for r in rows]),
                "nulls": sum(len(postprocess_pred(p)) == 0 for p in preds),
                "n": len(rows),
            }
    return out


def read_rows(path, num_samples: int | None = None) -> list:
    """The prediction rows of one task file and its unmerged shards ([] if there are none), each sample once
    (:func:`eval.rundir.rows_to_score`), samples 0..n-1 only if ``num_samples``.

    Strict: a skipped row would change a score silently, so a bad row raises and is named.
    """
    path = Path(path)
    rows = rows_to_score(
        path,
        lambda p: read_jsonl(
            p,
            required=("pred", "outputs"),
            strict=True,
            fix=f"RULER prediction rows hold pred and outputs; delete "
            f"that line of {p} and rerun the same `run` command, which recomputes that sample",
        ),
        sample_key,
        required=("pred", "outputs"),
    )
    if not rows:
        return []
    for i, row in enumerate(rows, 1):
        if not isinstance(row["pred"], str) or not isinstance(row["outputs"], list):
            raise ValueError(f"{path}: row {i}: pred must be a string and outputs a list of strings")
    return rows if num_samples is None else first_samples(rows, num_samples, path)


def sample_key(row: dict):
    """A prediction row's sample: its ``_id`` (this project's resume key), else its integer ``index``, else None."""
    if row.get("_id") is not None:
        return str(row["_id"])
    index = row.get("index")
    return str(index) if isinstance(index, int) and not isinstance(index, bool) else None


def check_indices(rows: list, path, why: str) -> None:
    """ValueError naming the first row of ``path`` without an integer ``index`` (the sample number),
    and ``why`` that matters."""
    bad = [i for i, r in enumerate(rows, 1) if isinstance(r.get("index"), bool) or not isinstance(r.get("index"), int)]
    if bad:
        raise ValueError(f"{path}: row {bad[0]} has no integer index, so {why}")


def first_samples(rows: list, n: int, path) -> list:
    """The rows of samples 0..n-1 (by ``index``); ValueError if a row has no integer index."""
    check_indices(rows, path, "--num-samples cannot tell which samples come first; score without --num-samples")
    kept = [r for r in rows if r["index"] < n]
    if len(kept) < n:
        warnings.warn(f"{path}: {len(kept)} of the first {n} samples are there; that task is scored on those")
    return kept


def parse_scope(text) -> int | dict | None:
    """score's and failures' ``--num-samples``: None or "" (every row), "N" (samples 0..N-1 at every
    length) or "L=N,..." per length, e.g. "4096=20,8192=2" or "4k=20,8k=2" (k = 1024, as --lengths);
    a length not named there is scored on every row. Returns None, an int, or {length label: n}."""
    if text is None or str(text).strip() == "":
        return None
    allowed = (
        "allowed: a whole number N >= 1 (samples 0..N-1 at every length) or counts per length, "
        "e.g. 4096=20,8192=2 or 4k=20,8k=2"
    )

    def count(item, digits):
        try:
            n = int(digits)
        except ValueError:
            raise ValueError(f"--num-samples: {item!r} is not a sample count; {allowed}") from None
        if n < 1:
            raise ValueError(f"--num-samples must be >= 1 (or omitted for every row), got {item!r}; {allowed}")
        return n

    text = str(text).strip()
    if "=" not in text:
        return count(text, text)
    scope = {}
    for item in (s.strip() for s in text.split(",")):
        length, sep, n = item.partition("=")
        if not sep or not length.strip():
            raise ValueError(f"--num-samples: {item!r} is not LENGTH=N; {allowed}")
        try:
            (key,) = parse_lengths(length)
        except ValueError as e:
            raise ValueError(f"--num-samples: {item!r}: {str(e).removeprefix('--lengths: ')}") from None
        if str(key) in scope:
            raise ValueError(f"--num-samples names length {key} twice; give each length once")
        scope[str(key)] = count(item, n)
    return scope


def samples_at(num_samples, length: str) -> int | None:
    """The sample count :func:`parse_scope`'s value gives ``length`` (a length label such as "4096")."""
    return num_samples.get(length) if isinstance(num_samples, dict) else num_samples


def scope_text(num_samples) -> str:
    """Words for a :func:`parse_scope` value, e.g. "samples 0..19 of each task at 4096, 0..1 at 8192"."""
    if num_samples is None:
        return "every sample of each task"
    if not isinstance(num_samples, dict):
        return f"samples 0..{num_samples - 1} of each task"
    named = ", ".join(f"0..{n - 1} at {L}" for L, n in num_samples.items())
    return f"samples {named} of each task (every sample at any other length)"


def collect(root, num_samples=None) -> dict:
    """{(length, method): {task: score entry}} for every method folder under ``root`` (see :func:`score_folder`).

    num_samples: a :func:`parse_scope` value: None, one count for every length, or {length: count}.
    """
    return {(L, m): s for L, m, d in find_runs(root) if (s := score_folder(d, samples_at(num_samples, L)))}


def _fmt(x) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.2f}"


def table(results: dict) -> tuple:
    """(header, rows, tasks): one row per (length, method), task scores, then both suite averages."""
    present = {t for s in results.values() for t in s}
    cols = [t for t in TASKS if t.name in present]
    header = ["Length", "Method"] + [t.short for t in cols] + ["Avg (11 offline)", "Avg (13)"]
    rows = []
    for (L, m), s in results.items():
        scores = {t: e["score"] for t, e in s.items()}
        rows.append(
            [L, m]
            + [_fmt(scores.get(t.name)) for t in cols]
            + [_fmt(suite_average(scores, OFFLINE)), _fmt(suite_average(scores, BY_NAME))]
        )
    return header, rows, cols


def samples_note(results: dict) -> str:
    ns = sorted({e["n"] for s in results.values() for e in s.values()})
    nulls = sum(e["nulls"] for s in results.values() for e in s.values())
    return (
        f"Samples per task: {', '.join(map(str, ns))}. Empty predictions: {nulls}. Scores: round(100 x mean, 2); "
        "string_match_all (niah, vt, cwe, fwe) or string_match_part (qa), as RULER's evaluate.py. "
        "Averages: plain mean over the 11 offline tasks / all 13 ('-' unless every task was scored)."
    )


def markdown(results: dict, settings: str = "") -> str:
    header, rows, _ = table(results)
    lines = ["# RULER", ""] + ([settings, ""] if settings else [])
    lines += ["| " + " | ".join(f"**{h}**" for h in header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(lines + ["", samples_note(results)]) + "\n"


def csv_text(results: dict) -> str:
    header, rows, cols = table(results)
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["length", "method"] + [t.name for t in cols] + ["avg_offline", "avg_all"])
    w.writerows([[("" if c == "-" else c) for c in r] for r in rows])
    return buf.getvalue()


def png(results: dict, path, title: str = "RULER") -> Path:
    """One heatmap per length: methods x tasks, cells annotated with the score (0-100)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np
    from matplotlib.colors import LinearSegmentedColormap

    from eval.palette import COLORS

    lengths = list(dict.fromkeys(L for L, _ in results))
    _, _, cols = table(results)
    cmap = LinearSegmentedColormap.from_list("ruler", COLORS).with_extremes(bad="#DDDDDD")
    n_methods = max(sum(1 for L2, _ in results if L2 == L) for L in lengths)
    fig, axes = plt.subplots(
        len(lengths),
        1,
        squeeze=False,
        layout="constrained",
        figsize=(1.6 + 0.75 * (len(cols) + 1), 1.2 + (0.45 * n_methods + 0.9) * len(lengths)),
    )
    for ax, L in zip(axes[:, 0], lengths):
        methods = [m for L2, m in results if L2 == L]
        grid = np.full((len(methods), len(cols) + 1), np.nan)
        for i, m in enumerate(methods):
            scores = {t: e["score"] for t, e in results[L, m].items()}
            for j, t in enumerate(cols):
                grid[i, j] = scores.get(t.name, np.nan)
            grid[i, -1] = suite_average(scores, OFFLINE)
        mesh = ax.pcolormesh(np.ma.masked_invalid(grid), cmap=cmap, vmin=0, vmax=100, edgecolors="grey", linewidth=0.5)
        for (i, j), v in np.ndenumerate(grid):
            if np.isfinite(v):
                ax.text(j + 0.5, i + 0.5, f"{v:.0f}", ha="center", va="center", fontsize=8)
        ax.set_xticks(np.arange(len(cols) + 1) + 0.5)
        ax.set_xticklabels([t.short for t in cols] + ["Avg"])
        ax.set_yticks(np.arange(len(methods)) + 0.5)
        ax.set_yticklabels(methods)
        ax.set_ylim(len(methods), 0)
        ax.set_title(f"{title}, {L} tokens" if L != "?" else title)
    fig.colorbar(mesh, ax=axes.ravel().tolist(), label="score (0-100)", shrink=0.9)
    save_png(fig, path, dpi=110)
    return Path(path)


def write_report(root, settings: str = "", title: str = "RULER", num_samples=None) -> list:
    """Score every method folder under ``root``; write report.md, report.csv, report.png there; return the paths.

    num_samples: only the first n samples of each task (see :func:`score_folder`), one n for every
    length or {length label: n} (see :func:`parse_scope`); None: all.
    """
    root = Path(root)
    results = collect(root, num_samples)
    if not results:
        raise ValueError(f"no scored predictions under {root}: every prediction file is empty")
    if not settings and (root / "config.json").is_file():
        config = read_json_object(
            root / "config.json", "run config", fix="Fix it or delete it; the report then omits the settings line"
        )
        settings = "Settings (config.json): " + ", ".join(f"{k} {v}" for k, v in config.items()) + "."
    md, cv = root / "report.md", root / "report.csv"
    write_text_atomic(md, markdown(results, settings))
    write_text_atomic(cv, csv_text(results))
    return [md, cv, png(results, root / "report.png", title)]
