"""Conversation's ``keep`` (SCBench's two modes): what a turn leaves in the history, against independent runs.

- ``questions`` (multi-turn with gold follow-ups): turn t answers [q1 .. qt] with no earlier answer in the
  history or the cache. full: plain generate on the concatenated questions; reselect: a from-scratch run
  of the method on them; reuse: a fresh apply() block that feeds q1, q2, .. one generate call each (one
  new token, never fed) and answers [q1 .. qt] on that cache, with no fork.
- ``context`` (multi-request): every question is asked over the prefilled context alone: full and
  reselect against fresh runs on [context, q]; reuse against a fresh apply() block (prefill, then q).
"""

import pytest
import torch
from tiny_models import BUILDERS, FILTER_LAYER, DotTokenizer

import gemfilter
from gemfilter.compat import cache_kwargs, dynamic_cache
from gemfilter.methods import get_method

pytestmark = pytest.mark.usefixtures("quiet")
TURNS, T = 4, 4


def question(t, n):
    return torch.randint(3, 96, (1, n), generator=torch.Generator().manual_seed(200 + t))


def greedy(**kw):
    return dict(max_new_tokens=T, min_new_tokens=T, do_sample=False, **kw)


QUESTIONS = [question(t, 40 if t == 0 else 6) for t in range(TURNS)]


def reuse_reference(model, method, prompts, last):
    """A fresh apply() block: every prompt but the last through generate (one new token, never fed), then
    ``last`` answered on that cache; plain calls, no fork."""
    cache = dynamic_cache(model.config)
    with gemfilter.apply(model, method):
        for p in prompts:
            model.generate(p, max_new_tokens=1, do_sample=False, **cache_kwargs(cache))
        out = model.generate(last, **cache_kwargs(cache), **greedy())
    return out[0, last.shape[1] :]


@pytest.mark.parametrize("family", ["llama", "gemma3"])
@pytest.mark.parametrize(
    "protocol,name,topk",
    [
        ("full", None, None),
        ("reselect", "gemfilter", 12),
        ("reuse", "gemfilter", 12),
        ("reuse", "snapkv", 36),
        ("reuse", "fastkv", 36),
        ("reuse", "h2o", 36),
    ],
)
def test_keep_questions_drops_every_answer(family, protocol, name, topk):
    model = gemfilter.set_attention(BUILDERS[family](), "banded")
    method = None if name is None else get_method(name, layer=FILTER_LAYER[family], topk=topk)
    if name == "fastkv":
        method = get_method(name, layer=1, topk=topk, tsp_len=30, window=4)
    tok = DotTokenizer()
    with gemfilter.Conversation(model, method, tok, protocol=protocol, keep="questions") as chat:
        turns = []
        for t in range(TURNS):
            turns.append(chat.ask(QUESTIONS[t], **greedy()))
            assert torch.equal(chat.history, torch.cat(QUESTIONS[: t + 1], dim=1))  # no answer kept
            if protocol == "full" and t:  # the history's cache goes on: only the new question runs
                assert turns[-1].recomputed == QUESTIONS[t].shape[1]
    for t, turn in enumerate(turns):  # references outside the conversation's apply() block
        history = torch.cat(QUESTIONS[: t + 1], dim=1)
        if protocol == "full":
            ref = model.generate(history, **greedy())[0, history.shape[1] :]
        elif protocol == "reselect":
            ref = gemfilter.generate(model, history, method=method, tokenizer=tok, **greedy()).new_tokens[0]
        else:
            ref = reuse_reference(model, method, [torch.cat(QUESTIONS[: i + 1], 1) for i in range(t)], history)
        assert torch.equal(turn.new_tokens, ref), (t, turn.new_tokens, ref)


@pytest.mark.parametrize("family", ["llama", "gemma3"])
@pytest.mark.parametrize(
    "protocol,name,topk", [("full", None, None), ("reselect", "gemfilter", 12), ("reuse", "snapkv", 36)]
)
def test_keep_context_asks_each_question_over_the_context_alone(family, protocol, name, topk):
    model = gemfilter.set_attention(BUILDERS[family](), "banded")
    method = None if name is None else get_method(name, layer=FILTER_LAYER[family], topk=topk)
    tok = DotTokenizer()
    context = question(9, 60)
    with gemfilter.Conversation(model, method, tok, protocol=protocol, keep="context") as chat:
        with pytest.raises(ValueError, match="call prefill\\(context\\) first"):
            chat.ask(QUESTIONS[1])
        assert chat.prefill(context) > 0
        turns = {t: chat.ask(QUESTIONS[t], **greedy()) for t in range(1, TURNS)}
        assert torch.equal(chat.history, context)
    for t, turn in turns.items():  # references outside the conversation's apply() block
        prompt = torch.cat([context, QUESTIONS[t]], dim=1)
        assert turn.history_tokens == prompt.shape[1]
        # only the question ran on the context's cache (reselect: the k kept tokens of [context, q])
        assert turn.recomputed == (QUESTIONS[t].shape[1] if protocol != "reselect" else turn.kept)
        # the selection's seconds are part of the time to first token; full and reuse select nothing per turn
        assert (0 < turn.select_s <= turn.ttft_s) if protocol == "reselect" else turn.select_s is None
        if protocol == "full":
            ref = model.generate(prompt, **greedy())[0, prompt.shape[1] :]
        elif protocol == "reselect":
            ref = gemfilter.generate(model, prompt, method=method, tokenizer=tok, **greedy()).new_tokens[0]
        else:
            ref = reuse_reference(model, method, [context], prompt)
        assert torch.equal(turn.new_tokens, ref), t


def test_bad_keep_is_refused():
    with pytest.raises(ValueError, match="unknown keep 'all'; allowed: answers, questions, context"):
        gemfilter.Conversation(BUILDERS["llama"](), None, protocol="full", keep="all")
