"""NIAH score functions against hand-computed values."""

import pytest

from eval.niah.scoring import METRICS, exact_hit, rouge1_x10, score_all, word_recall

# rouge_score tokens of the needle: the best thing to do in san francisco is eat a sandwich and sit
# in dolores park on a sunny day -> 21 tokens (punctuation and newlines dropped, lower-cased).


@pytest.mark.parametrize(
    "response, expected",
    [
        # 3 tokens, all in the needle: P = 1, R = 3/21 = 1/7, F = 2(1/7)/(8/7) = 1/4 -> x10 = 2.5.
        ("eat a sandwich", 2.5),
        # Porter stemmer: sitting -> sit, parks -> park; 'in' matches too. Same P, R as above.
        ("Sitting in parks", 2.5),
        # The 12-token answer: P = 1, R = 12/21 = 4/7, F = (8/7)/(11/7) = 8/11 -> 80/11.
        ("Eat a sandwich and sit in Dolores Park on a sunny day.", 80 / 11),
        # 'pizza' and 'tomorrow' miss: P = 2/4, R = 2/21, F = 2(1/2)(2/21)/(1/2 + 2/21) = 8/50 -> 1.6.
        ("eat pizza tomorrow sandwich", 1.6),
        # Counts clip: 'a' three times in the response, twice in the needle. P = 2/3, R = 2/21,
        # F = 2(2/3)(2/21)/(2/3 + 2/21) = (8/63)/(16/21) = 1/6 -> 10/6.
        ("a a a", 10 / 6),
        ("", 0.0),
        ("nothing relevant here", 0.0),
    ],
)
def test_rouge1_x10(response, expected):
    assert rouge1_x10(response) == pytest.approx(expected, abs=1e-9)


@pytest.mark.parametrize(
    "response, expected",
    [
        # exp = [eat a sandwich and sit in dolores park on a sunny day.]: 12 words, 11 distinct.
        ("Eat a sandwich and sit in Dolores Park on a sunny day.", 11 / 12),
        ("Dolores Park", 2 / 12),
        ("sunny day", 1 / 12),  # 'day' is not 'day.' (no punctuation stripping)
        ("sunny day.", 2 / 12),
        ("A a a", 1 / 12),  # a set: 'a' counts once
        ("DOLORES\npark", 2 / 12),  # lower-cased, split on any whitespace
        ("", 0.0),
    ],
)
def test_word_recall(response, expected):
    assert word_recall(response) == pytest.approx(expected, abs=1e-12)


@pytest.mark.parametrize(
    "response, expected",
    [
        (" Eat a sandwich and sit in Dolores Park on a sunny day.\nAnswer: ...", 1.0),
        ("eat a sandwich and sit in\n  Dolores   Park on a sunny day", 1.0),  # whitespace runs folded
        ("Eat a sandwich, and sit in Dolores Park on a sunny day.", 0.0),  # the comma breaks it
        ("eat a sandwich and sit in Dolores Park.", 0.0),
        ("", 0.0),
    ],
)
def test_exact_hit(response, expected):
    assert exact_hit(response) == expected


def test_registry_holds_every_metric_with_its_scale():
    assert {name: m.vmax for name, m in METRICS.items()} == {"rouge1": 10.0, "recall": 1.0, "hit": 1.0}
    # rouge1: P = 2/2, R = 2/21, F = 2(2/21)/(1 + 2/21) = (4/21)/(23/21) = 4/23 -> 40/23.
    assert score_all("Dolores Park") == pytest.approx({"rouge1": 40 / 23, "recall": 2 / 12, "hit": 0.0})
