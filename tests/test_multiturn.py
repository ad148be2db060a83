"""A second generate call on a cache filled inside apply() continues exactly.

Each method's second turn is checked against a computation that does not use apply()'s hooks:
- ``gemfilter`` feeds the kept tokens at positions 0..k-1, so its conversation is plain generation on
  [kept ids, turn-1 answer, turn-2 question];
- the cache methods and the original-position prompt methods keep rows at their original positions, so
  their turn 2 is a hand greedy loop: the turn-1 cache (copied), the new tokens at their true positions.
"""

import copy

import pytest
import torch
from tiny_models import BUILDERS

import gemfilter
from gemfilter.compat import cache_kwargs, dynamic_cache
from gemfilter.methods import get_method

pytestmark = pytest.mark.usefixtures("quiet")
N, Q, T = 48, 6, 5  # turn-1 prompt, turn-2 question, tokens per answer


def ids(n, seed):
    return torch.randint(3, 96, (1, n), generator=torch.Generator().manual_seed(seed))


def hand_loop(model, cache, new, start, steps):
    """Greedy tokens from plain forwards on ``cache`` (not apply()'s hooks), ``new`` at positions start.."""
    out = []
    with torch.no_grad():
        for _ in range(steps):
            pos = torch.arange(start, start + new.shape[1])[None]
            logits = model(input_ids=new, position_ids=pos, use_cache=True, **cache_kwargs(cache)).logits
            start += new.shape[1]
            new = logits[:, -1:].argmax(-1)
            out.append(int(new))
    return out


METHODS = {  # name -> (parameters, positions: "renumbered" (0..k-1) or "original")
    "gemfilter": (dict(layer=2, topk=16), "renumbered"),
    "gemfilter-orig-pos": (dict(layer=2, topk=16), "original"),
    "fastkv": (dict(layer=2, topk=24, tsp_len=32), "original"),  # TSP fires: n=48 > tsp_len
    "snapkv": (dict(topk=40), "original"),
    "h2o": (dict(topk=40), "original"),
    "full": ({}, "original"),
}


@pytest.mark.parametrize("name", sorted(METHODS))
@pytest.mark.parametrize("prefix", [False, True], ids=["two-generates", "prefix-forward-then-generate"])
def test_second_turn_continues_the_compressed_cache_exactly(name, prefix):
    params, positions = METHODS[name]
    model = BUILDERS["llama"]()
    first, question = ids(N, 1), ids(Q, 2)
    method = get_method(name, **params)
    with gemfilter.apply(model, method) as handle:
        cache = dynamic_cache(model.config)
        if prefix:  # a prefix cache built inside the block by one plain forward, then generate on top of it
            with torch.no_grad():
                model(input_ids=first, use_cache=True, **cache_kwargs(cache))
            consumed, turn1 = N, first
        else:
            turn1 = model.generate(first, max_new_tokens=T, min_new_tokens=T, do_sample=False, **cache_kwargs(cache))
            consumed = N + T - 1  # generate never feeds its last token
        after1, compressed = copy.deepcopy(cache), cache.get_seq_length()
        history = torch.cat([turn1, question], dim=1)
        turn2 = model.generate(history, max_new_tokens=T, min_new_tokens=T, do_sample=False, **cache_kwargs(cache))
    got = turn2[0, history.shape[1] :].tolist()
    fed = history[:, consumed:]  # what was never fed: turn 1's last token and the question
    if positions == "renumbered":  # gemfilter: plain generation on the kept tokens, the answer, the question
        kept = handle.calls[0].selection.kept_ids[0][None]
        plain = torch.cat([kept, turn1[:, N:consumed], fed], dim=1)
        want = model.generate(plain, max_new_tokens=T, min_new_tokens=T, do_sample=False)[0, plain.shape[1] :].tolist()
    else:
        want = hand_loop(model, after1, fed, consumed, T)
    assert got == want
    if name != "full":  # the cache really was compressed, so generate re-fed old tokens to the forward
        assert compressed < consumed


def test_a_different_history_is_refused_by_name():
    model = BUILDERS["llama"]()
    with gemfilter.apply(model, get_method("snapkv", topk=40)):
        cache = dynamic_cache(model.config)
        out = model.generate(ids(N, 1), max_new_tokens=3, do_sample=False, **cache_kwargs(cache))
        edited = out.clone()
        edited[0, 44] = (edited[0, 44] + 1) % 96
        with pytest.raises(ValueError, match="history given to this generate call differs from what the snapkv cache"):
            model.generate(torch.cat([edited, ids(Q, 2)], 1), max_new_tokens=2, do_sample=False, **cache_kwargs(cache))


def two_turns(model, method, first, question):
    """Turn 2's new tokens (b, T) after a turn-1 generate, on one cache, inside one apply() block."""
    mask = (first != 0).long()
    with gemfilter.apply(model, method):
        cache = dynamic_cache(model.config)
        turn1 = model.generate(
            first, attention_mask=mask, max_new_tokens=T, min_new_tokens=T, do_sample=False, **cache_kwargs(cache)
        )
        history = torch.cat([turn1, question], dim=1)
        mask = torch.cat([mask, torch.ones(mask.shape[0], history.shape[1] - mask.shape[1], dtype=torch.long)], 1)
        turn2 = model.generate(
            history, attention_mask=mask, max_new_tokens=T, min_new_tokens=T, do_sample=False, **cache_kwargs(cache)
        )
    return turn2[:, history.shape[1] :]


@pytest.mark.parametrize(
    "family,name", [("gemma3", "gemfilter"), ("gemma3", "snapkv"), ("gemma3", "full"), ("mistral-sliding", "gemfilter")]
)
def test_second_turn_on_sliding_window_models(family, name):
    """Gemma 3 (sliding and full layers) and Mistral (every layer slides): turn 2 equals the same conversation
    from a turn-1 cache copied and continued by hand (gemfilter: plain generate)."""
    model = BUILDERS[family]()
    layer = {"gemma3": 1}.get(family, 2)
    method = get_method(name, layer=layer, topk=40 if "snapkv" in name else 16)
    first, question = ids(N, 3), ids(Q, 4)
    got = two_turns(model, method, first, question)[0].tolist()
    with gemfilter.apply(model, method) as handle:
        cache = dynamic_cache(model.config)
        turn1 = model.generate(first, max_new_tokens=T, min_new_tokens=T, do_sample=False, **cache_kwargs(cache))
    fed = torch.cat([turn1[:, -1:], question], dim=1)
    if name == "gemfilter":
        plain = torch.cat([handle.calls[0].selection.kept_ids[0][None], turn1[:, N:-1], fed], dim=1)
        want = model.generate(plain, max_new_tokens=T, min_new_tokens=T, do_sample=False)[0, plain.shape[1] :].tolist()
    else:
        want = hand_loop(model, cache, fed, N + T - 1, T)
    assert got == want


@pytest.mark.parametrize("name", ["gemfilter", "snapkv", "fastkv"])
def test_batch_rows_continue_as_single_rows(name):
    params, _ = METHODS[name]
    model = BUILDERS["llama"]()
    first, question = torch.cat([ids(N, 5), ids(N, 6)]), torch.cat([ids(Q, 7), ids(Q, 8)])
    both = two_turns(model, get_method(name, **params), first, question)
    for r in range(2):
        assert torch.equal(
            both[r], two_turns(model, get_method(name, **params), first[r : r + 1], question[r : r + 1])[0]
        )


def test_left_padded_batch_continues_as_single_rows():
    """gemfilter on rows of 40 and 48 tokens (the first left-padded): each row's turn 2 equals the row alone."""
    model = BUILDERS["llama"]()
    short, long_ = ids(40, 9), ids(N, 10)
    first = torch.cat([torch.cat([torch.zeros(1, N - 40, dtype=torch.long), short], 1), long_])
    question = torch.cat([ids(Q, 11), ids(Q, 12)])
    method = get_method("gemfilter", layer=2, topk=16)
    both = two_turns(model, method, first, question)
    assert torch.equal(both[0], two_turns(model, method, short, question[:1])[0])
    assert torch.equal(both[1], two_turns(model, method, long_, question[1:])[0])
