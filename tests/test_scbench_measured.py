"""The SCBench figures in docs/scbench.md are the official scores of the conversations committed in measured/scbench.

The committed rows are scored again here (``eval.scbench.report``: the official scorers on each turn's
prediction and gold answer, and the mean time to first token per turn), and every table line must be in
the docs as it is, so a documented figure cannot drift from the run it came from.
"""

from pathlib import Path

from eval.scbench.report import collect, markdown, score_table

REPO = Path(__file__).resolve().parents[1]
ROOT = REPO / "measured" / "scbench"


def test_docs_tables_are_the_scores_of_the_committed_rows():
    table = score_table(collect(ROOT))
    assert {k[0] for k in table} == {"multi-turn", "multi-request"} and {k[1] for k in table} == {4096}
    text = (REPO / "docs" / "scbench.md").read_text(encoding="utf-8")
    lines = [x for x in markdown(table).splitlines() if x.startswith("| ") and not x.startswith("| method")]
    assert len(lines) > 10
    missing = [x for x in lines if x not in text]
    assert not missing, f"docs/scbench.md lacks {len(missing)} scored line(s), e.g. {missing[0]}"
