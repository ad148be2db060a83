"""LongBench end to end on the embedded Gemma 3 270M: three tasks of hand-written records, --limit 2.

The tasks (hotpotqa, triviaqa, passage_retrieval_en) have 32-token answers in the official table, which
keeps the run short without altering the table. Slow: loads the real model.
"""

import json

import pytest
from longbench_fixtures import TASKS, write_english

from eval.longbench.cli import main
from eval.longbench.pipeline import generation_kwargs, truncate_middle
from eval.longbench.tasks import BY_NAME
from gemfilter.toolkit.io import read_jsonl

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def embedded():
    import gemfilter

    return gemfilter.load_model(None)


def test_three_tasks_end_to_end_with_gemfilter(embedded, tmp_path, capsys):
    from gemfilter import default_layer

    data = write_english(tmp_path / "data")
    out = tmp_path / "out"
    assert (
        main(
            [
                "run",
                "--data-dir",
                str(data),
                "--tasks",
                ",".join(TASKS),
                "--limit",
                "2",
                "--methods",
                "gemfilter",
                "--topk",
                "64",
                "--out",
                str(out),
                "--no-progress",
            ]
        )
        == 0
    )
    printed = capsys.readouterr().out
    for task in TASKS:
        rows = read_jsonl(out / "pred" / "gemfilter" / f"{task}.jsonl")
        assert [r["_id"] for r in rows] == [f"{task}-000", f"{task}-001"]
        # Every prompt (80-180 tokens) is longer than topk, so GemFilter generated from exactly 64 tokens.
        assert all(r["kept"] == 64 < r["prompt_tokens"] for r in rows)
        assert all(r["layer"] == default_layer(embedded[0]) for r in rows)
        assert all(isinstance(r["pred"], str) and r["pred"].strip() for r in rows)
    result = json.loads((out / "pred" / "gemfilter" / "result.json").read_text())
    assert set(result) == set(TASKS) and all(0 <= v <= 100 for v in result.values())
    table = (out / "report.md").read_text()
    assert "| **Method** | **HotpotQA** | **TriviaQA** | **PRe** | **Average** |" in table
    assert f"| gemfilter | {result['hotpotqa']:.2f} | {result['triviaqa']:.2f} |" in table and table in printed


def test_truncation_and_samsum_stop_with_the_gemma_tokenizer(embedded):
    tok = embedded[1]
    prompt = "Start here. " + "filler words go on and on. " * 100 + "End there."
    assert tok(prompt)["input_ids"][0] == tok.bos_token_id  # default special tokens: a BOS in front
    cut = truncate_middle(prompt, tok, 20)
    # First 10 ids = BOS + 9 text tokens, last 10 ids = text tokens: BOS skipped, both ends kept.
    assert "<bos>" not in cut and cut.startswith("Start here.") and cut.endswith("End there.")
    assert len(tok(cut, add_special_tokens=False)["input_ids"]) <= 19 < len(tok(prompt)["input_ids"])
    stops = generation_kwargs(BY_NAME["samsum"], tok)["eos_token_id"]
    assert stops[0] == tok.eos_token_id and tok.decode([stops[1]]) == "\n"
