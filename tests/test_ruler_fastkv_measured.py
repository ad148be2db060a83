"""RULER for methods measured apart from the main table, beside its methods on the same samples:
fastkv and gemfilter-orig-pos (measured/ruler-fastkv) and the selection variants (a probe
on samples 0-3, measured/ruler-variants; 20 samples, measured/ruler-variants20; 8K, measured/ruler-variants8k;
k=1024 and gemfilter-span-qmax, measured/ruler-variants1024, measured/ruler-qmax and measured/ruler-qmax8k in
docs/ruler-variants.md, and the held-out samples of seed 43, measured/ruler-seed43).

Each folder holds the new methods' prediction rows; measured/ruler the others'. Both are scored again here with
RULER's metric over the sample count the document names in the folder's marker, and every row of that table
must be in the document after the marker.
"""

import json
import re
from pathlib import Path

import pytest

from eval.ruler.report import collect, parse_scope, read_rows, table

REPO = Path(__file__).resolve().parents[1]
#: (folder and marker name, the methods it holds, {other measured folder: its methods shown beside them;
#: None: all})
MAIN = "ruler"
CASES = [
    ("ruler-fastkv", {f"{m}_k{k}" for m in ("fastkv", "gemfilter-orig-pos") for k in (256, 1024)}, {MAIN: None}),
    (
        "ruler-variants",
        {"gemfilter-span-qwin_k256", "gemfilter-span-claa_k256", "gemfilter-span-claa:layers=7_k256"},
        {MAIN: {"full", "gemfilter_k256", "gemfilter-span_k256"}},
    ),
    (
        "ruler-variants20",
        {
            "gemfilter-span-claa:layers=7_k256",
            "gemfilter-claa_k256",
            "gemfilter-asl_k256",
            "gemfilter-qwin_k256",
            "gemfilter-span-qwin_k256",
        },
        {MAIN: {"full", "gemfilter_k256", "gemfilter-span_k256"}},
    ),
    (
        "ruler-variants8k",
        {"full", "gemfilter-span_k256", "gemfilter-span-claa:layers=7_k256", "gemfilter-span-qwin_k256"},
        {},
    ),
    (
        "ruler-variants1024",
        {
            "gemfilter-claa_k1024",
            "gemfilter-span-claa:layers=7_k1024",
            "gemfilter-span-qmax:max_span=96_k1024",
            "gemfilter-asl_k1024",
            "gemfilter-qwin_k1024",
            "gemfilter-span-qwin_k1024",
        },
        {MAIN: {"full", "gemfilter_k1024", "gemfilter-span_k1024"}},
    ),
    (
        "ruler-qmax",
        {"gemfilter-span-qmax_k256", "gemfilter-span-qmax:max_span=96_k256"},
        {MAIN: {"full", "gemfilter_k256", "gemfilter-span_k256"}, "ruler-variants20": {"gemfilter-span-qwin_k256"}},
    ),
    (
        "ruler-qmax8k",
        {"gemfilter-span-qmax_k256", "gemfilter-span-qmax:max_span=96_k256"},
        {"ruler-variants8k": {"full", "gemfilter-span_k256"}},
    ),
    ("ruler-seed43", {"full", "gemfilter-span-qmax_k256", "gemfilter-span-qmax:max_span=96_k256"}, {}),
]
#: the document of each folder's table, when it is not docs/ruler.md
PAGES = {name: "ruler-variants.md" for name in ("ruler-variants1024", "ruler-qmax", "ruler-qmax8k", "ruler-seed43")}


@pytest.mark.parametrize("name, new_methods, beside", CASES, ids=[c[0] for c in CASES])
def test_rows_in_the_docs_are_the_score_of_the_committed_predictions(name, new_methods, beside):
    page = PAGES.get(name, "ruler.md")
    text = (REPO / "docs" / page).read_text(encoding="utf-8")
    marker = re.search(rf"<!-- {name}-measured: --num-samples (\S+) -->", text)
    assert marker, f"docs/{page} has no <!-- {name}-measured: --num-samples 4096=N --> marker"
    scope = parse_scope(marker[1])
    new = collect(REPO / "measured" / name, scope)
    assert {m for _, m in new} == new_methods
    old = {
        k: v
        for folder, shown in beside.items()
        for k, v in collect(REPO / "measured" / folder, scope).items()
        if k[0] in scope and (shown is None or k[1] in shown)
    }
    _, rows, _ = table({**old, **new})
    section = text.split(marker[0], 1)[1]
    for row in rows:
        line = "| " + " | ".join(str(c) for c in row) + " |"
        assert line in section, f"docs/{page} lacks the scored row {line}"
    for (length, method), scores in new.items():
        assert {e["n"] for e in scores.values()} == {scope[length]}, (length, method)


def test_the_8k_folder_repeats_the_main_tables_first_two_samples():
    """measured/ruler-variants8k holds 5 samples of full and gemfilter-span; its samples 0-1 are the main table's."""
    for method in ("full", "gemfilter-span_k256"):
        main = REPO / "measured" / "ruler" / "8192" / "pred" / method
        for f in sorted(main.glob("*.jsonl")):
            here = (REPO / "measured" / "ruler-variants8k" / "8192" / "pred" / method / f.name).read_text()
            assert here.splitlines()[:2] == f.read_text().splitlines(), (method, f.name)


def test_the_seed43_folder_holds_samples_unseen_by_the_seed42_runs():
    """The held-out rows are other samples: prepared with seed 43, and no NIAH answer of theirs is a seed-42 one."""
    held = REPO / "measured" / "ruler-seed43"
    assert json.loads((held / "prepare.json").read_text())["seed"] == 43
    seen = {
        "4096": REPO / "measured" / "ruler" / "4096" / "pred" / "full",
        "8192": REPO / "measured" / "ruler-variants8k" / "8192" / "pred" / "full",
    }
    lengths = sorted(p.name for p in held.iterdir() if p.is_dir())
    assert lengths and set(lengths) <= set(seen), lengths
    for length in lengths:
        old = seen[length]
        files = sorted((held / length / "pred" / "full").glob("niah_*.jsonl"))
        assert len(files) == 8, (length, files)
        for f in files:
            new = {o for row in read_rows(f) for o in row["outputs"]}
            before = {o for row in read_rows(old / f.name) for o in row["outputs"]}
            assert new and not new & before, (length, f.name, new & before)
