"""Fig. 4.4 at the paper's weight decay (1e-3) on CPU: docs/icl-probes.md's rows are the committed runs.

Each run's delay and gap area are computed again from its stored accuracy history (``grokking_delay``,
threshold 0.99), and every table line under the docs' grok-wd1e-3 marker is rebuilt from the rows.
"""

import json
from pathlib import Path

import pytest
from docs_blocks import docs_block, table_lines

from icl_probes.modular.experiments import grokking_delay

REPO = Path(__file__).resolve().parents[1]
RUNS = sorted((REPO / "measured").glob("modular-grok-wd1e-3*/grok_runs.jsonl"))
ROWS = [json.loads(x) for path in RUNS for x in path.read_text().splitlines() if x.strip()]


def _cell(value):
    return "not reached" if value is None else str(value)


def line(row) -> str:
    last = row["history"][-1]
    return (
        f"| {row['k']} | {row['p']} | {last['step']} | {row['settings']['train']['weight_decay']:g} | "
        f"{_cell(row['train_step'])} | {_cell(row['test_step'])} | {_cell(row['delay'])} | {row['gap_area']:.0f} | "
        f"{last['train_acc']:.3f} / {last['test_acc']:.3f} |"
    )


@pytest.mark.parametrize("row", ROWS, ids=lambda r: f"k{r['k']}-steps{r['history'][-1]['step']}")
def test_delay_and_gap_are_the_history(row):
    assert row["settings"]["train"]["weight_decay"] == 1e-3
    got = grokking_delay(row["history"], 0.99)
    assert {k: row[k] for k in got} == got


def test_docs_rows_are_the_runs():
    assert len(RUNS) == 2 and len(ROWS) == 5
    lines = table_lines(docs_block("icl-probes.md", "grok-wd1e-3"), header="| k ")
    assert sorted(lines) == sorted(line(r) for r in ROWS)
