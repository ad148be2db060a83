"""RULER on the embedded Gemma 3 270M (slow: loads the real model; a few seconds of generation).

A 1K-token niah_single_1 sample (one 7-digit needle in the repeated noise sentences): full attention
answers with the needle's value, and GemFilter with a budget larger than the prompt gives the same
answer as full attention (it keeps every token, so it must).
"""

import pytest

pytestmark = pytest.mark.slow


def test_niah_single_1_at_1k_full_finds_the_needle_and_big_k_gemfilter_agrees(tmp_path):
    import gemfilter
    from eval.ruler.runner import RunConfig, run
    from gemfilter.methods.spec import expand_budgets

    model_and_tok = gemfilter.load_model()
    config = RunConfig(
        methods=expand_budgets(("full", "gemfilter"), (2048,)), tasks=("niah_single_1",), lengths=(1024,), num_samples=1
    )
    rows = run(config, tmp_path, model_and_tokenizer=model_and_tok, progress=False)
    full, gem = rows[1024, "full", "niah_single_1"][0], rows[1024, "gemfilter_k2048", "niah_single_1"][0]
    assert full["outputs"][0] in full["pred"], full
    assert gem["kept"] == gem["prompt_tokens"] == full["prompt_tokens"] and gem["answers_kept"] == 1.0
    assert gem["pred"] == full["pred"]
