"""The turn-stable layout: a follow-up turn that keeps the earlier turns' kept tokens where they are.

Paper setting: GemFilter (Shi et al. 2024, Algorithm 2) regenerates from the k tokens it keeps; under
:class:`gemfilter.Conversation`'s ``reselect`` protocol every turn selects again from the whole history and
regenerates all k from scratch, 7-10x the time to first token of ``full`` with prefix reuse on this project's CPU
(docs/scbench.md). Consecutive turns keep 60-80% of the same tokens, but share only a short common prefix, so
prefix reuse of the kept sequence buys little. The ``stable`` protocol reuses the overlap instead:

- a *layout*: a generation cache of slots, each a history token at a position id, valid or masked;
- each turn selects as ``reselect`` does (the same selector cache); tokens the layout holds and the selection
  keeps stay in their slots, with their cached keys and values; tokens it drops are masked out; tokens it newly
  keeps are appended after the last slot, in history order, at the positions after the last used one, and only
  they run through the model (with the turn's question among them);
- the layout is rebuilt in history order at positions 0..k-1 (exactly ``reselect``'s cache) on the first turn,
  when the masked slots would exceed ``max_holes`` of the layout, or when a turn keeps no new token.

A cap on what a follow-up newly keeps (``max_fresh``, ``stable`` and ``stable-cf``): the write's time grows with the
tokens it runs (docs/scbench.md, "Where a follow-up's time goes"), so a turn that is not rebuilt adds at most
``max_fresh`` of the earlier history's tokens it newly keeps, the highest-scoring by the selection's own scores
(``fresh_by``: whole runs of consecutive tokens, a span method's sentences, or single tokens), and all it keeps of
the turn's own tokens (its question). For each token the cap leaves out, one slot the selection drops stays valid,
the highest-scoring by the same scores, so the layout still holds k tokens. The left-out tokens may come in on a
later turn. A capped turn left with nothing to run is rebuilt, as ``stable`` rebuilds a turn that keeps nothing new.
The rebuild rule reads the capped turn's holes, or (``fresh_holes="selection"``) those the whole selection would
leave, as uncapped ``stable`` reads them, so that a turn whose selection moved far is rebuilt as there. A further
approximation of ``reselect``, measured (docs/scbench.md: on GF.Facts at layer 5 the mean follow-up came within 2x
``full``'s time, and turns a rebuilt layout answers were lost); with ``max_fresh`` at least k it is ``stable``. Under
``stable-cf`` the cap reads the context's newly kept tokens alone (the conversation's kept tokens run again every
turn, capped or not).

``stable-cf`` (context first) keeps the layout for the context's kept tokens alone. The kept tokens of the
conversation after the context (questions and answers) run again every turn, in history order, after the
context's slots; the next turn cuts them and the answer's slots off the cache (:meth:`Layout.place_context_first`).
So a token newly kept from the context sits after the older context slots but before the whole conversation, never
between a question and its answer. On GF.MultiKey's multi-turn follow-ups, that arrangement from scratch answered
right where ``stable``'s own order did not (``scripts/multikey_kept.py --stable-layout``, docs/scbench.md). Each
turn runs its newly kept context tokens and every kept token of the conversation, in one forward.

``stable-gap`` keeps ``stable-cf``'s order in positions without running the conversation again. A rebuilt layout
puts the context's c kept tokens at positions 0..c-1 and the conversation from 2c on, leaving c free positions
(none with ``max_holes=0``). A context token kept later takes the next free position, so the model reads it before
the whole conversation, while its slot is written after the conversation's slots, which it does not attend to;
the conversation's slots keep their keys and values, and a dropped answer's slots are cut
(:meth:`Layout.place_gap`). A follow-up runs only the tokens it newly keeps, as ``stable`` does, in one forward: the
new context first, blind to the conversation's slots (:class:`Blind`, through the attention wrapper), then the new
conversation tokens.

``stable-late`` is ``stable-gap`` whose rebuilt layout has no free positions: ``reselect``'s prompt, so a rebuilt turn
(the first) answers as ``reselect`` does (``stable-gap``'s free positions between the context and the question
changed GF.MultiKey's first answers, docs/scbench.md). The first follow-up that keeps new context opens c free
positions: the conversation's slots are cut, the new context takes positions c.., and every kept conversation token
runs again from 2c on, in one forward; later follow-ups run as ``stable-gap``'s.

``stable-late-runs`` is ``stable-late`` where a newly kept context token brings along the held tokens of its run (the
kept context tokens consecutive in the history with it): their slots are masked and the whole run is written again at
the free positions, in history order (:func:`whole_runs`). Under ``stable-gap`` and ``stable-late`` a kept needle
sentence can sit split, its older tokens at their old positions and a newly kept one at a free position after the
whole context; GF.MultiKey's wrong answers there began with the asked number's first digits (docs/scbench.md).

``stable-front`` puts ``stable-gap``'s free positions before the context instead: a rebuilt layout holds the
context at c..2c-1 and the conversation from 2c on, which is ``reselect``'s prompt shifted by c positions, so under
rotary positions a rebuilt turn (the first) answers as ``reselect`` does, up to rounding. A context token kept later
takes the free positions just below the lowest one in use: read before the whole context, and the context's slots it
attends to sit at later positions than its own.

``outgrown``: what a follow-up of ``stable-gap``, ``stable-late`` or ``stable-late-runs`` does when its new context
outgrows the free positions, or a conversation token it newly keeps precedes a held one. ``rebuild`` (the default)
runs every kept token again in ``reselect``'s order. ``reopen`` keeps the context slots before the conversation's first
slot with their keys and values, cuts every later slot off the cache, and runs the context those held, the new
context and the whole kept conversation, in history order, with free positions after the context again
(:meth:`Layout._reopen_gap`). Measured beside ``rebuild`` on GF.Facts and GF.MultiKey with ``stable-late-runs``
(docs/scbench.md): it replaced nearly every rebuild, ran fewer tokens, took no less of ``full``'s time, and lost
answers that rebuilding kept.

It is an approximation of ``reselect``: a kept slot's keys and values were computed when it was written, against
the slots valid then, and appended tokens sit after older ones whatever their place in the history. What it
computes is exactly stated: :meth:`Layout.attention_mask` gives the one mask under which a single forward over
every slot equals the layout's incremental cache (``tests/test_stable.py`` checks it), and with ``max_holes=0``
every turn that masks a slot is rebuilt and it equals ``reselect`` token for token. Accuracy against ``reselect``
is measured (docs/scbench.md).
"""

from __future__ import annotations

import copy
import math
from contextlib import ExitStack
from dataclasses import dataclass, replace

import torch

from .attention import STATE_KWARG, wrapped_attention
from .banded import BandedMask
from .compat import cache_kwargs, croppable_cache, drop_last, dynamic_cache

#: How :func:`capped` picks the earlier tokens a capped follow-up adds: ``runs`` (whole runs of consecutive newly
#: kept tokens, a span method's sentences) or ``tokens`` (single tokens); ``stable-late-runs`` also takes ``runs-new``
#: (``runs``, but a run that holds no held token ranks first, :meth:`Layout._fresh_context`).
FRESH_BY = ("runs", "tokens", "runs-new")
#: Which holes the rebuild rule reads on a capped follow-up (:class:`Cap`).
FRESH_HOLES = ("capped", "selection")
#: What a gap layout's follow-up does when its new context outgrows the free positions, or a conversation token it
#: newly keeps precedes a held one (:meth:`Layout.place_gap`): ``rebuild`` (every kept token runs again) or
#: ``reopen`` (:meth:`Layout._reopen_gap`: the context slots before the conversation's first stay).
OUTGROWN = ("rebuild", "reopen")
#: The protocols that can reopen: the gap layouts whose free positions lie after the context.
REOPENING = ("stable-gap", "stable-late", "stable-late-runs")


@dataclass(frozen=True)
class Cap:
    """``stable``'s cap on one follow-up (see the module docstring).

    size: at most this many of the earlier history's newly kept tokens join the layout; by: how they are picked
    (:data:`FRESH_BY`, :func:`capped`); scores: the selection's scores, a list of L floats; asked_from: the turn's
    first history index (the tokens from it on always join); holes: which masked slots the rebuild rule reads,
    ``capped`` (those the capped turn leaves) or ``selection`` (those the whole selection would leave, as uncapped
    ``stable`` reads them; the cap then shortens only a turn the rule lays out)."""

    size: int
    by: str
    scores: list
    asked_from: int
    holes: str = "capped"


def runs_of(indices: list) -> list:
    """Sorted history indices split into runs of consecutive ones (lists, in order)."""
    runs = []
    for h in indices:
        if runs and h == runs[-1][-1] + 1:
            runs[-1].append(h)
        else:
            runs.append([h])
    return runs


def capped(new: list, cap: Cap) -> list:
    """``new`` (sorted history indices) with at most ``cap.size`` of those below ``cap.asked_from``; every index
    from it on stays, in history order.

    ``cap.by``: ``tokens``: the highest ``scores``, ties to the earlier index. ``runs`` (and ``runs-new``, whose ranking
    :meth:`Layout._fresh_context` puts in ``scores``): the earlier indices split into runs of consecutive ones (a
    sentence a span method newly keeps is one), taken whole from the run with the highest score down (ties to the
    earlier run), each that still fits in what is left of the size; a run longer than it never joins. Single tokens cut
    a kept sentence into pieces the model cannot read (docs/scbench.md)."""
    scores, asked_from = cap.scores, cap.asked_from
    earlier = [h for h in new if h < asked_from]
    if len(earlier) <= cap.size:
        return new
    if cap.by == "tokens":
        top = sorted(earlier, key=lambda h: (-scores[h], h))[: cap.size]
    else:
        top, room = [], cap.size
        for run in sorted(runs_of(earlier), key=lambda r: (-max(scores[h] for h in r), r[0])):
            if len(run) <= room:
                top += run
                room -= len(run)
    chosen = set(top)
    return [h for h in new if h >= asked_from or h in chosen]


@dataclass(frozen=True)
class Blind:
    """Per-call attention state (:mod:`gemfilter.attention`): in one forward, the first ``rows`` new tokens do not
    see the earlier slots ``slots``, which the later ones see (``stable-gap``'s newly kept context, written before
    the conversation's new tokens). total: the slots after the forward; a layer that holds only the last keys (a
    sliding window) holds slots total - kv .. total - 1."""

    rows: int
    slots: tuple
    total: int

    def attention(self, module, query, key, value, attention_mask, kernel, **kwargs):
        implementation = module.config._attn_implementation
        if "flash" in implementation:  # flash kernels take no mask: the hidden slots would be seen
            raise ValueError(
                f"the gap layouts (stable-gap, stable-front, stable-late*) write with a mask that {implementation!r} "
                "does not take; load the model with attn='sdpa', 'eager' or 'banded'"
            )
        q, kv = query.shape[-2], key.shape[-2]
        first = self.total - kv
        keys = torch.tensor([s - first for s in self.slots if s >= first], dtype=torch.long, device=key.device)
        if len(keys):
            attention_mask = self._hide(attention_mask, q, kv, keys)
        return kernel(module, query, key, value, attention_mask, **kwargs)

    def _hide(self, mask, q: int, kv: int, keys: torch.Tensor):
        if isinstance(mask, BandedMask):
            return mask.without(self.rows, keys)
        if mask is None:  # transformers left out a mask that is causal alone
            mask = torch.ones(q, kv, dtype=torch.bool, device=keys.device).tril(kv - q)[None, None]
        hidden = torch.zeros(q, kv, dtype=torch.bool, device=mask.device)
        hidden[: self.rows, keys] = True
        mask = mask[..., :kv]
        if mask.dtype == torch.bool:
            return mask & ~hidden
        return mask.masked_fill(hidden, torch.finfo(mask.dtype).min)


def whole_runs(kept: list, fresh: set) -> tuple:
    """(every token of the runs of ``kept`` (sorted history indices) that hold a ``fresh`` one, in history order; those
    of them not in ``fresh``). A run: indices consecutive in the history (:func:`runs_of`)."""
    out = [h for run in runs_of(kept) if any(h in fresh for h in run) for h in run]
    return out, [h for h in out if h not in fresh]


class Layout:
    """A generation cache of slots (see the module docstring), on one row.

    ids: the history index each slot holds; valid: whether each slot is attended to now; pos: each slot's
    position id; writes: (first slot, end slot, the valid flags when they were written) of every forward that
    wrote slots, so that :meth:`attention_mask` can rebuild what each slot saw.
    """

    def __init__(self, model, croppable: bool = False):
        self.model, self.croppable = model, croppable  # croppable: stable-cf cuts the last turn's slots off
        self.reset()

    def copy(self) -> "Layout":
        twin = Layout.__new__(Layout)
        twin.model, twin.croppable, twin.cache = self.model, self.croppable, copy.deepcopy(self.cache)
        twin.ids, twin.valid, twin.pos, twin.writes = (
            list(self.ids),
            list(self.valid),
            list(self.pos),
            list(self.writes),
        )
        twin.context_slots, twin.talk_start, twin.answer_from = self.context_slots, self.talk_start, self.answer_from
        twin.closed = self.closed
        return twin

    @property
    def kept(self) -> int:
        return sum(self.valid)

    def snapshot(self) -> tuple:
        """What :meth:`restore` needs to undo a turn, held by reference (cache layers rebind their tensors)."""
        return (
            self.cache,
            list(self.cache.layers),
            [dict(vars(layer)) for layer in self.cache.layers],
            list(self.ids),
            list(self.valid),
            list(self.pos),
            list(self.writes),
            self.context_slots,
            self.talk_start,
            self.answer_from,
            self.closed,
        )

    def restore(self, snap: tuple) -> None:
        self.cache, layers, states, self.ids, self.valid, self.pos, self.writes = snap[:7]
        self.context_slots, self.talk_start, self.answer_from, self.closed = snap[7:]
        self.cache.layers[:] = layers
        for layer, state in zip(layers, states):
            vars(layer).clear()
            vars(layer).update(state)

    def place(self, history: torch.Tensor, want: list, max_holes: float, limit: Cap | None = None) -> tuple:
        """Lay out the selection ``want`` (sorted history indices of ``history`` (1, L)) and run the slots it adds.

        limit: a :class:`Cap`, or None: a turn that is not rebuilt adds at most ``limit.size`` of the tokens it
        newly keeps from the earlier history, as :func:`capped` picks them, and every one it keeps from
        ``limit.asked_from`` on. As many slots ``want`` drops stay valid as tokens the cap leaves out, the
        highest-scoring (ties to the earlier token).

        Returns (the last slot's logits (1, V) in float32, whether the layout was rebuilt, slots written)."""
        new, start, rebuild = self._lay(want, max_holes, limit=limit)
        return self.write(history[:, new], new, list(range(start, start + len(new)))), rebuild, len(new)

    def place_context_first(
        self, history: torch.Tensor, want: list, boundary: int, max_holes: float, limit: Cap | None = None
    ) -> tuple:
        """``stable-cf``: lay out ``want``'s context part (history indices below ``boundary``) as :meth:`place` does,
        after removing the last turn's conversation and answer slots, then append its conversation part in history
        order at the next positions; one forward runs the newly kept context and the whole conversation.

        limit: :meth:`place`'s cap, on the newly kept context tokens (``limit.asked_from`` at ``boundary`` or later:
        every one of them is the earlier history's); the conversation part always runs whole. The dropped context
        slots that stay make up for the left-out tokens only as far as the selection drops context slots, so the
        kept context can shrink (the selection's context part changes size from turn to turn).

        The layout is rebuilt (the context in history order at 0..c-1, then the conversation: ``reselect``'s
        prompt) on the first turn, when the context's masked slots would pass ``max_holes`` of its slots, when
        ``max_holes`` is 0 and the context gains a slot, or when nothing would run. Returns as :meth:`place`."""
        talk = [h for h in want if h >= boundary]
        if self.context_slots < len(self.ids):  # the last turn's conversation and answer slots go
            drop_last(self.cache, len(self.ids) - self.context_slots)
            self._keep_first(self.context_slots)
        new, start, rebuild = self._lay([h for h in want if h < boundary], max_holes, talk, limit=limit)
        run = new + talk
        logits = self.write(history[:, run], run, list(range(start, start + len(run))))
        self.context_slots = len(self.ids) - len(talk)
        return logits, rebuild, len(run)

    def place_gap(
        self,
        history: torch.Tensor,
        want: list,
        boundary: int,
        max_holes: float,
        cut_answer: bool,
        front: bool = False,
        late: bool = False,
        whole: bool = False,
        limit: Cap | None = None,
        reopen: bool = False,
    ) -> tuple:
        """``stable-gap``: the context's kept tokens as :meth:`place_context_first` lays them, but the conversation's
        slots stay too. A rebuilt layout puts the context at positions 0..c-1 and the conversation from c + gap on
        (gap: c, or 0 when ``max_holes`` is 0), so a context token kept later takes a free position before the
        conversation while its slot is written after it; it runs with the conversation's slots hidden, as it
        would in history order, in one forward with the newly kept conversation tokens after it (:class:`Blind`).

        cut_answer: the last turn's answer slots are cut first (the answer left the history). The layout is
        rebuilt on the first turn, when the context's masked slots would pass ``max_holes`` of its slots, when
        ``max_holes`` is 0 and a slot is masked or the context gains one, when the context's new tokens would not
        fit in the free positions, when a newly kept conversation token precedes a held one, or when no
        conversation token is new. Returns as :meth:`place`.

        front: ``stable-front``: the free positions lie before the context instead (the context at c..2c-1, the
        conversation from 2c on, positions 0..c-1 free), so a rebuilt layout has ``reselect``'s relative
        positions, and a context token kept later takes the free positions just below the lowest one in use.

        late: ``stable-late``: a rebuilt layout has no free positions (``reselect``'s prompt, as ``stable-cf``
        rebuilds it); the first follow-up that keeps new context opens them: the conversation's slots are cut, the
        new context takes positions c.., and every kept conversation token runs again from 2c on (c: the context's
        slots), one forward. Later follow-ups run as ``stable-gap``'s.

        whole: ``stable-late-runs``: a newly kept context token brings along the held tokens of its run (the kept
        context tokens consecutive in the history with it): their slots are masked and the whole run is written
        again, in history order at the free positions, so that a kept sentence or number never sits split between
        its old positions and new ones.

        limit: a :class:`Cap` on the context a follow-up newly keeps (:meth:`_fresh_context`; ``limit.asked_from`` at
        ``boundary``), or None.

        reopen: a follow-up whose new context outgrows the free positions, or whose newly kept conversation token
        precedes a held one, is not rebuilt but reopened (:meth:`_reopen_gap`; not with ``front``), where a context
        slot before the conversation's first stays valid (where none does, a reopen would run every kept token)."""
        # the cache is cut once below: a sliding-window layer past its window keeps no more than one cut can undo
        cut = len(self.ids) - self.answer_from if cut_answer and self.answer_from < len(self.ids) else 0
        self._keep_first(len(self.ids) - cut)
        held = {h: s for s, h in enumerate(self.ids) if self.valid[s]}
        talk = [h for h in want if h >= boundary and h not in held]
        fresh, drop, (judged_fresh, judged_drop) = self._fresh_context(want, boundary, held, whole, limit)
        context = [s for s, h in enumerate(self.ids) if h < boundary]
        holes = sum(not self.valid[s] for s in context) + sum(self.ids[s] < boundary for s in judged_drop)
        said = [h for h in held if h >= boundary]
        opening = self.closed and bool(fresh)  # stable-late: the free positions open on this turn
        if front:
            free = min((self.pos[s] for s in context), default=0)
        else:
            free = len(context) if opening else self.talk_start - (max((self.pos[s] for s in context), default=-1) + 1)
        outgrown = len(fresh) > free or bool(said and talk and talk[0] < max(said))
        first = next((s for s, h in enumerate(self.ids) if h >= boundary), len(self.ids))  # the conversation's first
        masked = set(drop)
        reopens = reopen and not front and outgrown and any(self.valid[s] and s not in masked for s in range(first))
        if (
            not self.ids
            or not talk
            or (not max_holes and (fresh or drop))
            or holes > max_holes * (len(context) + len(judged_fresh))
            or (outgrown and not reopens)
        ):
            return self._rebuild_gap(history, want, boundary, max_holes, front=front, late=late)
        for s in drop:
            self.valid[s] = False
        if reopens:
            return self._reopen_gap(history, first, want, boundary, fresh, cut, max_holes)
        if opening:
            return self._open_gap(history, fresh + [h for h in want if h >= boundary], len(fresh), len(context), cut)
        drop_last(self.cache, cut)
        return self._extend_gap(history, fresh, talk, free - len(fresh) if front else self.talk_start - free, boundary)

    def _extend_gap(self, history: torch.Tensor, fresh: list, talk: list, start: int, boundary: int) -> tuple:
        """:meth:`place_gap`'s follow-up that is neither rebuilt, reopened nor opening: the newly kept context
        (history indices ``fresh``) at the free positions from ``start``, blind to the conversation's slots, then
        the new conversation tokens ``talk`` after the last position in use, one forward. Returns as :meth:`place`."""
        spoken = [s for s, h in enumerate(self.ids) if h >= boundary]
        at = max(max(self.pos) + 1, self.talk_start)
        positions = list(range(start, start + len(fresh))) + list(range(at, at + len(talk)))
        logits = self.write(history[:, fresh + talk], fresh + talk, positions, blind=(len(fresh), spoken))
        self.answer_from = len(self.ids)
        return logits, False, len(fresh) + len(talk)

    def _fresh_context(self, want: list, boundary: int, held: dict, whole: bool, limit: Cap | None) -> tuple:
        """:meth:`place_gap`'s newly kept context: (the context tokens the follow-up writes, in history order; the
        held slots it masks; (those two as the rebuild rule reads them)). held: history index -> slot, the valid
        ones.

        Under ``whole`` a newly kept token's run comes whole (:func:`whole_runs`): its held tokens are written again and
        their slots masked. Under ``limit`` at most ``limit.size`` tokens are written, as :func:`capped` picks them
        (under ``whole``, whole runs, each counted with its held tokens and ranked by its newly kept tokens' best score:
        on GF.Facts the run of the last turn's fact, held and gaining a token, outranked the new fact's run and spent
        the cap; under ``limit.by == "runs-new"`` every run that holds no held token, a sentence the turn keeps anew,
        ranks before those that extend a held run: on GF.Facts seed 3 the last turn's passphrase run, gaining the
        high-scoring word after it, still outranked the asked sentence); a run the cap leaves out stays where it is, and
        for each newly kept token it leaves out one context slot the selection drops stays valid, the highest-scoring
        (ties to the earlier token), as far as there are any. The rebuild rule reads the capped turn, or under
        ``limit.holes == "selection"`` the whole selection."""
        wanted = set(want)
        kept = [h for h in want if h < boundary]
        fresh = [h for h in kept if h not in held]
        dropped = [s for h, s in held.items() if h not in wanted]
        if whole and fresh:
            fresh, moved = whole_runs(kept, set(fresh))
        else:
            moved = []
        drop = dropped + [held[h] for h in moved]
        if limit is None or not fresh:
            return fresh, drop, (fresh, drop)
        if whole:  # a run ranks by its newly kept tokens: a held run that gains a token is not what the turn asks
            rank = [float("-inf") if h in held else score for h, score in enumerate(limit.scores)]
            if limit.by == "runs-new":  # a run holding a held token ranks after every run that holds none
                finite = [x for x in limit.scores if math.isfinite(x)] or [0.0]
                below = min(finite) - max(finite) - 1.0
                for h in (h for run in runs_of(fresh) if any(x in held for x in run) for h in run if h not in held):
                    rank[h] += below
            write = capped(fresh, replace(limit, scores=rank))
        else:
            write = capped(fresh, limit)
        taken = set(write)
        left_out = sum(h not in held and h not in taken for h in fresh)
        spare = sorted(
            (s for s in dropped if self.ids[s] < boundary), key=lambda s: (-limit.scores[self.ids[s]], self.ids[s])
        )
        stay = set(spare[:left_out])
        mask = [s for s in dropped if s not in stay] + [held[h] for h in write if h in held]
        return write, mask, ((fresh, drop) if limit.holes == "selection" else (write, mask))

    def _open_gap(self, history: torch.Tensor, run: list, fresh: int, c: int, cut: int) -> tuple:
        """``stable-late``'s first follow-up with new context: a rebuilt layout's c context slots come first, so the
        conversation's slots go (with the ``cut`` answer slots the bookkeeping dropped, still in the cache); ``run``
        (its first ``fresh`` tokens the new context, then every kept conversation token) is written at positions
        c.. and 2c.., one forward. Returns as :meth:`place`."""
        drop_last(self.cache, cut + len(self.ids) - c)
        self._keep_first(c)
        self.closed = False
        self.talk_start = 2 * c
        positions = list(range(c, c + fresh)) + list(range(self.talk_start, self.talk_start + len(run) - fresh))
        logits = self.write(history[:, run], run, positions)
        self.answer_from = len(self.ids)
        return logits, False, len(run)

    def _reopen_gap(
        self, history: torch.Tensor, first: int, want: list, boundary: int, fresh: list, cut: int, max_holes: float
    ) -> tuple:
        """:meth:`place_gap`'s reopened follow-up (``reopen``), where the layout would otherwise be rebuilt: the context
        slots before the conversation's first slot (``first``) stay (with their keys, values and positions, the dropped
        ones masked); every slot from it on is cut off the cache (the conversation's, and the context slots written
        after it); the context those held and the turn keeps, with what it newly writes (``fresh``), is written in
        history order at the positions after the staying slots, and every kept conversation token after as many free
        positions as the context now holds valid slots (an opening, :meth:`_open_gap`, leaves c in all; none with
        ``max_holes`` 0, where only a conversation out of order reopens, and the layout is ``reselect``'s). One forward,
        in which the context is read before the conversation, as in the history; it runs the context kept after the
        conversation's first slot, the new context and the whole conversation, not the staying slots. ``cut``: answer
        slots the bookkeeping dropped, still in the cache. Returns as :meth:`place`."""
        stay = sum(self.valid[:first])
        # the context the cut slots hold and the turn keeps (a cap's spared slots too), and what it newly writes
        rest = sorted({h for s, h in enumerate(self.ids[first:], first) if self.valid[s] and h < boundary} | set(fresh))
        talk = [h for h in want if h >= boundary]
        drop_last(self.cache, cut + len(self.ids) - first)
        self._keep_first(first)
        free = stay + len(rest) if max_holes else 0
        self.closed = self.closed and not free
        start = max(self.pos, default=-1) + 1
        self.talk_start = start + len(rest) + free
        run = rest + talk
        positions = list(range(start, start + len(rest))) + list(range(self.talk_start, self.talk_start + len(talk)))
        logits = self.write(history[:, run], run, positions)
        self.answer_from = len(self.ids)
        return logits, False, len(run)

    def _rebuild_gap(
        self, history: torch.Tensor, want: list, boundary: int, max_holes: float, front: bool, late: bool
    ) -> tuple:
        """:meth:`place_gap`'s rebuilt layout: the context's c kept tokens, then c free positions (after the context,
        or before it under ``front``; none with ``max_holes`` 0, or under ``late`` until a follow-up opens them),
        then the conversation's."""
        self.reset()
        head = [h for h in want if h < boundary]
        free = len(head) if max_holes and not late else 0
        self.talk_start = len(head) + free
        self.closed = late and bool(max_holes)
        tail = list(range(self.talk_start, self.talk_start + len(want) - len(head)))
        lead = free if front else 0
        logits = self.write(history[:, want], list(want), list(range(lead, lead + len(head))) + tail)
        self.answer_from = len(self.ids)
        return logits, True, len(want)

    def _lay(self, want: list, max_holes: float, talk: list | None = None, limit: Cap | None = None) -> tuple:
        """Mask the slots ``want`` drops, or rebuild: (the history indices to write, their first position, whether
        rebuilt). talk: ``stable-cf``'s conversation part, written after ``want``'s (None under ``stable``, where a
        turn that keeps no new token rebuilds); limit: :meth:`place`'s cap on the newly kept earlier tokens."""
        held = {h: s for s, h in enumerate(self.ids) if self.valid[s]}
        wanted = set(want)
        new = [h for h in want if h not in held]  # what the selection adds and drops
        drop = [s for h, s in held.items() if h not in wanted]
        add, mask = new, drop  # what the turn lays out: the same, unless capped
        if limit is not None and self.ids:  # a rebuild (the first turn's too) lays out the whole selection
            add = capped(new, limit)
            by_score = sorted(drop, key=lambda s: (-limit.scores[self.ids[s]], self.ids[s]))
            mask = by_score[len(new) - len(add) :]  # the best of the dropped slots stay (as far as there are any)
        # the rebuild rule reads the turn as it is laid out, or under fresh_holes="selection" the whole selection
        judged_new, judged_drop = (new, drop) if limit is not None and limit.holes == "selection" else (add, mask)
        holes = self.valid.count(False) + len(judged_drop)
        if talk is None:
            forced = not add
        else:
            forced = (not add and not talk) or bool(add and not max_holes)
        if forced or not self.ids or holes > max_holes * (len(self.ids) + len(judged_new)):
            self.reset()
            return list(want), 0, True
        for s in mask:
            self.valid[s] = False
        return add, max(self.pos) + 1, False

    def reset(self) -> None:
        self.cache = (croppable_cache if self.croppable else dynamic_cache)(self.model.config)
        self.ids, self.valid, self.pos, self.writes = [], [], [], []
        self.context_slots = 0
        self.talk_start = self.answer_from = 0  # stable-gap: the conversation's first position; the answer's slot
        self.closed = False  # stable-late: a rebuilt layout whose free positions are not open yet

    def _keep_first(self, n: int) -> None:
        """The bookkeeping of the first ``n`` slots alone (the cache is cut apart)."""
        self.ids, self.valid, self.pos = self.ids[:n], self.valid[:n], self.pos[:n]
        self.writes = [(first, min(end, n), valid) for first, end, valid in self.writes if first < n]

    def write(self, tokens: torch.Tensor, ids: list, positions: list, blind: tuple = (0, ())) -> torch.Tensor:
        """Append ``tokens`` (1, m) as valid slots holding history indices ``ids`` at ``positions``; run them
        against the valid slots; return the last one's logits (1, V) in float32 (the LM head runs on that row alone:
        its 262K-row matmul on Gemma 3 270M can be a large share of a short write).

        blind: (rows, slots): the first ``rows`` of the new tokens do not see the earlier ``slots`` (valid ones),
        which the rest see: two writes in one forward (:class:`Blind`)."""
        rows, unseen = blind
        unseen = [s for s in unseen if self.valid[s]] if rows else []
        first = len(self.ids)
        if unseen:  # what each part saw, as two writes would record it
            hidden = list(self.valid)
            for s in unseen:
                hidden[s] = False
            self.writes.append((first, first + rows, hidden))
            self.writes.append((first + rows, first + len(ids), list(self.valid) + [True] * rows))
        else:
            self.writes.append((first, first + len(ids), list(self.valid)))
        self.ids += ids
        self.valid += [True] * len(ids)
        self.pos += positions
        device = tokens.device
        mask = None if all(self.valid) else torch.tensor([self.valid], dtype=torch.long, device=device)
        run = dict(
            input_ids=tokens,
            position_ids=torch.tensor([positions], device=device),
            use_cache=True,
            attention_mask=mask,
            **cache_kwargs(self.cache),
        )
        with ExitStack() as stack, torch.no_grad():
            if unseen:  # the attention wrapper hides the slots from the first rows, layer by layer
                stack.enter_context(wrapped_attention(self.model))
                run[STATE_KWARG] = Blind(rows, tuple(unseen), len(self.ids))
            out = self.model(**run, logits_to_keep=1)
        return out.logits[:, -1, :].float()

    def decode(self, first_logits, settings: dict, history_len: int, streamer=None) -> torch.Tensor:
        """Greedy tokens (1, t) from ``first_logits``, each written as a slot (history index ``history_len`` + i),
        as ``generate``'s greedy search picks them (EOS suppressed before ``min_new_tokens``; stops at EOS)."""
        eos = settings["eos"]
        logits, out = first_logits, []
        for i in range(settings["max_new_tokens"]):
            if i < settings["min_new_tokens"] and eos:
                logits = logits.clone()
                logits[:, sorted(eos)] = float("-inf")
            token = logits.argmax(-1)
            out.append(token)
            if streamer is not None:
                streamer.put(token.cpu())
            if int(token) in eos or i == settings["max_new_tokens"] - 1:
                break
            logits = self.write(token[:, None], [history_len + i], [max(self.pos) + 1])
        if streamer is not None:
            streamer.end()
        return torch.stack(out, dim=1)

    def attention_mask(self, dtype=torch.float32) -> torch.Tensor:
        """(1, 1, S, S) additive mask under which one forward over every slot (at ``pos``) computes what the
        incremental cache holds: slot j attends slot i iff i <= j and i was valid when j was written."""
        n = len(self.ids)
        allowed = torch.zeros(n, n, dtype=torch.bool)
        for first, end, valid in self.writes:
            seen = torch.tensor(valid + [True] * (end - first), dtype=torch.bool)
            for j in range(first, end):
                allowed[j, : j + 1] = seen[: j + 1]
        mask = torch.zeros(n, n, dtype=dtype).masked_fill(~allowed, torch.finfo(dtype).min)
        return mask[None, None]
