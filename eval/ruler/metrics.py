"""RULER metrics, as NVIDIA/RULER ``scripts/eval/evaluate.py`` and ``scripts/eval/synthetic/constants.py`` compute them.

- ``postprocess_pred``: strip, turn every control character (``\\x00``-``\\x1f``) into a newline, strip;
- ``string_match_all`` (niah, vt, cwe, fwe): per sample the fraction of references found in the
  prediction, case-insensitive substring test; the task score is ``round(100 * mean, 2)``;
- ``string_match_part`` (qa): per sample 1 if any reference is found, else 0; same task score;
- the suite average: the plain mean of the task scores (RULER's "Avg."), here reported over the 11
  offline tasks and, when both QA tasks were scored, over all 13.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

_CONTROL = re.compile(r"[\x00-\x1f]")


def postprocess_pred(pred: str) -> str:
    """evaluate.py's ``postprocess_pred``."""
    return _CONTROL.sub("\n", pred.strip()).strip()


@dataclass(frozen=True)
class StringMatchAll:
    """Share of the references that occur in the prediction (case-insensitive)."""

    name: str = "string_match_all"

    def score(self, pred: str, refs: list) -> float:
        return sum(1.0 if r.lower() in pred.lower() else 0.0 for r in refs) / len(refs)


@dataclass(frozen=True)
class StringMatchPart:
    """1 if any reference occurs in the prediction (case-insensitive), else 0."""

    name: str = "string_match_part"

    def score(self, pred: str, refs: list) -> float:
        return max(1.0 if r.lower() in pred.lower() else 0.0 for r in refs)


METRICS = {m.name: m for m in (StringMatchAll(), StringMatchPart())}


def task_score(metric: str, preds: list, refs: list) -> float:
    """``round(100 * mean over samples, 2)`` after ``postprocess_pred``; ValueError on empty or mismatched input."""
    if metric not in METRICS:
        raise ValueError(f"unknown RULER metric {metric!r}; allowed: {', '.join(METRICS)}")
    if not preds or len(preds) != len(refs):
        raise ValueError(
            f"need as many predictions as reference lists (got {len(preds)} and {len(refs)}), at least one"
        )
    if any(not r for r in refs):
        raise ValueError("every sample needs at least one reference answer")
    m = METRICS[metric]
    return round(sum(m.score(postprocess_pred(p), r) for p, r in zip(preds, refs)) / len(preds) * 100, 2)


def suite_average(scores: dict, tasks) -> float:
    """Plain mean of ``scores`` over ``tasks``, rounded to 2 places; NaN unless every one was scored."""
    tasks = tuple(tasks)
    if not tasks or not all(t in scores for t in tasks):
        return math.nan
    return round(sum(scores[t] for t in tasks) / len(tasks), 2)
