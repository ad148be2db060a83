"""Fig. G.3's row ablations on the NIAH demo grid (docs/evals.md) are the committed rows of measured/niah-g3.

Every response is scored again with the registered metrics, the grid is complete (4 lengths x 5 depths per
method), and every table line under the docs' niah-g3 marker is a line of the table built from the rows.
"""

import json
from pathlib import Path

import pytest

from eval.niah.report import markdown_table
from eval.niah.scoring import score_all

REPO = Path(__file__).resolve().parents[1]
RUN = REPO / "measured" / "niah-g3"
ROWS = [json.loads(x) for x in (RUN / "results.jsonl").read_text().splitlines() if x.strip()]
METHODS = [f"{m}:k={k}" for k in (256, 1024) for m in ("gemfilter", "middle-row", "largest-row")]


def test_every_response_scores_as_stored():
    for r in ROWS:
        for name, value in score_all(r["response"]).items():
            assert r[name] == pytest.approx(value), (r["method"], r["length"], r["depth"], name)


def test_the_grid_is_complete_for_each_method():
    for m in METHODS:
        cells = {(r["length"], r["depth"]) for r in ROWS if r["method"] == m}
        assert cells == {(n, d) for n in (1000, 2000, 4000, 8000) for d in (0, 25, 50, 75, 100)}, m
    assert len(ROWS) == 20 * len(METHODS)


def test_docs_lines_are_lines_of_the_rows_table():
    built = markdown_table(ROWS, "embedded:gemma3-270m").splitlines()
    text = (REPO / "docs" / "evals.md").read_text(encoding="utf-8")
    block = text.split("<!-- niah-g3 -->", 1)[1].split("<!-- /niah-g3 -->", 1)[0]
    lines = [x for x in block.splitlines() if x.startswith("| ") and not x.startswith("| method")]
    assert len(lines) == len(METHODS)
    missing = [x for x in lines if x not in built]
    assert not missing, f"docs/evals.md has line(s) the rows do not give, e.g. {missing[0]}"
