"""RULER at 4K for the selection variants of issue 48 (a probe: samples 0-3), beside full, gemfilter and
gemfilter-span on the same samples.

measured/ruler-variants holds the variants' prediction rows; measured/ruler the others'. Both are scored
again here with RULER's metric over the sample count docs/ruler.md names in its ``ruler-variants-measured``
marker, and every row of that table must be in docs/ruler.md.
"""

import re
from pathlib import Path

from eval.ruler.report import collect, parse_scope, table

REPO = Path(__file__).resolve().parents[1]
NEW = {"gemfilter-span-qwin_k256", "gemfilter-span-claa_k256", "gemfilter-span-claa:layers=7_k256"}
BESIDE = {"full", "gemfilter_k256", "gemfilter-span_k256"}


def test_variant_rows_in_the_docs_are_the_score_of_the_committed_predictions():
    text = (REPO / "docs" / "ruler.md").read_text(encoding="utf-8")
    marker = re.search(r"<!-- ruler-variants-measured: --num-samples (\S+) -->", text)
    assert marker, "docs/ruler.md has no <!-- ruler-variants-measured: --num-samples 4096=N --> marker"
    scope = parse_scope(marker[1])
    new = collect(REPO / "measured" / "ruler-variants", scope)
    assert {m for _, m in new} == NEW
    old = {k: v for k, v in collect(REPO / "measured" / "ruler", scope).items() if k[0] in scope and k[1] in BESIDE}
    _, rows, _ = table({**old, **new})
    section = text.split(marker[0], 1)[1]
    for row in rows:
        line = "| " + " | ".join(str(c) for c in row) + " |"
        assert line in section, f"docs/ruler.md lacks the scored row {line}"
    for scores in new.values():
        assert {e["n"] for e in scores.values()} == set(scope.values())
