"""Where a method misses a RULER sample that a reference method passes, with the kept-text evidence.

A score says how often a compression method misses, not why. A miss where the answer left the kept
text (``answers_kept`` < 1, recorded by ``run`` for the prompt-filtering methods) is a selection
miss; one with every answer still kept is the model's. This lists, per method, each sample that the
reference (``full`` by default) passes in full, meaning every expected output found (per-sample
score 1 under the task's official metric, see :mod:`eval.ruler.metrics`), and the method does not.

Layout as :func:`eval.ruler.report.find_runs`; rows are matched by their ``index`` (the sample number).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from gemfilter.toolkit.io import write_text_atomic

from .metrics import METRICS, postprocess_pred
from .report import check_indices, find_runs, read_rows, samples_at, scope_text
from .tasks import BY_NAME, TASKS


@dataclass(frozen=True)
class Miss:
    """One sample the reference passes and ``method`` does not. score: the method's per-sample score
    (0-1); answers_kept: share of the expected outputs in its kept prompt text (None: not recorded,
    as for full and the KV-cache methods, which keep no text)."""

    length: str
    method: str
    task: str
    index: int
    score: float
    answers_kept: float | None
    pred: str
    outputs: tuple


def sample_score(task: str, row: dict) -> float:
    """The official per-sample metric of ``task`` on one prediction row (0-1)."""
    return METRICS[BY_NAME[task].spec.metric].score(postprocess_pred(row["pred"]), row["outputs"])


def _by_index(path, num_samples) -> dict:
    rows = read_rows(path, num_samples)
    check_indices(rows, path, "it cannot be matched with the reference's sample")
    return {r["index"]: r for r in rows}


@dataclass(frozen=True)
class Comparison:
    """Every method folder under a root against the reference ``against``.

    passed: {(length, task): (samples the reference passes, samples it has)}; methods: {length:
    [method labels, report order]}; compared: {(length, method): samples the reference passes that
    the method has}; misses: [Miss], in that order; kept: {(length, method, task): mean answers_kept
    over the method's samples, where recorded}.
    """

    against: str
    num_samples: int | dict | None
    passed: dict
    methods: dict
    compared: dict
    misses: list
    kept: dict


def find_misses(root, against: str = "full", num_samples=None) -> Comparison:
    """Compare every method folder under ``root`` with ``against``; num_samples: only samples 0..n-1,
    one n for every length or {length label: n} (as ``score --num-samples``, see
    :func:`eval.ruler.report.parse_scope`)."""
    runs = find_runs(root)
    refs = {L: d for L, m, d in runs if m == against}
    if not refs:
        raise ValueError(
            f"no {against!r} predictions under {root}; --against takes one of the method folders "
            f"there: {', '.join(sorted({m for _, m, _ in runs}))}"
        )
    passed, misses, kept, methods, compared = {}, [], {}, {}, {}
    for L, ref_dir in refs.items():
        n = samples_at(num_samples, L)
        ref = {t.name: _by_index(ref_dir / f"{t.name}.jsonl", n) for t in TASKS}
        good = {t: {i for i, r in rows.items() if sample_score(t, r) == 1.0} for t, rows in ref.items()}
        passed.update({(L, t): (len(good[t]), len(ref[t])) for t in ref if ref[t]})
        for L2, method, folder in runs:
            if L2 != L or method == against:
                continue
            methods.setdefault(L, []).append(method)
            for t in ref:
                rows = _by_index(folder / f"{t}.jsonl", n)
                shares = [r["answers_kept"] for r in rows.values() if isinstance(r.get("answers_kept"), (int, float))]
                if shares:
                    kept[L, method, t] = sum(shares) / len(shares)
                both = sorted(good[t] & rows.keys())
                compared[L, method] = compared.get((L, method), 0) + len(both)
                for i in both:
                    score = sample_score(t, rows[i])
                    if score < 1.0:
                        misses.append(
                            Miss(
                                L,
                                method,
                                t,
                                i,
                                score,
                                rows[i].get("answers_kept"),
                                rows[i]["pred"],
                                tuple(rows[i]["outputs"]),
                            )
                        )
    return Comparison(against, num_samples, passed, methods, compared, misses, kept)


def _cell(text: str, width: int = 60) -> str:
    one = " ".join(str(text).split()).replace("|", "\\|")
    return one if len(one) <= width else one[: width - 1] + "…"


def markdown(c: Comparison) -> str:
    """failures.md: per length, what the reference passes; per method, a table of its misses and its
    mean answers_kept per task."""
    short = {t.name: t.short for t in TASKS}
    lines = [
        f"# RULER: where a method misses a sample `{c.against}` passes",
        "",
        f"Scope: {scope_text(c.num_samples)}. A sample passes when every expected output is found (per-sample "
        "score 1 under the task's official metric). answers_kept: share of the expected outputs in the "
        "method's kept prompt text (- where not recorded: full and the KV-cache methods keep no text).",
        "",
    ]
    for L, methods in c.methods.items():
        counts = [f"{short[t]} {p}/{n}" for (L2, t), (p, n) in c.passed.items() if L2 == L]
        lines += [f"## Length {L}", "", f"`{c.against}` passes: " + ", ".join(counts) + ".", ""]
        for method in methods:
            mine = [x for x in c.misses if x.length == L and x.method == method]
            lines += [
                f"### {method}: misses {len(mine)} of the {c.compared[L, method]} samples `{c.against}` passes "
                "that it has",
                "",
            ]
            if mine:
                lines += [
                    "| Task | Sample | Score | answers_kept | Prediction | Expected |",
                    "|---|---|---|---|---|---|",
                ]
                lines += [
                    f"| {short[x.task]} | {x.index} | {x.score:.2f} | "
                    f"{'-' if x.answers_kept is None else f'{x.answers_kept:.2f}'} | {_cell(x.pred)} | "
                    f"{_cell(', '.join(x.outputs))} |"
                    for x in mine
                ]
                lines.append("")
            shares = [f"{short[t]} {c.kept[L, method, t]:.2f}" for t in short if (L, method, t) in c.kept]
            if shares:
                lines += ["Mean answers_kept over its samples: " + ", ".join(shares) + ".", ""]
    return "\n".join(lines)


def write_failures(root, against: str = "full", num_samples=None) -> Path:
    """Write ``failures.md`` in ``root`` (see :func:`find_misses`); return its path."""
    path = Path(root) / "failures.md"
    write_text_atomic(path, markdown(find_misses(root, against, num_samples)))
    return path
