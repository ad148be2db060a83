"""The conversation timings in docs/serving.md are the committed rows of measured/serve-turns*.

Each folder's tables are built again from its JSONL rows (``gemfilter.lab.serve.turns.rebuild``: the cells
finished, their requests, medians and p95s) and must equal its committed bench-turns.md; every table line
between the docs' markers must be one of those lines, so a documented figure cannot drift from its run.
"""

from pathlib import Path

import pytest
from docs_blocks import docs_block

from gemfilter.lab.serve.turns import rebuild

REPO = Path(__file__).resolve().parents[1]
FOLDERS = sorted(p.parent for p in (REPO / "measured").glob("serve-turns*/bench-turns.json"))


@pytest.mark.parametrize("folder", FOLDERS, ids=lambda p: p.name)
def test_the_committed_tables_are_the_rows_tables(folder):
    assert rebuild(folder) == (folder / "bench-turns.md").read_text(encoding="utf-8")


def test_docs_lines_are_lines_of_the_committed_tables():
    assert any(f.name == "serve-turns" for f in FOLDERS)
    lines = [x for x in docs_block("serving.md", "serve-turns-measured").splitlines() if x.startswith("| ")]
    assert len(lines) > 25
    tables = "\n".join((f / "bench-turns.md").read_text(encoding="utf-8") for f in FOLDERS).splitlines()
    missing = [x for x in lines if x not in tables]
    assert not missing, f"docs/serving.md has {len(missing)} line(s) no committed run printed, e.g. {missing[0]}"
