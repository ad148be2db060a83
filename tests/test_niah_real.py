"""NIAH on the embedded Gemma 3 270M and the real Paul Graham haystack (slow: marked, and run in CI)."""

import pytest
import torch

import gemfilter
from eval.niah.haystack import build_case, make_haystack
from eval.niah.runner import RunConfig, run

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def embedded():
    torch.set_num_threads(2)
    return gemfilter.load_model()


def test_needle_lands_after_a_period_in_the_essays(embedded):
    _, tok = embedded
    hay = make_haystack(tok, 2000)
    for depth in (25, 50, 75):
        case = build_case(tok, 2000, depth, haystack=hay)
        before = case.context[: case.context.index("\nThe best thing to do in San Francisco")]
        assert before.endswith("."), before[-80:]
        # 2000 - 200 buffer tokens; decoding and re-encoding may merge a token at a seam.
        assert abs(len(tok.encode(case.context, add_special_tokens=False)) - 1800) <= 2
    assert build_case(tok, 2000, 100, haystack=hay).context.endswith("on a sunny day.\n")
    assert build_case(tok, 2000, 0, haystack=hay).context.startswith("\nThe best thing")


def test_two_real_cells(embedded, tmp_path):
    config = RunConfig(methods=("full", "gemfilter"), lengths=(1000,), depths=(50,), topk=256, max_new_tokens=16)
    full, filtered = run(config, tmp_path, model_and_tokenizer=embedded, progress=False)
    assert full["hit"] == 1.0 and full["recall"] == pytest.approx(11 / 12), full["response"]
    assert full["kept"] == full["prompt_tokens"] > 800
    assert filtered["kept"] == 256 and filtered["layer"] == gemfilter.default_layer(embedded[0])
