"""SCBench's scorers and their per-turn / per-task aggregation.

Source: microsoft/MInference ``scbench/compute_scores.py``: the ``get_score_one_*`` functions,
``string_match_all``, ``qa_f1_score_zh`` with ``normalize_zh_answer``, ``first_int_match``,
``get_score_one``'s ``NAME_TO_SCORE_GETTER`` and ``compute_scores``. Each scorer takes the prediction
and the label as stored in a prediction row (``ground_truth``, from ``get_ground_truth``) and returns
a float (booleans become 0.0 / 1.0, as ``get_score_one`` does).

Aggregation (``compute_scores``): in multi-turn mode the rows are grouped by ``turn_idx`` and each
turn's score is the plain mean over its rows; in multi-request mode all rows are pooled into one mean.
The summary line prints each as ``f"{acc * 100:.3f}"``, turns joined by commas.
RepoQA (``repo_qa_utils``) and the two Mix tasks' sub-task split are not transcribed.
"""

from __future__ import annotations

import re
import string
from collections import Counter

from .own import score as own_score
from .tasks import get_task

_ZH_PUNCTUATION = "！？｡。＂＃＄％＆＇（）＊＋，－／：；＜＝＞＠［＼］＾＿｀｛｜｝～｟｠｢｣､、〃》「」『』【】〔〕〖〗〘〙〚〛〜〝〞〟〰〾〿–—‘’‛“”„‟…‧﹏."  # noqa: E501


def normalize_zh_answer(s: str) -> str:
    """Lower-case, drop ASCII and Chinese punctuation, drop all whitespace."""
    punctuation = set(string.punctuation + _ZH_PUNCTUATION)
    return "".join("".join(ch for ch in s.lower() if ch not in punctuation).split())


def f1_score(prediction: list, ground_truth: list) -> float:
    """Token F1 of two token lists (0 without overlap)."""
    common = Counter(prediction) & Counter(ground_truth)
    same = sum(common.values())
    if same == 0:
        return 0.0
    precision, recall = same / len(prediction), same / len(ground_truth)
    return 2 * precision * recall / (precision + recall)


def first_int_match(prediction: str) -> str:
    """The first run of digits in the text ('' if none)."""
    for item in re.split("[^0-9]", prediction):
        if item != "":
            return item
    return ""


def kv_retrieval(pred: str, label) -> bool:
    """Retr.KV and Retr.Prefix-Suffix (``get_score_one_kv_retrieval``): the label is a substring of pred."""
    return label in pred


def passkey(pred: str, label) -> bool:
    """``get_score_one_passkey``: the first digit run equals the label (a string)."""
    if isinstance(label, list):
        label = label[0]
    return label == first_int_match(pred)


def math_find(pred: str, label) -> bool:
    """Math.Find (``get_score_one_math_find``): the first number in pred equals the label.

    An int label compares ``int(float(first number))``, a float label ``float(first number)``; only
    unsigned numbers are found (``\\d+\\.\\d+|\\d+``). Any other label type is a TypeError, as officially.
    """
    if isinstance(label, list):
        label = label[0]
    if not isinstance(label, (int, float)):
        raise TypeError(f"Expected int or float, got {type(label)}")
    found = re.search(r"\d+\.\d+|\d+", pred)
    if found is None:
        return False
    if isinstance(label, int):
        return int(float(found.group(0).strip())) == label
    return float(found.group(0).strip()) == label


def string_match_all(pred: str, ref) -> float:
    """Retr.MultiHop (``string_match_all``): fraction of the reference strings found in pred, any case,
    rounded to 2 decimals."""
    return round(sum(1.0 if r.lower() in pred.lower() else 0.0 for r in ref) / len(ref), 2)


def longdialogue_qa_eng(pred: str, label) -> int:
    """En.QA and ICL.ManyShot (``get_score_one_longdialogue_qa_eng``): 1 if any label, upper-cased, is in
    the stripped, upper-cased pred."""
    pred = pred.strip().upper()
    return int(any(item.upper() in pred for item in label))


def longbook_choice_eng(pred: str, label) -> bool:
    """En.MultiChoice (``get_score_one_longbook_choice_eng``); label is [option text, letter]."""
    pred = pred.strip()
    if pred == "":
        return False
    if pred[0] in "ABCD":
        return pred[0] in label
    if pred in label:
        return True
    for c in ["\n", '"', "'", ".", ",", "?", "!", "{", "}"]:
        pred = pred.replace(c, " ")
    while "  " in pred:
        pred = pred.replace("  ", " ")
    for prefix in ["answer is:", "answer:", "answer is", "option is"]:
        idx = pred.find(prefix)
        if idx == -1:
            continue
        if len(pred) < idx + len(prefix) + 1:  # the prediction ends with this prefix
            return False
        after = pred[idx + len(prefix) + 1 :]
        return any(after.startswith(s) for s in label)
    for word in pred.split():
        if word in "ABCD":  # a substring test, as officially: "" never occurs after split, "AB" would match
            return word in label
    return False


def longbook_qa_chn(pred: str, label) -> float:
    """Zh.QA (``qa_f1_score_zh``): character-level F1 after :func:`normalize_zh_answer`, max over labels."""
    labels = [label] if isinstance(label, str) else label
    return max((f1_score(list(normalize_zh_answer(pred)), list(normalize_zh_answer(g))) for g in labels), default=0.0)


def scbench_summary(pred: str, label: str) -> float:
    """En.Sum (``get_score_one_longbook_sum_eng``): ROUGE-Lsum F of the HF ``evaluate`` rouge metric,
    which runs ``rouge_score.RougeScorer`` without stemming; computed here with ``rouge_score`` directly
    (``evaluate.load`` would download the metric script)."""
    from rouge_score import rouge_scorer

    return rouge_scorer.RougeScorer(["rougeLsum"], use_stemmer=False).score(label, pred)["rougeLsum"].fmeasure


#: NAME_TO_SCORE_GETTER (the keys Task.scorer names).
SCORERS = {
    "kv_retrieval": kv_retrieval,
    "passkey": passkey,
    "math_find": math_find,
    "scbench_vt": string_match_all,
    "gf_string_match": own_score,  # this project's tasks (eval/scbench/own.py): RULER's metric on text answers
    "longdialogue_qa_eng": longdialogue_qa_eng,
    "scbench_many_shot": longdialogue_qa_eng,
    "longbook_choice_eng": longbook_choice_eng,
    "longbook_qa_chn": longbook_qa_chn,
    "scbench_summary": scbench_summary,
}


def score_one(task: str, pred: str, label) -> float:
    """One prediction's score for an official data name (``get_score_one`` through the task's scorer)."""
    name = get_task(task).scorer
    if name is None:
        raise ValueError(
            f"{task}: its official scorer is not transcribed here (RepoQA pass@1 / Mix sub-tasks); "
            f"scorable tasks: {', '.join(sorted(SCORERS))}"
        )
    return float(SCORERS[name](pred, label))


def _rows_check(rows, task):
    if not rows:
        raise ValueError(f"{task}: no prediction rows to score")
    for row in rows:
        missing = [k for k in ("turn_idx", "prediction", "ground_truth") if k not in row]
        if missing:
            raise ValueError(
                f"{task}: a prediction row lacks {missing}; rows need turn_idx, prediction and "
                "ground_truth (run_scbench.py's fields)"
            )


def score_by_turn(rows: list, task: str) -> dict:
    """Multi-turn accuracy (``compute_scores``): {turn_idx: mean score of that turn's rows}, turns in
    the order they first appear."""
    _rows_check(rows, task)
    by_turn = {}
    for row in rows:
        by_turn.setdefault(row["turn_idx"], []).append(score_one(task, row["prediction"], row["ground_truth"]))
    return {turn: sum(s) / len(s) for turn, s in by_turn.items()}


def score_pooled(rows: list, task: str) -> float:
    """Multi-request accuracy (``compute_scores`` with ``scdq_mode``): the mean over every row."""
    _rows_check(rows, task)
    scores = [score_one(task, row["prediction"], row["ground_truth"]) for row in rows]
    return sum(scores) / len(scores)


def summary_line(acc) -> str:
    """The official ``acc_str``: ``f"{acc * 100:.3f}"`` per turn, comma-joined (one number when pooled)."""
    if isinstance(acc, dict):
        return ",".join(f"{v * 100:.3f}" for v in acc.values())
    return f"{acc * 100:.3f}"
