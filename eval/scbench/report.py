"""SCBench tables and figure from a run folder: accuracy per turn and per task, time to first token per turn.

Scores are the official ones (``eval.scbench.scoring``), recomputed from each row's prediction and
ground truth, not read from the row's ``score``. Multi-turn accuracy is one mean per turn
(``compute_scores``); multi-request pools every (sample, query), and is shown per query position too.
"""

from __future__ import annotations

import math
from pathlib import Path

from eval.rundir import rows_to_score
from gemfilter.toolkit.io import corrupt, jsonl_lines

from .scoring import score_one
from .tasks import get_task

REPORT = "report.md"
FIGURE = "report.png"


def row_problem(row) -> str | None:
    """Why a stored row cannot be scored (None if it can): an object with ``_id`` and a non-empty list of
    ``turns``, each an object with a whole ``turn_idx``, a string ``prediction``, a ``ground_truth`` and a
    number ``ttft_s``."""
    if not isinstance(row, dict):
        return f"a row must be a JSON object, got {'null' if row is None else type(row).__name__}"
    missing = [k for k in ("_id", "turns") if k not in row]
    if missing:
        return f"the row lacks {', '.join(missing)}"
    turns = row["turns"]
    if not isinstance(turns, list) or not turns:
        return "'turns' must be a non-empty list of turns"
    for j, turn in enumerate(turns):
        if not isinstance(turn, dict):
            return f"turns[{j}] must be an object, got {type(turn).__name__}"
        lacks = [k for k in ("turn_idx", "prediction", "ground_truth", "ttft_s") if k not in turn]
        if lacks:
            return f"turns[{j}] lacks {', '.join(lacks)}"
        if isinstance(turn["turn_idx"], bool) or not isinstance(turn["turn_idx"], int) or turn["turn_idx"] < 0:
            return f"turns[{j}].turn_idx must be a whole number >= 0, got {turn['turn_idx']!r}"
        if not isinstance(turn["prediction"], str):
            return f"turns[{j}].prediction must be a string, got {turn['prediction']!r}"
        t = turn["ttft_s"]
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) or t < 0:
            return f"turns[{j}].ttft_s must be a number of seconds >= 0, got {t!r}"
    return None


def read_rows(path: Path) -> list:
    """Every row of one result file and its unmerged shards, each sample once. A row that cannot be scored is
    an error naming its file and line (a shard's: its file and sample), never a traceback."""

    def read(p):
        rows = []
        for i, row, unreadable in jsonl_lines(p):
            problem = f"the line is {unreadable}" if unreadable is not None else row_problem(row)
            if problem is not None:
                raise corrupt(f"{p}:{i}", problem, f"Fix or delete line {i} of {p}, then run the report again")
            rows.append(row)
        return rows

    rows = rows_to_score(path, read, lambda r: r.get("_id"), required=("_id", "turns"))
    for row in rows:  # rows of unmerged shards were read leniently: check them as strictly
        problem = row_problem(row)
        if problem is not None:
            raise corrupt(
                f"{path.parent} ({path.stem}'s shards, sample {row.get('_id')!r})",
                problem,
                "Fix or delete that row, or rerun the same `run` command to merge the shards",
            )
    return rows


def collect(out) -> dict:
    """{(mode, length, label, task): rows} over ``out/<mode>/<L>/<label>/<task>.jsonl``."""
    found = {}
    for path in sorted(Path(out).glob("*/*/*/*.jsonl*")):
        if not (path.name.endswith(".jsonl") or ".jsonl.rank" in path.name):
            continue
        mode, length, label = path.parts[-4:-1]
        task = path.name.split(".jsonl")[0]
        key = (mode, int(length), label, task)
        if key not in found:
            found[key] = read_rows(path.parent / f"{task}.jsonl")
    return found


def score_table(found: dict) -> dict:
    """{(mode, length, label, task): {"acc": [per turn], "ttft": [mean s per turn], "n": samples, "prefill": mean
    s of the shared context's prefill (multi-request; None in multi-turn, where turn 1 holds it)}}."""
    table = {}
    for key, rows in found.items():
        if not rows:  # a file with no rows yet says nothing
            continue
        task = key[3]
        get_task(task)
        turns = max(len(r["turns"]) for r in rows)
        acc = [
            [
                score_one(task, t["prediction"], t["ground_truth"])
                for r in rows
                for t in r["turns"]
                if t["turn_idx"] == i
            ]
            for i in range(turns)
        ]
        ttft = [[t["ttft_s"] for r in rows for t in r["turns"] if t["turn_idx"] == i] for i in range(turns)]
        prefill = [r["prefill_s"] for r in rows if r.get("prefill_s") is not None]

        def recorded(field):
            """The per-turn means of an optional field (None for a turn no row records it on)."""
            got = [
                [t[field] for r in rows for t in r["turns"] if t["turn_idx"] == i and t.get(field) is not None]
                for i in range(turns)
            ]
            return [sum(x) / len(x) if x else None for x in got]

        table[key] = {
            "acc": [sum(a) / len(a) for a in acc],
            "ttft": [sum(x) / len(x) for x in ttft],
            "n": len(rows),
            "prefill": sum(prefill) / len(prefill) if prefill else None,
            "recomputed": recorded("recomputed"),
            "select": recorded("select_s"),
        }
    return table


#: The per-turn tables of optional row fields, after the time to first token: (field, title, format of a mean).
RECORDED = (
    (
        "select",
        "The selection's part of the time to first token (s, mean over tasks and samples; - where not recorded).",
        "{:.2f}",
    ),
    (
        "recomputed",
        "Tokens run through the model per turn (mean over tasks and samples; - where not recorded).",
        "{:.0f}",
    ),
)


def _fmt(values, scale=100.0, digits=1) -> str:
    return " | ".join(f"{v * scale:.{digits}f}" for v in values)


def markdown(table: dict, settings: str = "") -> str:
    """Per (mode, length): accuracy per turn for each method and task, their mean over tasks, and each
    method's mean time to first token per turn with its ratio to ``full``."""
    lines = ["# SCBench (offline synthetic tasks)", ""] + ([settings, ""] if settings else [])
    for mode, length in sorted({(k[0], k[1]) for k in table}):
        cells = {k: v for k, v in table.items() if k[:2] == (mode, length)}
        turns = max(len(v["acc"]) for v in cells.values())
        head = " | ".join(f"turn {i + 1}" for i in range(turns))
        lines += [
            f"## {mode}, {length} tokens",
            "",
            "Accuracy (%) per turn. n: samples per task.",
            "",
            f"| method | task | n | {head} | mean |",
            "|---|---|---|" + "---|" * (turns + 1),
        ]
        labels = list(dict.fromkeys(k[2] for k in sorted(cells)))
        for label in labels:
            rows = [(k[3], v) for k, v in sorted(cells.items()) if k[2] == label]
            for task, v in rows:
                lines.append(
                    f"| {label} | {get_task(task).label} | {v['n']} | {_fmt(v['acc'])} | "
                    f"{100 * sum(v['acc']) / len(v['acc']):.1f} |"
                )
            per_turn = [sum(v["acc"][i] for _, v in rows) / len(rows) for i in range(turns)]
            lines.append(f"| **{label}** | all tasks | | {_fmt(per_turn)} | {100 * sum(per_turn) / turns:.1f} |")
        tasks_of = {label: sorted(k[3] for k in cells if k[2] == label) for label in labels}

        def mean_ttft(label, tasks):
            return [sum(cells[(mode, length, label, t)]["ttft"][i] for t in tasks) / len(tasks) for i in range(turns)]

        ttft = {label: mean_ttft(label, tasks_of[label]) for label in labels}
        # a ratio compares like with like: full's time over the tasks this label ran, not over all of full's
        base_of = {
            label: mean_ttft("full", tasks_of[label])
            for label in labels
            if set(tasks_of[label]) <= set(tasks_of.get("full", ()))
        }
        base = base_of.get("full")
        pre = {
            label: [v["prefill"] for k, v in cells.items() if k[2] == label and v["prefill"] is not None]
            for label in labels
        }
        shared = mode == "multi-request"
        lines += [
            "",
            "Time to first token (s, mean over tasks and samples) per turn"
            + ("; in brackets, the ratio to full in the same run" if base else "")
            + ("; a turn's time starts after the shared context's prefill, shown apart" if shared else "")
            + ".",
            "",
            f"| method | {'context prefill | ' if shared else ''}{head} |",
            "|---|" + "---|" * (turns + shared),
        ]
        for label in labels:
            own = base_of.get(label)
            cells_ = [
                f"{t:.2f}" + (f" ({t / b:.2f}x)" if own and b > 0 else "")
                for t, b in zip(ttft[label], own or [0] * turns)
            ]
            if shared:
                cells_.insert(0, f"{sum(pre[label]) / len(pre[label]):.2f}" if pre[label] else "-")
            lines.append(f"| {label} | {' | '.join(cells_)} |")
        for field, title, form in RECORDED:
            lines += _recorded(cells, labels, head, turns, field, title, form)
        lines.append("")
    return "\n".join(lines)


def _recorded(cells: dict, labels: list, head: str, turns: int, field: str, title: str, form: str) -> list:
    """A per-turn table of an optional field's means, a row per label that records it (``recomputed``: the tokens
    each turn ran through the model, a turn's new tokens for ``full`` and ``reuse``, the kept tokens rebuilt or
    newly kept for ``reselect`` and ``stable``, and the conversation's kept tokens too for ``stable-cf``;
    ``select``: the seconds of the time to first token the selection took, ``reselect`` and the layouts). A turn
    shows ``-`` unless every task of the label records it; no table when no row does (rows written before the
    field existed). form: the format of one mean."""
    shown = {}
    for label in labels:
        per = [v.get(field) or [None] * turns for k, v in cells.items() if k[2] == label]
        means = []
        for i in range(turns):
            got = [p[i] for p in per if i < len(p) and p[i] is not None]
            means.append(sum(got) / len(got) if len(got) == len(per) else None)
        if any(m is not None for m in means):
            shown[label] = means
    if not shown:
        return []
    lines = ["", title, "", f"| method | {head} |", "|---|" + "---|" * turns]
    for label, means in shown.items():
        lines.append(f"| {label} | {' | '.join('-' if m is None else form.format(m) for m in means)} |")
    return lines


# Matplotlib's default cycle has ten colours, and a run of every method and protocol draws more lines than that:
# the colour names the method, the dash pattern and marker its protocol, and the marker moves on past ten methods.
DASHES = ("-", ":", "--", "-.", (0, (5, 1)), (0, (3, 1, 1, 1, 1, 1)), (0, (1, 3)), (0, (8, 2, 2, 2)))
MARKERS = ("o", "s", "^", "D", "v", "P")
# (dash pattern, marker shift) of each protocol: a label without one (full, the cache methods) and reselect are
# both solid, the one with circles, the other with squares
PROTOCOL_STYLES = {
    "": (DASHES[0], 0),
    "reselect": (DASHES[0], 1),
    "reuse": (DASHES[1], 0),
    "stable": (DASHES[2], 0),
    "stable-cf": (DASHES[3], 0),
    "stable-gap": (DASHES[4], 0),
    "stable-front": (DASHES[5], 0),
    "stable-late": (DASHES[6], 0),
    "stable-late-runs": (DASHES[7], 0),
}


def line_styles(labels) -> dict:
    """{label: (colour, dash pattern, marker)} for a figure's lines, one distinct triple per label (for up to twenty
    methods and eight protocols that ``PROTOCOL_STYLES`` does not name).

    labels: method labels as the tables show them, ``METHOD`` or ``METHOD@PROTOCOL``. A method keeps its colour under
    every protocol (matplotlib's ten ``C0``..``C9``, in the order of ``labels``); a protocol keeps its dash pattern in
    every figure and, among the first ten methods, its marker (``PROTOCOL_STYLES``; one it does not name gets a
    pattern of its own, after them); the next ten methods take the colours again with other markers."""
    split = {label: (label.rsplit("@", 1) + [""])[:2] for label in labels}
    methods = list(dict.fromkeys(m for m, _ in split.values()))
    extra = sorted({p for _, p in split.values() if p not in PROTOCOL_STYLES})
    styles = {**PROTOCOL_STYLES, **{p: (DASHES[i % len(DASHES)], 2 + i // len(DASHES)) for i, p in enumerate(extra)}}
    shifts = 1 + max(shift for _, shift in styles.values())  # the markers one group of ten methods takes
    out = {}
    for label, (method, protocol) in split.items():
        m = methods.index(method)
        dashes, shift = styles[protocol]
        out[label] = (f"C{m % 10}", dashes, MARKERS[(m // 10 * shifts + shift) % len(MARKERS)])
    return out


def figure(table: dict, path) -> None:
    """Accuracy (mean over tasks) against turn, one line per label (method and protocol), one panel per (mode,
    length); a PNG. A label has the same style in every panel (:func:`line_styles`)."""
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    from gemfilter.toolkit.io import save_png

    panels = sorted({(k[0], k[1]) for k in table})
    styles = line_styles(dict.fromkeys(k[2] for k in sorted(table)))  # over all panels: one colour per method
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 3.6), squeeze=False)
    for ax, (mode, length) in zip(axes[0], panels):
        cells = {k: v for k, v in table.items() if k[:2] == (mode, length)}
        for label in dict.fromkeys(k[2] for k in sorted(cells)):
            color, dashes, marker = styles[label]
            rows = [v["acc"] for k, v in cells.items() if k[2] == label]
            turns = len(rows[0])
            ax.plot(
                range(1, turns + 1),
                [100 * sum(r[i] for r in rows) / len(rows) for i in range(turns)],
                color=color,
                linestyle=dashes,
                marker=marker,
                label=label,
            )
        ax.set(title=f"{mode}, {length} tokens", xlabel="turn", ylabel="accuracy (%)", ylim=(-2, 102))
        ax.set_xticks(range(1, turns + 1))
        ax.grid(alpha=0.3)
    # beside the panels, not on them: with a dozen lines a legend inside covers the lines it names
    axes[0][-1].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0)
    save_png(fig, path, dpi=110, bbox_inches="tight")  # the legend beside the panels included
    plt.close(fig)


def write_report(out, settings: str = "", plot: bool = True) -> list:
    """Write ``report.md`` (and ``report.png``) into ``out``; return the paths written."""
    out = Path(out)
    table = score_table(collect(out))
    if not table:
        raise ValueError(f"{out} holds no SCBench rows (<mode>/<L>/<method>/<task>.jsonl)")
    from gemfilter.toolkit.io import write_text_atomic

    paths = [out / REPORT]
    write_text_atomic(paths[0], markdown(table, settings))
    if plot:
        figure(table, out / FIGURE)
        paths.append(out / FIGURE)
    return paths
