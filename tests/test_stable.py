"""The ``stable`` conversation protocol (gemfilter.stable): each turn keeps last turn's kept tokens in their slots,
masks the ones it drops and runs only the ones it newly keeps.

References: with max_holes=0 every turn that masks a slot is rebuilt and must equal ``reselect`` token for token;
otherwise the answer must be what one forward over every slot computes under :meth:`Layout.attention_mask` (what
each slot saw when it was written), an independent computation of the layout the incremental cache holds."""

import itertools

import pytest
import torch
from tiny_models import BUILDERS, FILTER_LAYER, DotTokenizer

import gemfilter
from gemfilter.methods import get_method
from gemfilter.stable import Layout

pytestmark = pytest.mark.usefixtures("quiet")
TURNS, T = 5, 4


def question(t, n):
    return torch.randint(3, 96, (1, n), generator=torch.Generator().manual_seed(100 + t))


def greedy():
    return dict(max_new_tokens=T, min_new_tokens=T)


def converse(model, method, protocol, keep, **kw):
    with gemfilter.Conversation(model, method, DotTokenizer(), protocol=protocol, keep=keep, **kw) as chat:
        if keep == "context":
            chat.prefill(question(99, 40))
        for t in range(TURNS):
            chat.ask(question(t, 40 if t == 0 and keep != "context" else 7), **greedy())
    return chat


def asked(chat):
    """Ask TURNS questions (40 tokens, then 7); yield (t, turn, the history the turn was asked on)."""
    for t in range(TURNS):
        before = chat.history
        turn = chat.ask(question(t, 40 if t == 0 else 7), **greedy())
        yield t, turn, (torch.cat([before, question(t, 7)], dim=1) if before is not None else question(t, 40))


@pytest.mark.parametrize("family", ["llama", "gemma3"])
@pytest.mark.parametrize("name,topk", [("gemfilter", 12), ("gemfilter-span", 24), ("gemfilter-span-qmax", 24)])
@pytest.mark.parametrize("keep", ["answers", "questions", "context"])
def test_rebuilt_every_turn_it_is_reselect(family, name, topk, keep):
    model = gemfilter.set_attention(BUILDERS[family](), "banded")
    method = get_method(name, layer=FILTER_LAYER[family], topk=topk)
    again = converse(model, method, "reselect", keep)
    stable = converse(model, method, "stable", keep, max_holes=0.0)
    for a, b in zip(again.turns, stable.turns):
        assert torch.equal(a.new_tokens, b.new_tokens)
        assert torch.equal(a.selection.indices[0], b.selection.indices[0])
        assert b.rebuilt and b.recomputed == b.kept == a.kept


@pytest.mark.parametrize("max_fresh", [None, 2])
@pytest.mark.parametrize("name,topk", [("gemfilter", 12), ("gemfilter-span", 24)])
def test_the_answer_is_one_forward_over_the_layout_under_its_mask(name, topk, max_fresh):
    """Never rebuilt after turn 1 (max_holes=1): every answer token is the argmax that a single forward over every
    slot gives under Layout.attention_mask(), at the positions the layout gave them (with a cap on what a follow-up
    newly keeps too)."""
    model = BUILDERS["llama"]()
    method = get_method(name, layer=FILTER_LAYER["llama"], topk=topk)
    slots_before = []
    kw = dict(protocol="stable", max_holes=1.0, max_fresh=max_fresh)
    with gemfilter.Conversation(model, method, DotTokenizer(), **kw) as chat:
        for t in range(TURNS):
            slots_before.append(len(chat._layout.ids))
            chat.ask(question(t, 40 if t == 0 else 7), **greedy())
    assert [t.rebuilt for t in chat.turns] == [True] + [False] * (TURNS - 1)
    assert all(0 < t.recomputed < t.kept for t in chat.turns[1:])  # only the newly kept tokens ran, k held
    layout = chat._layout
    tokens = chat.history[:, layout.ids]
    with torch.no_grad():
        logits = (
            model(input_ids=tokens, position_ids=torch.tensor([layout.pos]), attention_mask=layout.attention_mask())
            .logits[0]
            .float()
        )
    logits[:, model.generation_config.eos_token_id] = float("-inf")  # min_new_tokens = max_new_tokens
    slot = {h: s for s, h in enumerate(layout.ids)}
    for turn, start in zip(chat.turns, slots_before):
        first = turn.history_tokens  # the history index of the answer's first token
        for i, token in enumerate(turn.new_tokens.tolist()):
            # the first token follows the last slot the turn placed; each next one, the slot of the token before
            before = slot[first + i - 1] if i else start + turn.recomputed - 1
            assert int(logits[before].argmax()) == token, (turn.history_tokens, i)


@pytest.mark.parametrize("max_holes", [0.1, 0.3, 0.5])
def test_holes_past_max_holes_rebuild_the_layout(max_holes):
    """The rebuild rule, replayed from the selections alone (keep="questions": the layout holds prompt slots only):
    a turn rebuilds when its masked slots would pass max_holes of the layout, or it keeps no new token."""
    model = BUILDERS["llama"]()
    method = get_method("gemfilter", layer=2, topk=12)
    chat = converse(model, method, "stable", "questions", max_holes=max_holes)
    slots, holes = 0, 0
    valid = set()
    for t, turn in enumerate(chat.turns):
        want = set(turn.selection.indices[0].tolist())
        new, drop = want - valid, valid - want
        expect = t == 0 or not new or holes + len(drop) > max_holes * (slots + len(new))
        assert turn.rebuilt == expect, (t, turn.rebuilt)
        assert turn.recomputed == (len(want) if expect else len(new))
        slots, holes = (len(want), 0) if expect else (slots + len(new), holes + len(drop))
        valid = want


def picked(earlier: list, cap: int, by: str, scores: list) -> list:
    """What a cap of ``cap`` takes of ``earlier`` (sorted history indices), as docs/methods.md states the rule:
    single tokens from the highest score down; or runs of consecutive indices, whole, from the run with the highest
    score down, each one that still fits."""
    if len(earlier) <= cap:
        return earlier
    if by == "tokens":
        return sorted(earlier, key=lambda h: (-scores[h], h))[:cap]
    starts = [h for h in earlier if h - 1 not in earlier]
    runs = [[h for h in earlier if h >= a and all(x in earlier for x in range(a, h + 1))] for a in starts]
    out = []
    for run in sorted(runs, key=lambda r: (-max(scores[h] for h in r), r[0])):
        if len(out) + len(run) <= cap:
            out += run
    return sorted(out)


def replayed(turn, valid: set, below: int, cap: int, by: str) -> tuple:
    """A capped turn replayed from its selection: (its kept indices, their scores, the tokens below ``below`` it
    newly keeps against ``valid``, what the cap takes of those (``picked``))."""
    want = turn.selection.indices[0].tolist()
    scores = turn.selection.scores[0].tolist()
    earlier = [h for h in want if h not in valid and h < below]
    return want, scores, earlier, picked(earlier, cap, by, scores)


@pytest.mark.parametrize("family", ["llama", "gemma3"])
@pytest.mark.parametrize("keep", ["answers", "questions", "context"])
@pytest.mark.parametrize("by,cap", [("tokens", 2), ("runs", 3)])
def test_a_capped_follow_up_adds_the_highest_scoring_earlier_tokens_and_its_question(family, keep, by, cap):
    """max_fresh, max_holes=1: each follow-up's placed slots are, replayed from the selection and the layout's
    valid slots before it, its question's kept tokens plus what the cap takes of the earlier tokens it newly keeps
    (``picked``); of the slots the selection drops, as many stay valid as the cap left out, the highest-scoring, so
    the layout holds k (keep="context": each question on a copy of the prefill's layout, so the counts alone); a turn
    left with nothing to run is rebuilt, as stable rebuilds a turn that keeps nothing new; the cap binds on some turn
    that is not rebuilt, and under ``runs`` some run it weighs is longer than one token."""
    model = gemfilter.set_attention(BUILDERS[family](), "banded")
    method = get_method("gemfilter", layer=FILTER_LAYER[family], topk=16)  # its kept set moves from turn to turn
    bound = longer = 0
    kw = dict(protocol="stable", keep=keep, max_holes=1.0, max_fresh=cap, fresh_by=by)
    with gemfilter.Conversation(model, method, DotTokenizer(), **kw) as chat:
        if keep == "context":
            chat.prefill(question(99, 40))
        for t in range(TURNS):
            layout = chat._layout
            valid = {h for h, v in zip(layout.ids, layout.valid) if v}
            slots, asked_from = len(layout.ids), 0 if chat.history is None else chat.history.shape[1]
            turn = chat.ask(question(t, 40 if t == 0 and keep != "context" else 7), **greedy())
            if t == 0 and keep != "context":
                assert turn.rebuilt
                continue
            want, scores, earlier, top = replayed(turn, valid, asked_from, cap, by)
            expect = sorted(top + [h for h in want if h >= asked_from])
            assert turn.rebuilt == (not expect), t  # a turn that would run nothing is rebuilt, as stable's are
            if not expect:
                assert turn.recomputed == turn.kept == 16
                continue
            left_out = len(earlier) - len(top)
            bound += left_out > 0
            longer += any(h + 1 in earlier for h in earlier)
            assert turn.recomputed == len(expect) and turn.kept == 16, t
            if keep == "context":  # each question is answered on a copy of the prefill's layout
                continue
            layout = chat._layout
            assert layout.ids[slots : slots + turn.recomputed] == expect, t
            dropped = sorted(valid - set(want), key=lambda h: (-scores[h], h))
            held = {h for h, v in zip(layout.ids[:slots], layout.valid[:slots]) if v}
            assert held == (valid & set(want)) | set(dropped[:left_out]), t
    assert bound, "the cap never bound on a turn it laid out: the test would not see it"
    assert by == "tokens" or longer, "every run was one token: the test would not see runs"


def capped_rebuilds(chat_turns, max_holes: float, holes: str, cap: int = 2) -> list:
    """The turns that the rebuild rule rebuilds, replayed from the selections alone (keep="questions", tokens cap):
    a turn is rebuilt when it would run nothing, or when its masked slots would pass ``max_holes`` of the layout,
    counted on the capped turn (``capped``) or on the whole selection (``selection``)."""
    out, valid, slots, masked, asked_from = [], set(), 0, 0, 0
    for t, turn in enumerate(chat_turns):
        want = turn.selection.indices[0].tolist()
        scores = turn.selection.scores[0].tolist()
        new, drop = [h for h in want if h not in valid], sorted(valid - set(want), key=lambda h: (-scores[h], h))
        short = sorted(
            picked([h for h in new if h < asked_from], cap, "tokens", scores) + [h for h in new if h >= asked_from]
        )
        gone = drop[len(new) - len(short) :]
        judge = (new, drop) if holes == "selection" else (short, gone)
        rebuilt = t == 0 or not short or masked + len(judge[1]) > max_holes * (slots + len(judge[0]))
        out.append(rebuilt)
        if rebuilt:
            valid, slots, masked = set(want), len(want), 0
        else:
            valid, slots, masked = (valid - set(gone)) | set(short), slots + len(short), masked + len(gone)
        asked_from = turn.history_tokens
    return out


@pytest.mark.parametrize("max_holes", [0.2, 0.4])
def test_a_capped_turn_is_rebuilt_by_the_holes_its_rule_reads(max_holes):
    """fresh_holes: the rebuild rule reads the capped turn's holes, or the whole selection's; each conversation's
    rebuilt turns are the replay's, and the two rules rebuild different turns."""
    model = BUILDERS["llama"]()
    method = get_method("gemfilter", layer=FILTER_LAYER["llama"], topk=16)
    seen = {}
    for holes in ("capped", "selection"):
        kw = dict(max_holes=max_holes, max_fresh=2, fresh_by="tokens", fresh_holes=holes)
        chat = converse(model, method, "stable", "questions", **kw)
        seen[holes] = [turn.rebuilt for turn in chat.turns]
        assert seen[holes] == capped_rebuilds(chat.turns, max_holes, holes), holes
    assert seen["capped"] != seen["selection"]


@pytest.mark.parametrize(
    "protocol", ["stable", "stable-cf", "stable-gap", "stable-front", "stable-late", "stable-late-runs"]
)
@pytest.mark.parametrize("keep", ["answers", "questions"])
def test_a_cap_no_turn_reaches_is_the_uncapped_layout(keep, protocol):
    """max_fresh at the budget k: no follow-up newly keeps more, so every turn is the protocol's without a cap."""
    model = BUILDERS["llama"]()
    method = get_method("gemfilter-span", layer=FILTER_LAYER["llama"], topk=24)
    where = {} if protocol == "stable" else {"context_tokens": 30}
    plain = converse(model, method, protocol, keep, max_holes=1.0, **where)
    capped = converse(model, method, protocol, keep, max_holes=1.0, max_fresh=24, **where)
    for a, b in zip(plain.turns, capped.turns):
        assert torch.equal(a.new_tokens, b.new_tokens) and (a.kept, a.recomputed) == (b.kept, b.recomputed)


def test_a_failed_stable_turn_leaves_the_layout_as_it_was(monkeypatch):
    model = BUILDERS["llama"]()
    method = get_method("gemfilter-span", layer=2, topk=24)
    clean = converse(model, method, "stable", "answers", max_holes=1.0)
    real = Layout.decode
    calls = {"n": 0}

    def interrupted(self, *args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 3:  # Ctrl-C in turn 3's answer, after its layout was placed
            raise KeyboardInterrupt
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Layout, "decode", interrupted)
    with gemfilter.Conversation(model, method, DotTokenizer(), protocol="stable", max_holes=1.0) as chat:
        for t in range(TURNS):
            if t == 2:
                with pytest.raises(KeyboardInterrupt):
                    chat.ask(question(t, 7), **greedy())
            chat.ask(question(t, 40 if t == 0 else 7), **greedy())
    for a, b in zip(clean.turns, chat.turns):
        assert torch.equal(a.new_tokens, b.new_tokens) and a.kept == b.kept


def test_stable_refuses_what_it_cannot_do():
    model = BUILDERS["llama"]()
    with pytest.raises(ValueError, match="snapkv is not a prompt method"):
        gemfilter.Conversation(model, get_method("snapkv", topk=16), protocol="stable")
    with pytest.raises(ValueError, match="max_holes must be a share in \\[0, 1\\]"):
        gemfilter.Conversation(model, get_method("gemfilter", layer=2), protocol="stable", max_holes=2)
    with pytest.raises(ValueError, match="unknown fresh_holes 'all'; allowed: capped, selection"):
        gemfilter.Conversation(
            model, get_method("gemfilter", layer=2), protocol="stable", max_fresh=8, fresh_holes="all"
        )
    with pytest.raises(ValueError, match="unknown fresh_by 'words'; allowed: runs, tokens"):
        gemfilter.Conversation(
            model, get_method("gemfilter", layer=2), protocol="stable", max_fresh=8, fresh_by="words"
        )
    for bad in (0, True, 1.5, "8"):
        with pytest.raises(ValueError, match="max_fresh is a whole number >= 1"):
            gemfilter.Conversation(model, get_method("gemfilter", layer=2), protocol="stable", max_fresh=bad)
    for protocol in ("reselect", "reuse"):
        with pytest.raises(ValueError, match=f"protocol '{protocol}' has no such cap"):
            gemfilter.Conversation(model, get_method("gemfilter", layer=2), protocol=protocol, max_fresh=8)
    with pytest.raises(ValueError, match="stable-late-runs writes a newly kept token's run whole, so its cap takes"):
        gemfilter.Conversation(
            model, get_method("gemfilter", layer=2), protocol="stable-late-runs", max_fresh=8, fresh_by="tokens"
        )
    for protocol in ("stable", "stable-gap", "stable-late"):
        with pytest.raises(
            ValueError, match=f"runs-new ranks the runs that extend a held one last.*; {protocol} would"
        ):
            gemfilter.Conversation(
                model, get_method("gemfilter", layer=2), protocol=protocol, max_fresh=8, fresh_by="runs-new"
            )
    with pytest.raises(ValueError, match="unknown outgrown 'grow'; allowed: rebuild, reopen"):
        gemfilter.Conversation(model, get_method("gemfilter", layer=2), protocol="stable-late", outgrown="grow")
    for protocol in ("reselect", "stable", "stable-cf", "stable-front"):
        with pytest.raises(ValueError, match=f"outgrown reopen keeps the context slots .*; got {protocol} \\("):
            gemfilter.Conversation(model, get_method("gemfilter", layer=2), protocol=protocol, outgrown="reopen")
    with gemfilter.Conversation(model, get_method("gemfilter", layer=2, topk=12), protocol="stable") as chat:
        with pytest.raises(ValueError, match="decodes greedily"):
            chat.ask(question(0, 30), max_new_tokens=3, do_sample=True)
        with pytest.raises(ValueError, match="max_new_tokens"):
            chat.ask(question(0, 30))


def test_recomputed_counts_what_ran_through_the_whole_model():
    """full: the turn's new history tokens (its question); reuse: the method's first prefill (k for a prompt method),
    then the question; reselect: the kept tokens."""
    model = BUILDERS["llama"]()
    method = get_method("gemfilter", layer=2, topk=12)
    for protocol, first in (("full", 40), ("reuse", 12), ("reselect", 12)):
        chat = converse(model, None if protocol == "full" else method, protocol, "answers")
        assert chat.turns[0].recomputed == first, protocol
        later = [t.recomputed for t in chat.turns[1:]]
        assert later == ([12] * (TURNS - 1) if protocol == "reselect" else [7] * (TURNS - 1)), (protocol, later)


# ------------------------------------------------------------------ stable-cf: the context first


def converse_cf(model, method, keep, context_tokens=None, **kw):
    """:func:`converse` under stable-cf; ``context_tokens``: how many of the first question's 40 tokens are the
    context (None: the prefill, or the whole first question)."""
    return converse(model, method, "stable-cf", keep, context_tokens=context_tokens, **kw)


@pytest.mark.parametrize("family", ["llama", "gemma3"])
@pytest.mark.parametrize("name,topk", [("gemfilter", 12), ("gemfilter-span", 24), ("gemfilter-span-qmax", 24)])
@pytest.mark.parametrize("keep", ["answers", "questions", "context"])
def test_stable_cf_rebuilt_on_every_change_is_reselect(family, name, topk, keep):
    """max_holes=0: every turn that masks or adds a context slot rebuilds it; the context's slots then sit in
    history order at 0..c-1 and the conversation's after them, which is reselect's prompt, token for token."""
    model = gemfilter.set_attention(BUILDERS[family](), "banded")
    method = get_method(name, layer=FILTER_LAYER[family], topk=topk)
    again = converse(model, method, "reselect", keep)
    cf = converse_cf(model, method, keep, None if keep == "context" else 30, max_holes=0.0)
    for a, b in zip(again.turns, cf.turns):
        assert torch.equal(a.new_tokens, b.new_tokens)
        assert torch.equal(a.selection.indices[0], b.selection.indices[0])
        assert b.kept == a.kept


@pytest.mark.parametrize("family", ["llama", "gemma3"])
@pytest.mark.parametrize("context_tokens", [None, 30])
def test_stable_cf_keeping_everything_is_plain_generate(family, context_tokens):
    """k >= n: the context's slots never change after turn 1 and the whole conversation runs after them at the
    next positions, so every answer is ``generate``'s on the whole history (keep="answers")."""
    model = gemfilter.set_attention(BUILDERS[family](), "banded")
    method = get_method("gemfilter", layer=FILTER_LAYER[family], topk=4096)
    chat = converse_cf(model, method, "answers", context_tokens, max_holes=0.5)
    history = None
    for t, turn in enumerate(chat.turns):
        q = question(t, 40 if t == 0 else 7)
        history = q if history is None else torch.cat([history, q], dim=1)
        with torch.no_grad():
            out = model.generate(history, do_sample=False, **greedy())
        assert torch.equal(turn.new_tokens, out[0, history.shape[1] :]), t
        boundary = context_tokens or 40
        # turn 1 runs the whole prompt; later turns run the conversation alone, the context's slots kept
        assert turn.recomputed == (history.shape[1] if t == 0 else history.shape[1] - boundary), t
        assert turn.rebuilt == (t == 0)
        history = torch.cat([history, turn.new_tokens[None]], dim=1)


@pytest.mark.parametrize("max_fresh", [None, 1])
@pytest.mark.parametrize("keep", ["answers", "questions"])
def test_stable_cf_answers_are_one_forward_over_the_context_slots_then_the_conversation(keep, max_fresh):
    """Never rebuilt after turn 1 (max_holes=1): each turn's answer is the greedy run of one forward over the
    context's slots under Layout.attention_mask (what each saw when written), then the turn's kept conversation
    tokens in history order at the next positions, which see every valid context slot and each other causally
    (the last turn's conversation and answer slots cut off the cache first); with a cap on the newly kept context
    too, where the valid context slots are as many as the selection keeps of the context, not the same ones
    (gemfilter at k=16 there: its kept set moves from turn to turn)."""
    model = BUILDERS["llama"]()
    name, topk = ("gemfilter-span", 24) if max_fresh is None else ("gemfilter", 16)
    method = get_method(name, layer=FILTER_LAYER["llama"], topk=topk)
    boundary, bound = 30, 0
    with gemfilter.Conversation(
        model,
        method,
        DotTokenizer(),
        protocol="stable-cf",
        keep=keep,
        max_holes=1.0,
        context_tokens=boundary,
        max_fresh=max_fresh,
        fresh_by="tokens",
    ) as chat:
        for t, turn, history in asked(chat):
            layout = chat._layout  # the context's slots, then this turn's conversation and answer
            want = turn.selection.indices[0].tolist()
            c = layout.context_slots
            ids_c, valid_c, pos_c = layout.ids[:c], layout.valid[:c], layout.pos[:c]
            talk = [h for h in want if h >= boundary]
            assert all(h < boundary for h in ids_c)
            held = sorted(h for h, v in zip(ids_c, valid_c) if v)
            if max_fresh is None:
                assert held == [h for h in want if h < boundary]
            else:  # the dropped slots that stay make up for the left-out tokens, as far as there are dropped slots
                assert len(held) <= len([h for h in want if h < boundary])
                bound += held != [h for h in want if h < boundary]
            assert layout.ids[c : c + len(talk)] == talk and all(layout.valid[c:])  # in history order
            assert layout.pos[c : c + len(talk)] == list(range(max(pos_c) + 1, max(pos_c) + 1 + len(talk)))
            assert turn.recomputed >= len(talk) and turn.kept == len(held) + len(talk)
            n, m = c, len(talk)
            mask = torch.full((n + m, n + m), torch.finfo(torch.float32).min)
            mask[:n, :n] = layout.attention_mask()[0, 0, :n, :n]  # what each context slot saw when written
            mask[n:, :n] = torch.where(torch.tensor(valid_c), 0.0, torch.finfo(torch.float32).min)
            mask[n:, n:] = torch.triu(torch.full((m, m), torch.finfo(torch.float32).min), 1)
            start = max(pos_c) + 1
            ids = torch.cat([history[:, ids_c], history[:, talk]], dim=1)
            pos = pos_c + list(range(start, start + m))
            answer = []
            for _ in range(T):  # greedy, EOS suppressed as min_new_tokens asks, each answer token appended
                with torch.no_grad():
                    logits = model(
                        input_ids=ids, position_ids=torch.tensor([pos]), attention_mask=mask[None, None]
                    ).logits[0, -1]
                logits[model.generation_config.eos_token_id] = float("-inf")
                token = int(logits.argmax())
                answer.append(token)
                ids = torch.cat([ids, torch.tensor([[token]])], dim=1)
                pos = pos + [pos[-1] + 1]
                grown = torch.full((mask.shape[0] + 1, mask.shape[0] + 1), torch.finfo(torch.float32).min)
                grown[:-1, :-1] = mask
                grown[-1, :] = torch.cat([mask[-1, :], torch.zeros(1)])
                mask = grown
            assert turn.new_tokens.tolist() == answer, t
            assert turn.rebuilt == (t == 0)
    assert max_fresh is None or bound, "the cap never bound: the test would not see it"


@pytest.mark.parametrize("family", ["llama", "gemma3"])
@pytest.mark.parametrize("keep", ["answers", "questions"])
@pytest.mark.parametrize("by,cap", [("tokens", 1), ("runs", 2)])
def test_a_capped_stable_cf_follow_up_adds_the_highest_scoring_context_tokens(family, keep, by, cap):
    """max_fresh under stable-cf, max_holes=1: replayed from the selection and the context slots valid before it,
    each follow-up writes what the cap takes (``picked``) of the context tokens it newly keeps, after the context's
    slots, then the whole kept conversation; of the context slots the selection drops, as many stay valid as the cap
    left out, the highest-scoring (all of them where it drops fewer: the kept context can shrink, unlike stable's
    k slots); a follow-up is rebuilt only when it would run nothing (no conversation token kept, no context token
    taken)."""
    model = gemfilter.set_attention(BUILDERS[family](), "banded")
    method = get_method("gemfilter", layer=FILTER_LAYER[family], topk=16)  # its kept set moves from turn to turn
    boundary, bound = 30, 0
    kw = dict(protocol="stable-cf", keep=keep, max_holes=1.0, max_fresh=cap, fresh_by=by, context_tokens=boundary)
    with gemfilter.Conversation(model, method, DotTokenizer(), **kw) as chat:
        for t in range(TURNS):
            layout = chat._layout
            slots = layout.context_slots
            valid = {h for h, v in zip(layout.ids[:slots], layout.valid[:slots]) if v}
            turn = chat.ask(question(t, 40 if t == 0 else 7), **greedy())
            if t == 0:
                assert turn.rebuilt
                continue
            want, scores, earlier, top = replayed(turn, valid, boundary, cap, by)
            talk = [h for h in want if h >= boundary]
            assert turn.rebuilt == (not top and not talk), t  # a turn that would run nothing is rebuilt
            if turn.rebuilt:
                assert turn.recomputed == turn.kept == len(want)
                continue
            left_out = len(earlier) - len(top)
            bound += left_out > 0
            layout = chat._layout
            assert turn.recomputed == len(top) + len(talk), t
            # the answer's slots follow (all but its last token, which is never written)
            assert layout.ids[slots:] == top + talk + list(range(turn.history_tokens, turn.history_tokens + T - 1)), t
            dropped = sorted(valid - set(want), key=lambda h: (-scores[h], h))
            held = {h for h, v in zip(layout.ids[:slots], layout.valid[:slots]) if v}
            assert held == (valid & set(want)) | set(dropped[:left_out]), t
            assert turn.kept == len(held) + len(top) + len(talk), t
    assert bound, "the cap never bound on a follow-up: the test would not see it"


def test_stable_cf_refuses_a_bad_context_boundary():
    model = BUILDERS["llama"]()
    method = get_method("gemfilter", layer=2, topk=12)
    for bad in (0, -3, 2.5, True, "30"):
        with pytest.raises(ValueError, match="context_tokens is a whole number >= 1"):
            gemfilter.Conversation(model, method, protocol="stable-cf", context_tokens=bad)
    with pytest.raises(
        ValueError,
        match="for protocols stable-cf, stable-gap, stable-front, stable-late and stable-late-runs only; got 30 with "
        "protocol 'stable'",
    ):
        gemfilter.Conversation(model, method, protocol="stable", context_tokens=30)


@pytest.mark.parametrize("family", ["llama", "gemma3"])
@pytest.mark.parametrize("fail", [1, 3])
@pytest.mark.parametrize("protocol", ["stable-cf", "stable-gap", "stable-front", "stable-late", "stable-late-runs"])
def test_a_failed_context_first_turn_leaves_the_conversation_as_it_was(monkeypatch, family, fail, protocol):
    """Ctrl-C in a turn's answer, after its layout was placed (the last turn's slots cut off the cache, a sliding
    window's too): the conversation goes on as if the turn had not been asked. The first turn also forgets the
    context's end it set (no prefill), so the conversation goes on as a fresh one."""
    model = gemfilter.set_attention(BUILDERS[family](), "banded")
    method = get_method("gemfilter-span", layer=FILTER_LAYER[family], topk=24)
    clean = converse(model, method, protocol, "answers", max_holes=1.0)
    real = Layout.decode
    calls = {"n": 0}

    def interrupted(self, *args, **kwargs):
        calls["n"] += 1
        if calls["n"] == fail:
            raise KeyboardInterrupt
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Layout, "decode", interrupted)
    with gemfilter.Conversation(model, method, DotTokenizer(), protocol=protocol, max_holes=1.0) as chat:
        for t in range(TURNS):
            if t == fail - 1:
                with pytest.raises(KeyboardInterrupt):
                    chat.ask(question(t, 30 if t == 0 else 7), **greedy())
                if t == 0:
                    assert chat._boundary is None and chat.history is None
            chat.ask(question(t, 40 if t == 0 else 7), **greedy())
    for a, b in zip(clean.turns, chat.turns, strict=True):
        assert torch.equal(a.new_tokens, b.new_tokens) and a.kept == b.kept and a.recomputed == b.recomputed


@pytest.mark.parametrize("twice", [False, True])
@pytest.mark.parametrize("family", ["llama", "gemma3"])
def test_a_croppable_cache_cut_back_is_the_cache_of_the_shorter_prefix(family, twice):
    """stable-cf cuts the last turn's slots off its cache (gemfilter.compat.drop_last). Past a sliding window too:
    the next tokens' logits equal those on a cache that only ever held the shorter prefix. twice: two cuts with a
    write between them, the second deeper than the write (stable-late cuts an answer, writes a question, then cuts
    the whole conversation to open its free positions); transformers' own cut keeps only the window, so the second
    gave back fewer keys than the window holds (a shape error)."""
    from gemfilter.compat import cache_kwargs, croppable_cache, drop_last

    model = BUILDERS[family]()
    window = getattr(model.config, "sliding_window", None) or 0
    ids = question(7, max(60, 2 * window + 5))
    more, then = question(9, 2), question(8, 4)
    n = ids.shape[1] - 9 - (3 if twice else 0)
    with torch.no_grad():
        cut = croppable_cache(model.config)
        model(input_ids=ids, use_cache=True, **cache_kwargs(cut))
        if twice:
            drop_last(cut, 3)
            model(input_ids=more, use_cache=True, **cache_kwargs(cut))
            drop_last(cut, more.shape[1] + 9)
        else:
            drop_last(cut, 9)
        got = model(input_ids=then, use_cache=True, **cache_kwargs(cut)).logits
        short = croppable_cache(model.config)
        model(input_ids=ids[:, :n], use_cache=True, **cache_kwargs(short))
        want = model(input_ids=then, use_cache=True, **cache_kwargs(short)).logits
    assert cut.get_seq_length() == n + then.shape[1]
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


# ---------------------------------------------- stable-gap, stable-front: the conversation's slots stay
GAPS = ["stable-gap", "stable-front", "stable-late", "stable-late-runs"]


def layout_mask(model, layout):
    """Layout.attention_mask() for one forward over the layout's slots; for a model with sliding-window layers, a
    mask per layer type, the window counted in slots as the layout's cache counts it (slot j sees slot i only if
    j - i < W)."""
    mask = layout.attention_mask()
    window = getattr(model.config, "sliding_window", None)
    if not window or "sliding_attention" not in (getattr(model.config, "layer_types", None) or ()):
        return mask
    i = torch.arange(mask.shape[-1])
    far = (i[:, None] - i[None, :]) >= window
    return {"full_attention": mask, "sliding_attention": mask.masked_fill(far, torch.finfo(mask.dtype).min)}


def assert_one_forward(model, layout, history, turn, t):
    """Every answer token of ``turn`` (asked on ``history`` (1, L)) is the argmax that one forward over the gap
    layout's slots gives under Layout.attention_mask() (:func:`layout_mask`) at the layout's positions; the answer's
    slots follow the turn's last written slot."""
    answer = turn.new_tokens.tolist()
    tokens = torch.tensor(
        [[int(history[0, h]) if h < history.shape[1] else answer[h - history.shape[1]] for h in layout.ids]]
    )
    with torch.no_grad():
        logits = (
            model(input_ids=tokens, position_ids=torch.tensor([layout.pos]), attention_mask=layout_mask(model, layout))
            .logits[0]
            .float()
        )
    logits[:, model.generation_config.eos_token_id] = float("-inf")  # min_new_tokens = max_new_tokens
    for i, token in enumerate(answer):
        assert int(logits[layout.answer_from - 1 + i].argmax()) == token, (t, i)


@pytest.mark.parametrize("protocol", GAPS)
@pytest.mark.parametrize("family", ["llama", "gemma3"])
@pytest.mark.parametrize("name,topk", [("gemfilter", 12), ("gemfilter-span", 24), ("gemfilter-span-qmax", 24)])
@pytest.mark.parametrize("keep", ["answers", "questions", "context"])
def test_stable_gap_rebuilt_on_every_change_is_reselect(family, name, topk, keep, protocol):
    """max_holes=0: no free positions, and every turn that masks a slot or adds a context slot rebuilds; a turn
    that only appends conversation tokens extends reselect's prompt, so every answer is reselect's."""
    model = gemfilter.set_attention(BUILDERS[family](), "banded")
    method = get_method(name, layer=FILTER_LAYER[family], topk=topk)
    again = converse(model, method, "reselect", keep)
    where = {} if keep == "context" else {"context_tokens": 30}
    gap = converse(model, method, protocol, keep, max_holes=0.0, **where)
    for a, b in zip(again.turns, gap.turns, strict=True):
        assert torch.equal(a.new_tokens, b.new_tokens)
        assert torch.equal(a.selection.indices[0], b.selection.indices[0])
        assert b.kept == a.kept


@pytest.mark.parametrize("protocol", GAPS)
@pytest.mark.parametrize("family", ["llama", "gemma3"])
@pytest.mark.parametrize("keep", ["answers", "questions"])
def test_stable_gap_keeping_everything_runs_only_the_new_tokens(family, keep, protocol):
    """k >= n, max_holes=0: after turn 1 nothing is masked and no context is added, so a follow-up runs only the
    tokens the history gained (as ``full`` does) and answers as ``generate`` on the whole history."""
    model = gemfilter.set_attention(BUILDERS[family](), "banded")
    method = get_method("gemfilter", layer=FILTER_LAYER[family], topk=4096)
    chat = converse(model, method, protocol, keep, max_holes=0.0, context_tokens=30)
    history, before = None, 0
    for t, turn in enumerate(chat.turns):
        q = question(t, 40 if t == 0 else 7)
        history = q if history is None else torch.cat([history, q], dim=1)
        with torch.no_grad():
            out = model.generate(history, do_sample=False, **greedy())
        assert torch.equal(turn.new_tokens, out[0, history.shape[1] :]), t
        assert turn.rebuilt == (t == 0)
        assert turn.recomputed == history.shape[1] - before, t
        if keep == "answers":
            history = torch.cat([history, turn.new_tokens[None]], dim=1)
            before = history.shape[1] - 1  # the answer's last token was never fed
        else:
            before = history.shape[1]


@pytest.mark.parametrize("protocol", GAPS)
@pytest.mark.parametrize("keep", ["answers", "questions"])
@pytest.mark.parametrize("family", ["llama", "gemma3"])
def test_stable_gap_answers_are_one_forward_over_the_layout_under_its_mask(family, keep, protocol):
    """Never rebuilt for holes (max_holes=1): after each turn, every answer token is the argmax that one forward over
    the layout's slots gives under Layout.attention_mask() at the layout's positions. Context kept after turn 1 sits
    after the conversation's slots but at positions before them, and ran in the forward of the conversation's new
    tokens, blind to the conversation's slots. (gemfilter at k=12, k=16 and 20 on Gemma 3, keeps new context on these
    follow-ups; the span methods keep the first and last tokens here.) Gemma 3 runs under banded, whose sliding
    layers (window 8) hide the slots through a BandedMask; Llama under sdpa."""
    model = BUILDERS[family]()
    if family == "gemma3":
        model = gemfilter.set_attention(model, "banded")
    boundary, late, opened = 30, 0, 0
    for topk in (12,) if family == "llama" else (16, 20):
        method = get_method("gemfilter", layer=FILTER_LAYER[family], topk=topk)
        closed = False
        with gemfilter.Conversation(
            model, method, DotTokenizer(), protocol=protocol, keep=keep, max_holes=1.0, context_tokens=boundary
        ) as chat:
            for t, turn, history in asked(chat):
                layout = chat._layout
                talk = [s for s, h in enumerate(layout.ids) if boundary <= h < history.shape[1]]
                context = [s for s, h in enumerate(layout.ids) if h < boundary]
                # a context slot written after a conversation slot sits at a position before every conversation slot
                after = [s for s in context if talk and s > talk[0]]
                assert all(layout.pos[s] < min(layout.pos[c] for c in talk) for s in after)
                late += bool(after) and not turn.rebuilt
                opened += closed and not turn.rebuilt and not layout.closed  # stable-late* ran the conversation again
                closed = layout.closed
                assert sorted(h for h, v in zip(layout.ids, layout.valid) if v and h < history.shape[1]) == sorted(
                    turn.selection.indices[0].tolist()
                )
                assert_one_forward(model, layout, history, turn, t)
    if protocol.startswith("stable-late"):
        assert opened, "no follow-up opened the free positions: the test would not see them"
    else:
        assert late, "no turn added context after the conversation: the test would not see the gap"


@pytest.mark.parametrize("protocol", GAPS)
def test_stable_gap_rebuilds_by_its_rule(protocol):
    """The rebuild rule, replayed from the selections alone (keep="questions"): a turn rebuilds when the context's
    masked slots would pass max_holes of its slots, when its newly kept context tokens outgrow the free positions
    (as many as the context had slots when rebuilt), or when a newly kept conversation token precedes a held one.
    Under stable-late the free positions open on the first follow-up that keeps new context, which runs every kept
    conversation token again (gemfilter at k=12, k=8 with whole runs, opens them here; gemfilter-span's follow-ups
    keep no new context before a rebuild). Under stable-late-runs a newly kept token's run is written again whole:
    its held tokens are holes, and run."""
    model = BUILDERS["llama"]()
    name, topk = {"stable-late": ("gemfilter", 12), "stable-late-runs": ("gemfilter", 8)}.get(
        protocol, ("gemfilter-span", 24)
    )
    method = get_method(name, layer=2, topk=topk)
    boundary, max_holes = 30, 0.5
    chat = converse(model, method, protocol, "questions", max_holes=max_holes, context_tokens=boundary)
    seen, opened, moved = {}, 0, 0
    for t, turn in enumerate(chat.turns):
        want = turn.selection.indices[0].tolist()
        ctx = [h for h in want if h < boundary]
        talk_new = [h for h in want if h >= boundary and h not in seen.get("valid", set())]
        if t:
            fresh = [h for h in ctx if h not in seen["valid"]]
            drop = [h for h in seen["valid"] if h not in set(want)]
            if protocol == "stable-late-runs" and fresh:  # the runs that gain a token are written again whole
                runs = [[ctx[0]]] if ctx else []
                for h in ctx[1:]:
                    runs[-1].append(h) if h == runs[-1][-1] + 1 else runs.append([h])
                fresh = [h for run in runs if set(run) & set(fresh) for h in run]
                drop += [h for h in fresh if h in seen["valid"]]
            again = sum(h in seen["valid"] for h in fresh)  # held tokens written again with their run
            holes = seen["holes"] + sum(h < boundary for h in drop)
            said = [h for h in seen["valid"] if h >= boundary]
            expect = (
                not talk_new
                or holes > max_holes * (seen["slots"] + len(fresh))
                or len(fresh) > seen["free"]
                or bool(said and talk_new[0] < max(said))
            )
        else:
            expect = True
        assert turn.rebuilt == expect, t
        if expect:
            seen = {"slots": len(ctx), "holes": 0, "free": len(ctx), "closed": protocol.startswith("stable-late")}
            assert turn.recomputed == len(want)
        elif seen["closed"] and fresh:  # stable-late opens its free positions: the conversation runs again
            assert turn.recomputed == len(fresh) + sum(h >= boundary for h in want), t
            seen |= {"slots": seen["slots"] + len(fresh), "holes": holes, "free": seen["free"] - len(fresh)}
            seen["closed"], opened, moved = False, opened + 1, moved + again
        else:
            assert turn.recomputed == len(fresh) + len(talk_new)
            moved += again
            seen |= {"slots": seen["slots"] + len(fresh), "holes": holes, "free": seen["free"] - len(fresh)}
        seen["valid"] = set(want)
    assert any(not t.rebuilt for t in chat.turns[1:])
    assert opened or not protocol.startswith("stable-late"), "no follow-up opened the free positions: test misses it"
    assert moved or protocol != "stable-late-runs", "no held token was written again with its run: test misses it"


@pytest.mark.parametrize("protocol", ["stable-front", "stable-late", "stable-late-runs"])
@pytest.mark.parametrize("family", ["llama", "gemma3"])
@pytest.mark.parametrize("name,topk", [("gemfilter", 12), ("gemfilter-span", 24), ("gemfilter-span-qmax", 24)])
@pytest.mark.parametrize("keep", ["answers", "questions"])
def test_rebuilt_turns_of_stable_front_and_late_answer_as_reselect(family, name, topk, keep, protocol):
    """With free positions (max_holes=1), a rebuilt layout answers as reselect on the same history: the first turn,
    and under keep="questions" (where the history does not depend on earlier answers) every rebuilt turn.
    stable-front puts the context at c..2c-1 and the conversation from 2c on, reselect's prompt shifted by c
    positions (the same under rotary positions); stable-late lays out reselect's prompt itself."""
    model = gemfilter.set_attention(BUILDERS[family](), "banded")
    method = get_method(name, layer=FILTER_LAYER[family], topk=topk)
    again = converse(model, method, "reselect", keep)
    front = converse(model, method, protocol, keep, max_holes=1.0, context_tokens=30)
    rebuilt = [t for t, turn in enumerate(front.turns) if turn.rebuilt and (t == 0 or keep == "questions")]
    assert rebuilt[0] == 0
    for t in rebuilt:
        a, b = again.turns[t], front.turns[t]
        assert torch.equal(a.selection.indices[0], b.selection.indices[0]), t
        assert torch.equal(a.new_tokens, b.new_tokens), t


def split_runs(layout, boundary: int) -> int:
    """How many runs of the layout's valid context tokens (consecutive in the history) do not sit at consecutive
    positions, in order."""
    at = {h: layout.pos[s] for s, h in enumerate(layout.ids) if layout.valid[s] and h < boundary}
    kept = sorted(at)
    return sum(h == g + 1 and at[h] != at[g] + 1 for g, h in zip(kept, kept[1:]))


@pytest.mark.parametrize("family", ["llama", "gemma3"])
@pytest.mark.parametrize("keep", ["answers", "questions"])
def test_stable_late_runs_never_splits_a_kept_run(family, keep):
    """stable-late-runs (max_holes=1): after every turn, the kept context tokens that are consecutive in the history
    sit at consecutive positions, in order: a newly kept token brings the held tokens of its run along. stable-late
    on the same conversations splits runs (a newly kept token at a free position beside neighbours at their old
    ones), so the check can fail."""
    model = BUILDERS[family]()
    method = get_method("gemfilter", layer=FILTER_LAYER[family], topk=12 if family == "llama" else 20)
    split = {}
    for protocol in ("stable-late", "stable-late-runs"):
        split[protocol] = 0
        with gemfilter.Conversation(
            model, method, DotTokenizer(), protocol=protocol, keep=keep, max_holes=1.0, context_tokens=30
        ) as chat:
            for t, turn, history in asked(chat):
                split[protocol] += split_runs(chat._layout, 30)
    assert split["stable-late-runs"] == 0
    assert split["stable-late"] > 0, "stable-late split no run here: the test would not see a split"


def whole(kept: list, fresh: list) -> list:
    """Every index of the runs of ``kept`` (sorted; a run: consecutive indices) that hold a ``fresh`` one, sorted."""
    return sorted(h for h in kept if any(all(x in kept for x in range(min(h, f), max(h, f) + 1)) for f in fresh))


@pytest.mark.parametrize("protocol", GAPS)
@pytest.mark.parametrize("keep", ["answers", "questions"])
@pytest.mark.parametrize("family", ["llama", "gemma3"])
def test_a_capped_gap_follow_up_writes_what_the_cap_takes(family, keep, protocol):
    """max_fresh under the gap layouts (runs, max_holes=1): replayed from the selection and the context slots valid
    before it, a follow-up that is not rebuilt writes what the cap takes (``picked``) of the context tokens it newly
    keeps (under stable-late-runs each one's whole run of kept context, its held tokens counted, ranked by its newly
    kept tokens' best score), and its new conversation tokens; of the context slots the selection drops, as many
    stay valid as the cap left out newly kept tokens, the highest-scoring; the answer is still one forward over the
    layout under its mask. gemfilter at k=16 (and k=20 on Gemma 3), caps 1, 6 and 12: the cap binds, and some
    follow-up writes a run of more than one token."""
    model = BUILDERS[family]()
    if family == "gemma3":
        model = gemfilter.set_attention(model, "banded")
    boundary, bound, longer = 30, 0, 0
    for topk, cap in itertools.product((16,) if family == "llama" else (16, 20), (1, 6, 12)):
        method = get_method("gemfilter", layer=FILTER_LAYER[family], topk=topk)
        kw = dict(protocol=protocol, keep=keep, max_holes=1.0, max_fresh=cap, fresh_by="runs", context_tokens=boundary)
        with gemfilter.Conversation(model, method, DotTokenizer(), **kw) as chat:
            valid, said, closed = set(), set(), False
            for t, turn, history in asked(chat):
                want, scores, earlier, _ = replayed(turn, valid, boundary, cap, "runs")
                context = [h for h in want if h < boundary]
                if turn.rebuilt:
                    expect = set(context)
                else:
                    if protocol == "stable-late-runs":  # whole runs, ranked by their newly kept tokens
                        rank = [float("-inf") if h in valid else x for h, x in enumerate(scores)]
                        top = picked(whole(context, earlier), cap, "runs", rank)
                    else:
                        top = picked(earlier, cap, "runs", scores)
                    assert len(top) <= cap, t
                    left_out = len(set(earlier) - set(top))
                    bound += left_out > 0
                    longer += any(h + 1 in top for h in top)
                    dropped = sorted(valid - set(want), key=lambda h: (-scores[h], h))
                    expect = (valid & set(want)) | set(top) | set(dropped[:left_out])
                    if closed and top:  # stable-late opens its free positions: every kept conversation token runs
                        talk = [h for h in want if h >= boundary]
                    else:
                        talk = [h for h in want if h >= boundary and h not in said]
                    assert turn.recomputed == len(top) + len(talk), t
                layout = chat._layout
                valid = {h for h, v in zip(layout.ids, layout.valid) if v and h < boundary}
                assert valid == expect, t
                # the conversation's held slots; under keep="questions" the answer's are cut on the next turn
                said = {h for h, v in zip(layout.ids, layout.valid) if v and boundary <= h}
                said = said if keep == "answers" else {h for h in said if h < history.shape[1]}
                closed = layout.closed
                assert_one_forward(model, layout, history, turn, t)
    assert bound, "the cap never bound on a follow-up: the test would not see it"
    assert longer, "no follow-up wrote a run of two tokens or more: the test would not see runs"


def test_a_capped_whole_run_ranks_by_its_newly_kept_tokens():
    """stable-late-runs' cap, by hand: a held run (history 10-19, high scores) gains token 20 (low score), so it is
    written again whole, 11 tokens; a new run 40-44 (middle scores) is newly kept. With a cap of 12, ranked by the
    run's best score with held tokens counted the held run would take 11 and leave the new run out; ranked by the
    newly kept tokens, the new run is written and the held run stays where it is. The selection drops held token 5;
    the cap left out token 20, so 5's slot stays valid."""
    from gemfilter.stable import Cap

    layout = Layout.__new__(Layout)
    layout.ids = [5, *range(10, 20), 60]  # slot 0: token 5; slots 1-10: the held run; slot 11: a question token
    layout.valid, layout.pos = [True] * 12, list(range(12))
    held = {h: s for s, h in enumerate(layout.ids)}
    scores = [0.0] * 70
    scores[5], scores[20] = 0.3, 0.1
    for h in range(10, 20):
        scores[h] = 0.9
    for h in range(40, 45):
        scores[h] = 0.5
    want = [*range(10, 21), *range(40, 45), 60]
    limit = Cap(12, "runs", scores, asked_from=50, holes="capped")  # the context: 0-49
    write, mask, judged = layout._fresh_context(want, 50, held, whole=True, limit=limit)
    assert write == list(range(40, 45))
    assert mask == []  # token 5 stays for the left-out token 20; the held run is not written again
    assert judged == (write, mask)
    everything, moved, _ = layout._fresh_context(want, 50, held, whole=True, limit=None)
    assert everything == [*range(10, 21), *range(40, 45)] and moved == [0, *range(1, 11)]


@pytest.mark.parametrize("by, written", [("runs", [*range(10, 21)]), ("runs-new", [*range(40, 45)])])
def test_runs_new_ranks_a_new_run_before_one_that_extends_a_held_run(by, written):
    """stable-late-runs' cap, by hand: a held run (history 10-19) gains token 20 with the best score of the turn (the
    word after the last turn's needle, as on GF.Facts seed 3); a new run 40-44 scores less. With a cap of 12, ``runs``
    writes the held run again whole (11 tokens) and leaves the new run out; ``runs-new`` writes the new run and
    leaves the held run where it is (11 more would pass the cap)."""
    from gemfilter.stable import Cap

    layout = Layout.__new__(Layout)
    layout.ids = [*range(10, 20), 60]
    layout.valid, layout.pos = [True] * 11, list(range(11))
    held = {h: s for s, h in enumerate(layout.ids)}
    scores = [0.0] * 70
    scores[20] = 0.95
    for h in range(10, 20):
        scores[h] = 0.9
    for h in range(40, 45):
        scores[h] = 0.5
    want = [*range(10, 21), *range(40, 45), 60]
    write, mask, _ = layout._fresh_context(want, 50, held, True, Cap(12, by, scores, asked_from=50, holes="capped"))
    assert write == written
    assert mask == ([held[h] for h in range(10, 20)] if by == "runs" else [])


REOPENING = ["stable-gap", "stable-late", "stable-late-runs"]


@pytest.mark.parametrize("protocol", REOPENING)
@pytest.mark.parametrize("keep", ["answers", "questions"])
@pytest.mark.parametrize("family", ["llama", "gemma3"])
def test_a_reopened_follow_up_keeps_the_context_before_the_conversation(family, keep, protocol, monkeypatch):
    """outgrown="reopen" (max_holes=1, gemfilter at k=12, 20 and 24, which outgrow the free positions here): a follow-up
    that reopens keeps the context slots before the conversation's first slot (at least one valid), and runs, in one
    forward, the kept context those do not hold, in history order at the positions right after theirs, then every kept
    conversation token in history order, after as many free positions as the context holds valid slots; fewer tokens
    than the selection. After every turn the valid slots are the selection, every context slot sits at a position before
    every conversation slot, and each answer token is what one forward over the layout's slots gives under
    Layout.attention_mask() (:func:`assert_one_forward`). The same conversations under outgrown="rebuild" rebuild more
    turns, so the check sees turns that reopened."""
    from gemfilter.stable import Layout

    model = BUILDERS[family]()
    if family == "gemma3":
        model = gemfilter.set_attention(model, "banded")
    state, reopened = {}, 0
    real = Layout._reopen_gap

    def spy(self, history, first, *args):
        state["before"] = (first, self.pos[:first], [self.ids[s] for s in range(first) if self.valid[s]])
        return real(self, history, first, *args)

    monkeypatch.setattr(Layout, "_reopen_gap", spy)
    boundary, rebuilt = 30, {}
    for outgrown in ("rebuild", "reopen"):
        rebuilt[outgrown] = 0
        for topk in (12, 20, 24):
            method = get_method("gemfilter", layer=FILTER_LAYER[family], topk=topk)
            where = dict(keep=keep, max_holes=1.0, context_tokens=boundary, outgrown=outgrown)
            with gemfilter.Conversation(model, method, DotTokenizer(), protocol=protocol, **where) as chat:
                for t, turn, history in asked(chat):
                    layout, want = chat._layout, turn.selection.indices[0].tolist()
                    rebuilt[outgrown] += turn.rebuilt
                    assert sorted(h for h, v in zip(layout.ids, layout.valid) if v and h < history.shape[1]) == want
                    talk = [s for s, h in enumerate(layout.ids) if boundary <= h < history.shape[1]]
                    context = [s for s, h in enumerate(layout.ids) if h < boundary and layout.valid[s]]
                    if talk and context:
                        assert max(layout.pos[s] for s in context) < min(layout.pos[s] for s in talk), t
                    if "before" in state:  # this turn reopened
                        first, kept_pos, stay = state.pop("before")
                        reopened += 1
                        assert not turn.rebuilt and layout.pos[:first] == kept_pos
                        ran = layout.ids[first : layout.answer_from]
                        rest = [h for h in want if h < boundary and h not in stay]
                        spoken = [h for h in want if h >= boundary]
                        assert ran == rest + spoken, t
                        start = max(kept_pos) + 1
                        talk_start = start + len(rest) + len(stay) + len(rest)  # as many free as valid context slots
                        expect = list(range(start, start + len(rest))) + list(
                            range(talk_start, talk_start + len(spoken))
                        )
                        assert layout.pos[first : layout.answer_from] == expect, t
                        assert turn.recomputed == len(ran) < len(want), t
                    assert_one_forward(model, layout, history, turn, t)
    assert reopened, "no follow-up reopened: the test would not see it"
    assert rebuilt["reopen"] < rebuilt["rebuild"]
