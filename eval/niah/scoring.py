"""NIAH score functions, registered by name in :data:`METRICS` (the runner stores every one per cell).

- ``rouge1``: the GemFilter repo's stored score, rouge1 F-measure of the response against the whole
  needle, x10 (``rouge_score`` with the Porter stemmer). Range 0..10.
- ``recall``: the GemFilter repo's plotted score, ``len(set(resp.lower().split()) & set(exp)) / len(exp)``
  with exp the 12 words of "eat a sandwich and sit in dolores park on a sunny day." ("a" twice, so
  the maximum is 11/12). Range 0..1; this is the heatmap score.
- ``hit``: 1.0 if the answer phrase "eat a sandwich and sit in dolores park on a sunny day" is a
  substring of the response, lower-cased with whitespace runs collapsed to one space, else 0.0.

Kamradt's own LLM judge (1-10) cannot run offline and is not reimplemented.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from .haystack import NEEDLE

EXPECTED_ANSWER = "eat a sandwich and sit in dolores park on a sunny day."


@dataclass(frozen=True)
class Metric:
    """A score function of the response; ``vmax`` is its best possible scale (10 for rouge1 x10)."""

    name: str
    fn: Callable[[str], float]
    vmax: float
    label: str  # short, for plot titles
    description: str


METRICS: dict = {}


def register(name: str, vmax: float, label: str, description: str):
    """Decorator: add ``fn(response) -> float`` to :data:`METRICS` under ``name``."""

    def deco(fn):
        if name in METRICS:
            raise ValueError(f"metric {name!r} is registered twice")
        METRICS[name] = Metric(name, fn, vmax, label, description)
        return fn

    return deco


_SCORER = None


def _rouge_scorer():
    global _SCORER
    if _SCORER is None:
        try:
            from rouge_score import rouge_scorer
        except ImportError as err:  # pragma: no cover - a declared dependency
            raise ImportError(
                "the NIAH rouge1 score needs the package 'rouge_score' (pip install rouge_score)"
            ) from err
        _SCORER = rouge_scorer.RougeScorer(["rouge1"], use_stemmer=True)
    return _SCORER


@register("rouge1", 10.0, "rouge1 F x10", "rouge1 F x10 vs the needle (GemFilter repo's stored score)")
def rouge1_x10(response: str, needle: str = NEEDLE) -> float:
    """rouge1 F-measure x10, target = the needle, prediction = the response (argument order matters for P/R)."""
    return _rouge_scorer().score(needle, response)["rouge1"].fmeasure * 10


@register("recall", 1.0, "word recall", "word recall of the answer, max 11/12 (GemFilter repo's plotted score)")
def word_recall(response: str, expected: str = EXPECTED_ANSWER) -> float:
    """Fraction of the expected words (as a list, duplicates counted) covered by the response's word set."""
    exp = expected.split()
    return len(set(response.lower().split()) & set(exp)) / len(exp)


@register("hit", 1.0, "exact hit", "1 if the answer phrase is in the response (case and whitespace folded)")
def exact_hit(response: str, expected: str = EXPECTED_ANSWER) -> float:
    """Exact-substring hit of the answer phrase without its final period."""
    phrase = " ".join(expected.lower().rstrip(".").split())
    return float(phrase in " ".join(response.lower().split()))


def score_all(response: str) -> dict:
    """Every registered metric of ``response``, by name."""
    return {name: m.fn(response) for name, m in METRICS.items()}
