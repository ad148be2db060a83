"""The RULER figures in the docs are the official scores of the predictions committed in measured/ruler.

The rows are scored again here with RULER's metric (``eval.ruler.report``), over the sample count that
docs/ruler.md names in its ``ruler-measured`` marker (``--num-samples N``, or one count per
length such as ``4096=20,8192=2``), so a documented figure cannot drift from the run it came from, and a
table cannot claim more samples than the folder holds.
"""

import re
import warnings
from pathlib import Path

import pytest

from eval.ruler.report import collect, parse_scope, samples_at, table
from eval.ruler.tasks import OFFLINE

REPO = Path(__file__).resolve().parents[1]
ROOT = REPO / "measured" / "ruler"
METHODS = {"full"} | {f"{m}_k{k}" for m in ("gemfilter", "gemfilter-span", "snapkv", "h2o") for k in (256, 1024)}


@pytest.fixture(scope="module")
def measured():
    """(docs/ruler.md's text, the marker's --num-samples text, its parsed scope, collect() of the committed rows
    over that scope)."""
    text = (REPO / "docs" / "ruler.md").read_text(encoding="utf-8")
    marker = re.search(r"<!-- ruler-measured: --num-samples (\S+) -->", text)
    if marker is None:
        pytest.fail(
            "docs/ruler.md has no <!-- ruler-measured: --num-samples N --> marker (or 4096=N,8192=M, "
            "one count per length) before its table"
        )
    scope = parse_scope(marker[1])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        results = collect(ROOT, scope)
    # collect warns "k of the first n samples are there" when a task is short: the table must cover n samples
    missing = [str(w.message) for w in caught if "of the first" in str(w.message)]
    assert not missing, missing[0]
    return text, marker[1], scope, results


def test_committed_run_covers_every_method_and_offline_task_for_the_stated_samples(measured):
    _, _, scope, results = measured
    assert "4096" in {length for length, _ in results}
    for length in {length for length, _ in results}:
        assert {m for L, m in results if L == length} == METHODS, length
    for (length, method), scores in results.items():
        n = samples_at(scope, length)
        assert n is not None, f"the ruler-measured marker gives no sample count for length {length}"
        assert set(scores) == set(OFFLINE), (length, method)
        assert {e["n"] for e in scores.values()} == {n}, (length, method)


def test_ruler_readme_table_is_the_score_of_the_committed_predictions(measured):
    text, _, _, results = measured
    _, rows, _ = table(results)
    for row in rows:
        line = "| " + " | ".join(str(c) for c in row) + " |"
        assert line in text, f"docs/ruler.md lacks the scored row {line}"


def test_top_readme_averages_are_the_committed_ones(measured):
    text = (REPO / "README.md").read_text(encoding="utf-8")
    section = text.split("### RULER", 1)[1].split("\n#", 1)[0]
    _, rows, cols = table(measured[3])
    avg = len(cols) + 2  # Length, Method, tasks..., Avg (11 offline)
    for row in rows:
        assert row[avg] in section, f"README.md's RULER table lacks {row[1]}'s 11-task average {row[avg]}"


def test_committed_failures_md_is_the_failures_command_over_the_stated_samples(measured):
    """docs/ruler.md's sentences on failures cite failures.md; it must be what the command gives now."""
    from eval.ruler.failures import find_misses, markdown

    _, marked, scope, _ = measured
    path = ROOT / "failures.md"
    command = f"gemfilter-ruler failures {ROOT.relative_to(REPO)} --num-samples {marked}"
    assert path.is_file(), f"run: {command}"
    assert path.read_text(encoding="utf-8") == markdown(find_misses(ROOT, num_samples=scope)), (
        f"{path} is stale: rerun {command}"
    )
