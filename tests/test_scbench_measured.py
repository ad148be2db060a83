"""The SCBench figures in docs/scbench.md are the official scores of the conversations committed in measured/scbench.

The committed rows are scored again here (``eval.scbench.report``: the official scorers on each turn's
prediction and gold answer, and the mean time to first token per turn), and every table line must be in
the docs as it is, so a documented figure cannot drift from the run it came from.
"""

from pathlib import Path

import pytest
from docs_blocks import docs_block, table_lines

from eval.scbench.report import collect, markdown, score_table

REPO = Path(__file__).resolve().parents[1]
ROOT = REPO / "measured" / "scbench"
SAMPLES = {4096: 20, 8192: 5}  # samples per task committed at each length (the floor: 20 at 4K, 5 at 8K)


def test_docs_tables_are_the_scores_of_the_committed_rows():
    table = score_table(collect(ROOT))
    assert {k[0] for k in table} == {"multi-turn", "multi-request"} and {k[1] for k in table} == set(SAMPLES)
    text = (REPO / "docs" / "scbench.md").read_text(encoding="utf-8")
    lines = table_lines(markdown(table))
    assert len(lines) > 10
    missing = [x for x in lines if x not in text]
    assert not missing, f"docs/scbench.md lacks {len(missing)} scored line(s), e.g. {missing[0]}"


@pytest.mark.parametrize("length", sorted(SAMPLES))
def test_every_task_mode_and_method_holds_the_same_samples_of_five_turns(length):
    """Every committed label holds samples 0..n-1 of every task, in both modes, with 5 turns each."""
    found = {key: rows for key, rows in collect(ROOT).items() if key[1] == length}
    assert len(found) == 2 * 4 * 4  # modes x labels x tasks
    for key, rows in found.items():
        assert sorted(int(r["_id"]) for r in rows) == list(range(SAMPLES[length])), key
        assert all(len(r["turns"]) == 5 for r in rows), key


ENGINE = REPO / "measured" / "scbench-engine"


def test_engine_rows_are_scored_again_and_equal_the_local_rows_they_share():
    """measured/scbench-engine (answers by vLLM): its tables in the docs are its scores, and every turn of the
    samples measured/scbench also holds has the local rows' prediction, score, kept tokens and history."""
    import json

    table = score_table(collect(ENGINE))
    lines = table_lines(markdown(table))
    shown = table_lines(docs_block("scbench.md", "scbench-engine-measured"))
    assert len(shown) >= 8 and all(x in lines for x in shown), [x for x in shown if x not in lines][:1]
    compared = 0
    for path in ENGINE.glob("*/4096/*/*.jsonl"):
        local = {json.loads(x)["_id"]: json.loads(x) for x in (ROOT / path.relative_to(ENGINE)).open()}
        for line in path.open():
            row = json.loads(line)
            assert row["engine"].startswith("http")
            if row["_id"] in local:
                for a, b in zip(local[row["_id"]]["turns"], row["turns"], strict=True):
                    assert (a["prediction"], a["score"], a["kept"], a["history_tokens"]) == (
                        b["prediction"],
                        b["score"],
                        b["kept"],
                        b["history_tokens"],
                    ), (path, row["_id"])
                    compared += 1
    assert compared == 100  # every engine conversation (5 samples x 4 labels and modes, 5 turns) has local rows


WHOLE = REPO / "measured" / "scbench-multi-request"  # the multi-request rows again, each context fed whole
WHOLE_SAMPLES = SAMPLES  # the samples of measured/scbench, each run again fed whole


def test_whole_context_rows_are_scored_again_as_the_docs_show_them():
    """measured/scbench-multi-request: its block in the docs is its scores, and every label and task holds
    samples 0..n-1 of five turns (that they were fed whole is checked by the slow test below)."""
    found = collect(WHOLE)
    assert {(k[0], k[1]) for k in found} == {("multi-request", n) for n in WHOLE_SAMPLES}
    assert len(found) == 4 * 4 * len(WHOLE_SAMPLES)  # labels x tasks x lengths
    for key, rows in found.items():
        assert sorted(int(r["_id"]) for r in rows) == list(range(WHOLE_SAMPLES[key[1]])), key
        assert all(len(r["turns"]) == 5 for r in rows), key
    table = score_table(found)
    block = docs_block("scbench.md", "scbench-multi-request")
    lines = table_lines(markdown(table))
    missing = [x for x in lines if x not in block]
    assert len(lines) > 10 and not missing, f"the docs' block lacks {len(missing)} scored line(s): {missing[:1]}"


@pytest.mark.slow
@pytest.mark.parametrize(
    "root,mode", [(ROOT, "multi-turn"), (WHOLE, "multi-request")], ids=["scbench-multi-turn", "scbench-multi-request"]
)
def test_the_committed_rows_were_fed_the_samples_the_runner_makes_now(root, mode):
    """Every committed row was fed today's sample for its (mode, length, task, seed), whole: its ground truths and
    each turn's history length equal the ones rebuilt here with the embedded tokenizer, and the first prompt fits
    the mode's input budget, so the runner's middle truncation cut nothing (measured/scbench's multi-turn rows
    predate the per-mode sizing, which leaves multi-turn samples as they were; its multi-request rows were cut,
    and measured/scbench-multi-request holds them again)."""
    import gemfilter
    from eval.scbench.generate import make_sample
    from eval.scbench.prompts import build_prompts, max_input_length, turn_input_ids

    tok = gemfilter.models.load_tokenizer()
    rows = {(k[1], k[3]): v for k, v in collect(root).items() if k[0] == mode and k[2] == "full"}
    assert rows and len(rows) == 4 * len({length for length, _ in rows})  # the four tasks at each length
    for (length, task), found in rows.items():
        for row in found:
            prompts = build_prompts(make_sample(task, tok, length, 5, seed=int(row["_id"]), mode=mode), task, mode)
            assert [t["ground_truth"] for t in row["turns"]] == prompts.ground_truth, (length, task, row["_id"])
            limit = max_input_length(task, length, 5, mode)
            assert len(tok.encode(prompts.first)) <= limit
            lengths = [len(turn_input_ids(prompts, tok, t, max_length=limit)) for t in range(5)]
            assert [t["history_tokens"] for t in row["turns"]] == lengths, (length, task, row["_id"])
