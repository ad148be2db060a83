"""LongBench metrics on hand-computed cases (the arithmetic is in the comments), quirks included."""

import math

import pytest

from eval.longbench.metrics import (
    METRICS,
    bucket,
    classification,
    code_sim,
    count,
    fuzz_ratio,
    get_metric,
    normalize_answer,
    qa_f1,
    retrieval,
    rouge_l,
    score_rows,
    score_sample,
    task_score,
)
from eval.longbench.tasks import BY_NAME, TASKS


def test_every_task_metric_is_registered_and_unknown_names_are_refused():
    assert set(METRICS) == {"qa_f1", "rouge", "classification", "count", "retrieval", "code_sim"}
    assert {t.metric for t in TASKS} == set(METRICS)
    with pytest.raises(ValueError, match="unknown LongBench metric 'bleu'; allowed: qa_f1, rouge"):
        get_metric("bleu")


def test_normalize_answer_lowercases_strips_punctuation_then_articles():
    # "The Cat, a dog!" -> "the cat, a dog!" -> "the cat a dog" -> " cat   dog" -> "cat dog"
    assert normalize_answer("The Cat, a dog!") == "cat dog"
    # Punctuation goes before the article rule: "an-apple" -> "anapple" keeps its "an".
    assert normalize_answer("an-apple  THE\tend.") == "anapple end"


def test_qa_f1_token_overlap():
    # pred [quick, brown, fox], gt [quick, fox, jumps]: 2 shared; P = R = 2/3 -> F1 = 2/3
    assert qa_f1("The quick brown fox", "a quick fox jumps") == pytest.approx(2 / 3)
    # Multiset overlap: pred [fox, fox, fox] vs gt [fox] -> 1 shared; P = 1/3, R = 1 -> 2*(1/3)/(4/3) = 0.5
    assert qa_f1("fox fox fox", "Fox.") == pytest.approx(0.5)
    assert qa_f1("Paris", "paris!") == 1.0
    assert qa_f1("London", "Paris") == 0.0
    assert qa_f1("", "Paris") == 0.0  # no overlap -> 0, not a division by zero
    assert qa_f1("the", "a") == 0.0  # both normalize to nothing


def test_rouge_l_is_the_rouge_package_union_lcs_over_unique_words():
    # hyp sentences ["the cat sat", "the dog"], ref ["the cat sat on the mat"]; unique words: ref m = 5
    # {the, cat, sat, on, mat}, hyp n = 4 {the, cat, sat, dog}; union LCS = {the, cat, sat} = 3.
    # P = 3/4, R = 3/5, F = 2PR / (P + R + 1e-8)
    p, r = 3 / 4, 3 / 5
    assert rouge_l("the cat sat. the dog", "the cat sat on the mat") == pytest.approx(
        2 * p * r / (p + r + 1e-8), abs=1e-12
    )
    # Unique words: "a a a b" has the word set {a, b}, so P = R = 2/2 = 1 and F = 2 / (2 + 1e-8);
    # counting repeats would give P = 2/4.
    assert rouge_l("a a a b", "a b") == pytest.approx(2 / (2 + 1e-8), abs=1e-12)
    # No lower-casing, no punctuation removal: "Cat" != "cat", "sat," != "sat"; only "mat" matches.
    # P = R = 1/3 -> F = (2/9) / (2/3 + 1e-8)
    assert rouge_l("Cat sat, mat", "cat sat mat") == pytest.approx((2 / 9) / (2 / 3 + 1e-8), abs=1e-12)
    # Sentences split on ".": hyp ["mat", "cat sat"] vs ref "cat sat mat": the union of the per-sentence
    # LCSs is {mat, cat, sat} = 3 -> P = R = 1; unsplit, the LCS of "mat cat sat" would be 2 (P = R = 2/3).
    assert rouge_l("mat. cat sat", "cat sat mat") == pytest.approx(2 / (2 + 1e-8), abs=1e-12)
    assert rouge_l("mat cat sat", "cat sat mat") == pytest.approx((8 / 9) / (4 / 3 + 1e-8), abs=1e-12)
    # The package raises on an empty hypothesis (also one made only of "."); the official scorer gives 0.0.
    assert rouge_l("", "cat") == 0.0
    assert rouge_l("...", "cat") == 0.0


def test_classification_removal_while_iterating_quirk():
    classes = ["city", "city name", "city name origin"]
    # All three are substrings of the prediction. Loop: "city" is inside the answer and differs from it,
    # so it is removed; the list shifts and the loop's next index lands on "city name origin", so
    # "city name" is never examined and stays. L = ["city name", "city name origin"] -> 1/2 (not 1).
    assert classification("city name origin", "city name origin", classes) == 0.5
    # Without the skip: L = ["city", "city name"]; "city" removed, the loop ends -> L = ["city name"] -> 1.
    assert classification("city name", "city name", ["city", "city name", "zip"]) == 1.0
    # Two matched classes, neither inside the other: L = ["Animal", "Food"] -> 1/2.
    assert classification("Animal or Food", "Food", ["Animal", "Color", "Food"]) == 0.5
    assert classification("Color", "Food", ["Animal", "Color", "Food"]) == 0.0
    with pytest.raises(ValueError, match="needs the record's all_classes"):
        classification("Food", "Food", None)


def test_count_and_retrieval_are_fractions_of_all_digit_runs():
    # numbers ["3", "4", "3"]; 2 equal "3" -> 2/3
    assert count("There are 3 unique paragraphs, not 4, so 3.", "3") == pytest.approx(2 / 3)
    assert count("thirty", "3") == 0.0  # no digits -> 0
    assert count("30", "3") == 0.0  # whole digit runs are compared, "30" != "3"
    assert count("7", 7) == 1.0  # the answer is compared as str(answer)
    # gt id "12"; numbers ["12", "1", "12"] -> 2/3
    assert retrieval("Paragraph 12, or Paragraph 1 or 12", "Paragraph 12") == pytest.approx(2 / 3)
    assert retrieval("The answer is Paragraph 5", "Paragraph 5") == 1.0
    with pytest.raises(ValueError, match="must contain 'Paragraph <number>'"):
        retrieval("5", "5")


def test_fuzz_ratio_and_code_sim():
    # SequenceMatcher ratio = 2M/T: "abcd" vs "abce": M = 3 ("abc"), T = 8 -> 0.75 -> 75
    assert fuzz_ratio("abcd", "abce") == 75
    assert fuzz_ratio("", "") == 100  # equality is checked first
    assert fuzz_ratio("", "x") == 0
    # First line without "`", "#", "//" after stripping leading newlines: "return a + b" (12 chars) vs
    # "return a+b" (10): blocks "return a" (8), "+" (1), "b" (1) -> M = 10, 2*10/22 = 0.909 -> 91 -> 0.91
    pred = "\n\n# add them\n`code`\nx = 1 // 2\nreturn a + b\nprint(a)"
    assert code_sim(pred, "return a+b") == 0.91
    assert code_sim("# only\n// comments", "return a") == 0.0  # no line qualifies -> "" -> 0


def test_score_sample_first_line_rule_and_max_over_answers():
    triviaqa, hotpotqa = BY_NAME["triviaqa"], BY_NAME["hotpotqa"]
    # triviaqa keeps "\n\nParis\nLondon ..." -> "Paris" -> F1 1.0 against "Paris"
    assert score_sample(triviaqa, "\n\nParis\nLondon is big", ["London Bridge", "Paris"]) == 1.0
    # hotpotqa scores the whole text: [paris, london] vs [paris] -> P = 1/2, R = 1 -> 2/3
    assert score_sample(hotpotqa, "Paris\nLondon", ["Paris"]) == pytest.approx(2 / 3)
    # max over answers: [paris, london] vs [london] and vs [paris, london] -> max(2/3, 1) = 1
    assert score_sample(hotpotqa, "Paris\nLondon", ["London", "Paris London"]) == 1.0
    assert score_sample(hotpotqa, "Rome", []) == 0.0  # starts from 0
    # trec: first line "Food" only; the second line's "Animal" does not count -> L = ["Food"] -> 1
    assert score_sample(BY_NAME["trec"], "Food\nAnimal", ["Food"], ["Animal", "Food"]) == 1.0
    with pytest.raises(ValueError, match="answers must be a list"):
        score_sample(hotpotqa, "Paris", "Paris")


def test_task_score_and_length_buckets():
    assert task_score([1.0, 0.5, 0.0]) == 50.0  # mean 0.5 -> 50
    assert task_score([1 / 3]) == 33.33  # 33.333.. -> 33.33
    assert task_score([2 / 3]) == 66.67  # 66.666.. -> 66.67
    assert math.isnan(task_score([]))
    assert [bucket(n) for n in (0, 3999, 4000, 7999, 8000, 50000)] == ["0-4k", "0-4k", "4-8k", "4-8k", "8k+", "8k+"]
    rows = [
        {"pred": "Paris", "answers": ["Paris"], "length": 100},  # 1.0 in 0-4k
        {"pred": "Rome", "answers": ["Paris"], "length": 3000},  # 0.0 in 0-4k
        {"pred": "x Paris", "answers": ["Paris"], "length": 9000},
    ]  # [x, paris] vs [paris]: 2/3 in 8k+
    hotpotqa = BY_NAME["hotpotqa"]
    assert score_rows(hotpotqa, rows) == 55.56  # (1 + 0 + 2/3) / 3 = 0.5556
    e = score_rows(hotpotqa, rows, e=True)
    assert e["0-4k"] == 50.0 and e["8k+"] == 66.67 and math.isnan(e["4-8k"])
