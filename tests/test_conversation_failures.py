"""A Conversation turn that fails leaves the conversation exactly as before it; bad questions and settings are
refused with a message that says what is allowed (reliability round four, items 7 and 10).

The reference is a clean conversation that never saw the failed turn: every later turn must equal it (kept
indices, answer tokens, kept count) and the history must be the same tokens."""

import pytest
import torch
from tiny_models import BUILDERS, FILTER_LAYER
from transformers import LogitsProcessor, LogitsProcessorList

import gemfilter
from gemfilter.methods import get_method

pytestmark = pytest.mark.usefixtures("quiet")
T = 4


def ids(seed, n):
    return torch.randint(3, 96, (1, n), generator=torch.Generator().manual_seed(seed))


class Interrupt(LogitsProcessor):
    """Ctrl-C in the middle of an answer: raises KeyboardInterrupt at the given decode step."""

    def __init__(self, at: int):
        self.at, self.calls = at, 0

    def __call__(self, input_ids, scores):
        self.calls += 1
        if self.calls == self.at:
            raise KeyboardInterrupt
        return scores


FAILURES = {
    "refused keyword": lambda: {"bogus_keyword": 1},  # generate refuses it before any token, after reselect's pass
    "Ctrl-C mid-answer": lambda: {"logits_processor": LogitsProcessorList([Interrupt(at=3)])},
}
SETUPS = [
    ("reselect", "gemfilter", "answers"),
    ("reselect", "gemfilter", "questions"),
    ("reselect", "gemfilter", "context"),
    ("reuse", "gemfilter", "answers"),
    ("reuse", "snapkv", "questions"),
    ("reuse", "gemfilter", "context"),
    ("full", None, "answers"),
    ("full", None, "questions"),
]


def run(model, protocol, name, keep, family, fail=None):
    method = (
        None if name is None else get_method(name, layer=FILTER_LAYER[family], topk=16 if name == "gemfilter" else 40)
    )
    with gemfilter.Conversation(model, method, protocol=protocol, keep=keep) as chat:
        if keep == "context":
            chat.prefill(ids(0, 60))
        chat.ask(ids(1, 60 if keep != "context" else 6), max_new_tokens=T, min_new_tokens=T)
        if fail is not None:
            with pytest.raises((ValueError, KeyboardInterrupt)):
                chat.ask(ids(2, 9), max_new_tokens=T, min_new_tokens=T, **FAILURES[fail]())
        for seed, n in ((3, 12), (4, 5)):  # a longer question than the failed one, then a shorter one
            chat.ask(ids(seed, n), max_new_tokens=T, min_new_tokens=T)
    return chat


@pytest.mark.parametrize("family", ["llama", "gemma3"])
@pytest.mark.parametrize("protocol,name,keep", SETUPS)
@pytest.mark.parametrize("fail", sorted(FAILURES))
def test_a_failed_turn_leaves_the_conversation_as_it_was(family, protocol, name, keep, fail):
    if name == "snapkv" and family == "gemma3":
        pytest.skip("the tiny Gemma 3's sliding layers: snapkv's eviction is covered on Llama")
    model = BUILDERS[family]()
    clean = run(model, protocol, name, keep, family)
    failed = run(model, protocol, name, keep, family, fail)
    assert len(failed.turns) == len(clean.turns) == 3
    assert torch.equal(failed.history, clean.history)
    for a, b in zip(failed.turns, clean.turns):
        assert torch.equal(a.new_tokens, b.new_tokens)
        assert a.kept == b.kept and a.history_tokens == b.history_tokens
        if b.selection is not None:
            assert torch.equal(a.selection.indices[0], b.selection.indices[0])
            assert torch.allclose(a.selection.scores, b.selection.scores, rtol=0, atol=1e-6)


def test_a_failed_prefill_leaves_no_context_behind():
    model = BUILDERS["llama"]()
    method = get_method("gemfilter", layer=2, topk=16)
    with gemfilter.Conversation(model, method, keep="context") as chat:
        with pytest.raises(ValueError, match="token ids must lie in"):
            chat.prefill(torch.tensor([[5, 6, 500]]))
        assert chat.history is None and chat.selector_tokens == 0
        chat.prefill(ids(0, 40))
        assert chat.selector_tokens == 40


@pytest.mark.parametrize("protocol", ["reselect", "reuse", "full"])
def test_bad_questions_and_settings_are_refused_and_the_conversation_goes_on(protocol):
    model = BUILDERS["llama"]()
    method = None if protocol == "full" else get_method("gemfilter", layer=2, topk=16)
    with gemfilter.Conversation(model, method, protocol=protocol, keep="questions") as chat:
        chat.ask(ids(1, 30), max_new_tokens=T)
        with pytest.raises(ValueError, match="max_new_tokens must be a whole number >= 1, got 0; .*prefill"):
            chat.ask(ids(2, 5), max_new_tokens=0)
        with pytest.raises(TypeError, match="a question is text, or token ids .* got NoneType"):
            chat.ask(None, max_new_tokens=T)
        with pytest.raises(ValueError, match=r"token ids must lie in \[0, 96\).*position 1 of the question holds 96"):
            chat.ask(torch.tensor([5, 96]), max_new_tokens=T)
        with pytest.raises(ValueError, match="num_beams must be 1, got 2"):
            chat.ask(ids(3, 5), max_new_tokens=T, num_beams=2)
        with pytest.raises(ValueError, match=r"would hold 531 tokens .* max_position_embeddings \(512\)"):
            chat.ask(ids(4, 501), max_new_tokens=T)
        turn = chat.ask([5, 6, 7], max_new_tokens=T)
        assert len(chat.turns) == 2 and turn.history_tokens == 33


def test_a_method_given_as_text_is_refused_by_type():
    model = BUILDERS["llama"]()
    for protocol in ("full", "reselect", "reuse"):
        with pytest.raises(TypeError, match="method must be a method object such as gemfilter.get_method"):
            gemfilter.Conversation(model, "gemfilter", protocol=protocol)
