"""LongBench v1 metrics, registered by name in :data:`METRICS`, and the per-sample / per-task scorers.

Source: THUDM/LongBench (v1) ``metrics.py`` and ``eval.py``. Every metric has the official signature
``fn(prediction, ground_truth, all_classes=None) -> float`` and its exact semantics, quirks included,
because the point is comparing with published tables:

- ``qa_f1``: token F1 of :func:`normalize_answer` outputs (0 without overlap).
- ``rouge``: ROUGE-L F of the PyPI package ``rouge`` (sentences split on ".", words on spaces, no
  lower-casing, union-LCS over unique words, F = 2PR/(P+R+1e-8)); 0.0 on any exception (empty text).
- ``classification``: 1/len(L) over the class names found in the prediction, after the official
  remove-while-iterating loop (which skips the element after each removed one; kept on purpose).
- ``count`` / ``retrieval``: the fraction of all digit runs in the prediction that equal the answer.
- ``code_sim``: fuzzywuzzy's ``fuzz.ratio`` on the first code-like line, reimplemented with difflib.

Per sample (:func:`score_sample`): first-line rule for the tasks flagged ``first_line``, then the max
over the answers, starting from 0. Per task: ``round(100 * mean, 2)``; LongBench-E buckets by length.
"""

from __future__ import annotations

import difflib
import math
import re
import string
from collections import Counter
from typing import Callable

METRICS: dict = {}
#: LongBench-E length buckets: (name, upper bound exclusive), in report order.
BUCKETS = (("0-4k", 4000), ("4-8k", 8000), ("8k+", math.inf))


def register(name: str):
    """Decorator: add ``fn(prediction, ground_truth, all_classes=None) -> float`` to :data:`METRICS`."""

    def deco(fn: Callable) -> Callable:
        if name in METRICS:
            raise ValueError(f"metric {name!r} is registered twice")
        METRICS[name] = fn
        return fn

    return deco


def get_metric(name: str) -> Callable:
    """The metric function registered as ``name``; ValueError listing the names otherwise."""
    if name not in METRICS:
        raise ValueError(f"unknown LongBench metric {name!r}; allowed: {', '.join(METRICS)}")
    return METRICS[name]


def normalize_answer(s: str) -> str:
    """SQuAD-style normalization, in the official order: lower-case, drop ``string.punctuation``,
    replace the words a/an/the by a space, collapse whitespace."""
    s = s.lower()
    s = "".join(ch for ch in s if ch not in set(string.punctuation))
    s = re.sub(r"\b(a|an|the)\b", " ", s)
    return " ".join(s.split())


def f1_tokens(prediction: list, ground_truth: list) -> float:
    """Token-multiset F1 (official ``f1_score``): 0 when no token is shared."""
    same = sum((Counter(prediction) & Counter(ground_truth)).values())
    if same == 0:
        return 0.0
    precision, recall = same / len(prediction), same / len(ground_truth)
    return 2 * precision * recall / (precision + recall)


@register("qa_f1")
def qa_f1(prediction: str, ground_truth: str, all_classes=None) -> float:
    """Official ``qa_f1_score``: F1 over the whitespace tokens of the normalized strings."""
    return f1_tokens(normalize_answer(prediction).split(), normalize_answer(ground_truth).split())


@register("rouge")
def rouge_l(prediction: str, ground_truth: str, all_classes=None) -> float:
    """Official ``rouge_score``: ``Rouge().get_scores([pred], [gt], avg=True)["rouge-l"]["f"]``, 0.0 on error.

    The call computes rouge-1/2 too; an error in any of them (e.g. "Hypothesis is empty." for an
    empty or all-"." prediction) gives 0.0, as in the official code.
    """
    try:
        from rouge import Rouge
    except ImportError as err:  # pragma: no cover - a declared dependency
        raise ImportError("the LongBench rouge metric needs the PyPI package 'rouge' (pip install rouge)") from err
    try:
        scores = Rouge().get_scores([prediction], [ground_truth], avg=True)
    except Exception:  # noqa: BLE001 - the official scorer swallows every error as 0.0
        return 0.0
    return scores["rouge-l"]["f"]


@register("classification")
def classification(prediction: str, ground_truth: str, all_classes=None) -> float:
    """Official ``classification_score`` (TREC), including its remove-while-iterating quirk.

    all_classes: the record's class names (required).
    """
    if all_classes is None:
        raise ValueError("classification needs the record's all_classes (a list of class names), got None")
    matches = [name for name in all_classes if name in prediction]
    # Official loop, unchanged: removing from the list being iterated skips the next element, so a
    # class right after a removed one survives even if it is also a substring of the answer.
    for term in matches:
        if term in ground_truth and term != ground_truth:
            matches.remove(term)
    return 1.0 / len(matches) if ground_truth in matches else 0.0


def _digit_fraction(prediction: str, target: str) -> float:
    numbers = re.findall(r"\d+", prediction)
    if not numbers:
        return 0.0
    return sum(str(n) == str(target) for n in numbers) / len(numbers)


@register("count")
def count(prediction: str, ground_truth, all_classes=None) -> float:
    """Official ``count_score``: digit runs of the prediction equal to ``str(ground_truth)``, over all runs."""
    return _digit_fraction(prediction, ground_truth)


@register("retrieval")
def retrieval(prediction: str, ground_truth: str, all_classes=None) -> float:
    """Official ``retrieval_score``: the answer's "Paragraph N" id, as a fraction of all digit runs."""
    ids = re.findall(r"Paragraph (\d+)", ground_truth)
    if not ids:
        raise ValueError(f"retrieval answer must contain 'Paragraph <number>', got {ground_truth!r}")
    return _digit_fraction(prediction, ids[0])


def fuzz_ratio(a: str, b: str) -> int:
    """fuzzywuzzy's ``fuzz.ratio`` (pure-Python path): 100 if equal, 0 if either is empty, else
    ``round(100 * difflib.SequenceMatcher(None, a, b).ratio())``.

    fuzzywuzzy with python-Levenshtein installed, and ``rapidfuzz.fuzz.ratio``, compute a slightly
    different ratio; this is the difflib one, which fuzzywuzzy uses without extras.
    """
    if a == b:
        return 100
    if not a or not b:
        return 0
    return int(round(100 * difflib.SequenceMatcher(None, a, b).ratio()))


@register("code_sim")
def code_sim(prediction: str, ground_truth: str, all_classes=None) -> float:
    """Official ``code_sim_score``: ``fuzz.ratio(line, gt) / 100`` for the first line of the prediction
    (after stripping leading newlines) that has none of "`", "#", "//" ("" if none qualifies).
    Uses :func:`fuzz_ratio` (difflib, fuzzywuzzy semantics)."""
    line = next((s for s in prediction.lstrip("\n").split("\n") if "`" not in s and "#" not in s and "//" not in s), "")
    return fuzz_ratio(line, ground_truth) / 100


def first_line(prediction: str) -> str:
    """The official first-line rule: ``prediction.lstrip("\\n").split("\\n")[0]``."""
    return prediction.lstrip("\n").split("\n")[0]


def score_sample(task, prediction: str, answers, all_classes=None) -> float:
    """One sample's score: first-line rule if ``task.first_line``, then max over the answers from 0.

    task: a row of ``eval.longbench.tasks.TASKS``; answers: the record's list of reference strings.
    """
    if isinstance(answers, str):
        raise ValueError(f"answers must be a list of strings, got the string {answers!r}")
    metric = get_metric(task.metric)
    if task.first_line:
        prediction = first_line(prediction)
    score = 0.0
    for answer in answers:
        score = max(score, metric(prediction, answer, all_classes=all_classes))
    return score


def task_score(scores) -> float:
    """Official per-task aggregate: ``round(100 * mean, 2)``; NaN for no samples."""
    scores = list(scores)
    return round(100 * sum(scores) / len(scores), 2) if scores else math.nan


def bucket(length) -> str:
    """LongBench-E bucket of a record's ``length``: <4000 "0-4k", <8000 "4-8k", else "8k+"."""
    return next(name for name, upper in BUCKETS if length < upper)


def score_rows(task, rows, e: bool = False):
    """Score a task's prediction rows (dicts with pred, answers, all_classes, length).

    Returns the task score (``round(100*mean, 2)``), or with ``e`` a dict bucket -> score, NaN for an
    empty bucket (as the official ``scorer_e``, whose ``np.mean([])`` is NaN).
    """
    per = [(score_sample(task, r["pred"], r["answers"], r.get("all_classes")), r.get("length")) for r in rows]
    if not e:
        return task_score(s for s, _ in per)
    return {name: task_score(s for s, length in per if bucket(length) == name) for name, _ in BUCKETS}
