"""NIAH demo-grid runs in docs/evals.md are their committed rows: Fig. G.3's row ablations (measured/niah-g3) and
the selection variants (measured/niah-variants).

Every response is scored again with the registered metrics, the grid is complete (4 lengths x 5 depths per
method), and every table line under the docs' marker is a line of the table built from the rows.
"""

import json
from pathlib import Path

import pytest
from docs_blocks import docs_block, table_lines

from eval.niah.report import markdown_table
from eval.niah.scoring import score_all

REPO = Path(__file__).resolve().parents[1]
RUNS = {  # run folder (and docs marker) -> its methods
    "niah-g3": [f"{m}:k={k}" for k in (256, 1024) for m in ("gemfilter", "middle-row", "largest-row")],
    "niah-variants": [
        "gemfilter-claa:k=256",
        "gemfilter-asl:k=256",
        "gemfilter-qwin:k=256",
        "gemfilter-span-qwin:k=256",
        "gemfilter-span-claa:layers=7,k=256",
        "gemfilter-span-qmax:k=256",
    ],
}


def rows(run: str) -> list:
    text = (REPO / "measured" / run / "results.jsonl").read_text()
    return [json.loads(x) for x in text.splitlines() if x.strip()]


@pytest.mark.parametrize("run", RUNS)
def test_every_response_scores_as_stored(run):
    for r in rows(run):
        for name, value in score_all(r["response"]).items():
            assert r[name] == pytest.approx(value), (r["method"], r["length"], r["depth"], name)


@pytest.mark.parametrize("run", RUNS)
def test_the_grid_is_complete_for_each_method(run):
    got = rows(run)
    for m in RUNS[run]:
        cells = {(r["length"], r["depth"]) for r in got if r["method"] == m}
        assert cells == {(n, d) for n in (1000, 2000, 4000, 8000) for d in (0, 25, 50, 75, 100)}, m
    assert len(got) == 20 * len(RUNS[run])


@pytest.mark.parametrize("run", RUNS)
def test_docs_lines_are_lines_of_the_rows_table(run):
    built = markdown_table(rows(run), "embedded:gemma3-270m").splitlines()
    lines = table_lines(docs_block("evals.md", run))
    assert len(lines) == len(RUNS[run])
    missing = [x for x in lines if x not in built]
    assert not missing, f"docs/evals.md has line(s) the rows do not give, e.g. {missing[0]}"
