"""gemfilter.Conversation: each protocol against an independent computation.

- ``reselect`` equals a from-scratch run of the method on the concatenated history, turn by turn (kept ids
  and generated tokens), on tiny Llama and Gemma 3 under the banded kernel, for k < n and k >= n;
- ``full`` equals plain generate on the growing conversation;
- ``reuse`` with gemfilter equals plain generate on [turn 1's kept tokens, then every later token].
"""

import pytest
import torch
from tiny_models import BUILDERS, FILTER_LAYER, DotTokenizer

import gemfilter
from gemfilter.methods import get_method

pytestmark = pytest.mark.usefixtures("quiet")
TURNS, T = 5, 4


def question(t, n):
    return torch.randint(3, 96, (1, n), generator=torch.Generator().manual_seed(100 + t))


def greedy(**kw):
    return dict(max_new_tokens=T, min_new_tokens=T, do_sample=False, **kw)


@pytest.mark.parametrize("family", ["llama", "gemma3"])
@pytest.mark.parametrize(
    "name,topk", [("gemfilter", 12), ("gemfilter", 400), ("gemfilter-span", 24), ("gemfilter-orig-pos", 12)]
)
def test_reselect_equals_a_fresh_run_on_the_whole_history(family, name, topk):
    model = gemfilter.set_attention(BUILDERS[family](), "banded")
    method = get_method(name, layer=FILTER_LAYER[family], topk=topk)
    tok = DotTokenizer()
    with gemfilter.Conversation(model, method, tok, protocol="reselect") as chat:
        for t in range(TURNS):
            turn = chat.ask(question(t, 40 if t == 0 else 7), **greedy())
            history = chat.history[:, : turn.history_tokens]
            fresh = gemfilter.generate(model, history, method=method, tokenizer=tok, **greedy())
            assert torch.equal(turn.selection.indices[0], fresh.selection.indices[0]), t
            assert torch.equal(turn.new_tokens, fresh.new_tokens[0]), t
            assert turn.kept == min(topk, history.shape[1]) or name == "gemfilter-span"
            assert 0 < turn.ttft_s <= turn.total_s
            assert chat.selector_tokens == turn.history_tokens  # each token ran through layers 0..r once


@pytest.mark.parametrize("family", ["llama", "gemma3"])
def test_full_equals_plain_generate_on_the_growing_conversation(family):
    model = BUILDERS[family]()
    with gemfilter.Conversation(model, None, protocol="full") as chat:
        for t in range(TURNS):
            turn = chat.ask(question(t, 30 if t == 0 else 5), **greedy())
            history = chat.history[:, : turn.history_tokens]
            plain = model.generate(history, **greedy())[0, history.shape[1] :]
            assert torch.equal(turn.new_tokens, plain), t
            assert turn.kept == history.shape[1] or family == "gemma3"  # Gemma's sliding layers hold windows


def test_reuse_continues_turn_one_s_compressed_cache():
    """Turn t of gemfilter under reuse equals plain generate on turn 1's kept tokens followed by every token
    after turn 1's prompt (the references run after the block: inside it, generate runs the method)."""
    model = BUILDERS["llama"]()
    method = get_method("gemfilter", layer=2, topk=12)
    with gemfilter.Conversation(model, method, protocol="reuse") as chat:
        for t in range(4):
            chat.ask(question(t, 40 if t == 0 else 6), **greedy())
    kept = gemfilter.select_tokens(model, question(0, 40), layer=2, topk=12).kept_ids[0][None]
    assert chat.turns[0].kept == 12
    for t, turn in enumerate(chat.turns[1:], 1):
        plain = torch.cat([kept, chat.history[:, 40 : turn.history_tokens]], dim=1)
        assert torch.equal(turn.new_tokens, model.generate(plain, **greedy())[0, plain.shape[1] :]), t
        assert turn.kept == plain.shape[1]


def test_refusals_say_what_to_use_instead():
    model = BUILDERS["llama"]()
    with pytest.raises(ValueError, match="unknown protocol 'again'; allowed: reselect, reuse, full"):
        gemfilter.Conversation(model, get_method("gemfilter", layer=2), protocol="again")
    with pytest.raises(ValueError, match="snapkv is not a prompt method. Use 'reuse'"):
        gemfilter.Conversation(model, get_method("snapkv", topk=16), protocol="reselect")
    with pytest.raises(ValueError, match="middle-row reads another row. Use 'reuse'"):
        gemfilter.Conversation(model, get_method("middle-row", layer=2), protocol="reselect")
    with pytest.raises(ValueError, match="filter layer 0 has a sliding window"):
        gemfilter.Conversation(BUILDERS["gemma3"](), get_method("gemfilter", layer=0), protocol="reselect")
    with pytest.raises(ValueError, match="protocol 'full' runs no method"):
        gemfilter.Conversation(model, get_method("snapkv"), protocol="full")
    chat = gemfilter.Conversation(model, get_method("gemfilter", layer=2))
    with pytest.raises(RuntimeError, match="inside `with Conversation"):
        chat.ask(question(0, 5))
    with chat, pytest.raises(ValueError, match="a text question needs the tokenizer"):
        chat.ask("hello")


def test_a_machine_without_proc_reports_no_peak_but_still_times_the_turn(monkeypatch):
    from gemfilter.measure import PeakMemory

    def no_proc(self):
        raise OSError("/proc/self/status: no such file")

    monkeypatch.setattr(PeakMemory, "now", no_proc)
    model = BUILDERS["llama"]()
    with gemfilter.Conversation(model, get_method("gemfilter", layer=2, topk=12)) as chat:
        turn = chat.ask(question(0, 30), **greedy())
    assert turn.peak_mib is None and 0 < turn.ttft_s <= turn.total_s


@pytest.mark.parametrize("family", ["llama", "gemma3"])
@pytest.mark.parametrize(
    "name,topk",
    [
        ("gemfilter-qwin", 12),
        ("gemfilter-qwin", 400),
        ("gemfilter-span-qwin", 24),
        ("gemfilter-span-qmax", 24),
        ("gemfilter-span-qmax", 400),
        ("gemfilter-claa", 12),
        ("gemfilter-span-claa", 24),
        ("gemfilter-asl", 12),
        ("gemfilter-asl", 400),
    ],
)
def test_methods_that_read_more_rows_or_layers_reselect_as_a_fresh_run(family, name, topk):
    """Window methods keep the history's last query rows (QueryTail), CLAA reads the last row at several layers,
    ASL runs every layer: turn t equals a from-scratch run on the concatenated history, follow-ups (7 tokens)
    shorter than their windows (16, 32, 48) included."""
    model = gemfilter.set_attention(BUILDERS[family](), "banded")
    params = {"layer": FILTER_LAYER[family] if name != "gemfilter-asl" else 1, "topk": topk}
    if name == "gemfilter-asl":
        params["window"] = 8
    method = get_method(name, **params)
    tok = DotTokenizer()
    with gemfilter.Conversation(model, method, tok, protocol="reselect") as chat:
        for t in range(TURNS):
            turn = chat.ask(question(t, 40 if t == 0 else 7), **greedy())
            history = chat.history[:, : turn.history_tokens]
            fresh = gemfilter.generate(model, history, method=method, tokenizer=tok, **greedy())
            assert torch.equal(turn.selection.indices[0], fresh.selection.indices[0]), t
            assert torch.equal(turn.new_tokens, fresh.new_tokens[0]), t
            assert turn.selection.layers == fresh.selection.layers, t
