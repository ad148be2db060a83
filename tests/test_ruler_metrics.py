"""RULER metrics on hand-computed cases (official evaluate.py / eval/synthetic/constants.py semantics)."""

import math

import pytest

from eval.ruler.metrics import METRICS, postprocess_pred, suite_average, task_score
from eval.ruler.tasks import BY_NAME, OFFLINE


def test_postprocess_strips_and_turns_control_characters_into_newlines():
    assert postprocess_pred("  \tabc\x00def\x1fghi\x7f \n") == "abc\ndef\nghi\x7f"  # \x7f is not in [\x00-\x1f]
    assert postprocess_pred("\n\n") == ""


def test_string_match_all_partial_case_and_multiple_answers():
    m = METRICS["string_match_all"]
    assert m.score("The numbers are 1234567 and 7654321.", ["1234567", "7654321"]) == 1.0
    assert m.score("only 1234567 here", ["1234567", "7654321", "1111111", "2222222"]) == 0.25
    assert m.score("Answer: WORD-one, Apple", ["word-ONE", "apple", "pear"]) == pytest.approx(2 / 3)
    assert m.score("nothing", ["x1", "y2"]) == 0.0
    # substring, not token match: "123" is found inside "12345"
    assert m.score("12345", ["123"]) == 1.0


def test_string_match_part_is_any_reference():
    m = METRICS["string_match_part"]
    assert m.score("It was Paris, France.", ["London", "paris"]) == 1.0
    assert m.score("It was Paris.", ["London", "Rome"]) == 0.0


def test_task_score_is_rounded_percent_of_the_mean_after_postprocessing():
    # all: (1 + 0.5 + 0) / 3 * 100 = 50.0 ; 1/3 of 100 = 33.333.. -> 33.33
    assert task_score("string_match_all", ["a b", "A", "z"], [["a", "b"], ["a", "c"], ["q"]]) == 50.0
    assert task_score("string_match_all", ["x", "", ""], [["X"], ["y"], ["z"]]) == 33.33
    # part: 2 of 3 samples hit one of their answers -> 66.67
    assert task_score("string_match_part", ["Rome", "paris\x00", "no"], [["rome", "x"], ["Paris"], ["yes"]]) == 66.67
    # control characters become newlines, so an answer cut by one is no longer found
    assert task_score("string_match_all", ["12\x0134"], [["1234"]]) == 0.0


def test_task_score_rejects_bad_input():
    with pytest.raises(ValueError, match="unknown RULER metric 'f1'; allowed: string_match_all, string_match_part"):
        task_score("f1", ["a"], [["a"]])
    with pytest.raises(ValueError, match="as many predictions"):
        task_score("string_match_all", ["a"], [])
    with pytest.raises(ValueError, match="at least one reference"):
        task_score("string_match_all", ["a"], [[]])


def test_suite_average_with_and_without_qa():
    scores = {name: float(i) for i, name in enumerate(BY_NAME)}  # 0..12, qa_1 = 11, qa_2 = 12
    assert suite_average(scores, OFFLINE) == 5.0  # mean of 0..10
    assert suite_average(scores, BY_NAME) == 6.0  # mean of 0..12
    del scores["qa_2"]
    assert math.isnan(suite_average(scores, BY_NAME))
    assert suite_average({"a": 1.0, "b": 2.0, "c": 2.0}, ["a", "b", "c"]) == 1.67


def test_metric_per_task_matches_the_official_table():
    kinds = {name: t.spec.metric for name, t in BY_NAME.items()}
    assert {k for k, m in kinds.items() if m == "string_match_part"} == {"qa_1", "qa_2"}
    assert all(kinds[n] == "string_match_all" for n in OFFLINE)
