"""The figures of docs/scbench.md's section on this project's tasks are the scores of the rows committed in
measured/scbench-own: rescored here with the official per-turn aggregation (``eval.scbench.report``), and every
table line of the docs' block must be one the rows give, so a documented figure cannot drift from its run."""

import re
from collections import Counter
from pathlib import Path

import pytest
from docs_blocks import docs_block, table_lines

from eval.scbench.report import collect, markdown, score_table
from eval.scbench.scoring import score_one
from gemfilter.toolkit.io import read_jsonl

REPO = Path(__file__).resolve().parents[1]
ROOT = REPO / "measured" / "scbench-own"
DOC = REPO / "docs" / "scbench.md"
HELD_OUT = range(4, 20)  # the task sizes were chosen looking at seeds 0-3 (full only); 4-19 first ran for the tables


def by_task(name: str) -> dict:
    """{task: folder} of two runs named alike: GF.MultiKey's ``scbench-own-multikey-<name>``, GF.Facts'
    ``scbench-own-<name>``."""
    measured = REPO / "measured"
    return {"gf_multikey": measured / f"scbench-own-multikey-{name}", "gf_facts": measured / f"scbench-own-{name}"}


CALIBRATION = REPO / "measured" / "scbench-own-calibration"
FULL = REPO / "measured" / "scbench-own-full"
EIGHT_K = REPO / "measured" / "scbench-own-8k"
EIGHT_K_METHODS = REPO / "measured" / "scbench-own-8k-methods"  # gemfilter-span-qmax and the cache methods at 8K
EIGHT_K_SAMPLES = 10  # the 8K run's samples (seeds 0..n-1)
GEMFILTER = REPO / "measured" / "scbench-own-gemfilter"  # GF.Facts, 4K, gemfilter:k=256 beside full, both modes
GEMFILTER_8K = REPO / "measured" / "scbench-own-gemfilter-8k"  # the same at 8K, seeds 0-9
MULTIKEY_GEMFILTER_8K = REPO / "measured" / "scbench-own-multikey-gemfilter-8k"  # and on GF.MultiKey at 8K
# GF.MultiKey's needle wording was chosen looking at full's first answers on seeds 0-5, its keys' kinds looking at
# full's multi-request answers on seeds 0-5 (both lengths)
MULTIKEY_SEEN = range(6)
MULTIKEY = REPO / "measured" / "scbench-own-multikey"  # full on GF.MultiKey with keys of distinct kinds
MULTIKEY_METHODS = REPO / "measured" / "scbench-own-multikey-methods"  # the same task at 4K, k=256 methods beside
FACTS_K1024_MT = REPO / "measured" / "scbench-own-k1024-multi-turn"  # the k=1024 methods, multi-turn, seeds 0-19
FACTS_K1024_MT_8K = REPO / "measured" / "scbench-own-k1024-multi-turn-8k"  # the same at 8K, seeds 0-9
MULTIKEY_QMAX = REPO / "measured" / "scbench-own-multikey-qmax"  # full, gemfilter-span-qmax:k=256, seeds 0-19
MULTIKEY_K1024 = REPO / "measured" / "scbench-own-multikey-k1024"  # and gemfilter-span at k=1024, multi-request only
#: the same at k=1024 with every method of MULTIKEY_METHODS and gemfilter-span-qmax (reselect, reuse, stable), FastKV
#: and H2O, multi-request only, seeds 0-19
MULTIKEY_K1024_METHODS = REPO / "measured" / "scbench-own-multikey-k1024-methods"
#: the same labels on GF.MultiKey in multi-turn, seeds 0-19
MULTIKEY_K1024_MT = REPO / "measured" / "scbench-own-multikey-k1024-multi-turn"
MULTIKEY_K1024_MT_8K = REPO / "measured" / "scbench-own-multikey-k1024-multi-turn-8k"  # the same at 8K, seeds 0-9
#: MULTIKEY_K1024_METHODS' labels at 8K, multi-request, seeds 0-9
MULTIKEY_K1024_METHODS_8K = REPO / "measured" / "scbench-own-multikey-k1024-methods-8k"
#: GF.Facts at 4K, the same methods and protocols at k=1024, multi-request only, seeds 0-19
FACTS_K1024_METHODS = REPO / "measured" / "scbench-own-k1024-methods"
FACTS_K1024_METHODS_8K = REPO / "measured" / "scbench-own-k1024-methods-8k"  # the same at 8K, seeds 0-9
MULTIKEY_8K = REPO / "measured" / "scbench-own-multikey-8k"  # GF.MultiKey at 8K: gemfilter-span-qmax, both modes
#: GF.MultiKey at 8K, both modes, seeds 0-9: gemfilter-span:k=256 under reselect, reuse and stable, and the cache
#: methods (SnapKV, FastKV, H2O at k=256), with full
MULTIKEY_8K_METHODS = REPO / "measured" / "scbench-own-multikey-8k-methods"
#: GF.MultiKey at 8K, multi-turn, seeds 0-9: layer 5's reselect and uncapped stable-late-runs (--max-holes 1), with full
MULTIKEY_8K_RUNS_5 = REPO / "measured" / "scbench-own-multikey-8k-runs-5"
#: GF.Facts at 8K, multi-turn, seeds 0-9: layer 5's reselect and the capped stable-late-runs with new sentences first
#: (--max-holes 1 --max-fresh 64 --fresh-by runs-new --fresh-holes selection), with full
FACTS_8K_RUNS_NEW_5 = REPO / "measured" / "scbench-own-8k-runs-new-5"
MULTIKEY_CF = REPO / "measured" / "scbench-own-multikey-cf"  # gemfilter-span-qmax under stable-cf, multi-turn
FACTS_CF = REPO / "measured" / "scbench-own-cf"  # GF.Facts, the span methods under stable-cf, multi-turn
#: MULTIKEY_CF's stable-cf conversations at other rebuild shares (--max-holes; MULTIKEY_CF ran 0.5)
HOLES = {share: REPO / "measured" / f"scbench-own-multikey-holes-{share:g}" for share in (0.25, 1.0)}
#: stable-gap, multi-turn, 4K, seeds 0-19, with full: GF.MultiKey (gemfilter-span-qmax) and GF.Facts (both span methods)
MULTIKEY_GAP = REPO / "measured" / "scbench-own-multikey-gap"
FACTS_GAP = REPO / "measured" / "scbench-own-gap"
#: stable-front and stable-gap (the LM head skipped on a context write), multi-turn, 4K, gemfilter-span-qmax:k=256,
#: with full: GF.MultiKey (seeds 0-19) and GF.Facts (seeds 0-9)
MULTIKEY_FRONT = REPO / "measured" / "scbench-own-multikey-front"
FACTS_FRONT = REPO / "measured" / "scbench-own-front"
#: GF.Facts, multi-turn, 4K, seeds 0-9: rows that record each turn's selection time (select_s), with full;
#: gemfilter-span-qmax:k=256 under reselect and the three layouts, and at layer 5 under reselect and stable
FACTS_SELECT = REPO / "measured" / "scbench-own-select"
#: GF.MultiKey, multi-turn, 4K, seeds 0-9: gemfilter-span-qmax:k=256 at layer 5 under reselect and stable, with full
MULTIKEY_SELECT = REPO / "measured" / "scbench-own-multikey-select"
#: GF.Facts, multi-turn, 4K, seeds 0-9, gemfilter-span-qmax:k=256 at layer 5 under stable, with full: never rebuilt
#: after turn 1 (--max-holes 1); a follow-up capped at 32 single tokens (with reselect beside it); at 64 tokens in
#: whole runs; the same rebuilt by the whole selection's holes (--fresh-holes selection), which also ran seeds 10-19
#: (seen by no choice of its settings), with layer 5's reselect on seeds 0-19
FACTS_HOLES = REPO / "measured" / "scbench-own-holes"
FACTS_FRESH = {by: REPO / "measured" / f"scbench-own-fresh-{by}" for by in ("tokens", "runs", "selection")}
#: the last setting (64 tokens in whole runs, rebuilt by the whole selection's holes) on GF.MultiKey at 4K (seeds 0-9,
#: beside MULTIKEY_SELECT's reselect and uncapped stable) and on GF.Facts at 8K (seeds 0-9, with reselect)
MULTIKEY_FRESH = REPO / "measured" / "scbench-own-multikey-fresh"
FACTS_FRESH_8K = REPO / "measured" / "scbench-own-fresh-8k"
#: stable-cf and stable-gap at layer 5 (gemfilter-span-qmax:k=256,layer=5), multi-turn, 4K, seeds 0-9, with full:
#: GF.MultiKey (beside MULTIKEY_SELECT's layer 5) and GF.Facts (beside FACTS_SELECT's)
LAYOUTS_5 = by_task("layouts-5")
#: stable-cf at layer 5 with no hole rebuilds (--max-holes 1), multi-turn, 4K, seeds 0-9, with full: GF.MultiKey
#: uncapped; GF.MultiKey capped (--max-fresh 64 --fresh-by runs --fresh-holes selection, beside stable-gap at
#: --max-holes 1, uncapped); GF.Facts capped
CF_HOLES_5 = REPO / "measured" / "scbench-own-multikey-cf-holes-5"
CF_CAPPED_5 = by_task("cf-capped-5")
#: stable-gap (one forward) and stable-late at layer 5, multi-turn, 4K, seeds 0-9, with full: GF.MultiKey, GF.Facts
LATE_5 = by_task("late-5")
#: --max-holes 1, multi-turn, 4K, with full: stable-late on GF.MultiKey (seeds 0-9); stable-late-runs on GF.MultiKey
#: (seeds 0-9, then seeds 10-19 with layer 5's reselect on seeds 0-19) and on GF.Facts (seeds 0-9)
LATE_HOLES_5 = REPO / "measured" / "scbench-own-multikey-late-holes-5"
RUNS_5 = by_task("runs-5")
#: the capped stable-late-runs with --fresh-by runs-new (new sentences first), multi-turn, 4K, seeds 0-19, with full
RUNS_NEW_5 = by_task("runs-new-5")
#: stable-late-runs at layer 5, --max-holes 1, capped (--max-fresh 64 --fresh-by runs --fresh-holes selection),
#: multi-turn, 4K, seeds 0-9, with full: GF.MultiKey (then seeds 10-19), GF.Facts (then seeds 10-19, with layer 5's
#: reselect on 0-19)
RUNS_CAPPED_5 = by_task("runs-capped-5")
#: stable-late-runs at layer 5, --max-holes 1, multi-turn, 4K, seeds 0-19, with full, in one sitting: rebuilding
#: (--outgrown rebuild, the default) and reopening (--outgrown reopen), uncapped and capped as RUNS_NEW_5 (--max-fresh
#: 64 --fresh-by runs-new --fresh-holes selection), on both tasks
RUNS_REBUILD_5 = by_task("runs-rebuild-5")
RUNS_NEW_REBUILD_5 = by_task("runs-new-rebuild-5")
RUNS_REOPEN_5 = by_task("runs-reopen-5")
RUNS_NEW_REOPEN_5 = by_task("runs-new-reopen-5")
#: layer 5's reselect on seeds 0-19 of each task, beside the stable-late-runs runs
RESELECT_5 = {"gf_multikey": RUNS_5["gf_multikey"], "gf_facts": RUNS_CAPPED_5["gf_facts"]}
#: the stable-late-runs runs at layer 5 (--max-holes 1) that the docs set side by side, by name
LATE_RUNS_5 = [("uncapped", RUNS_5), ("capped, `runs`", RUNS_CAPPED_5), ("capped, `runs-new`", RUNS_NEW_5)]
#: the one sitting's rebuilding and reopening runs, side by side
REOPEN_RUNS_5 = [
    ("uncapped", RUNS_REBUILD_5),
    ("uncapped, reopen", RUNS_REOPEN_5),
    ("capped, `runs-new`", RUNS_NEW_REBUILD_5),
    ("capped, `runs-new`, reopen", RUNS_NEW_REOPEN_5),
]
REOPEN_FOLDERS = [folders for _, folders in REOPEN_RUNS_5]


@pytest.mark.parametrize(
    "folder,name",
    [
        (ROOT, "scbench-own-measured"),
        (GEMFILTER, "scbench-own-gemfilter"),
        (GEMFILTER_8K, "scbench-own-gemfilter-8k"),
        (MULTIKEY_GEMFILTER_8K, "scbench-own-multikey-gemfilter-8k"),
        (CALIBRATION, "scbench-own-calibration"),
        (FULL, "scbench-own-full"),
        (EIGHT_K, "scbench-own-8k"),
        (EIGHT_K_METHODS, "scbench-own-8k-methods"),
        (MULTIKEY, "scbench-own-multikey"),
        (MULTIKEY_METHODS, "scbench-own-multikey-methods"),
        (MULTIKEY_QMAX, "scbench-own-multikey-qmax"),
        (MULTIKEY_K1024, "scbench-own-multikey-k1024"),
        (MULTIKEY_K1024_METHODS, "scbench-own-multikey-k1024-methods"),
        (MULTIKEY_K1024_METHODS_8K, "scbench-own-multikey-k1024-methods-8k"),
        (FACTS_K1024_METHODS, "scbench-own-k1024-methods"),
        (FACTS_K1024_METHODS_8K, "scbench-own-k1024-methods-8k"),
        (FACTS_K1024_MT, "scbench-own-k1024-multi-turn"),
        (FACTS_K1024_MT_8K, "scbench-own-k1024-multi-turn-8k"),
        (MULTIKEY_K1024_MT, "scbench-own-multikey-k1024-multi-turn"),
        (MULTIKEY_K1024_MT_8K, "scbench-own-multikey-k1024-multi-turn-8k"),
        (MULTIKEY_8K, "scbench-own-multikey-8k"),
        (MULTIKEY_8K_METHODS, "scbench-own-multikey-8k-methods"),
        (MULTIKEY_8K_RUNS_5, "scbench-own-multikey-8k-runs-5"),
        (FACTS_8K_RUNS_NEW_5, "scbench-own-8k-runs-new-5"),
        (MULTIKEY_CF, "scbench-own-multikey-cf"),
        (FACTS_CF, "scbench-own-cf"),
        (HOLES[0.25], "scbench-own-multikey-holes-0.25"),
        (HOLES[1.0], "scbench-own-multikey-holes-1"),
        (MULTIKEY_GAP, "scbench-own-multikey-gap"),
        (FACTS_GAP, "scbench-own-gap"),
        (MULTIKEY_FRONT, "scbench-own-multikey-front"),
        (FACTS_FRONT, "scbench-own-front"),
        (FACTS_SELECT, "scbench-own-select"),
        (MULTIKEY_SELECT, "scbench-own-multikey-select"),
        (FACTS_HOLES, "scbench-own-holes"),
        (FACTS_FRESH["tokens"], "scbench-own-fresh-tokens"),
        (FACTS_FRESH["runs"], "scbench-own-fresh-runs"),
        (FACTS_FRESH["selection"], "scbench-own-fresh-selection"),
        (MULTIKEY_FRESH, "scbench-own-multikey-fresh"),
        (FACTS_FRESH_8K, "scbench-own-fresh-8k"),
        (LAYOUTS_5["gf_multikey"], "scbench-own-multikey-layouts-5"),
        (LAYOUTS_5["gf_facts"], "scbench-own-layouts-5"),
        (CF_HOLES_5, "scbench-own-multikey-cf-holes-5"),
        (CF_CAPPED_5["gf_multikey"], "scbench-own-multikey-cf-capped-5"),
        (CF_CAPPED_5["gf_facts"], "scbench-own-cf-capped-5"),
        (LATE_5["gf_multikey"], "scbench-own-multikey-late-5"),
        (LATE_5["gf_facts"], "scbench-own-late-5"),
        (LATE_HOLES_5, "scbench-own-multikey-late-holes-5"),
        (RUNS_5["gf_multikey"], "scbench-own-multikey-runs-5"),
        (RUNS_5["gf_facts"], "scbench-own-runs-5"),
        (RUNS_CAPPED_5["gf_multikey"], "scbench-own-multikey-runs-capped-5"),
        (RUNS_CAPPED_5["gf_facts"], "scbench-own-runs-capped-5"),
        (RUNS_NEW_5["gf_multikey"], "scbench-own-multikey-runs-new-5"),
        (RUNS_NEW_5["gf_facts"], "scbench-own-runs-new-5"),
        (RUNS_REOPEN_5["gf_multikey"], "scbench-own-multikey-runs-reopen-5"),
        (RUNS_REOPEN_5["gf_facts"], "scbench-own-runs-reopen-5"),
        (RUNS_NEW_REOPEN_5["gf_multikey"], "scbench-own-multikey-runs-new-reopen-5"),
        (RUNS_NEW_REOPEN_5["gf_facts"], "scbench-own-runs-new-reopen-5"),
        (RUNS_REBUILD_5["gf_multikey"], "scbench-own-multikey-runs-rebuild-5"),
        (RUNS_REBUILD_5["gf_facts"], "scbench-own-runs-rebuild-5"),
        (RUNS_NEW_REBUILD_5["gf_multikey"], "scbench-own-multikey-runs-new-rebuild-5"),
        (RUNS_NEW_REBUILD_5["gf_facts"], "scbench-own-runs-new-rebuild-5"),
    ],
)
def test_docs_tables_are_the_scores_of_the_committed_rows(folder, name):
    lines = table_lines(markdown(score_table(collect(folder))))
    shown = table_lines(docs_block("scbench.md", name))
    assert len(shown) >= 8
    assert [x for x in shown if x not in lines] == []
    assert [x for x in lines if x not in shown] == []  # and nothing measured is left out of the docs


def turns_by_seed(found: dict, label: str, task: str, length: int = 4096, mode: str = "multi-turn") -> dict:
    """{seed: the row's turns} of one label's ``mode`` rows of ``task`` at ``length`` in a collected folder."""
    return {int(r["_id"]): r["turns"] for r in found[(mode, length, label, task)]}


def gained_lost(x: dict, y: dict, seeds=range(20)) -> tuple:
    """(turns x answers and y does not, turns y answers and x does not) of two labels' turns ({seed: turns})."""
    every = [(i, t) for i in seeds for t in range(5)]
    return sum(x[i][t]["score"] > y[i][t]["score"] for i, t in every), sum(
        x[i][t]["score"] < y[i][t]["score"] for i, t in every
    )


def turn_ratios(x: dict, full: dict, seeds, first: int = 0) -> list:
    """Per turn from ``first``: a label's mean time to first token over ``full``'s on the same seeds, as the
    report's ratio columns give it."""
    return [
        round(sum(x[i][t]["ttft_s"] for i in seeds) / sum(full[i][t]["ttft_s"] for i in seeds), 2)
        for t in range(first, 5)
    ]


SPAN_K1024, QMAX_K1024 = "gemfilter-span:k=1024@{}", "gemfilter-span-qmax:k=1024@{}"
PAPER_K1024 = "gemfilter:k=1024@{}"
PROTOCOLS = ("reselect", "reuse", "stable")  # the prompt methods' protocols in the k=1024 runs
CACHE_K1024 = ("snapkv:k=1024", "fastkv:k=1024", "h2o:k=1024")  # the cache methods beside them (reuse only)


def span_k1024_turns(
    found: dict,
    task: str,
    length: int = 4096,
    protocols=PROTOCOLS,
    mode: str = "multi-turn",
    selections=(SPAN_K1024, QMAX_K1024),
) -> dict:
    """{label: {seed: turns}} of full and the selections at k=1024 (the two span ones unless told) under each
    protocol, in one mode."""
    names = ("full", *(f.format(p) for f in selections for p in protocols))
    return {name: turns_by_seed(found, name, task, length, mode) for name in names}


def ratio_spread(turns: dict, seeds, *names, first: int = 1) -> tuple:
    """(lowest, highest) ratio to full's time to first token over the labels' turns from ``first`` (the follow-ups,
    unless told; in multi-request every turn is a request of its own)."""
    every = [r for name in names for r in turn_ratios(turns[name], turns["full"], seeds, first)]
    return min(every), max(every)


def rebuilds(x: dict, seeds) -> list:
    """(seed, turn) of a label's follow-ups ({seed: turns}) that ran every token they keep: stable's rebuilds."""
    return [(i, t) for i in seeds for t in range(1, 5) if x[i][t]["recomputed"] == x[i][t]["kept"]]


def halves(x: dict, n: int = 10) -> list:
    """A label's accuracy (%) over all turns of seeds 0..n-1 and of seeds n..2n-1 ({seed: turns})."""
    return [
        round(100 * sum(x[i][t]["score"] for i in half for t in range(5)) / (5 * n))
        for half in (range(n), range(n, 2 * n))
    ]


def follow_ups(y: dict, full: dict, seeds=range(10)) -> tuple:
    """One protocol's turns ({seed: turns}) against ``full``'s on the same seeds: the mean over the follow-ups of the
    time to first token over full's on the same sample and turn, the follow-ups within 2x, the mean tokens run, the
    follow-ups that ran every kept token, and the per-turn accuracy (%), as the docs' tables give them."""
    follow = [(i, t) for i in seeds for t in range(1, 5)]
    return (
        round(sum(y[i][t]["ttft_s"] / full[i][t]["ttft_s"] for i, t in follow) / len(follow), 2),
        sum(y[i][t]["ttft_s"] <= 2 * full[i][t]["ttft_s"] for i, t in follow),
        round(sum(y[i][t]["recomputed"] for i, t in follow) / len(follow)),
        len(rebuilds(y, seeds)),
        [round(100 * sum(y[i][t]["score"] for i in seeds) / len(seeds)) for t in range(5)],
    )


def held_out_line(rows_by_label: dict) -> list:
    out = []
    for label, rows in sorted(rows_by_label.items()):
        picked = [r for r in rows if int(r["_id"]) in HELD_OUT]
        turns = [score_one("gf_facts", t["prediction"], t["ground_truth"]) for r in picked for t in r["turns"]]
        out.append(f"| {label} | {len(picked)} | {100 * sum(turns) / len(turns):.1f} |")
    return out


def test_held_out_seeds_table_is_computed_from_the_rows():
    """The mean accuracy over seeds 4-19 alone, per label (GF.Facts, multi-turn, 4K), as the docs show it."""
    rows = {k[2]: v for k, v in collect(ROOT).items() if k[:2] == ("multi-turn", 4096) and k[3] == "gf_facts"}
    assert len(rows) >= 5
    assert held_out_line(rows) == table_lines(docs_block("scbench.md", "scbench-own-held-out"))


@pytest.mark.parametrize(
    "folder,length,n",
    [
        (ROOT, 4096, 20),
        (CALIBRATION, 4096, 10),
        (FULL, 4096, 20),
        (FULL, 8192, 10),
        (EIGHT_K, 8192, EIGHT_K_SAMPLES),
        (EIGHT_K_METHODS, 8192, EIGHT_K_SAMPLES),
        (MULTIKEY, 4096, 20),
        (MULTIKEY, 8192, 10),
        (MULTIKEY_METHODS, 4096, 20),
        (MULTIKEY_QMAX, 4096, 20),
        (MULTIKEY_K1024, 4096, 10),
        (MULTIKEY_K1024_METHODS, 4096, 20),
        (MULTIKEY_K1024_METHODS_8K, 8192, EIGHT_K_SAMPLES),
        (FACTS_K1024_METHODS, 4096, 20),
        (FACTS_K1024_METHODS_8K, 8192, EIGHT_K_SAMPLES),
        (FACTS_K1024_MT, 4096, 20),
        (FACTS_K1024_MT_8K, 8192, EIGHT_K_SAMPLES),
        (MULTIKEY_K1024_MT, 4096, 20),
        (MULTIKEY_K1024_MT_8K, 8192, EIGHT_K_SAMPLES),
        (MULTIKEY_8K, 8192, EIGHT_K_SAMPLES),
        (MULTIKEY_8K_METHODS, 8192, EIGHT_K_SAMPLES),
        (MULTIKEY_8K_RUNS_5, 8192, EIGHT_K_SAMPLES),
        (FACTS_8K_RUNS_NEW_5, 8192, EIGHT_K_SAMPLES),
        (GEMFILTER, 4096, 20),
        (GEMFILTER_8K, 8192, EIGHT_K_SAMPLES),
        (MULTIKEY_GEMFILTER_8K, 8192, EIGHT_K_SAMPLES),
        (MULTIKEY_CF, 4096, 20),
        (FACTS_CF, 4096, 20),
        (HOLES[0.25], 4096, 10),
        (HOLES[1.0], 4096, 10),
        (MULTIKEY_GAP, 4096, 20),
        (FACTS_GAP, 4096, 20),
        (MULTIKEY_FRONT, 4096, 20),
        (FACTS_FRONT, 4096, 10),
        (FACTS_SELECT, 4096, 10),
        (MULTIKEY_SELECT, 4096, 10),
        (FACTS_HOLES, 4096, 10),
        (FACTS_FRESH["tokens"], 4096, 10),
        (FACTS_FRESH["runs"], 4096, 10),
        (FACTS_FRESH["selection"], 4096, 20),
        (MULTIKEY_FRESH, 4096, 10),
        (FACTS_FRESH_8K, 8192, 10),
        (LAYOUTS_5["gf_multikey"], 4096, 10),
        (LAYOUTS_5["gf_facts"], 4096, 10),
        (CF_HOLES_5, 4096, 10),
        (CF_CAPPED_5["gf_multikey"], 4096, 10),
        (CF_CAPPED_5["gf_facts"], 4096, 10),
        (LATE_5["gf_multikey"], 4096, 10),
        (LATE_5["gf_facts"], 4096, 10),
        (LATE_HOLES_5, 4096, 10),
        (RUNS_5["gf_multikey"], 4096, 20),
        (RUNS_5["gf_facts"], 4096, 10),
        (RUNS_CAPPED_5["gf_multikey"], 4096, 20),
        (RUNS_CAPPED_5["gf_facts"], 4096, 20),
        (RUNS_NEW_5["gf_multikey"], 4096, 20),
        (RUNS_NEW_5["gf_facts"], 4096, 20),
        *((folders[task], 4096, 20) for folders in REOPEN_FOLDERS for task in folders),
    ],
)
def test_every_committed_label_holds_samples_0_to_n_of_five_turns(folder, length, n):
    found = {k: v for k, v in collect(folder).items() if k[1] == length}
    assert found
    for key, rows in found.items():
        assert sorted(int(r["_id"]) for r in rows) == list(range(n)), key
        assert all(len(r["turns"]) == 5 for r in rows), key


@pytest.mark.parametrize(
    "folder,name", [(FULL, "scbench-own-full-held-out"), (MULTIKEY, "scbench-own-multikey-held-out")]
)
def test_multikey_on_the_seeds_its_wording_was_not_chosen_on(folder, name):
    """GF.MultiKey's per-turn accuracy of full over the seeds after MULTIKEY_SEEN, as the docs show it (RULER's keys,
    then keys of distinct kinds)."""
    out = []
    for (mode, length, label, task), rows in sorted(collect(folder).items()):
        if task != "gf_multikey":
            continue
        picked = [r for r in rows if int(r["_id"]) not in MULTIKEY_SEEN]
        per = [100 * sum(r["turns"][t]["score"] for r in picked) / len(picked) for t in range(5)]
        cells = " | ".join(f"{x:.1f}" for x in [*per, sum(per) / 5])
        out.append(f"| {mode} | {length} | {len(picked)} | {cells} |")
    assert len(out) == 4
    assert out == [x for x in table_lines(docs_block("scbench.md", name)) if not x.startswith("| mode")]


def test_the_multikey_rows_are_of_the_keys_they_are_documented_with():
    """measured/scbench-own-multikey's GF.MultiKey rows drew today's keys, one of each kind; measured/scbench-own-full's
    drew RULER's (its config.json has no multikey_keys, which a resume reads as the former keys). A sample's numbers
    are drawn after its keys and before its haystack (the order asked comes after it), so each row's answers are the
    numbers of today's draw of its seed at any size, and not the former draw's."""
    import json
    import random

    from eval.scbench import own

    assert "multikey_keys" not in json.loads((FULL / "config.json").read_text())
    assert json.loads((MULTIKEY / "config.json").read_text())["multikey_keys"] == own.MULTIKEY_KEY_STYLE

    def answers(rows):
        return {r["_id"]: sorted(t["ground_truth"] for t in r["turns"]) for r in rows}

    def drawn(seed):
        return sorted(t["answer"] for t in own.multikey(random.Random(int(seed)), 10, 5)["multi_turns"])

    for folder, today in ((MULTIKEY, True), (FULL, False)):
        found = {k: answers(v) for k, v in collect(folder).items() if k[3] == "gf_multikey"}
        assert len(found) == 4  # two modes, two lengths
        for rows in found.values():
            assert all((drawn(seed) == gold) == today for seed, gold in rows.items())


def multikey_answers(folder) -> list:
    """Every GF.MultiKey answer of full in ``folder``: (length, prediction, missed, names another needle's number),
    where each sample asks all five keys, so the other turns' answers are the other needles'."""
    import re

    out = []
    for (mode, length, label, task), rows in collect(folder).items():
        if task != "gf_multikey":
            continue
        for r in rows:
            golds = [t["ground_truth"] for t in r["turns"]]
            for t in r["turns"]:
                found = re.search(r"\d{7}", t["prediction"])
                other = bool(found) and found.group() in golds and found.group() != t["ground_truth"]
                out.append((length, t["prediction"], t["score"] < 1, t["score"] < 1 and other))
    return out


def test_multikey_misses_with_keys_of_distinct_kinds():
    """What the docs say of GF.MultiKey's wrong answers under full with today's keys: 35 of 300, 29 of them the
    number of another of the sample's needles, three a run of zeros."""
    found = multikey_answers(MULTIKEY)
    zeros = sum(missed and text.lstrip(": ").startswith("100000") for _, text, missed, _ in found)
    assert (len(found), sum(x[2] for x in found), sum(x[3] for x in found), zeros) == (300, 35, 29, 3)


def test_multikey_misses_are_another_needle_s_number():
    """What the docs say of GF.MultiKey's wrong answers under full with RULER's keys: 86 of 88 name the number of
    another of the sample's needles, all 55 of those at 4K."""
    found = multikey_answers(FULL)
    assert (sum(x[2] for x in found), sum(x[3] for x in found)) == (88, 86)
    at_4k = [x for x in found if x[0] == 4096]
    assert sum(x[2] for x in at_4k) == sum(x[3] for x in at_4k) == 55


def answers(found: dict, key: tuple) -> dict:
    """{sample id: the answers of its turns} of one (mode, length, label, task) of a collected folder."""
    return {r["_id"]: [t["prediction"] for t in r["turns"]] for r in found[key]}


@pytest.mark.parametrize(
    "folder,length,task,reference",
    [
        (ROOT, 4096, "gf_facts", FULL),
        (EIGHT_K, 8192, "gf_facts", FULL),
        (EIGHT_K_METHODS, 8192, "gf_facts", FULL),
        (GEMFILTER, 4096, "gf_facts", ROOT),
        (GEMFILTER_8K, 8192, "gf_facts", EIGHT_K),
        (MULTIKEY_GEMFILTER_8K, 8192, "gf_multikey", MULTIKEY),
        (MULTIKEY_METHODS, 4096, "gf_multikey", MULTIKEY),
        (MULTIKEY_QMAX, 4096, "gf_multikey", MULTIKEY),
        (MULTIKEY_K1024, 4096, "gf_multikey", MULTIKEY),
        (MULTIKEY_K1024_METHODS, 4096, "gf_multikey", MULTIKEY),
        (MULTIKEY_K1024_METHODS_8K, 8192, "gf_multikey", MULTIKEY),
        (FACTS_K1024_METHODS, 4096, "gf_facts", FULL),
        (FACTS_K1024_METHODS_8K, 8192, "gf_facts", EIGHT_K),
        (FACTS_K1024_MT, 4096, "gf_facts", FULL),
        (FACTS_K1024_MT_8K, 8192, "gf_facts", EIGHT_K),
        (MULTIKEY_K1024_MT, 4096, "gf_multikey", MULTIKEY),
        (MULTIKEY_K1024_MT_8K, 8192, "gf_multikey", MULTIKEY),
        (MULTIKEY_8K, 8192, "gf_multikey", MULTIKEY),
        (MULTIKEY_8K_METHODS, 8192, "gf_multikey", MULTIKEY),
        (MULTIKEY_8K_RUNS_5, 8192, "gf_multikey", MULTIKEY),
        (FACTS_8K_RUNS_NEW_5, 8192, "gf_facts", EIGHT_K),
        (MULTIKEY_CF, 4096, "gf_multikey", MULTIKEY),
        (HOLES[0.25], 4096, "gf_multikey", MULTIKEY),
        (HOLES[1.0], 4096, "gf_multikey", MULTIKEY),
        (FACTS_HOLES, 4096, "gf_facts", FULL),
        *((FACTS_FRESH[by], 4096, "gf_facts", FULL) for by in ("tokens", "runs", "selection")),
        (MULTIKEY_FRESH, 4096, "gf_multikey", MULTIKEY_SELECT),
        (FACTS_FRESH_8K, 8192, "gf_facts", EIGHT_K),
        (LAYOUTS_5["gf_multikey"], 4096, "gf_multikey", MULTIKEY_SELECT),
        (LAYOUTS_5["gf_facts"], 4096, "gf_facts", FACTS_SELECT),
        (CF_HOLES_5, 4096, "gf_multikey", MULTIKEY_SELECT),
        (CF_CAPPED_5["gf_multikey"], 4096, "gf_multikey", MULTIKEY_SELECT),
        (CF_CAPPED_5["gf_facts"], 4096, "gf_facts", FACTS_SELECT),
        (LATE_5["gf_multikey"], 4096, "gf_multikey", MULTIKEY_SELECT),
        (LATE_5["gf_facts"], 4096, "gf_facts", FACTS_SELECT),
        (LATE_HOLES_5, 4096, "gf_multikey", MULTIKEY_SELECT),
        (RUNS_5["gf_multikey"], 4096, "gf_multikey", MULTIKEY),
        (RUNS_5["gf_facts"], 4096, "gf_facts", FACTS_SELECT),
        (RUNS_CAPPED_5["gf_multikey"], 4096, "gf_multikey", RUNS_5["gf_multikey"]),
        (RUNS_CAPPED_5["gf_facts"], 4096, "gf_facts", FULL),
        (RUNS_NEW_5["gf_multikey"], 4096, "gf_multikey", RUNS_5["gf_multikey"]),
        (RUNS_NEW_5["gf_facts"], 4096, "gf_facts", RUNS_CAPPED_5["gf_facts"]),
        *((folders[task], 4096, task, RESELECT_5[task]) for folders in REOPEN_FOLDERS for task in folders),
    ],
)
def test_full_answers_the_same_in_two_runs(folder, length, task, reference):
    """Seeds 0-9 under full ran in each methods' run and in the full-only run: same prompts, greedy decoding, so
    every answer is the same: the rows are reproducible, not one draw of a noisy run."""
    here, full_only = collect(folder), collect(reference)
    for mode in sorted({k[0] for k in here}):  # the modes the folder ran
        first = answers(here, (mode, length, "full", task))
        again = {i: a for i, a in answers(full_only, (mode, length, "full", task)).items() if i in first}
        assert len(again) == len(first) >= 5
        for i, turns in again.items():
            assert turns == first[i], (mode, i)


def test_span_at_k1024_answers_the_same_in_two_runs():
    """gemfilter-span:k=1024 under reselect and stable ran in MULTIKEY_K1024 (seeds 0-9) and again beside the other
    methods (seeds 0-19): the same prompts, greedy decoding, so the same answers turn for turn on seeds 0-9 (the docs
    compare the two runs' times)."""
    first, again = collect(MULTIKEY_K1024), collect(MULTIKEY_K1024_METHODS)
    for protocol in ("reselect", "stable"):
        key = ("multi-request", 4096, f"gemfilter-span:k=1024@{protocol}", "gf_multikey")
        before = answers(first, key)
        shared = {i: a for i, a in answers(again, key).items() if i in before}
        assert len(before) == 10 and before == shared, protocol


@pytest.mark.parametrize(
    "folder,length,method,task",
    [
        (MULTIKEY_K1024, 4096, "gemfilter-span:k=1024", "gf_multikey"),
        (MULTIKEY_K1024_METHODS, 4096, "gemfilter:k=1024", "gf_multikey"),
        (MULTIKEY_K1024_METHODS, 4096, "gemfilter-span:k=1024", "gf_multikey"),
        (MULTIKEY_K1024_METHODS, 4096, "gemfilter-span-qmax:k=1024", "gf_multikey"),
        (FACTS_K1024_METHODS, 4096, "gemfilter:k=1024", "gf_facts"),
        (FACTS_K1024_METHODS, 4096, "gemfilter-span:k=1024", "gf_facts"),
        (FACTS_K1024_METHODS, 4096, "gemfilter-span-qmax:k=1024", "gf_facts"),
        (FACTS_K1024_MT, 4096, "gemfilter-span:k=1024", "gf_facts"),
        (FACTS_K1024_MT, 4096, "gemfilter-span-qmax:k=1024", "gf_facts"),
        (FACTS_K1024_MT_8K, 8192, "gemfilter-span:k=1024", "gf_facts"),
        (FACTS_K1024_MT_8K, 8192, "gemfilter-span-qmax:k=1024", "gf_facts"),
        (MULTIKEY_K1024_MT, 4096, "gemfilter-span:k=1024", "gf_multikey"),
        (MULTIKEY_K1024_MT, 4096, "gemfilter-span-qmax:k=1024", "gf_multikey"),
        (MULTIKEY_K1024_MT, 4096, "gemfilter:k=1024", "gf_multikey"),
        *(
            (folder, 8192, f"{m}:k=1024", "gf_multikey")
            for folder in (MULTIKEY_K1024_MT_8K, MULTIKEY_K1024_METHODS_8K)
            for m in ("gemfilter-span", "gemfilter-span-qmax")
        ),
        (MULTIKEY_K1024_METHODS_8K, 8192, "gemfilter:k=1024", "gf_multikey"),
        *(
            (FACTS_K1024_METHODS_8K, 8192, f"{m}:k=1024", "gf_facts")
            for m in ("gemfilter", "gemfilter-span", "gemfilter-span-qmax")
        ),
        (ROOT, 4096, "gemfilter-span:k=256", "gf_facts"),
        (ROOT, 4096, "gemfilter-span-qmax:k=256", "gf_facts"),
        (GEMFILTER, 4096, "gemfilter:k=256", "gf_facts"),
        (GEMFILTER_8K, 8192, "gemfilter:k=256", "gf_facts"),
        (MULTIKEY_GEMFILTER_8K, 8192, "gemfilter:k=256", "gf_multikey"),
        (EIGHT_K, 8192, "gemfilter-span:k=256", "gf_facts"),
        (EIGHT_K_METHODS, 8192, "gemfilter-span-qmax:k=256", "gf_facts"),
        (MULTIKEY_METHODS, 4096, "gemfilter-span:k=256", "gf_multikey"),
        (MULTIKEY_METHODS, 4096, "gemfilter:k=256", "gf_multikey"),
        (MULTIKEY_QMAX, 4096, "gemfilter-span-qmax:k=256", "gf_multikey"),
        (MULTIKEY_8K, 8192, "gemfilter-span-qmax:k=256", "gf_multikey"),
        (MULTIKEY_8K_METHODS, 8192, "gemfilter-span:k=256", "gf_multikey"),
        (MULTIKEY_CF, 4096, "gemfilter-span-qmax:k=256", "gf_multikey"),
        (FACTS_CF, 4096, "gemfilter-span:k=256", "gf_facts"),
        (FACTS_CF, 4096, "gemfilter-span-qmax:k=256", "gf_facts"),
    ],
)
def test_stable_runs_fewer_tokens_than_reselect_on_follow_ups(folder, length, method, task):
    """What the tables' last block reports, read from the rows: reselect runs all its kept tokens (at most k) on
    every turn; stable's follow-ups run fewer on average (the newly kept ones, or all when it rebuilds): from 9%
    of reselect's (gemfilter-span at k=1024 on GF.MultiKey, multi-turn; 14% with -qmax there, 34% with gemfilter;
    19% and 20% on GF.Facts; in multi-request 25% and 26%; 32% for gemfilter-span on GF.Facts at k=256) to 87%
    (gemfilter on GF.MultiKey at 8K, multi-request; 72% at 4K, where seeds 0-9 alone gave 69%; on GF.Facts 76% at
    8K, 73% at 4K). The tables pin the means."""
    found, k = collect(folder), int(method.rsplit("=", 1)[1])
    for mode in sorted({key[0] for key in found}):  # the modes the folder ran
        reselect = found[(mode, length, f"{method}@reselect", task)]
        stable = found[(mode, length, f"{method}@stable", task)]
        assert all(t["recomputed"] == t["kept"] <= k for r in reselect for t in r["turns"])  # all it keeps
        follow = [t["recomputed"] for r in stable for t in r["turns"][1:]]
        again = [t["recomputed"] for r in reselect for t in r["turns"][1:]]
        assert all(0 < x <= k for x in follow) and sum(follow) / len(follow) < sum(again) / len(again)


def fact_kind(answer: str) -> str:
    """GF.Facts' kind of fact from its answer's shape (eval/scbench/own.py:_fact): a 7-digit magic number, an
    8-letter passphrase, a platform 2-19, the San Francisco sentence's park, else where the key is hidden."""
    import re

    if answer == "Dolores Park":
        return "sf"
    for kind, shape in (("magic", r"\d{7}"), ("platform", r"\d{1,2}"), ("passphrase", r"[a-z]{8}")):
        if re.fullmatch(shape, answer):
            return kind
    return "where"


def test_gemfilter_at_8k_keeps_some_kinds_of_fact():
    """What the docs say of gemfilter:k=256@reselect on GF.Facts at 8K, over both modes' 20 conversations: the
    platform 20 of 20, where the key is 14, the magic number 9, the San Francisco sentence 3, the passphrase 3;
    full 99 of 100, the one miss a passphrase."""
    found = collect(GEMFILTER_8K)

    def right(label):
        out = {}
        for mode in ("multi-request", "multi-turn"):
            for row in found[(mode, 8192, label, "gf_facts")]:
                for t in row["turns"]:
                    kind = fact_kind(t["ground_truth"])
                    out[kind] = out.get(kind, 0) + score_one("gf_facts", t["prediction"], t["ground_truth"])
        return out

    assert right("gemfilter:k=256@reselect") == {"platform": 20, "where": 14, "magic": 9, "sf": 3, "passphrase": 3}
    assert right("full") == {"platform": 20, "where": 20, "magic": 20, "sf": 20, "passphrase": 19}


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


def test_ruler_s_own_rows_give_what_the_goals_say_of_vt_and_multikey():
    """The goals' evidence that GF.VarTrack and GF.MultiKey ask more than the embedded model gives: RULER's vt and
    niah_multikey_1 under full, rescored with RULER's metric from the committed rows, as docs/scbench.md states."""
    from eval.ruler.report import score_folder

    runs = [
        ("ruler", 4096),
        ("ruler-seed43", 4096),
        ("ruler", 8192),
        ("ruler-seed43", 8192),
        ("ruler-variants8k", 8192),
    ]
    scored = {run: score_folder(REPO / "measured" / run[0] / str(run[1]) / "pred" / "full") for run in runs}

    def scores(task):
        return [(*run, scored[run][task]["n"], f"{scored[run][task]['score']:.1f}") for run in runs]

    assert scores("vt") == [
        ("ruler", 4096, 20, "0.0"),
        ("ruler-seed43", 4096, 20, "0.0"),
        ("ruler", 8192, 2, "0.0"),
        ("ruler-seed43", 8192, 5, "0.0"),
        ("ruler-variants8k", 8192, 5, "0.0"),
    ]
    assert [s[3] for s in scores("niah_multikey_1")] == ["80.0", "85.0", "0.0", "80.0", "20.0"]
    text = " ".join(DOC.read_text(encoding="utf-8").split())
    assert "`vt` scores 0.0 at 4K (20 samples in `measured/ruler`, 20 in `measured/ruler-seed43`)" in text
    assert "scores 80.0 and 85.0 at 4K, and 0.0, 80.0 and 20.0 at 8K in those folders" in text


KEPT = MULTIKEY_METHODS / "kept-gemfilter-span-k256.jsonl"  # scripts/multikey_kept.py's records, seeds 0-19
KEPT_QMAX = MULTIKEY_QMAX / "kept-gemfilter-span-qmax-k256.jsonl"
KEPT_K1024 = MULTIKEY_K1024 / "kept-gemfilter-span-k1024.jsonl"
KEPT_K1024_QMAX = MULTIKEY_K1024_METHODS / "kept-gemfilter-span-qmax-k1024.jsonl"
KEPT_K1024_GEMFILTER = MULTIKEY_K1024_METHODS / "kept-gemfilter-k1024.jsonl"
KEPT_8K = MULTIKEY_8K_METHODS / "kept-gemfilter-span-k256.jsonl"  # the same at 8K, seeds 0-9


@pytest.mark.parametrize(
    "path,folder,method,seeds,counts,others",
    [
        # seeds 0-9 (the prompts the -qmax and k=1024 sections compare with): kept whole in 30 of 50 prompts; right
        # in 29 of those 30, in none of the 20 others
        (KEPT, MULTIKEY_METHODS, "gemfilter-span:k=256", 10, {(True, 1.0): 29, (True, 0.0): 1, (False, 0.0): 20}, 85),
        # seeds 0-19: kept whole in 52 of 100 prompts; right in 51 of those 52, in none of the 48 others
        (KEPT, MULTIKEY_METHODS, "gemfilter-span:k=256", 20, {(True, 1.0): 51, (True, 0.0): 1, (False, 0.0): 48}, 165),
        # kept whole in all 50, and all 50 right
        (KEPT_QMAX, MULTIKEY_QMAX, "gemfilter-span-qmax:k=256", 10, {(True, 1.0): 50}, 161),
        # and in all 100 of seeds 0-19, all 100 right
        (KEPT_QMAX, MULTIKEY_QMAX, "gemfilter-span-qmax:k=256", 20, {(True, 1.0): 100}, 320),
        # at k=1024: every needle of the sample kept whole in all 50 prompts; 48 right
        (KEPT_K1024, MULTIKEY_K1024, "gemfilter-span:k=1024", 10, {(True, 1.0): 48, (True, 0.0): 2}, 200),
        # gemfilter-span-qmax at k=1024: every needle kept whole in all 50 prompts of seeds 0-9; 49 right
        (
            KEPT_K1024_QMAX,
            MULTIKEY_K1024_METHODS,
            "gemfilter-span-qmax:k=1024",
            10,
            {(True, 1.0): 49, (True, 0.0): 1},
            200,
        ),
        # and in all 100 of seeds 0-19; 98 right
        (
            KEPT_K1024_QMAX,
            MULTIKEY_K1024_METHODS,
            "gemfilter-span-qmax:k=1024",
            20,
            {(True, 1.0): 98, (True, 0.0): 2},
            400,
        ),
        # the paper's token-level gemfilter at k=1024: kept whole in 27 of 50 prompts, all 27 right, none of the others
        (
            KEPT_K1024_GEMFILTER,
            MULTIKEY_K1024_METHODS,
            "gemfilter:k=1024",
            10,
            {(True, 1.0): 27, (False, 0.0): 23},
            101,
        ),
        # seeds 0-19: kept whole in 48 of 100, all 48 right; 1 of the 52 others right (seed 11, turn 2: the number kept)
        (
            KEPT_K1024_GEMFILTER,
            MULTIKEY_K1024_METHODS,
            "gemfilter:k=1024",
            20,
            {(True, 1.0): 48, (False, 0.0): 51, (False, 1.0): 1},
            174,
        ),
        # at 8K: kept whole in 30 of 50 prompts; right in 28 of those 30, in none of the 20 others
        (
            KEPT_8K,
            MULTIKEY_8K_METHODS,
            "gemfilter-span:k=256",
            10,
            {(True, 1.0): 28, (True, 0.0): 2, (False, 0.0): 20},
            111,
        ),
    ],
)
def test_multikey_turns_are_right_where_the_selection_keeps_the_asked_needle(
    path, folder, method, seeds, counts, others
):
    """What the docs say of the span selections on GF.MultiKey (multi-request): in how many of the prompts of
    seeds 0..seeds-1 the selection keeps the asked needle whole (and how many other needles in all), and how many of
    those reselect turns are right. The committed rows' scores against the committed selection records."""
    found = collect(folder)
    (length,) = {key[1] for key in found}  # each folder ran one length
    rows = {int(r["_id"]): r["turns"] for r in found[("multi-request", length, f"{method}@reselect", "gf_multikey")]}
    records = [x for x in read_jsonl(path, strict=True) if x["seed"] < seeds]
    assert sorted((x["seed"], x["turn"]) for x in records) == [(s, t) for s in range(seeds) for t in range(5)]
    pairs = [(x["asked_whole"], rows[x["seed"]][x["turn"]]["score"]) for x in records]
    assert {k: pairs.count(k) for k in set(pairs)} == counts
    assert sum(len(x["others_whole"]) for x in records) == others


def kept_first(folder: Path, method: str) -> Path:
    """scripts/multikey_kept.py --mode multi-turn --turns 1's records in a k=1024 multi-turn folder: the method's
    selection on the first prompt of each conversation (what reuse keeps for all five turns), the folder's seeds."""
    return folder / f"kept-first-{method}-k1024.jsonl"


@pytest.mark.parametrize(
    "folder,method,every,counts",
    [
        # every needle kept on all 20 seeds: 96 of the 100 turns right (reselect: 95), 97 with gemfilter-span (as
        # reselect); the paper's gemfilter keeps all five on no seed, and 28 turns are right
        (MULTIKEY_K1024_MT, "gemfilter-span-qmax", 20, {(True, 1.0): 96, (True, 0.0): 4}),
        (MULTIKEY_K1024_MT, "gemfilter-span", 20, {(True, 1.0): 97, (True, 0.0): 3}),
        (MULTIKEY_K1024_MT, "gemfilter", 0, {(False, 1.0): 28, (False, 0.0): 72}),
        # at 8K, seeds 0-9: -qmax keeps every needle on all 10 and answers all 50 turns; gemfilter-span keeps every
        # needle on 6, answers all 30 of their turns and 15 of the other 20; gemfilter none, 16 of 50
        (MULTIKEY_K1024_MT_8K, "gemfilter-span-qmax", 10, {(True, 1.0): 50}),
        (MULTIKEY_K1024_MT_8K, "gemfilter-span", 6, {(True, 1.0): 30, (False, 1.0): 15, (False, 0.0): 5}),
        (MULTIKEY_K1024_MT_8K, "gemfilter", 0, {(False, 1.0): 16, (False, 0.0): 34}),
    ],
)
def test_reuse_answers_where_the_first_selection_keeps_every_needle(folder, method, every, counts):
    """GF.MultiKey at k=1024 in multi-turn, 4K and 8K: ``reuse`` answers every turn from its first turn's
    selection. The records of that selection give in how many samples it keeps all five needles whole, and the reuse
    rows' turns, split by it, how many are right: (all five kept, score) -> turns."""
    found = collect(folder)
    (length,) = {key[1] for key in found}  # each folder ran one length
    rows = turns_by_seed(found, f"{method}:k=1024@reuse", "gf_multikey", length)
    kept = read_jsonl(kept_first(folder, method), strict=True)
    assert sorted((x["seed"], x["turn"]) for x in kept) == [(i, 0) for i in sorted(rows)]  # the rows' seeds, each once
    whole = {x["seed"]: x["asked_whole"] and len(x["others_whole"]) == 4 for x in kept}
    assert sum(whole.values()) == every
    pairs = [(whole[i], rows[i][t]["score"]) for i in rows for t in range(5)]
    assert {k: pairs.count(k) for k in set(pairs)} == counts


def script_and_model(name: str) -> tuple:
    """scripts/<name>.py loaded as a module, and the embedded model and tokenizer on 2 threads, as the scripts run."""
    import importlib.util

    import torch

    import gemfilter

    spec = importlib.util.spec_from_file_location(name, REPO / "scripts" / f"{name}.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    torch.set_num_threads(2)
    return (script, *gemfilter.load_model(None))


@pytest.mark.slow
def test_the_selection_records_are_what_the_script_computes_now():
    """scripts/multikey_kept.py on seed 0 with the embedded model gives the committed records of seed 0, of a
    multi-request selection and of a multi-turn conversation's first."""
    import gemfilter

    script, model, tok = script_and_model("multikey_kept")
    got = script.kept(model, tok, gemfilter.get_method("gemfilter-span", topk=256), 0, 4096)
    assert got == [x for x in read_jsonl(KEPT, strict=True) if x["seed"] == 0]
    qmax = gemfilter.get_method("gemfilter-span-qmax", topk=1024)
    got = script.kept(model, tok, qmax, 0, 4096, mode="multi-turn", turns=1)
    assert got == [
        x for x in read_jsonl(kept_first(MULTIKEY_K1024_MT, "gemfilter-span-qmax"), strict=True) if x["seed"] == 0
    ]


def test_facts_k1024_multi_turn_rows_give_what_the_docs_say():
    """measured/scbench-own-k1024-multi-turn (GF.Facts, 4K, the k=1024 methods in multi-turn, seeds 0-19, two
    sittings): the turns reselect gains and loses against full, stable against reselect, stable-qmax's score on each
    half of the seeds, and the follow-ups' ratios to full's time to first token, as docs/scbench.md gives them."""
    turns = span_k1024_turns(collect(FACTS_K1024_MT), "gf_facts", protocols=("reselect", "stable"))
    span, qmax = SPAN_K1024, QMAX_K1024
    assert gained_lost(turns[qmax.format("reselect")], turns["full"]) == (3, 0)
    assert gained_lost(turns[span.format("reselect")], turns["full"]) == (3, 1)
    assert gained_lost(turns[qmax.format("stable")], turns[qmax.format("reselect")]) == (0, 3)
    assert gained_lost(turns[span.format("stable")], turns[span.format("reselect")]) == (1, 8)
    assert halves(turns[qmax.format("stable")]) == [100, 94]
    assert ratio_spread(turns, range(20), qmax.format("stable")) == (2.63, 3.66)
    assert ratio_spread(turns, range(10, 20), span.format("reselect"), qmax.format("reselect")) == (10.19, 10.49)


def test_facts_k1024_multi_turn_at_8k_gives_what_the_docs_say():
    """measured/scbench-own-k1024-multi-turn-8k (GF.Facts, 8K, the k=1024 methods in multi-turn, seeds 0-9, two
    sittings): the turns reselect and stable miss where full answers, stable against reselect, the ratio ranges of the
    follow-ups and of the first turn, where stable rebuilds, and the span selections' scores in each sitting, as
    docs/scbench.md gives them."""
    selections = (SPAN_K1024, QMAX_K1024, PAPER_K1024)
    found = collect(FACTS_K1024_MT_8K)
    turns = span_k1024_turns(found, "gf_facts", 8192, selections=selections)
    span, qmax, paper = selections
    seeds = range(EIGHT_K_SAMPLES)

    def missed(name):  # (seed, turn) of the wrong turns
        return [(i, t) for i in seeds for t in range(5) if not turns[name][i][t]["score"]]

    assert missed("full") == []
    assert missed(qmax.format("reselect")) == [(0, 3), (3, 4)]
    assert missed(span.format("reselect")) == [(0, 3), (4, 2)]
    assert missed(qmax.format("stable")) == [(0, 3), (6, 2), (9, 3)]
    assert missed(span.format("stable")) == [(0, 3), (5, 3), (6, 2)]
    for f in (span, qmax):
        assert gained_lost(turns[f.format("stable")], turns[f.format("reselect")], seeds) == (1, 2)
    assert gained_lost(turns[paper.format("stable")], turns[paper.format("reselect")], seeds) == (1, 12)
    assert ratio_spread(turns, seeds, span.format("reselect"), qmax.format("reselect")) == (9.63, 10.5)
    assert ratio_spread(turns, seeds, qmax.format("stable")) == (2.95, 4.91)
    assert ratio_spread(turns, seeds, span.format("stable")) == (2.37, 2.56)
    assert ratio_spread(turns, seeds, paper.format("stable")) == (5.45, 7.87)
    assert rebuilds(turns[qmax.format("stable")], seeds) == [(4, 4), (7, 4), (9, 4)]
    assert rebuilds(turns[span.format("stable")], seeds) == []
    once = rebuilds(turns[paper.format("stable")], seeds)
    assert [i for i, _ in once] == list(seeds) and {t for _, t in once} == {2, 3, 4}  # once a seed, turns 3-5
    # the first turn: the prompt methods against full, which prefills the whole history
    first = [turn_ratios(turns[f.format(p)], turns["full"], seeds, 0)[0] for f in selections for p in PROTOCOLS]
    assert (min(first), max(first)) == (0.66, 0.73)
    # reuse and the cache methods' follow-ups
    turns |= {name: turns_by_seed(found, name, "gf_facts", 8192) for name in CACHE_K1024}
    assert ratio_spread(turns, seeds, *(f.format("reuse") for f in selections), *CACHE_K1024) == (0.8, 0.97)
    # the two sittings: the span selections' accuracy (%) on seeds 0-4 and 5-9
    for p, scores in (("reselect", [92, 100]), ("stable", [96, 92])):
        assert [halves(turns[f.format(p)], 5) for f in (span, qmax)] == [scores, scores]


def test_multikey_k1024_multi_turn_rows_give_what_the_docs_say():
    """measured/scbench-own-multikey-k1024-multi-turn (GF.MultiKey, 4K, the k=1024 methods in multi-turn, seeds
    0-19): the turns reselect gains and loses against full, reuse and stable against reselect, reuse's score on each
    half of the seeds, the ratios of the follow-ups to full's time to first token, and what stable's missed
    follow-ups answer, as docs/scbench.md gives them."""
    turns = span_k1024_turns(collect(MULTIKEY_K1024_MT), "gf_multikey")
    span, qmax = SPAN_K1024, QMAX_K1024
    assert gained_lost(turns[span.format("reselect")], turns["full"]) == (8, 0)
    assert gained_lost(turns[qmax.format("reselect")], turns["full"]) == (6, 0)
    assert gained_lost(turns[span.format("reuse")], turns[span.format("reselect")]) == (0, 0)
    assert gained_lost(turns[qmax.format("reuse")], turns[qmax.format("reselect")]) == (1, 0)
    assert gained_lost(turns[qmax.format("stable")], turns[qmax.format("reselect")]) == (1, 47)
    assert gained_lost(turns[span.format("stable")], turns[span.format("reselect")]) == (0, 42)
    assert [halves(turns[f.format("reuse")]) for f in (span, qmax)] == [[98, 96], [98, 94]]
    seeds = range(20)
    assert ratio_spread(turns, seeds, span.format("reselect"), qmax.format("reselect")) == (8.16, 9.27)
    assert ratio_spread(turns, seeds, span.format("reuse"), qmax.format("reuse")) == (0.84, 1.01)
    assert ratio_spread(turns, seeds, qmax.format("stable")) == (1.84, 3.61)
    assert ratio_spread(turns, seeds, span.format("stable")) == (1.68, 2.0)

    def missed(name):  # stable's wrong follow-ups: no number, an earlier turn's answer, a 1 and zeros
        out = {"none": 0, "earlier": 0, "zeros": 0, "other": 0}
        for x in turns[name].values():
            for t in range(1, 5):
                if x[t]["score"]:
                    continue
                number = re.search(r"\d{5,}", x[t]["prediction"])
                if number is None:
                    out["none"] += 1
                elif number.group()[:7] in [x[s]["ground_truth"] for s in range(t)]:
                    out["earlier"] += 1
                elif re.fullmatch(r"10*", number.group()):
                    out["zeros"] += 1
                else:
                    out["other"] += 1
        return out

    assert missed(qmax.format("stable")) == {"none": 20, "earlier": 14, "zeros": 13, "other": 3}
    assert missed(span.format("stable")) == {"none": 23, "earlier": 14, "zeros": 5, "other": 3}


def test_multikey_k1024_multi_turn_at_8k_gives_what_the_docs_say():
    """measured/scbench-own-multikey-k1024-multi-turn-8k (GF.MultiKey, 8K, the k=1024 methods in multi-turn, seeds
    0-9): the turns reselect gains and loses against full, reuse and stable against reselect, reuse's per-turn
    scores and the follow-ups' ratio ranges, as docs/scbench.md gives them."""
    turns = span_k1024_turns(collect(MULTIKEY_K1024_MT_8K), "gf_multikey", 8192)
    span, qmax = SPAN_K1024, QMAX_K1024
    seeds = range(EIGHT_K_SAMPLES)
    assert gained_lost(turns[qmax.format("reselect")], turns["full"], seeds) == (5, 0)
    assert gained_lost(turns[span.format("reselect")], turns["full"], seeds) == (6, 2)
    assert gained_lost(turns[qmax.format("reuse")], turns[qmax.format("reselect")], seeds) == (1, 0)
    assert gained_lost(turns[span.format("reuse")], turns[span.format("reselect")], seeds) == (1, 4)
    assert gained_lost(turns[qmax.format("stable")], turns[qmax.format("reselect")], seeds) == (0, 24)
    assert gained_lost(turns[span.format("stable")], turns[span.format("reselect")], seeds) == (0, 21)
    per_turn = {
        name: [10 * sum(turns[name][i][t]["score"] for i in seeds) for t in range(5)]
        for name in (span.format("reuse"), span.format("reselect"))
    }
    assert per_turn == {span.format("reuse"): [90, 100, 90, 80, 90], span.format("reselect"): [90, 100, 90, 100, 100]}
    assert ratio_spread(turns, seeds, span.format("reselect"), qmax.format("reselect")) == (8.43, 8.66)
    assert ratio_spread(turns, seeds, qmax.format("reuse")) == (0.82, 0.83)
    assert ratio_spread(turns, seeds, qmax.format("stable")) == (1.85, 3.54)
    assert ratio_spread(turns, seeds, span.format("stable")) == (1.91, 2.1)


def test_multikey_k1024_methods_at_8k_give_what_the_docs_say():
    """measured/scbench-own-multikey-k1024-methods-8k (GF.MultiKey, 8K, the k=1024 methods in multi-request, seeds
    0-9): the turns reselect gains and loses against full, stable against reselect, stable's per-turn scores, the
    ratio ranges to full's time to first token over every turn, and that stable rebuilds on no follow-up, as
    docs/scbench.md gives them."""
    selections = (SPAN_K1024, QMAX_K1024, PAPER_K1024)
    turns = span_k1024_turns(
        collect(MULTIKEY_K1024_METHODS_8K), "gf_multikey", 8192, mode="multi-request", selections=selections
    )
    span, qmax, paper = selections
    seeds = range(EIGHT_K_SAMPLES)
    assert gained_lost(turns[qmax.format("reselect")], turns["full"], seeds) == (6, 2)
    assert gained_lost(turns[span.format("reselect")], turns["full"], seeds) == (6, 3)
    assert gained_lost(turns[paper.format("reselect")], turns["full"], seeds) == (1, 20)
    assert gained_lost(turns[qmax.format("stable")], turns[qmax.format("reselect")], seeds) == (2, 1)
    assert gained_lost(turns[span.format("stable")], turns[span.format("reselect")], seeds) == (2, 2)
    assert gained_lost(turns[paper.format("stable")], turns[paper.format("reselect")], seeds) == (0, 4)
    per_turn = {name: [10 * sum(turns[name][i][t]["score"] for i in seeds) for t in range(5)] for name in turns}
    assert per_turn[qmax.format("stable")] == [100, 90, 90, 100, 100]
    assert all(a >= b for a, b in zip(per_turn[qmax.format("stable")], per_turn[qmax.format("reselect")]))
    assert ratio_spread(turns, seeds, *(f.format("reselect") for f in selections), first=0) == (8.56, 9.48)
    assert ratio_spread(turns, seeds, qmax.format("stable"), first=0) == (4.48, 4.75)
    assert ratio_spread(turns, seeds, span.format("stable"), first=0) == (3.57, 3.78)
    assert ratio_spread(turns, seeds, paper.format("stable"), first=0) == (6.94, 7.51)
    assert all(rebuilds(turns[f.format("stable")], seeds) == [] for f in selections)


def test_facts_k1024_methods_at_8k_give_what_the_docs_say():
    """measured/scbench-own-k1024-methods-8k (GF.Facts, 8K, the k=1024 methods in multi-request, seeds 0-9): the
    turns full misses, reselect against full and stable against reselect, the ratio ranges to full's time to first
    token over every turn (all seeds, and seeds 1-9 without seed 0's two slow full turns; reuse and the cache methods
    too), and that stable rebuilds on no turn, as docs/scbench.md gives them."""
    selections = (SPAN_K1024, QMAX_K1024, PAPER_K1024)
    found = collect(FACTS_K1024_METHODS_8K)
    turns = span_k1024_turns(found, "gf_facts", 8192, mode="multi-request", selections=selections)
    span, qmax, paper = selections
    seeds = range(EIGHT_K_SAMPLES)
    assert [(i, t) for i in seeds for t in range(5) if not turns["full"][i][t]["score"]] == [(9, 2)]
    assert [round(turns["full"][0][t]["ttft_s"], 2) for t in (1, 3)] == [0.71, 1.05]
    for f in (span, qmax):
        assert gained_lost(turns[f.format("reselect")], turns["full"], seeds) == (1, 0)
    assert gained_lost(turns[paper.format("reselect")], turns["full"], seeds) == (0, 14)
    assert gained_lost(turns[qmax.format("stable")], turns[qmax.format("reselect")], seeds) == (0, 1)
    assert gained_lost(turns[span.format("stable")], turns[span.format("reselect")], seeds) == (0, 2)
    assert gained_lost(turns[paper.format("stable")], turns[paper.format("reselect")], seeds) == (1, 6)
    reselect = [f.format("reselect") for f in selections]
    assert ratio_spread(turns, seeds, *reselect, first=0) == (6.63, 11.09)
    assert ratio_spread(turns, range(1, 10), *reselect, first=0) == (8.67, 11.46)
    assert ratio_spread(turns, seeds, qmax.format("stable"), first=0) == (2.85, 4.28)
    assert ratio_spread(turns, range(1, 10), qmax.format("stable"), first=0) == (3.51, 4.5)
    assert ratio_spread(turns, seeds, span.format("stable"), first=0) == (2.28, 3.16)
    assert ratio_spread(turns, range(1, 10), span.format("stable"), first=0) == (2.85, 3.16)
    assert ratio_spread(turns, seeds, paper.format("stable"), first=0) == (5.02, 6.94)
    assert ratio_spread(turns, range(1, 10), paper.format("stable"), first=0) == (6.23, 7.18)
    assert all(rebuilds(turns[f.format("stable")], seeds) == [] for f in selections)
    # reuse and the cache methods, which have only reuse
    others = (*(f.format("reuse") for f in selections), *CACHE_K1024)
    turns |= {name: turns_by_seed(found, name, "gf_facts", 8192, "multi-request") for name in others}
    assert ratio_spread(turns, seeds, *others, first=0) == (0.54, 0.87)
    assert ratio_spread(turns, range(1, 10), *others, first=0) == (0.66, 0.91)


def test_multikey_qmax_rows_give_what_the_docs_say():
    """measured/scbench-own-multikey-qmax (GF.MultiKey, 4K, gemfilter-span-qmax:k=256, seeds 0-19, three runs): the
    turns stable and reuse lose and gain against reselect and full, stable's multi-turn score on each half of the
    seeds, and the ratios to full's time to first token per turn on the seeds whose labels all ran in one sitting
    (10-19) and on seeds 0-9, as docs/scbench.md gives them."""
    found = collect(MULTIKEY_QMAX)
    label = "gemfilter-span-qmax:k=256@{}"

    def turns(mode, name):
        return turns_by_seed(found, name, "gf_multikey", mode=mode)

    def against(mode, a, b):  # (turns a gains over b, turns it loses), over seeds 0-19
        return gained_lost(turns(mode, a), turns(mode, b))

    def ratios(mode, name, seeds, first=0):  # per turn: mean ttft over full's mean ttft on the same seeds
        return turn_ratios(turns(mode, name), turns(mode, "full"), seeds, first)

    low, high = range(10), range(10, 20)
    assert against("multi-request", label.format("stable"), label.format("reselect")) == (0, 9)
    assert against("multi-turn", label.format("stable"), label.format("reselect")) == (0, 25)
    assert against("multi-turn", label.format("reselect"), "full") == (7, 6)
    stable = turns("multi-turn", label.format("stable"))
    assert halves(stable) == [62, 68]
    mr = {p: ratios("multi-request", label.format(p), high) for p in ("reselect", "reuse", "stable")}
    assert (min(mr["reselect"]), max(mr["reselect"])) == (2.61, 2.76)
    assert (min(mr["reuse"]), max(mr["reuse"])) == (0.84, 0.87)
    assert (min(mr["stable"]), max(mr["stable"])) == (1.98, 2.19)
    early = ratios("multi-request", label.format("reselect"), low)
    assert (min(early), max(early)) == (2.89, 3.02)
    reuse = ratios("multi-turn", label.format("reuse"), high, first=1)
    assert (min(reuse), max(reuse)) == (0.84, 0.88)


LAYOUT_QMAX = MULTIKEY_QMAX / "layout-gemfilter-span-qmax-k256.jsonl"  # multikey_kept.py --stable-layout, seeds 0-9


def test_stable_layout_records_replay_the_rows_and_give_what_the_docs_say():
    """The records of scripts/multikey_kept.py --stable-layout (GF.MultiKey, multi-turn, 4K,
    gemfilter-span-qmax:k=256): its stable answers are the committed stable rows', its history-order answers are
    right where the reselect rows are, and the counts docs/scbench.md gives of the 19 follow-ups stable gets wrong
    hold."""
    rows = {
        protocol: {
            int(r["_id"]): r["turns"]
            for r in collect(MULTIKEY_QMAX)[
                ("multi-turn", 4096, f"gemfilter-span-qmax:k=256@{protocol}", "gf_multikey")
            ]
        }
        for protocol in ("stable", "reselect")
    }
    records = read_jsonl(LAYOUT_QMAX, strict=True)
    assert sorted((x["seed"], x["turn"]) for x in records) == [(s, t) for s in range(10) for t in range(5)]
    assert all(x["prediction"] == rows["stable"][x["seed"]][x["turn"]]["prediction"] for x in records)
    assert all(x["right"] == (rows["stable"][x["seed"]][x["turn"]]["score"] == 1.0) for x in records)
    assert all(x["history_order_right"] == (rows["reselect"][x["seed"]][x["turn"]]["score"] == 1.0) for x in records)
    assert all(x["asked_in_layout"] == x["asked_whole"] for x in records)  # no needle split by the layout
    wrong = [x for x in records if x["turn"] > 0 and not x["right"]]
    kept = [x for x in wrong if x["asked_whole"]]
    assert (len(wrong), len(kept)) == (19, 15)
    assert not any(x["history_order_right"] for x in wrong if not x["asked_whole"])  # reselect wrong there too
    assert sum(x["slot_order_right"] for x in kept) == 5  # stale keys and values
    assert sum(not x["slot_order_right"] and x["context_first_right"] for x in kept) == 10  # the order
    assert all(x["context_first_right"] for x in kept)
    per_turn = {
        name: [10 * sum(x[name] for x in records if x["turn"] == t) for t in range(5)]
        for name in ("right", "slot_order_right", "history_order_right", "context_first_right")
    }
    assert per_turn == {
        "right": [100, 30, 70, 40, 70],
        "slot_order_right": [100, 40, 70, 70, 70],
        "history_order_right": [100, 90, 100, 90, 70],
        "context_first_right": [100, 100, 100, 90, 70],
    }


@pytest.mark.slow
def test_the_stable_layout_records_are_what_the_script_computes_now():
    """scripts/multikey_kept.py --stable-layout on seed 0's first three turns (turn 3 is one stable gets wrong and
    the layout's order from scratch gets right) gives the committed records."""
    import gemfilter

    script, model, tok = script_and_model("multikey_kept")
    got = script.layout_turns(model, tok, gemfilter.get_method("gemfilter-span-qmax", topk=256), 0, 4096, upto=3)
    assert got == [x for x in read_jsonl(LAYOUT_QMAX, strict=True) if x["seed"] == 0 and x["turn"] < 3]


VT_FORWARD = {names: CALIBRATION / f"vt-forward-{names}.jsonl" for names in ("ruler", "words")}


@pytest.mark.parametrize("names,first_hop", [("ruler", 8), ("words", 9)])
def test_vt_forward_probe_records_give_what_the_docs_say(names, first_hop):
    """GF.VarTrack asked from a chain's end (scripts/vt_forward_probe.py, seeds 0-3, 4K): the answer names the
    chain's first variable in 8 (RULER's names) and 9 (words) of 20 questions, the value in none, and each answer's
    line is a single capitalized word and a full stop. Counted again from the answers as written."""
    import re

    records = read_jsonl(VT_FORWARD[names], strict=True)
    assert sorted((x["seed"], x["turn"]) for x in records) == [(s, t) for s in range(4) for t in range(5)]
    lines = [x["said"].split("\n")[0] for x in records]
    assert sum(re.search(rf"\b{x['chain'][0]}\b", line) is not None for x, line in zip(records, lines)) == first_hop
    assert [x["first_hop"] for x in records].count(True) == first_hop
    assert not any(x["value"] in line or x["value_found"] for x, line in zip(records, lines))
    assert all(re.fullmatch(r" [A-Z]+\.", line) for line in lines)


@pytest.mark.slow
def test_the_vt_forward_records_are_what_the_script_computes_now():
    """scripts/vt_forward_probe.py on seed 0 with the embedded model gives the committed records of seed 0."""
    script, model, tok = script_and_model("vt_forward_probe")
    for names in ("ruler", "words"):
        got = script.probe(model, tok, 0, 4096, names)
        assert got == [x for x in read_jsonl(VT_FORWARD[names], strict=True) if x["seed"] == 0], names


def test_stable_cf_rows_give_what_the_docs_say():
    """measured/scbench-own-multikey-cf (GF.MultiKey, multi-turn, 4K, gemfilter-span-qmax:k=256): reselect and
    stable answer as in scbench-own-multikey-qmax turn for turn on seeds 0-19 (greedy, the same prompts);
    stable-cf's score equals reselect's on 78 of 80 follow-ups (seeds 0-19), it is right on every follow-up of seeds
    0-9 that stable gets wrong with the asked needle kept (the --stable-layout records) and wrong where the needle
    is not kept; and the counts of its follow-ups that ran all their kept tokens, as docs/scbench.md gives them."""
    label = "gemfilter-span-qmax:k=256@{}"
    here, before = collect(MULTIKEY_CF), collect(MULTIKEY_QMAX)

    def turns(found, protocol):
        return {int(r["_id"]): r["turns"] for r in found[("multi-turn", 4096, label.format(protocol), "gf_multikey")]}

    for protocol in ("reselect", "stable"):  # separate runs of the same 20 samples
        a, b = turns(here, protocol), turns(before, protocol)
        assert sorted(b) == sorted(a) == list(range(20))
        assert all([t["prediction"] for t in a[i]] == [t["prediction"] for t in b[i]] for i in b), protocol
    cf, again = turns(here, "stable-cf"), turns(here, "reselect")
    follow = [(i, t) for i in range(20) for t in range(1, 5)]
    differ = [(i, t) for i, t in follow if cf[i][t]["score"] != again[i][t]["score"]]
    assert differ == [(9, 1), (18, 1)] and all(cf[i][t]["score"] == 1.0 for i, t in differ)
    records = read_jsonl(LAYOUT_QMAX, strict=True)
    wrong = [x for x in records if x["turn"] > 0 and not x["right"]]
    assert all(cf[x["seed"]][x["turn"]]["score"] == 1.0 for x in wrong if x["asked_whole"])
    assert all(cf[x["seed"]][x["turn"]]["score"] == 0.0 for x in wrong if not x["asked_whole"])
    rebuilt = [sum(cf[i][t]["recomputed"] == cf[i][t]["kept"] for i in range(20)) for t in range(1, 5)]
    assert rebuilt == [0, 5, 15, 8]
    others = [cf[i][t]["recomputed"] for i, t in follow if cf[i][t]["recomputed"] < cf[i][t]["kept"]]
    assert (len(others), min(others), max(others)) == (52, 69, 218)
    late = {
        lab: [sum(x[i][t]["score"] for i in range(10, 20)) * 10 for t in range(5)]
        for lab, x in (("stable-cf", cf), ("reselect", again))
    }
    assert late == {"stable-cf": [100, 100, 100, 100, 60], "reselect": [100, 90, 100, 100, 60]}


@pytest.mark.parametrize(
    "method,differ,rebuilt,others",
    [
        ("gemfilter-span-qmax:k=256", [], [0, 16, 4, 5], (55, 91, 199)),
        ("gemfilter-span:k=256", [(3, 4), (12, 4), (14, 1), (17, 2), (18, 1)], [0, 3, 11, 4], (62, 68, 182)),
    ],
)
def test_stable_cf_on_gf_facts_gives_what_the_docs_say(method, differ, rebuilt, others):
    """measured/scbench-own-cf (GF.Facts, multi-turn, 4K, seeds 0-19): full, reselect and stable answer and run the
    tokens of measured/scbench-own (seeds 0-19, another two runs) turn for turn; the follow-ups where stable-cf's score
    differs from reselect's (each wrong under stable-cf), and those it rebuilt (ran all its kept tokens), as
    docs/scbench.md gives them."""
    here, before = collect(FACTS_CF), collect(ROOT)

    def turns(found, label):
        return turns_by_seed(found, label, "gf_facts")

    for label in ("full", f"{method}@reselect", f"{method}@stable"):
        a, b = turns(here, label), turns(before, label)
        assert sorted(b) == sorted(a) == list(range(20))
        assert all(
            [(t["prediction"], t["recomputed"]) for t in a[i]] == [(t["prediction"], t["recomputed"]) for t in b[i]]
            for i in b
        ), label
    cf, again = turns(here, f"{method}@stable-cf"), turns(here, f"{method}@reselect")
    follow = [(i, t) for i in range(20) for t in range(1, 5)]
    assert [(i, t) for i, t in follow if cf[i][t]["score"] != again[i][t]["score"]] == differ
    assert all(cf[i][t]["score"] == 0.0 for i, t in differ)
    assert [sum(cf[i][t]["recomputed"] == cf[i][t]["kept"] for i in range(20)) for t in range(1, 5)] == rebuilt
    ran = [cf[i][t]["recomputed"] for i, t in follow if cf[i][t]["recomputed"] < cf[i][t]["kept"]]
    assert (len(ran), min(ran), max(ran)) == others


@pytest.mark.slow
@pytest.mark.parametrize(
    "protocol,folder", [("stable-cf", MULTIKEY_CF), ("stable-gap", MULTIKEY_GAP), ("stable-front", MULTIKEY_FRONT)]
)
def test_a_layout_row_is_what_the_runner_computes_now(protocol, folder):
    """GF.MultiKey seed 0, multi-turn, 4K, gemfilter-span-qmax:k=256 under the context-first layouts: the runner's
    conversation today gives the committed row's answers and the tokens each turn ran (under stable-cf two of its
    follow-ups rebuild the layout)."""
    import gemfilter
    from eval.scbench.generate import make_sample
    from eval.scbench.runner import converse

    _, model, tok = script_and_model("multikey_kept")
    sample = make_sample("gf_multikey", tok, 4096, seed=0, mode="multi-turn")
    method = gemfilter.get_method("gemfilter-span-qmax", topk=256)
    got = converse(model, tok, method, protocol, "multi-turn", 4096, "gf_multikey", sample)["turns"]
    label = f"gemfilter-span-qmax:k=256@{protocol}"
    row = next(r for r in collect(folder)[("multi-turn", 4096, label, "gf_multikey")] if int(r["_id"]) == 0)
    assert [(t["prediction"], t["recomputed"]) for t in got] == [
        (t["prediction"], t["recomputed"]) for t in row["turns"]
    ]


@pytest.mark.parametrize(
    "share,rebuilt,others,reworded",
    [
        (0.25, [7, 7, 10, 10], (6, 85, 112), 9),
        (0.5, [0, 3, 7, 4], (26, 85, 218), 0),
        (1.0, [0, 0, 0, 0], (40, 85, 226), 6),
    ],
)
def test_the_rebuild_share_gives_what_the_docs_say(share, rebuilt, others, reworded):
    """GF.MultiKey, multi-turn, 4K, gemfilter-span-qmax:k=256@stable-cf at --max-holes 0.25, 0.5 (MULTIKEY_CF) and 1:
    each folder records the share it ran; every follow-up scores as at the default (some answers reworded); the
    follow-ups rebuilt per turn (all kept tokens ran) and the tokens run on the others, as docs/scbench.md gives
    them."""
    import json

    folder = HOLES.get(share, MULTIKEY_CF)
    stored = json.loads((folder / "config.json").read_text())
    assert stored.get("max_holes", 0.5) == share  # a folder written before --max-holes ran 0.5
    key = ("multi-turn", 4096, "gemfilter-span-qmax:k=256@stable-cf", "gf_multikey")
    cf = {int(r["_id"]): r["turns"] for r in collect(folder)[key]}
    default = {int(r["_id"]): r["turns"] for r in collect(MULTIKEY_CF)[key]}
    every = [(i, t) for i in range(10) for t in range(5)]
    assert all(cf[i][t]["score"] == default[i][t]["score"] for i, t in every)
    assert sum(cf[i][t]["prediction"] != default[i][t]["prediction"] for i, t in every) == reworded
    assert [sum(cf[i][t]["recomputed"] == cf[i][t]["kept"] for i in range(10)) for t in range(1, 5)] == rebuilt
    ran = [cf[i][t]["recomputed"] for i, t in every if t and cf[i][t]["recomputed"] < cf[i][t]["kept"]]
    assert (len(ran), min(ran), max(ran)) == others


@pytest.mark.parametrize(
    "folder,before,task,method,first_wrong,first_right,rebuilt,others,apart",
    [
        (
            MULTIKEY_GAP,
            MULTIKEY_CF,
            "gf_multikey",
            "gemfilter-span-qmax",
            [1, 2, 6, 13],
            [],
            [0, 6, 14, 9],
            (51, 36, 112),
            [],
        ),
        (
            FACTS_GAP,
            FACTS_CF,
            "gf_facts",
            "gemfilter-span-qmax",
            [],
            [15],
            [0, 16, 7, 10],
            (47, 32, 168),
            [(0, 3), (6, 2), (10, 2), (12, 4), (15, 1)],
        ),
        (
            FACTS_GAP,
            FACTS_CF,
            "gf_facts",
            "gemfilter-span",
            [],
            [],
            [0, 5, 12, 7],
            (56, 42, 168),
            [(3, 4), (5, 4), (16, 4), (17, 2)],
        ),
    ],
)
def test_stable_gap_rows_give_what_the_docs_say(
    folder, before, task, method, first_wrong, first_right, rebuilt, others, apart
):
    """stable-gap, multi-turn, 4K, seeds 0-19: full answers as in the stable-cf run turn for turn; turn 1 runs
    reselect's kept tokens with the conversation moved past the free positions, and the samples it gets wrong where
    reselect is right (and right where it is wrong); the follow-ups whose score differs from stable-cf's; the
    follow-ups rebuilt (ran all their kept tokens) and the tokens the others ran, as docs/scbench.md gives them."""
    here, then = collect(folder), collect(before)

    def turns(found, label):
        return turns_by_seed(found, label, task)

    a, b = turns(here, "full"), turns(then, "full")
    assert sorted(a) == sorted(b) == list(range(20))
    assert all([t["prediction"] for t in a[i]] == [t["prediction"] for t in b[i]] for i in a)
    gap, again, cf = (
        turns(x, f"{method}:k=256@{p}") for x, p in ((here, "stable-gap"), (then, "reselect"), (then, "stable-cf"))
    )
    assert all(gap[i][0]["kept"] == again[i][0]["kept"] and gap[i][0]["recomputed"] == gap[i][0]["kept"] for i in gap)
    assert [i for i in range(20) if gap[i][0]["score"] < again[i][0]["score"]] == first_wrong
    assert [i for i in range(20) if gap[i][0]["score"] > again[i][0]["score"]] == first_right
    follow = [(i, t) for i in range(20) for t in range(1, 5)]
    assert [(i, t) for i, t in follow if gap[i][t]["score"] != cf[i][t]["score"]] == apart
    assert [sum(gap[i][t]["recomputed"] == gap[i][t]["kept"] for i in range(20)) for t in range(1, 5)] == rebuilt
    ran = [gap[i][t]["recomputed"] for i, t in follow if gap[i][t]["recomputed"] < gap[i][t]["kept"]]
    assert (len(ran), min(ran), max(ran)) == others


@pytest.mark.parametrize(
    "folder,gap_before,before,task,n,follow_wrong,follow_right,rebuilt,right,named,below_gap,ratios",
    [
        (
            MULTIKEY_FRONT,
            MULTIKEY_GAP,
            MULTIKEY_CF,
            "gf_multikey",
            20,
            [
                (0, 1),
                (1, 1),
                (1, 3),
                (5, 4),
                (6, 1),
                (6, 4),
                (7, 1),
                (7, 4),
                (9, 4),
                (10, 1),
                (10, 3),
                (11, 2),
                (12, 4),
                (14, 1),
                (17, 2),
                (17, 4),
                (18, 2),
            ],
            [],
            [0, 6, 14, 9],
            (24, 24, 31, 48),
            (16, 14),
            17,
            (2.05, 2.07),
        ),
        (
            FACTS_FRONT,
            FACTS_GAP,
            FACTS_CF,
            "gf_facts",
            10,
            [
                (0, 1),
                (1, 1),
                (1, 3),
                (1, 4),
                (2, 1),
                (2, 3),
                (3, 1),
                (3, 3),
                (5, 2),
                (5, 4),
                (6, 1),
                (6, 3),
                (6, 4),
                (7, 1),
                (7, 4),
                (8, 1),
                (8, 3),
                (9, 1),
                (9, 3),
            ],
            [],
            [0, 8, 3, 5],
            (14, 16, 5, 24),
            None,
            21,
            (2.42, 2.22),
        ),
    ],
)
def test_stable_front_rows_give_what_the_docs_say(
    folder, gap_before, before, task, n, follow_wrong, follow_right, rebuilt, right, named, below_gap, ratios
):
    """stable-front and stable-gap, multi-turn, 4K, gemfilter-span-qmax:k=256: full answers as in the stable-cf run;
    stable-gap, its context writes now without the LM head, gives the answers and runs the tokens of its earlier
    run; stable-front's first answers, and those of every follow-up it rebuilt, are reselect's text; its follow-ups
    wrong where stable-cf is right (and right where it is wrong), none of them rebuilt; both layouts rebuild the
    same follow-ups and run the same tokens; how often each is right on the rebuilt follow-ups and on the others,
    what GF.MultiKey's wrong follow-ups answer, and the others' time to first token against full's, as
    docs/scbench.md gives them."""
    here, gap_then, then = collect(folder), collect(gap_before), collect(before)

    def turns(found, label):
        return turns_by_seed(found, label, task)

    label = "gemfilter-span-qmax:k=256@"
    full, full_then = turns(here, "full"), turns(then, "full")
    assert sorted(full) == list(range(n))
    assert all([t["prediction"] for t in full[i]] == [t["prediction"] for t in full_then[i]] for i in full)
    gap, old_gap, front = (
        turns(here, label + "stable-gap"),
        turns(gap_then, label + "stable-gap"),
        turns(here, label + "stable-front"),
    )
    again, cf = turns(then, label + "reselect"), turns(then, label + "stable-cf")
    ran = [(t["prediction"], t["recomputed"]) for i in range(n) for t in gap[i]]
    assert ran == [(t["prediction"], t["recomputed"]) for i in range(n) for t in old_gap[i]]
    every = [(i, t) for i in range(n) for t in range(5)]
    rebuilt_turns = [(i, t) for i, t in every if front[i][t]["recomputed"] == front[i][t]["kept"]]
    assert all((i, 0) in rebuilt_turns for i in range(n))
    assert all(front[i][t]["prediction"] == again[i][t]["prediction"] for i, t in rebuilt_turns)
    follow = [(i, t) for i in range(n) for t in range(1, 5)]
    assert [(i, t) for i, t in follow if front[i][t]["score"] < cf[i][t]["score"]] == follow_wrong
    assert [(i, t) for i, t in follow if front[i][t]["score"] > cf[i][t]["score"]] == follow_right
    assert all(front[i][t]["recomputed"] < front[i][t]["kept"] for i, t in follow_wrong + follow_right)
    assert all(front[i][t]["recomputed"] == gap[i][t]["recomputed"] for i, t in follow)
    assert [sum(front[i][t]["recomputed"] == front[i][t]["kept"] for i in range(n)) for t in range(1, 5)] == rebuilt
    rebuilt_follow = [(i, t) for i, t in rebuilt_turns if t]
    other = [(i, t) for i, t in follow if (i, t) not in rebuilt_follow]
    parts = (rebuilt_follow, other)
    assert tuple(int(sum(x[i][t]["score"] for i, t in part)) for part in parts for x in (front, gap)) == right
    assert sum(front[i][t]["score"] < gap[i][t]["score"] for i, t in follow) == below_gap
    # the mean of each follow-up's ratio to full's on the same sample and turn, on those not rebuilt
    assert (
        tuple(
            round(sum(x[i][t]["ttft_s"] / full[i][t]["ttft_s"] for i, t in other) / len(other), 2) for x in (gap, front)
        )
        == ratios
    )
    if named is not None:  # GF.MultiKey: the wrong follow-ups that name another key's number, an earlier turn's
        import re

        said = [
            (re.search(r"\d{7}", front[i][t]["prediction"]), [x["ground_truth"] for x in front[i]], t)
            for i, t in follow_wrong
        ]
        numbers = [(m.group(), golds, t) for m, golds, t in said if m]
        assert (sum(g in golds for g, golds, _ in numbers), sum(g in golds[:t] for g, golds, t in numbers)) == named


def test_the_selection_s_share_of_a_follow_up_gives_what_the_docs_say():
    """GF.Facts, multi-turn, 4K, seeds 0-9, rows that record select_s: every label answers and runs the tokens of
    its earlier run (so recording the time changed nothing it computes); per protocol, the mean over the 40
    follow-ups of the selection's time and of the time to first token, each over full's on the same sample and turn;
    under stable (one write a follow-up), the least-squares line of the rest of the time against the tokens run, the
    tokens it allows within 2x full's, and the follow-ups at most 2x by tokens run; the same at layer 5 for reselect
    and stable, with the turns it scores otherwise than layer 11, as docs/scbench.md gives them."""
    import numpy as np

    here = collect(FACTS_SELECT)

    def turns(found, label):
        return turns_by_seed(found, label, "gf_facts")

    qmax = "gemfilter-span-qmax:k=256@"
    for label, before in [
        ("full", FULL),
        (qmax + "reselect", FACTS_CF),
        (qmax + "stable-cf", FACTS_CF),
        (qmax + "stable-gap", FACTS_FRONT),
        (qmax + "stable", ROOT),
    ]:
        a, b = turns(here, label), turns(collect(before), label)
        assert all(
            [(t["prediction"], t["recomputed"]) for t in a[i]] == [(t["prediction"], t["recomputed"]) for t in b[i]]
            for i in range(10)
        ), label
    full = turns(here, "full")
    assert all(t["select_s"] is None for i in range(10) for t in full[i])
    follow = [(i, t) for i in range(10) for t in range(1, 5)]

    def share(x, key):
        """The mean over the follow-ups of each one's ``key`` over full's time to first token."""
        return sum(x[i][t][key] / full[i][t]["ttft_s"] for i, t in follow) / len(follow)

    got = {p: turns(here, qmax + p) for p in ("reselect", "stable", "stable-cf", "stable-gap")}
    assert {p: (round(share(x, "select_s"), 2), round(share(x, "ttft_s"), 2)) for p, x in got.items()} == {
        "reselect": (0.57, 3.10),
        "stable": (0.59, 2.45),
        "stable-cf": (0.60, 2.73),
        "stable-gap": (0.61, 2.91),
    }
    stable = got["stable"]
    ran = np.array([stable[i][t]["recomputed"] for i, t in follow], dtype=float)
    rest = np.array([(stable[i][t]["ttft_s"] - stable[i][t]["select_s"]) / full[i][t]["ttft_s"] for i, t in follow])
    (a, b), *_ = np.linalg.lstsq(np.stack([np.ones_like(ran), ran], 1), rest, rcond=None)
    assert (round(a, 2), round(100 * b, 2), round((2 - share(stable, "select_s") - a) / b)) == (0.76, 0.79, 81)
    ratio = [stable[i][t]["ttft_s"] / full[i][t]["ttft_s"] for i, t in follow]
    buckets = [(0, 60), (61, 120), (121, 200), (201, 256)]
    assert [
        (len(r), round(sum(r) / len(r), 2), sum(x <= 2 for x in r))
        for r in ([x for x, n in zip(ratio, ran) if lo <= n <= hi] for lo, hi in buckets)
    ] == [(3, 1.67, 3), (20, 2.08, 10), (7, 2.48, 1), (10, 3.41, 0)]
    # at layer 5 (the model's first full-attention layer): the selection's share, the time, the follow-ups within 2x,
    # and the (sample, turn) pairs whose score differs from layer 11's
    early = {p: turns(here, f"gemfilter-span-qmax:k=256,layer=5@{p}") for p in ("reselect", "stable")}
    assert {p: (round(share(x, "select_s"), 2), round(share(x, "ttft_s"), 2)) for p, x in early.items()} == {
        "reselect": (0.38, 3.28),
        "stable": (0.33, 2.21),
    }
    within = {
        p: sum(x[i][t]["ttft_s"] <= 2 * full[i][t]["ttft_s"] for i, t in follow)
        for p, x in {**early, "stable@11": stable}.items()
    }
    assert within == {"reselect": 0, "stable": 19, "stable@11": 14}
    every = [(i, t) for i in range(10) for t in range(5)]
    assert {p: [(i, t) for i, t in every if x[i][t]["score"] != got[p][i][t]["score"]] for p, x in early.items()} == {
        "reselect": [(0, 3), (3, 4)],
        "stable": [(0, 3), (3, 4), (5, 3), (5, 4)],
    }


def test_layer_5_on_multikey_gives_what_the_docs_say():
    """GF.MultiKey, multi-turn, 4K, seeds 0-9, gemfilter-span-qmax:k=256 at layer 5: full answers as in the
    layer-11 run of the same seeds; the selection's share and the time over full's (mean over the 40 follow-ups of
    each one's ratio), the follow-ups within 2x, the tokens run a follow-up, and the per-turn accuracy beside layer
    11's, as docs/scbench.md gives them."""
    here, then = collect(MULTIKEY_SELECT), collect(MULTIKEY_QMAX)

    def turns(found, label):
        return turns_by_seed(found, label, "gf_multikey")

    full = turns(here, "full")
    assert all(
        [t["prediction"] for t in full[i]] == [t["prediction"] for t in turns(then, "full")[i]] for i in range(10)
    )
    follow = [(i, t) for i in range(10) for t in range(1, 5)]
    got = {}
    for p in ("reselect", "stable"):
        x, y = turns(here, f"gemfilter-span-qmax:k=256,layer=5@{p}"), turns(then, f"gemfilter-span-qmax:k=256@{p}")
        got[p] = (
            round(sum(x[i][t]["select_s"] / full[i][t]["ttft_s"] for i, t in follow) / len(follow), 2),
            round(sum(x[i][t]["ttft_s"] / full[i][t]["ttft_s"] for i, t in follow) / len(follow), 2),
            sum(x[i][t]["ttft_s"] <= 2 * full[i][t]["ttft_s"] for i, t in follow),
            round(sum(x[i][t]["recomputed"] for i, t in follow) / len(follow)),
            [round(100 * sum(z[i][t]["score"] for i in range(10)) / 10) for z in (x, y) for t in range(5)],
        )
    assert got == {
        "reselect": (0.32, 2.70, 5, 255, [100, 80, 100, 100, 100, 100, 90, 100, 90, 70]),
        "stable": (0.31, 1.79, 27, 119, [100, 10, 60, 90, 100, 100, 30, 70, 40, 70]),
    }


def test_stable_at_layer_5_without_rebuilds_and_capped_gives_what_the_docs_say():
    """GF.Facts, multi-turn, 4K, seeds 0-9, gemfilter-span-qmax:k=256,layer=5@stable in three folders that each change
    one setting of the select folder's: full answers as there, and so does reselect beside the single-token cap;
    stable's first turn (rebuilt) answers as there; per folder, the mean over the 40 follow-ups of the time to first
    token over full's on the same sample and turn, the follow-ups within 2x, the mean tokens run, the follow-ups
    rebuilt, and the per-turn accuracy, as docs/scbench.md gives them; and an answer of the single-token cap."""
    base = collect(FACTS_SELECT)
    label = "gemfilter-span-qmax:k=256,layer=5@"
    before = {p: turns_by_seed(base, label + p, "gf_facts") for p in ("reselect", "stable")}
    follow = [(i, t) for i in range(10) for t in range(1, 5)]
    got = {}
    for name, folder in (("holes", FACTS_HOLES), *((f"fresh-{by}", f) for by, f in FACTS_FRESH.items())):
        here = collect(folder)
        full = turns_by_seed(here, "full", "gf_facts")
        then = turns_by_seed(base, "full", "gf_facts")
        assert all([t["prediction"] for t in full[i]] == [t["prediction"] for t in then[i]] for i in range(10)), name
        x = turns_by_seed(here, label + "stable", "gf_facts")
        assert all(x[i][0]["prediction"] == before["stable"][i][0]["prediction"] for i in range(10)), name
        got[name] = follow_ups(x, full)  # rebuilt: the follow-ups that ran every kept token
    again = turns_by_seed(collect(FACTS_FRESH["tokens"]), label + "reselect", "gf_facts")
    reselect = before["reselect"]
    assert all([t["prediction"] for t in again[i]] == [t["prediction"] for t in reselect[i]] for i in range(10))
    assert got == {
        "holes": (1.89, 27, 111, 0, [100, 100, 90, 70, 100]),
        "fresh-tokens": (1.44, 38, 61, 0, [100, 30, 50, 30, 60]),
        "fresh-runs": (1.77, 27, 125, 10, [100, 90, 80, 80, 90]),
        "fresh-selection": (1.96, 28, 125, 10, [100, 90, 80, 100, 100]),
    }
    x = before["stable"]  # the no-cap row of the docs' table: tokens run, rebuilt, per-turn accuracy
    assert (
        round(sum(x[i][t]["recomputed"] for i, t in follow) / len(follow)),
        len(rebuilds(x, range(10))),
        [round(100 * sum(x[i][t]["score"] for i in range(10)) / 10) for t in range(5)],
    ) == (146, 10, [100, 100, 90, 90, 90])
    runs = turns_by_seed(collect(FACTS_FRESH["runs"]), label + "stable", "gf_facts")
    every = [(i, t) for i in range(10) for t in range(5)]
    lost = [(i, t) for i, t in every if x[i][t]["score"] > runs[i][t]["score"]]
    assert lost == [(1, 1), (2, 3), (8, 2), (9, 3)]
    assert [(i, t) for i, t in every if x[i][t]["score"] < runs[i][t]["score"]] == [(5, 3)]
    assert [x[i][t]["recomputed"] == x[i][t]["kept"] for i, t in lost] == [False, True, True, True]  # rebuilt there
    assert not any(runs[i][t]["recomputed"] == runs[i][t]["kept"] for i, t in lost)  # and not under the cap
    sel = turns_by_seed(collect(FACTS_FRESH["selection"]), label + "stable", "gf_facts")
    for y in (runs, sel):
        laid = [y[i][t]["recomputed"] for i, t in follow if y[i][t]["recomputed"] != y[i][t]["kept"]]
        assert round(sum(laid) / len(laid)) == 82  # a capped follow-up that is not rebuilt
    # read by the whole selection's holes: against reselect, uncapped stable and the runs cap, turn by turn
    assert [(i, t) for i, t in every if sel[i][t]["score"] != reselect[i][t]["score"]] == [(1, 1), (3, 4), (8, 2)]
    assert [reselect[i][t]["score"] for i, t in [(1, 1), (3, 4), (8, 2)]] == [1.0, 0.0, 1.0]
    assert [(i, t) for i, t in every if sel[i][t]["score"] < runs[i][t]["score"]] == []
    assert [(i, t) for i, t in every if sel[i][t]["score"] > runs[i][t]["score"]] == [(2, 3), (3, 4), (9, 3)]
    rebuilt = {name: rebuilds(y, range(10)) for name, y in (("s", sel), ("x", x))}
    assert len(rebuilt["s"]) == len(rebuilt["x"]) == 10 and sum(t for _, t in rebuilt["s"]) > sum(
        t for _, t in rebuilt["x"]
    )
    tokens = turns_by_seed(collect(FACTS_FRESH["tokens"]), label + "stable", "gf_facts")
    assert tokens[0][1]["prediction"].startswith(" eat Park on in front.") and tokens[0][1]["ground_truth"] == (
        "Dolores Park"
    )


def test_the_capped_layout_on_seeds_no_choice_saw_gives_what_the_docs_say():
    """GF.Facts, multi-turn, 4K: gemfilter-span-qmax:k=256,layer=5@stable capped at 64 tokens in whole runs and rebuilt
    by the whole selection's holes, with layer 5's reselect and full, over seeds 10-19 (which no choice of its settings
    saw) and 0-19 (full answers as in scbench-own-full: test_full_answers_the_same_in_two_runs). reselect answers as in
    the select folder (seeds 0-9), and stable's first turn as reselect's; per protocol, the mean over the follow-ups of
    the time to first token over full's on the same sample and turn, the follow-ups within 2x, those that ran every kept
    token, and the per-turn accuracy, as docs/scbench.md gives them; where stable and reselect differ, the tokens a
    laid-out follow-up runs, the turns the rebuilds fall on, and the report's per-turn ratio of mean times."""
    here = collect(FACTS_FRESH["selection"])
    label = "gemfilter-span-qmax:k=256,layer=5@"
    full = turns_by_seed(here, "full", "gf_facts")
    x = {p: turns_by_seed(here, label + p, "gf_facts") for p in ("reselect", "stable")}
    before = turns_by_seed(collect(FACTS_SELECT), label + "reselect", "gf_facts")
    assert all([t["prediction"] for t in x["reselect"][i]] == [t["prediction"] for t in before[i]] for i in range(10))
    assert all(x["stable"][i][0]["prediction"] == x["reselect"][i][0]["prediction"] for i in range(20))
    got = {}
    for seeds in (range(10, 20), range(20)):
        got[seeds.start, "full"] = [round(100 * sum(full[i][t]["score"] for i in seeds) / len(seeds)) for t in range(5)]
        for name, y in x.items():
            got[seeds.start, name] = follow_ups(y, full, seeds)
    assert got == {
        (10, "full"): [90, 100, 100, 100, 100],
        (10, "reselect"): (2.52, 6, 256, 40, [100, 80, 80, 100, 70]),
        (10, "stable"): (1.92, 26, 125, 10, [100, 90, 90, 100, 70]),
        (0, "full"): [90, 100, 100, 95, 100],
        (0, "reselect"): (2.56, 16, 256, 80, [100, 90, 85, 100, 80]),
        (0, "stable"): (1.94, 54, 125, 20, [100, 90, 85, 100, 85]),
    }
    stable, reselect = x["stable"], x["reselect"]
    every = [(i, t) for i in range(10, 20) for t in range(5)]
    differ = [(i, t) for i, t in every if stable[i][t]["score"] != reselect[i][t]["score"]]
    assert differ == [(10, 2), (12, 4), (15, 1), (16, 4)]
    assert [reselect[i][t]["score"] for i, t in differ] == [0.0, 1.0, 0.0, 0.0]
    follow = [(i, t) for i in range(20) for t in range(1, 5)]
    for seeds in (range(10), range(10, 20)):
        laid = [
            stable[i][t]["recomputed"]
            for i, t in follow
            if i in seeds and stable[i][t]["recomputed"] != stable[i][t]["kept"]
        ]
        assert round(sum(laid) / len(laid)) == 82
    assert Counter(t for i, t in follow if stable[i][t]["recomputed"] == stable[i][t]["kept"]) == {3: 18, 4: 2}
    mean_ratio = [
        round(sum(stable[i][t]["ttft_s"] for i in range(20)) / sum(full[i][t]["ttft_s"] for i in range(20)), 2)
        for t in range(1, 5)
    ]
    assert mean_ratio == [1.67, 1.72, 2.58, 1.61]


def test_the_capped_layout_on_gf_multikey_gives_what_the_docs_say():
    """GF.MultiKey, multi-turn, 4K, seeds 0-9: gemfilter-span-qmax:k=256,layer=5@stable capped at 64 tokens in whole
    runs and rebuilt by the whole selection's holes, beside the select folder's reselect and uncapped stable on the same
    conversations (full answers as there: test_full_answers_the_same_in_two_runs). stable's first turn answers as
    reselect's; the mean over the follow-ups of the time to first token over full's, the follow-ups within 2x, the
    tokens run, the follow-ups rebuilt and the per-turn accuracy, as docs/scbench.md gives them; and the turns the cap
    answers or loses against uncapped stable."""
    here, base = collect(MULTIKEY_FRESH), collect(MULTIKEY_SELECT)
    label = "gemfilter-span-qmax:k=256,layer=5@"
    full, then = turns_by_seed(here, "full", "gf_multikey"), turns_by_seed(base, "full", "gf_multikey")
    capped = turns_by_seed(here, label + "stable", "gf_multikey")
    x = {p: turns_by_seed(base, label + p, "gf_multikey") for p in ("reselect", "stable")}
    assert all(capped[i][0]["prediction"] == x["reselect"][i][0]["prediction"] for i in range(10))
    follow = [(i, t) for i in range(10) for t in range(1, 5)]
    got = {}
    for name, y, f in (("capped", capped, full), *((p, x[p], then) for p in x)):
        got[name] = follow_ups(y, f)
    assert got == {
        "capped": (1.56, 34, 113, 9, [100, 20, 60, 70, 100]),
        "reselect": (2.70, 5, 255, 40, [100, 80, 100, 100, 100]),
        "stable": (1.79, 27, 119, 10, [100, 10, 60, 90, 100]),
    }
    every = [(i, t) for i in range(10) for t in range(5)]
    assert [(i, t) for i, t in every if capped[i][t]["score"] > x["stable"][i][t]["score"]] == [(0, 1), (1, 1), (9, 2)]
    assert [(i, t) for i, t in every if capped[i][t]["score"] < x["stable"][i][t]["score"]] == [
        (8, 2),
        (8, 3),
        (9, 1),
        (9, 3),
    ]
    laid = [capped[i][t]["recomputed"] for i, t in follow if capped[i][t]["recomputed"] != capped[i][t]["kept"]]
    assert (len(laid), round(sum(laid) / len(laid))) == (31, 72)


def test_the_capped_layout_at_8k_gives_what_the_docs_say():
    """GF.Facts, multi-turn, 8K, seeds 0-9: gemfilter-span-qmax:k=256,layer=5 under reselect and under stable capped at
    64 tokens in whole runs and rebuilt by the whole selection's holes, with full (which answers as in scbench-own-8k:
    test_full_answers_the_same_in_two_runs). stable's first turn answers as reselect's; per protocol, the mean over the
    follow-ups of the time to first token over full's, the follow-ups within 2x, the tokens run, the follow-ups that ran
    every kept token and the per-turn accuracy, as docs/scbench.md gives them; where stable and reselect differ; the
    laid-out follow-ups' tokens and mean times; where the rebuilds fall; and the report's per-turn ratio of mean
    times."""
    here = collect(FACTS_FRESH_8K)
    label = "gemfilter-span-qmax:k=256,layer=5@"
    full = turns_by_seed(here, "full", "gf_facts", 8192)
    x = {p: turns_by_seed(here, label + p, "gf_facts", 8192) for p in ("reselect", "stable")}
    assert all(x["stable"][i][0]["prediction"] == x["reselect"][i][0]["prediction"] for i in range(10))
    follow = [(i, t) for i in range(10) for t in range(1, 5)]
    got = {"full": [round(100 * sum(full[i][t]["score"] for i in range(10)) / 10) for t in range(5)]}
    for name, y in x.items():
        got[name] = follow_ups(y, full)
    assert got == {
        "full": [100, 100, 100, 100, 100],
        "reselect": (2.78, 0, 256, 40, [100, 90, 90, 90, 100]),
        "stable": (2.10, 23, 127, 10, [100, 100, 90, 90, 100]),
    }
    stable, reselect = x["stable"], x["reselect"]
    every = [(i, t) for i in range(10) for t in range(5)]
    assert [(i, t, stable[i][t]["score"]) for i, t in every if stable[i][t]["score"] != reselect[i][t]["score"]] == [
        (1, 1, 1.0)
    ]
    laid = [(i, t) for i, t in follow if stable[i][t]["recomputed"] != stable[i][t]["kept"]]
    assert len(laid) == 30 and round(sum(stable[i][t]["recomputed"] for i, t in laid) / 30) == 84
    assert [
        round(sum(y[i][t][k] for i, t in laid) / 30, 2)
        for y, k in ((stable, "ttft_s"), (full, "ttft_s"), (stable, "select_s"))
    ] == [0.51, 0.29, 0.12]
    assert Counter(t for i, t in follow if (i, t) not in laid) == {3: 8, 2: 1, 4: 1}
    mean_ratio = [
        round(sum(stable[i][t]["ttft_s"] for i in range(10)) / sum(full[i][t]["ttft_s"] for i in range(10)), 2)
        for t in range(1, 5)
    ]
    assert mean_ratio == [1.73, 2.07, 2.73, 1.87]


def test_the_context_first_layouts_at_layer_5_give_what_the_docs_say():
    """GF.MultiKey and GF.Facts, multi-turn, 4K, seeds 0-9: gemfilter-span-qmax:k=256,layer=5 under stable-cf and
    stable-gap, beside the select folders' layer-5 reselect and stable (full answers as there:
    test_full_answers_the_same_in_two_runs). stable-cf's first turn answers as reselect's; per protocol, the mean over
    the follow-ups of the time to first token over the full of its own run, the follow-ups within 2x, the tokens run,
    the follow-ups that ran every kept token and the per-turn accuracy, as docs/scbench.md's table gives them; and where
    stable-cf's scores differ from reselect's."""
    label = "gemfilter-span-qmax:k=256,layer=5@"
    base = {"gf_multikey": MULTIKEY_SELECT, "gf_facts": FACTS_SELECT}
    got, differ = {}, {}
    for task, folder in LAYOUTS_5.items():
        here, there = collect(folder), collect(base[task])
        full, then = turns_by_seed(here, "full", task), turns_by_seed(there, "full", task)
        rows = {p: (turns_by_seed(there, label + p, task), then) for p in ("reselect", "stable")}
        rows |= {p: (turns_by_seed(here, label + p, task), full) for p in ("stable-cf", "stable-gap")}
        reselect = rows["reselect"][0]
        assert all(rows["stable-cf"][0][i][0]["prediction"] == reselect[i][0]["prediction"] for i in range(10)), task
        for name, (y, f) in rows.items():
            got[task, name] = follow_ups(y, f)
        cf = rows["stable-cf"][0]
        differ[task] = [
            (i, t, cf[i][t]["score"])
            for i in range(10)
            for t in range(5)
            if cf[i][t]["score"] != reselect[i][t]["score"]
        ]
    assert got == {
        ("gf_multikey", "reselect"): (2.70, 5, 255, 40, [100, 80, 100, 100, 100]),
        ("gf_multikey", "stable"): (1.79, 27, 119, 10, [100, 10, 60, 90, 100]),
        ("gf_multikey", "stable-cf"): (2.30, 13, 198, 18, [100, 90, 100, 100, 100]),
        ("gf_multikey", "stable-gap"): (2.13, 17, 161, 18, [50, 100, 100, 100, 100]),
        ("gf_facts", "reselect"): (3.28, 0, 256, 40, [100, 100, 90, 100, 90]),
        ("gf_facts", "stable"): (2.21, 19, 146, 10, [100, 100, 90, 90, 90]),
        ("gf_facts", "stable-cf"): (2.48, 7, 214, 19, [100, 100, 90, 100, 90]),
        ("gf_facts", "stable-gap"): (2.53, 11, 185, 19, [100, 100, 80, 100, 100]),
    }
    assert differ == {"gf_multikey": [(4, 1, 1.0), (5, 1, 1.0), (6, 1, 0.0)], "gf_facts": []}


def test_stable_cf_without_hole_rebuilds_and_capped_gives_what_the_docs_say():
    """stable-cf at layer 5 with --max-holes 1 (GF.MultiKey), and capped (GF.MultiKey and GF.Facts), multi-turn, 4K,
    seeds 0-9 (full answers as in the select folders: test_full_answers_the_same_in_two_runs): each folder records its
    settings; no follow-up is rebuilt; the first turn answers as in the layer-5 stable-cf run; per protocol, the
    summary of docs/scbench.md's table (:func:`follow_ups`), the per-turn ratio of time to first token and tokens run,
    and where the scores differ from stable-cf's at the default share."""
    import json

    label = "gemfilter-span-qmax:k=256,layer=5@"
    settings = {
        CF_HOLES_5: (1.0, None, None),
        CF_CAPPED_5["gf_multikey"]: (1.0, 64, "selection"),
        CF_CAPPED_5["gf_facts"]: (1.0, 64, "selection"),
    }
    for folder, (share, cap, holes) in settings.items():
        stored = json.loads((folder / "config.json").read_text())
        # CF_HOLES_5 ran before stable-cf had a cap, and records none: a resume reads that as no cap
        assert (stored["max_holes"], stored.get("max_fresh"), stored.get("fresh_holes")) == (share, cap, holes), folder
    runs = {
        ("gf_multikey", "uncapped"): (CF_HOLES_5, "stable-cf"),
        ("gf_multikey", "capped"): (CF_CAPPED_5["gf_multikey"], "stable-cf"),
        ("gf_multikey", "stable-gap"): (CF_CAPPED_5["gf_multikey"], "stable-gap"),
        ("gf_facts", "capped"): (CF_CAPPED_5["gf_facts"], "stable-cf"),
    }
    found = {folder: collect(folder) for folder in (*settings, *LAYOUTS_5.values())}  # each folder read once
    got, per_turn, differ = {}, {}, {}
    for (task, name), (folder, protocol) in runs.items():
        full, y = turns_by_seed(found[folder], "full", task), turns_by_seed(found[folder], label + protocol, task)
        got[task, name] = follow_ups(y, full)
        per_turn[task, name] = [
            (
                round(sum(y[i][t]["ttft_s"] / full[i][t]["ttft_s"] for i in range(10)) / 10, 2),
                round(sum(y[i][t]["recomputed"] for i in range(10)) / 10),
            )
            for t in range(1, 5)
        ]
        default = turns_by_seed(found[LAYOUTS_5[task]], label + protocol, task)
        if protocol == "stable-cf":
            assert all(y[i][0]["prediction"] == default[i][0]["prediction"] for i in range(10)), (task, name)
            assert rebuilds(y, range(10)) == []
        differ[task, name] = [
            (i, t, y[i][t]["score"]) for i in range(10) for t in range(5) if y[i][t]["score"] != default[i][t]["score"]
        ]
    assert got == {
        ("gf_multikey", "uncapped"): (2.19, 16, 159, 0, [100, 90, 100, 100, 100]),
        ("gf_multikey", "capped"): (2.05, 23, 155, 0, [100, 90, 100, 90, 100]),
        ("gf_multikey", "stable-gap"): (1.79, 27, 80, 1, [50, 100, 100, 30, 100]),
        ("gf_facts", "capped"): (2.17, 19, 149, 0, [100, 100, 80, 100, 100]),
    }
    assert per_turn == {
        ("gf_multikey", "uncapped"): [(1.96, 146), (1.65, 112), (2.45, 173), (2.71, 204)],
        ("gf_multikey", "capped"): [(1.8, 123), (1.75, 125), (2.24, 168), (2.42, 203)],
        ("gf_multikey", "stable-gap"): [(2.1, 118), (1.49, 47), (1.87, 91), (1.7, 64)],
        ("gf_facts", "capped"): [(1.93, 113), (1.98, 139), (2.35, 165), (2.42, 177)],
    }
    gap = turns_by_seed(found[CF_CAPPED_5["gf_multikey"]], label + "stable-gap", "gf_multikey")
    wrong = [gap[i][3] for i in range(10) if not gap[i][3]["score"]]
    garbled = [t for t in wrong if t["prediction"].strip()[:3] == str(t["ground_truth"])[:3]]
    other = [
        i for i in range(10) if not gap[i][3]["score"] and str(gap[i][2]["ground_truth"]) in gap[i][3]["prediction"]
    ]
    assert (len(wrong), len(garbled), other) == (7, 6, [2])  # the seventh gives turn 3's number
    assert differ == {
        ("gf_multikey", "uncapped"): [],
        ("gf_multikey", "capped"): [(1, 3, 0.0)],
        ("gf_multikey", "stable-gap"): [(i, 3, 0.0) for i in (1, 2, 3, 4, 7, 8, 9)],
        ("gf_facts", "capped"): [(3, 4, 1.0), (8, 2, 0.0)],
    }


def laid_out_and_rebuilt(y: dict, full: dict) -> tuple:
    """(follow-ups laid out, their mean tokens run, their mean time / full), the same for the rebuilt ones (those that
    ran every kept token)."""
    out = []
    for rebuilt in (False, True):
        picked = [(i, t) for i in y for t in range(1, 5) if (y[i][t]["recomputed"] >= y[i][t]["kept"]) == rebuilt]
        out += [
            len(picked),
            round(sum(y[i][t]["recomputed"] for i, t in picked) / len(picked)),
            round(sum(y[i][t]["ttft_s"] / full[i][t]["ttft_s"] for i, t in picked) / len(picked), 2),
        ]
    return tuple(out)


def test_stable_gap_in_one_forward_and_stable_late_give_what_the_docs_say():
    """stable-gap in one forward and stable-late at layer 5, multi-turn, 4K, seeds 0-9 (full answers as in the select
    folders: test_full_answers_the_same_in_two_runs): stable-gap answers and runs the tokens of its two-forward run in
    LAYOUTS_5 on every turn; stable-late's first turn keeps as many tokens as layer 5's reselect and gives its answer;
    docs/scbench.md's summary, the laid-out and rebuilt follow-ups apart, and where stable-late scores otherwise than
    reselect."""
    label = "gemfilter-span-qmax:k=256,layer=5@"
    reference = {"gf_multikey": MULTIKEY_SELECT, "gf_facts": FACTS_SELECT}
    got, parts, differ, texts = {}, {}, {}, {}
    for task, folder in LATE_5.items():
        here, before = collect(folder), collect(LAYOUTS_5[task])
        full = turns_by_seed(here, "full", task)
        reselect = turns_by_seed(collect(reference[task]), label + "reselect", task)
        two = turns_by_seed(before, label + "stable-gap", task)
        for protocol in ("stable-gap", "stable-late"):
            y = turns_by_seed(here, label + protocol, task)
            got[task, protocol] = follow_ups(y, full)
            parts[task, protocol] = laid_out_and_rebuilt(y, full)
        gap, late = turns_by_seed(here, label + "stable-gap", task), turns_by_seed(here, label + "stable-late", task)
        for i in range(10):
            for t in range(5):
                assert gap[i][t]["prediction"] == two[i][t]["prediction"], (task, i, t)
                assert gap[i][t]["recomputed"] == two[i][t]["recomputed"], (task, i, t)
            assert late[i][0]["prediction"] == reselect[i][0]["prediction"], (task, i)
            assert late[i][0]["kept"] == reselect[i][0]["kept"], (task, i)
        differ[task] = [
            (i, t, late[i][t]["score"])
            for i in range(10)
            for t in range(5)
            if late[i][t]["score"] != reselect[i][t]["score"]
        ]
        texts[task] = sum(late[i][t]["prediction"] == reselect[i][t]["prediction"] for i in range(10) for t in range(5))
    assert got == {
        ("gf_multikey", "stable-gap"): (2.21, 19, 161, 18, [50, 100, 100, 100, 100]),
        ("gf_multikey", "stable-late"): (2.26, 13, 188, 18, [100, 100, 100, 100, 100]),
        ("gf_facts", "stable-gap"): (2.61, 8, 185, 19, [100, 100, 80, 100, 100]),
        ("gf_facts", "stable-late"): (2.89, 1, 212, 19, [100, 100, 90, 100, 90]),
    }
    assert parts == {
        ("gf_multikey", "stable-gap"): (22, 85, 1.6, 18, 255, 2.94),
        ("gf_multikey", "stable-late"): (22, 134, 1.88, 18, 255, 2.73),
        ("gf_facts", "stable-gap"): (21, 121, 2.13, 19, 256, 3.13),
        ("gf_facts", "stable-late"): (21, 173, 2.62, 19, 256, 3.2),
    }
    assert differ == {"gf_multikey": [(4, 1, 1.0), (5, 1, 1.0)], "gf_facts": []}
    assert texts == {"gf_multikey": 37, "gf_facts": 40}


def test_stable_late_without_hole_rebuilds_and_stable_late_runs_give_what_the_docs_say():
    """--max-holes 1 at layer 5, multi-turn, 4K: stable-late on GF.MultiKey and stable-late-runs on both tasks
    (GF.MultiKey's seeds 10-19 beside reselect in the same run): each folder records the share; docs/scbench.md's
    summary per task and seeds; stable-late's wrong follow-ups, each part of the asked number, are right under
    stable-late-runs, which loses none on GF.MultiKey; its first turn is reselect's; reselect's seeds 0-9 in the
    runs folder answer as in the select folder; where it scores otherwise than reselect."""
    import json

    label = "gemfilter-span-qmax:k=256,layer=5@"
    for folder in (LATE_HOLES_5, *RUNS_5.values()):
        assert json.loads((folder / "config.json").read_text())["max_holes"] == 1.0, folder
    late_folder, runs_folder, facts_folder = (
        collect(LATE_HOLES_5),
        collect(RUNS_5["gf_multikey"]),
        collect(RUNS_5["gf_facts"]),
    )
    multikey_select, facts_select = collect(MULTIKEY_SELECT), collect(FACTS_SELECT)
    full = turns_by_seed(runs_folder, "full", "gf_multikey")
    late = turns_by_seed(late_folder, label + "stable-late", "gf_multikey")
    runs = turns_by_seed(runs_folder, label + "stable-late-runs", "gf_multikey")
    reselect = turns_by_seed(runs_folder, label + "reselect", "gf_multikey")
    selected = turns_by_seed(multikey_select, label + "reselect", "gf_multikey")
    facts = turns_by_seed(facts_folder, label + "stable-late-runs", "gf_facts")
    facts_full = turns_by_seed(facts_folder, "full", "gf_facts")
    facts_reselect = turns_by_seed(facts_select, label + "reselect", "gf_facts")
    seen, unseen = range(10), range(10, 20)
    got = {
        "late": follow_ups(late, turns_by_seed(late_folder, "full", "gf_multikey")),
        "runs 0-9": follow_ups(runs, full, seen),
        "runs 10-19": follow_ups(runs, full, unseen),
        "reselect 10-19": follow_ups(reselect, full, unseen),
        "facts runs": follow_ups(facts, facts_full),
    }
    assert got == {
        "late": (1.69, 29, 90, 1, [100, 100, 90, 70, 100]),
        "runs 0-9": (2.2, 18, 152, 8, [100, 100, 100, 100, 100]),
        "runs 10-19": (2.03, 21, 137, 6, [100, 100, 100, 100, 100]),
        "reselect 10-19": (2.76, 0, 255, 40, [100, 90, 100, 100, 100]),
        "facts runs": (2.87, 3, 219, 18, [100, 100, 90, 90, 90]),
    }
    assert all(reselect[i][t]["prediction"] == selected[i][t]["prediction"] for i in seen for t in range(5))
    assert all(runs[i][0]["prediction"] == reselect[i][0]["prediction"] for i in range(20))
    wrong = [
        (i, t, late[i][t]["prediction"].split(".")[0].strip()[:14])
        for i in seen
        for t in range(5)
        if not late[i][t]["score"]
    ]
    assert wrong == [(1, 3, "753 numbers"), (2, 2, "2368"), (3, 3, "89988888888888"), (9, 3, "85836845858584")]
    assert all(
        part.split()[0] in str(late[i][t]["ground_truth"]) or str(late[i][t]["ground_truth"]).startswith(part[:3])
        for i, t, part in wrong
    )
    assert all(runs[i][t]["score"] for i, t, _ in wrong)
    assert [(i, t) for i in range(20) for t in range(5) if runs[i][t]["score"] != reselect[i][t]["score"]] == [
        (i, 1) for i in (4, 5, 18)
    ]  # right where reselect is wrong
    assert laid_out_and_rebuilt({i: runs[i] for i in seen}, full)[:3] == (32, 127, 2.03)
    assert round(sum(runs[i][1]["recomputed"] for i in seen) / 10) == 220
    assert round(sum(runs[i][1]["ttft_s"] / full[i][1]["ttft_s"] for i in seen) / 10, 2) == 2.81
    assert laid_out_and_rebuilt(facts, facts_full) == (22, 188, 2.67, 18, 256, 3.13)
    assert [(i, t) for i in seen for t in range(5) if facts[i][t]["score"] != facts_reselect[i][t]["score"]] == [(0, 3)]
    assert facts[0][3]["prediction"].startswith(" 7007071.") and not facts[0][3]["ground_truth"].isdigit()


def test_stable_late_runs_with_a_cap_gives_what_the_docs_say():
    """stable-late-runs at layer 5, --max-holes 1, capped at 64 (runs, selection holes), multi-turn, 4K, seeds 0-9:
    each folder records the setting; docs/scbench.md's summary per task, the laid-out and rebuilt follow-ups apart;
    where it scores otherwise than reselect (layer 5's, the select folders) and than uncapped stable-late-runs, and
    what the wrong answers give; GF.Facts' seeds 10-19 beside reselect in the same run; GF.MultiKey's seeds 10-19
    against RUNS_5's reselect and uncapped stable-late-runs."""
    import json

    label = "gemfilter-span-qmax:k=256,layer=5@"
    reference = {"gf_multikey": MULTIKEY_SELECT, "gf_facts": FACTS_SELECT}
    got, parts, against_reselect, against_uncapped, wrong = {}, {}, {}, {}, {}
    for task, folder in RUNS_CAPPED_5.items():
        stored = json.loads((folder / "config.json").read_text())
        assert (stored["max_holes"], stored["max_fresh"], stored["fresh_by"], stored["fresh_holes"]) == (
            1.0,
            64,
            "runs",
            "selection",
        )
        here = collect(folder)
        full = turns_by_seed(here, "full", task)
        y = turns_by_seed(here, label + "stable-late-runs", task)
        reselect = turns_by_seed(collect(reference[task]), label + "reselect", task)
        uncapped = turns_by_seed(collect(RUNS_5[task]), label + "stable-late-runs", task)
        got[task] = follow_ups(y, full)
        parts[task] = laid_out_and_rebuilt({i: y[i] for i in range(10)}, full)
        seeds = [(i, t) for i in range(10) for t in range(5)]
        against_reselect[task] = [
            (i, t, y[i][t]["score"]) for i, t in seeds if y[i][t]["score"] != reselect[i][t]["score"]
        ]
        against_uncapped[task] = [
            (i, t, y[i][t]["score"]) for i, t in seeds if y[i][t]["score"] != uncapped[i][t]["score"]
        ]
        wrong[task] = {
            (i, t): y[i][t]["prediction"].split("\n")[0].strip()[:20].strip() for i, t in seeds if not y[i][t]["score"]
        }
    assert got == {
        "gf_multikey": (1.77, 31, 95, 1, [100, 100, 100, 80, 100]),
        "gf_facts": (1.94, 25, 119, 6, [100, 80, 80, 80, 90]),
    }
    # GF.Facts' seeds 10-19, which no choice saw, beside reselect in the same run; its seeds 0-9 are the select folder's
    here = collect(RUNS_CAPPED_5["gf_facts"])
    full = turns_by_seed(here, "full", "gf_facts")
    y, beside = (turns_by_seed(here, label + p, "gf_facts") for p in ("stable-late-runs", "reselect"))
    selected = turns_by_seed(collect(FACTS_SELECT), label + "reselect", "gf_facts")
    unseen = range(10, 20)
    assert all(beside[i][t]["prediction"] == selected[i][t]["prediction"] for i in range(10) for t in range(5))
    assert all(y[i][0]["prediction"] == beside[i][0]["prediction"] for i in range(20))
    assert (follow_ups(y, full, unseen), follow_ups(beside, full, unseen)) == (
        (2.15, 23, 132, 9, [100, 70, 100, 90, 70]),
        (3.13, 0, 256, 40, [100, 80, 80, 100, 70]),
    )
    assert [round(100 * sum(full[i][t]["score"] for i in unseen) / 10) for t in range(5)] == [90, 100, 100, 100, 100]
    # GF.MultiKey's seeds 10-19, which no choice saw; reselect and uncapped stable-late-runs from RUNS_5's run
    here, there = collect(RUNS_CAPPED_5["gf_multikey"]), collect(RUNS_5["gf_multikey"])
    full, full_there = (turns_by_seed(x, "full", "gf_multikey") for x in (here, there))
    y = turns_by_seed(here, label + "stable-late-runs", "gf_multikey")
    beside = {p: turns_by_seed(there, label + p, "gf_multikey") for p in ("reselect", "stable-late-runs")}
    assert [follow_ups(x, f, unseen) for x, f in ((y, full), (beside["reselect"], full_there))] == [
        (1.64, 39, 87, 0, [100, 80, 100, 70, 90]),
        (2.76, 0, 255, 40, [100, 90, 100, 100, 100]),
    ]
    assert follow_ups(beside["stable-late-runs"], full_there, unseen) == (2.03, 21, 137, 6, [100] * 5)
    assert [round(100 * sum(full[i][t]["score"] for i in unseen) / 10) for t in range(5)] == [80, 70, 100, 100, 80]
    assert parts == {"gf_multikey": (39, 91, 1.75, 1, 256, 2.62), "gf_facts": (34, 95, 1.83, 6, 256, 2.57)}
    assert against_reselect == {
        "gf_multikey": [(4, 1, 1.0), (5, 1, 1.0), (5, 3, 0.0), (8, 3, 0.0)],
        "gf_facts": [(3, 1, 0.0), (4, 1, 0.0), (4, 2, 0.0), (4, 3, 0.0), (9, 3, 0.0)],
    }
    assert against_uncapped["gf_multikey"] == [(5, 3, 0.0), (8, 3, 0.0)]
    assert wrong["gf_multikey"] == {(5, 3): "73800000000000000000", (8, 3): "87029800000."}
    assert against_uncapped["gf_facts"] == [(0, 3, 1.0), *against_reselect["gf_facts"]]
    assert [wrong["gf_facts"][i, t] for i, t, _ in against_reselect["gf_facts"]] == [
        "to go to the beach.",
        "the bed. The secret",
        "caohzbnj.",
        "to go to the Golden",
        "1.",
    ]


#: the head of the layer-5 summaries' tables (:func:`summary_line` gives a row)
SUMMARY_HEAD = (
    "| task | seeds | protocol | time / full | within 2× | tokens | all run | per-turn accuracy | mean |",
    "|---|---|---|---|---|---|---|---|---|",
)
TASK_NAMES = {"gf_multikey": "GF.MultiKey", "gf_facts": "GF.Facts"}


def summary_line(task: str, name: str, y: dict, full: dict, seeds=range(10)) -> str:
    """One row of a layer-5 summary: a protocol's turns ({seed: turns}) against its run's full's over ``seeds``
    (:func:`follow_ups`); task and name as the table shows them."""
    ratio, within, tokens, every, acc = follow_ups(y, full, seeds)
    return (
        f"| {task} | {seeds[0]}–{seeds[-1]} | {name} | {ratio:.2f}× | {within}/40 | {tokens} | {every} | "
        f"{'/'.join(map(str, acc))} | {sum(acc) / 5:.1f} |"
    )


def late_runs_summary(runs: list) -> list:
    """A docs/scbench.md summary of stable-late-runs rows (layer 5) beside layer 5's reselect, per task and seed range,
    from the rows (:func:`follow_ups`; each against its own run's full). runs: (name, {task: folder}) in the table's
    order; a run gives a seed range's line where it holds every seed of it."""
    label = "gemfilter-span-qmax:k=256,layer=5@"
    lines = list(SUMMARY_HEAD)
    for task in ("gf_facts", "gf_multikey"):
        rows = []  # (name, the protocol's turns, its run's full's turns), each folder read once
        for name, folders in [("reselect", RESELECT_5), *runs]:
            found = collect(folders[task])
            protocol = "reselect" if name == "reselect" else "stable-late-runs"
            rows.append((name, turns_by_seed(found, label + protocol, task), turns_by_seed(found, "full", task)))
        for seeds in (range(10), range(10, 20)):
            for name, y, full in rows:
                if not set(seeds) <= set(y):
                    continue
                lines.append(summary_line(TASK_NAMES[task], name, y, full, seeds))
    return lines


def runs_new_summary() -> list:
    """docs/scbench.md's summary of the capped stable-late-runs with --fresh-by runs-new beside --fresh-by runs and
    reselect (layer 5)."""
    return late_runs_summary([("capped, `runs`", RUNS_CAPPED_5), ("capped, `runs-new`", RUNS_NEW_5)])


def test_stable_late_runs_capped_with_new_sentences_first_gives_what_the_docs_say():
    """The capped stable-late-runs with --fresh-by runs-new (multi-turn, 4K, seeds 0-19): each folder records the
    setting; full answers as in the other runs; docs/scbench.md's summary table is the rows' (runs-new, runs and
    reselect per seed range); on GF.Facts' seeds 0-9, the choice's, it scores reselect's on every turn, and the
    follow-ups where it scores otherwise than runs, as the docs give them."""
    import json

    for folder in RUNS_NEW_5.values():
        stored = json.loads((folder / "config.json").read_text())
        assert (stored["max_fresh"], stored["fresh_by"], stored["fresh_holes"]) == (64, "runs-new", "selection")
    block = docs_block("scbench.md", "scbench-own-runs-new-summary")
    assert runs_new_summary() == [x for x in block.splitlines() if x.startswith("|")]
    label = "gemfilter-span-qmax:k=256,layer=5@stable-late-runs"
    differ, new = {}, {}
    for task in RUNS_NEW_5:
        new[task] = turns_by_seed(collect(RUNS_NEW_5[task]), label, task)
        old = turns_by_seed(collect(RUNS_CAPPED_5[task]), label, task)
        differ[task] = [
            (i, t, new[task][i][t]["score"])
            for i in range(20)
            for t in range(5)
            if new[task][i][t]["score"] != old[i][t]["score"]
        ]
    assert differ == {
        "gf_facts": [
            *[(3, 1, 1.0), (4, 1, 1.0), (4, 2, 1.0), (4, 3, 1.0), (9, 3, 1.0)],  # the choice's seeds: runs' misses
            *[(10, 2, 0.0), (13, 4, 1.0), (14, 2, 0.0), (14, 4, 0.0), (15, 4, 0.0), (16, 4, 1.0), (19, 1, 1.0)],
        ],
        "gf_multikey": [(6, 1, 0.0), (9, 3, 0.0), (12, 1, 0.0)],
    }
    keys = new["gf_multikey"]
    assert [keys[i][1]["prediction"].split(".")[0].strip() for i in (6, 12)] == [
        keys[i][0]["ground_truth"] for i in (6, 12)
    ]
    assert keys[9][3]["prediction"].startswith(" 85836484") and keys[9][3]["ground_truth"] == "8583652"


def paired_against_reselect(runs: list = LATE_RUNS_5) -> list:
    """docs/scbench.md's follow-ups of the stable-late-runs rows (layer 5; runs: (name, {task: folder}) in the table's
    order) against layer 5's reselect on the same seed and turn: how many each answers right where reselect answers
    wrong, and wrong where it answers right. Greedy answers do not depend on the run, so reselect's rows of one run
    serve each task. The last column is the two-sided sign test's p over the follow-ups where the two differ (how often
    so uneven a split comes of chance if neither were the better)."""
    from math import comb

    label = "gemfilter-span-qmax:k=256,layer=5@"
    lines = [
        "| task | protocol | seeds | follow-ups | right where `reselect` is wrong | wrong where `reselect` is right "
        "| sign test p |",
        "|---|---|---|---|---|---|---|",
    ]
    for task, name in (("gf_facts", "GF.Facts"), ("gf_multikey", "GF.MultiKey")):
        ref = turns_by_seed(collect(RESELECT_5[task]), label + "reselect", task)
        for protocol, folders in runs:
            y = turns_by_seed(collect(folders[task]), label + "stable-late-runs", task)
            follow = [(i, t) for i in sorted(y) for t in range(1, 5)]
            gained = sum(y[i][t]["score"] > ref[i][t]["score"] for i, t in follow)
            lost = sum(y[i][t]["score"] < ref[i][t]["score"] for i, t in follow)
            n = gained + lost
            p = min(1.0, 2 * sum(comb(n, j) for j in range(min(gained, lost) + 1)) / 2**n)
            lines.append(f"| {name} | {protocol} | 0–{max(y)} | {len(follow)} | {gained} | {lost} | {p:.2f} |")
    return lines


def test_reopening_where_stable_late_runs_rebuilds_gives_what_the_docs_say():
    """--outgrown reopen (stable-late-runs, layer 5, --max-holes 1, multi-turn, 4K, seeds 0-19): each folder records
    it with the rest of its setting (uncapped, or capped as RUNS_NEW_5), and docs/scbench.md's summary beside the
    rebuilding runs and reselect is the rows'."""
    import json

    uncapped, capped = (None, None), (64, "runs-new")
    for folders, outgrown, cap in (
        (RUNS_REBUILD_5, "rebuild", uncapped),
        (RUNS_REOPEN_5, "reopen", uncapped),
        (RUNS_NEW_REBUILD_5, "rebuild", capped),
        (RUNS_NEW_REOPEN_5, "reopen", capped),
    ):
        for folder in folders.values():
            stored = json.loads((folder / "config.json").read_text())
            assert (stored["outgrown"], stored["max_holes"]) == (outgrown, 1.0), folder
            assert (stored.get("max_fresh"), stored.get("fresh_by")) == cap, folder
    block = docs_block("scbench.md", "scbench-own-reopen-summary")
    assert late_runs_summary(REOPEN_RUNS_5) == [x for x in block.splitlines() if x.startswith("|")]
    # the rebuilding runs of this sitting answer as the earlier ones, token for token, on the seeds both hold
    label = "gemfilter-span-qmax:k=256,layer=5@stable-late-runs"
    for again, before in ((RUNS_REBUILD_5, RUNS_5), (RUNS_NEW_REBUILD_5, RUNS_NEW_5)):
        for task in again:
            now = turns_by_seed(collect(again[task]), label, task)
            then = turns_by_seed(collect(before[task]), label, task)
            assert set(then) <= set(now), task
            for i in then:
                assert [(t["prediction"], t["recomputed"]) for t in now[i]] == [
                    (t["prediction"], t["recomputed"]) for t in then[i]
                ], (task, i)


def test_stable_late_runs_against_reselect_turn_by_turn_gives_what_the_docs_say():
    """The paired count of docs/scbench.md (follow-ups gained and lost against reselect, per task and protocol) is
    the rows'."""
    block = docs_block("scbench.md", "scbench-own-runs-paired")
    assert paired_against_reselect() == [x for x in block.splitlines() if x.startswith("|")]
    block = docs_block("scbench.md", "scbench-own-reopen-paired")
    assert paired_against_reselect(REOPEN_RUNS_5) == [x for x in block.splitlines() if x.startswith("|")]


def rebuilt_follow_ups(runs: list = LATE_RUNS_5) -> list:
    """docs/scbench.md's rebuilt follow-ups of the stable-late-runs rows (layer 5; runs: (name, {task: folder}) in the
    table's order): those that ran every kept token, by turn, and the mean time to first token over full's
    (:func:`follow_ups`' ratio) of those, of the others and of all, with the tokens the others ran."""
    label = "gemfilter-span-qmax:k=256,layer=5@"
    lines = [
        "| task | protocol | seeds | ran every kept token | on turns 2/3/4/5 | time / full, those | time / full, "
        "the others | time / full, all | tokens, the others |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for task, name in (("gf_facts", "GF.Facts"), ("gf_multikey", "GF.MultiKey")):
        for protocol, folders in runs:
            found = collect(folders[task])
            y = turns_by_seed(found, label + "stable-late-runs", task)
            full = turns_by_seed(found, "full", task)
            follow = [(i, t) for i in sorted(y) for t in range(1, 5)]
            every = rebuilds(y, sorted(y))
            others = [x for x in follow if x not in every]

            def ratio(picked):
                if not picked:
                    return "–"
                return f"{sum(y[i][t]['ttft_s'] / full[i][t]['ttft_s'] for i, t in picked) / len(picked):.2f}×"

            turns = "/".join(str(sum(t == turn for _, t in every)) for turn in range(1, 5))
            tokens = round(sum(y[i][t]["recomputed"] for i, t in others) / len(others))
            lines.append(
                f"| {name} | {protocol} | 0–{max(y)} | {len(every)} of {len(follow)} | {turns} | {ratio(every)} | "
                f"{ratio(others)} | {ratio(follow)} | {tokens} |"
            )
    return lines


def test_stable_late_runs_rebuilt_follow_ups_give_what_the_docs_say():
    """The rebuilt follow-ups' table of docs/scbench.md (their count by turn, their time and the others') is the
    rows'."""
    block = docs_block("scbench.md", "scbench-own-runs-rebuilt")
    assert rebuilt_follow_ups() == [x for x in block.splitlines() if x.startswith("|")]
    block = docs_block("scbench.md", "scbench-own-reopen-rebuilt")
    assert rebuilt_follow_ups(REOPEN_RUNS_5) == [x for x in block.splitlines() if x.startswith("|")]


@pytest.mark.slow
def test_a_runs_new_row_is_what_the_runner_computes_now():
    """GF.Facts seed 3, the seed runs-new was chosen on: the runner's capped stable-late-runs conversation today gives
    the committed row's answers and tokens run under --fresh-by runs-new, and turn 2 (San Francisco) right where the
    --fresh-by runs row has it wrong."""
    import gemfilter
    from eval.scbench.generate import make_sample
    from eval.scbench.runner import converse

    _, model, tok = script_and_model("multikey_kept")
    sample = make_sample("gf_facts", tok, 4096, seed=3, mode="multi-turn")
    method = gemfilter.get_method("gemfilter-span-qmax", topk=256, layer=5)
    kw = dict(max_holes=1.0, max_fresh=64, fresh_by="runs-new", fresh_holes="selection")
    got = converse(model, tok, method, "stable-late-runs", "multi-turn", 4096, "gf_facts", sample, **kw)["turns"]
    label = "gemfilter-span-qmax:k=256,layer=5@stable-late-runs"
    row = turns_by_seed(collect(RUNS_NEW_5["gf_facts"]), label, "gf_facts")[3]
    runs = turns_by_seed(collect(RUNS_CAPPED_5["gf_facts"]), label, "gf_facts")[3]
    assert [(t["prediction"], t["recomputed"]) for t in got] == [(t["prediction"], t["recomputed"]) for t in row]
    assert (got[1]["score"], runs[1]["score"]) == (1.0, 0.0)


def late_runs_8k_summary(folder: Path, task: str, protocols: list) -> list:
    """docs/scbench.md's summary of a layer-5 run at 8K (multi-turn, seeds 0-9) in :func:`late_runs_summary`'s
    columns, from the rows (:func:`follow_ups`, against the run's own full). protocols: (name in the table, the
    label's protocol)."""
    found = collect(folder)
    full = turns_by_seed(found, "full", task, 8192)
    return [
        *SUMMARY_HEAD,
        *(
            summary_line(
                f"{TASK_NAMES[task]}, 8K",
                name,
                turns_by_seed(found, f"gemfilter-span-qmax:k=256,layer=5@{protocol}", task, 8192),
                full,
            )
            for name, protocol in protocols
        ),
    ]


def test_stable_late_runs_at_8k_gives_what_the_docs_say():
    """stable-late-runs at layer 5 at 8K (--max-holes 1, rebuilding): uncapped on GF.MultiKey, capped with new
    sentences first on GF.Facts. Each folder records its setting, and docs/scbench.md's summary beside layer 5's
    reselect of the same run is the rows'."""
    import json

    label = "gemfilter-span-qmax:k=256,layer=5@reselect"
    for folder, task, cap, name, block in (
        (MULTIKEY_8K_RUNS_5, "gf_multikey", (None, None), "stable-late-runs", "scbench-own-multikey-8k-runs-5-summary"),
        (FACTS_8K_RUNS_NEW_5, "gf_facts", (64, "runs-new"), "capped, `runs-new`", "scbench-own-8k-runs-new-5-summary"),
    ):
        stored = json.loads((folder / "config.json").read_text())
        assert (stored["max_holes"], stored["outgrown"]) == (1.0, "rebuild"), folder
        assert (stored["max_fresh"], stored.get("fresh_by")) == cap, folder
        shown = [x for x in docs_block("scbench.md", block).splitlines() if x.startswith("|")]
        assert late_runs_8k_summary(folder, task, [("reselect", "reselect"), (name, "stable-late-runs")]) == shown
    # layer 5's reselect at 8K on GF.Facts answers as in the earlier 8K run, seed for seed (greedy, the same prompts)
    now = turns_by_seed(collect(FACTS_8K_RUNS_NEW_5), label, "gf_facts", 8192)
    then = turns_by_seed(collect(FACTS_FRESH_8K), label, "gf_facts", 8192)
    assert set(now) == set(then) == set(range(10))
    assert all([t["prediction"] for t in now[i]] == [t["prediction"] for t in then[i]] for i in now)
