"""Budgets as they are: what a prefill kept, read from the cache it left.

On tiny Gemma 3 (layers: sliding 8, full, sliding 8, full) with a 48-token prompt, each method's KV rows per
layer and propagated tokens follow from the definitions alone: a sliding layer holds window - 1 = 7 rows,
a full layer what the method keeps there.
"""

import pytest
import torch
from tiny_models import BUILDERS

import gemfilter
from gemfilter.methods import get_method

pytestmark = pytest.mark.usefixtures("quiet")
N = 48


@pytest.mark.parametrize(
    "name,params,rows,propagated",
    [
        ("full", {}, [7, 48, 7, 48], 48),
        ("gemfilter", dict(layer=1, topk=16), [7, 16, 7, 16], 16),  # the kept tokens, at positions 0..15
        ("snapkv", dict(topk=40), [7, 40, 7, 40], 48),  # the full prefill, then eviction
        ("fastkv", dict(layer=1, topk=24, tsp_len=32), [7, 24, 7, 24], 32),  # TSP fires: 32 go on past layer 1
    ],
)
def test_rows_per_layer_and_propagated_tokens_are_measured(name, params, rows, propagated):
    model = BUILDERS["gemma3"]()
    ids = torch.randint(3, 96, (1, N), generator=torch.Generator().manual_seed(0))
    out = gemfilter.generate(model, ids, method=get_method(name, **params), max_new_tokens=1)
    assert out.budget.summary() == {"kv_rows": rows, "propagated": propagated}


def test_an_engine_answer_records_no_budget():
    """The engine's KV cache is not visible from the proxy side: its rows claim nothing."""
    from gemfilter.apply import budget_fields
    from gemfilter.toolkit.serving.engine import EngineOutput

    assert budget_fields(EngineOutput(new_tokens=None, kept=[3], kept_text=None, selection=None, text="")) == {}
