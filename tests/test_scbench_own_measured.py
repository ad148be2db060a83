"""The figures of docs/scbench.md's section on this project's tasks are the scores of the rows committed in
measured/scbench-own: rescored here with the official per-turn aggregation (``eval.scbench.report``), and every
table line of the docs' block must be one the rows give, so a documented figure cannot drift from its run."""

from pathlib import Path

import pytest

from eval.scbench.report import collect, markdown, score_table
from eval.scbench.scoring import score_one

REPO = Path(__file__).resolve().parents[1]
ROOT = REPO / "measured" / "scbench-own"
DOC = REPO / "docs" / "scbench.md"
HELD_OUT = range(4, 10)  # the task sizes were chosen looking at seeds 0-3 (full only); 4-9 first ran for the tables


def block(name: str) -> list:
    text = DOC.read_text(encoding="utf-8")
    part = text[text.index(f"<!-- {name} -->") : text.index(f"<!-- /{name} -->")]
    return [x for x in part.splitlines() if x.startswith("| ") and not x.startswith("| method")]


CALIBRATION = REPO / "measured" / "scbench-own-calibration"


@pytest.mark.parametrize("folder,name", [(ROOT, "scbench-own-measured"), (CALIBRATION, "scbench-own-calibration")])
def test_docs_tables_are_the_scores_of_the_committed_rows(folder, name):
    lines = [
        x
        for x in markdown(score_table(collect(folder))).splitlines()
        if x.startswith("| ") and not x.startswith("| method")
    ]
    shown = block(name)
    assert len(shown) >= 8
    assert [x for x in shown if x not in lines] == []
    assert [x for x in lines if x not in shown] == []  # and nothing measured is left out of the docs


def held_out_line(rows_by_label: dict) -> list:
    out = []
    for label, rows in sorted(rows_by_label.items()):
        picked = [r for r in rows if int(r["_id"]) in HELD_OUT]
        turns = [score_one("gf_facts", t["prediction"], t["ground_truth"]) for r in picked for t in r["turns"]]
        out.append(f"| {label} | {len(picked)} | {100 * sum(turns) / len(turns):.1f} |")
    return out


def test_held_out_seeds_table_is_computed_from_the_rows():
    """The mean accuracy over seeds 4-9 alone, per label (GF.Facts, multi-turn, 4K), as the docs show it."""
    rows = {k[2]: v for k, v in collect(ROOT).items() if k[:2] == ("multi-turn", 4096) and k[3] == "gf_facts"}
    assert len(rows) >= 5
    assert held_out_line(rows) == block("scbench-own-held-out")


@pytest.mark.parametrize("folder,length", [(ROOT, 4096), (CALIBRATION, 4096)])
def test_every_committed_label_holds_samples_0_to_9_of_five_turns(folder, length):
    found = {k: v for k, v in collect(folder).items() if k[1] == length}
    assert found
    for key, rows in found.items():
        assert sorted(int(r["_id"]) for r in rows) == list(range(10)), key
        assert all(len(r["turns"]) == 5 for r in rows), key


def test_stable_runs_fewer_tokens_than_reselect_on_follow_ups():
    """What the tables' last block reports, read from the rows: reselect runs all its kept tokens (at most k) on
    every turn; stable's follow-ups run under 70% as many on average (the newly kept ones, or all when it
    rebuilds)."""
    for mode in ("multi-turn", "multi-request"):
        found = collect(ROOT)
        reselect = found[(mode, 4096, "gemfilter-span:k=256@reselect", "gf_facts")]
        stable = found[(mode, 4096, "gemfilter-span:k=256@stable", "gf_facts")]
        assert all(t["recomputed"] == t["kept"] <= 256 for r in reselect for t in r["turns"])  # all it keeps
        follow = [t["recomputed"] for r in stable for t in r["turns"][1:]]
        again = [t["recomputed"] for r in reselect for t in r["turns"][1:]]
        assert all(0 < x <= 256 for x in follow) and sum(follow) / len(follow) < 0.7 * sum(again) / len(again)


def test_the_readme_row_gives_the_rows_mean_accuracies():
    """The README's headline row for GF.Facts: each accuracy it names is the mean over the committed rows' turns."""
    import re

    found = collect(ROOT)

    def mean(mode, label):
        turns = [t["score"] for r in found[(mode, 4096, label, "gf_facts")] for t in r["turns"]]
        return f"{100 * sum(turns) / len(turns):.1f}"

    readme = (REPO / "README.md").read_text(encoding="utf-8")
    row = next(x for x in readme.splitlines() if "this project's GF.Facts task" in x)
    multi_turn, multi_request = row.split(" | ")[1].split("multi-request:")
    span = "gemfilter-span:k=256"
    turn_labels = ["full", f"{span}@reselect", f"{span}@reuse", "snapkv:k=256", "fastkv:k=256", "h2o:k=256"]
    number = r"(?<![\d.])\d+\.\d(?![\d])"
    assert re.findall(number, multi_turn) == [mean("multi-turn", x) for x in [*turn_labels, f"{span}@stable"]]
    assert re.findall(number, multi_request) == [
        mean("multi-request", f"{span}@stable"),
        mean("multi-request", f"{span}@reselect"),
    ]
