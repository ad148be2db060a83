"""Many questions over one long context: a conversation whose every turn runs a method.

SCBench (Li et al. 2024, arXiv 2412.10319) measures methods over turns that share a context, in two
modes: follow-up questions in one conversation, and independent questions over one context. Three
named protocols say what a turn keeps of the earlier ones:

- ``reselect`` (prompt methods: gemfilter, gemfilter-span, gemfilter-orig-pos): the conversation keeps a
  KV cache of layers 0..r over the whole history (r + 1 of m layers). Each turn runs only its new tokens
  through layers 0..r, selects top-k from the whole history by the new last row, and generates from the
  kept tokens with a fresh cache. The context is never lost; turn t equals a from-scratch run of the
  method on the concatenated history.
- ``reuse``: the first turn's compressed cache goes on, as a KV-cache method runs in an engine (SCBench's
  setting for cache methods); every later turn feeds only its new tokens (see :func:`gemfilter.apply`).
- ``full``: no method; the whole cache is kept and extended (prefix reuse).
- ``stable`` (prompt methods; greedy): selects as ``reselect`` does, but keeps last turn's kept tokens in their
  slots of the generation cache, masks the ones this turn drops and runs only the ones it newly keeps
  (:mod:`gemfilter.stable`); an approximation of ``reselect``, rebuilt exactly when its holes pass ``max_holes``.
  ``max_fresh`` caps how many earlier tokens a follow-up newly keeps (the highest-scoring), a further approximation
  (every layout: under the context-first ones it caps the newly kept context tokens).
- ``stable-cf`` (context first; prompt methods; greedy): ``stable`` for the kept tokens of the context alone; the
  kept tokens of the conversation after it (questions and answers) run again each turn after the context's
  slots, in history order, so newly kept context never sits between a question and its answer.
- ``stable-gap`` (prompt methods; greedy): ``stable-cf``'s order in positions, with the conversation's slots kept:
  the conversation starts a gap of free positions after the context, a newly kept context token takes one of
  them (its slot written after the conversation, with the conversation masked), and a turn runs only its newly
  kept tokens (:meth:`gemfilter.stable.Layout.place_gap`).
- ``stable-front`` (prompt methods; greedy): ``stable-gap`` with its free positions before the context instead of
  after it, so a rebuilt layout (the first turn's) has ``reselect``'s relative positions.
- ``stable-late`` (prompt methods; greedy): ``stable-gap`` whose rebuilt layout has no free positions (``reselect``'s
  prompt, so the first turn answers as ``reselect``); the first follow-up that keeps new context opens them, running
  the kept conversation again after them once.
- ``stable-late-runs`` (prompt methods; greedy): ``stable-late`` where a newly kept context token brings along the held
  tokens of its run (consecutive in the history), written again whole at the free positions.
- ``outgrown="reopen"`` (``stable-gap``, ``stable-late*``): a follow-up that would be rebuilt because its new context
  outgrew the free positions, or its conversation came out of order, keeps the context slots before the
  conversation's first and runs the rest again (:meth:`gemfilter.stable.Layout.place_gap`).

What stays in the history after a turn (``keep``): ``answers`` (question and answer, as a chat), ``questions``
(the answer is dropped, from the cache too: SCBench's multi-turn mode, whose next question starts with the
gold answer), or ``context`` (nothing: every question is asked over the history as it was, SCBench's
multi-request mode; :meth:`Conversation.prefill` adds the context first). A dropped answer is generated on
a copy of the cache (``Applied.fork`` under ``reuse``), so the history's cache is never recomputed.

Each turn reports its time to first token, the tokens its answer was generated from, and peak memory.

A turn that fails (a refused ``generate`` keyword, Ctrl-C, an out-of-memory error) leaves the conversation exactly
as it was before it: the history, the turns, every cache and the method's per-cache state (:class:`_Checkpoint`).
"""

from __future__ import annotations

import copy
import time
from contextlib import ExitStack
from dataclasses import dataclass

import torch

from .apply import apply, resolve
from .compat import cache_kwargs, dynamic_cache, unwindowed_cache
from .layers import default_layer
from .measure import FirstTokenClock, PeakMemory
from .methods.spec import Method, PromptMethod
from .selection import QueryTail, Selection, check_causal_decoder, select_cached, sliding_window_of
from .stable import FRESH_BY, FRESH_HOLES, OUTGROWN, REOPENING, Cap, Layout

#: the protocols that answer on a :class:`gemfilter.stable.Layout`
LAYOUTS = ("stable", "stable-cf", "stable-gap", "stable-front", "stable-late", "stable-late-runs")
PROTOCOLS = ("reselect", "reuse", "full", *LAYOUTS)
#: the protocols that select from the whole history every turn, with the selector's cache of layers 0..r
SELECTING = ("reselect", *LAYOUTS)
#: the layouts that know where the context ends (``context_tokens``)
CONTEXT_FIRST = ("stable-cf", "stable-gap", "stable-front", "stable-late", "stable-late-runs")
#: the layouts whose follow-ups ``max_fresh`` can cap
CAPPED = LAYOUTS
#: The layouts' rebuild share: a layout whose masked slots pass half of its slots is rebuilt in history order.
MAX_HOLES = 0.5
KEEPS = ("answers", "questions", "context")


@dataclass
class Turn:
    """One answered question. new_tokens: (t,) generated ids; kept: tokens the answer was generated from
    (reselect: the kept history, reuse: the compressed cache's prompt rows, full: the whole history);
    history_tokens: the history's length with this question; ttft_s: seconds to the first new token,
    selection included; total_s: the whole turn; peak_mib: peak memory over the turn beyond what was held
    before it (CPU: resident set, read from Linux's /proc; None elsewhere. CUDA: allocated); recomputed: tokens
    the turn ran through the whole model before its first new token (full and reuse: the new tokens; reselect:
    the kept ones; stable: the ones it newly keeps); rebuilt: stable only, whether the layout was rebuilt;
    select_s: reselect and the layouts, the seconds of ``ttft_s`` the selection took (the selector's layers 0..r
    over the tokens its cache had not seen, and the method's scoring); None for full and reuse."""

    new_tokens: torch.Tensor
    text: str | None
    kept: int
    history_tokens: int
    ttft_s: float
    total_s: float
    peak_mib: float | None
    selection: Selection | None
    recomputed: int | None = None
    rebuilt: bool | None = None
    select_s: float | None = None


@dataclass(frozen=True, eq=False)
class Preselected(PromptMethod):
    """A prompt method run on a selection made beforehand (by :class:`Conversation`'s reselect protocol)."""

    method: object
    selection: Selection

    @property
    def name(self) -> str:
        return self.method.name

    def begin(self, model, input_ids, valid, tokenizer=None):
        return self.method.start(model, self.selection, valid)


def check_max_holes(max_holes, name: str = "max_holes") -> None:
    """Raise ValueError unless ``max_holes`` is a share in [0, 1]; ``name`` is how the caller spells it."""
    if isinstance(max_holes, bool) or not isinstance(max_holes, (int, float)) or not 0 <= max_holes <= 1:
        raise ValueError(
            f"{name} must be a share in [0, 1] (0: rebuild whenever a slot is masked, which answers as reselect), "
            f"got {max_holes!r}"
        )


def check_whole_runs_cap(max_fresh, fresh_by: str, protocols, name: str = "fresh_by") -> None:
    """Raise ValueError if ``stable-late-runs`` is among ``protocols`` with a cap (``max_fresh``) that picks single
    tokens: it writes a newly kept token's run whole, so its cap takes whole runs; or if ``runs-new`` is asked with
    a capped layout that writes no held token again (every other one in :data:`CAPPED`), where it would pick as
    ``runs``. ``name`` is how the caller spells ``fresh_by``."""
    if max_fresh is None:
        return
    if "stable-late-runs" in protocols and fresh_by == "tokens":
        raise ValueError(
            f"{name} {fresh_by}: stable-late-runs writes a newly kept token's run whole, so its cap takes whole runs "
            f"({name} runs or runs-new)"
        )
    others = [p for p in protocols if p in CAPPED and p != "stable-late-runs"]
    if fresh_by == "runs-new" and others:
        raise ValueError(
            f"{name} runs-new ranks the runs that extend a held one last, and only stable-late-runs writes those; "
            f"{', '.join(others)} would pick as {name} runs (use runs, or run stable-late-runs alone)"
        )


def check_outgrown(outgrown: str, protocols, name: str = "outgrown") -> None:
    """Raise ValueError unless ``outgrown`` is in :data:`gemfilter.stable.OUTGROWN`, and ``reopen`` comes only with
    protocols that can reopen (:data:`gemfilter.stable.REOPENING`). ``name`` is how the caller spells it."""
    if outgrown not in OUTGROWN:
        raise ValueError(f"unknown {name} {outgrown!r}; allowed: {', '.join(OUTGROWN)}")
    others = [p for p in protocols if p not in REOPENING]
    if outgrown == "reopen" and others:
        raise ValueError(
            f"{name} reopen keeps the context slots before the conversation's first and runs the rest again, which "
            f"only {', '.join(REOPENING)} lay out; got {', '.join(others)} ({name} rebuild runs every protocol)"
        )


def check_max_fresh(max_fresh, protocol: str, name: str = "max_fresh") -> None:
    """Raise ValueError unless ``max_fresh`` is None, or a whole number >= 1 under a protocol in :data:`CAPPED`."""
    if max_fresh is None:
        return
    if isinstance(max_fresh, bool) or not isinstance(max_fresh, int) or max_fresh < 1:
        raise ValueError(
            f"{name} is a whole number >= 1 (how many earlier tokens a follow-up may newly keep), or None for no cap; "
            f"got {max_fresh!r}"
        )
    if protocol not in CAPPED:
        raise ValueError(
            f"{name} caps the follow-ups of protocols {', '.join(CAPPED[:-1])} and {CAPPED[-1]}; protocol {protocol!r} "
            "has no such cap"
        )


class Conversation:
    """A conversation over one long context, one method, one protocol; use it as a context manager.

    Parameters: model: a transformers causal LM (batch of one conversation); method: a method object (e.g.
    ``GemFilter(topk=1024)``; None for ``full``); tokenizer: to encode text questions and decode answers; protocol:
    ``reselect``, ``reuse``, ``full``, ``stable``, ``stable-cf``, ``stable-gap``, ``stable-front``, ``stable-late`` or
    ``stable-late-runs``; keep: ``answers``, ``questions`` or ``context`` (what stays in the history after a turn; see
    the module docstring); max_holes: the layouts only (``stable*``), the share of masked slots past which the layout is
    rebuilt in history order (0: every turn that masks or adds a slot, which is ``reselect``); context_tokens:
    ``stable-cf``, ``stable-gap``, ``stable-front`` and ``stable-late*`` only, how many of the history's first tokens
    are the context (None: the first :meth:`prefill`'s tokens, or without one, the whole first question); max_fresh:
    the layouts only, at most this many tokens of the earlier history (under the context-first layouts, of the
    context) that a turn newly keeps are added to the layout (the highest-scoring; what it keeps of its question always
    runs; as many dropped slots stay, so the layout holds k, under the context-first layouts as far as the selection
    drops context slots; a rebuilt turn lays out the whole selection), None for no cap
    (:meth:`gemfilter.stable.Layout.place`; under ``stable-late-runs`` a run counts with the held tokens it writes
    again, :meth:`gemfilter.stable.Layout.place_gap`); fresh_by: how the cap picks, ``runs`` (whole runs of consecutive
    tokens, a span method's sentences), ``tokens`` (single tokens; refused under ``stable-late-runs``, which writes
    whole runs) or ``runs-new`` (``stable-late-runs`` only: ``runs``, but a run that holds no held token, a sentence the
    turn keeps anew, ranks before every run that extends a held one); fresh_holes: which masked slots the rebuild rule
    reads on a capped turn, ``capped`` (the capped turn's) or ``selection`` (those the whole selection would leave, as
    without the cap); outgrown: ``stable-gap`` and ``stable-late*`` only, what a follow-up does when its new context
    outgrows the free positions or a conversation token it newly keeps precedes a held one: ``rebuild`` (every kept
    token runs again) or ``reopen`` (the context slots before the conversation's first stay, the rest runs again,
    :meth:`gemfilter.stable.Layout._reopen_gap`).

    Example::

        with gemfilter.Conversation(model, gemfilter.GemFilter(topk=1024), tok) as chat:
            chat.ask(document + "\\nQuestion: who ...?", max_new_tokens=50)
            chat.ask("\\nQuestion: and when ...?", max_new_tokens=50)
    """

    def __init__(
        self,
        model,
        method=None,
        tokenizer=None,
        protocol: str = "reselect",
        keep: str = "answers",
        max_holes: float = MAX_HOLES,
        context_tokens: int | None = None,
        max_fresh: int | None = None,
        fresh_by: str = "runs",
        fresh_holes: str = "capped",
        outgrown: str = "rebuild",
    ):
        if protocol not in PROTOCOLS:
            raise ValueError(f"unknown protocol {protocol!r}; allowed: {', '.join(PROTOCOLS)}")
        if keep not in KEEPS:
            raise ValueError(f"unknown keep {keep!r}; allowed: {', '.join(KEEPS)}")
        check_causal_decoder(model, need_generate=True)
        if method is not None and not isinstance(method, Method):
            got = repr(method) if isinstance(method, str) else type(method).__name__
            raise TypeError(
                f"method must be a method object such as gemfilter.get_method('gemfilter-span', topk=256), "
                f"or None for protocol 'full'; got {got}"
            )
        if protocol == "full":
            if method is not None and method.name != "full":
                raise ValueError(
                    f"protocol 'full' runs no method (got {method.name}): pass method=None, or choose "
                    "'reselect' (prompt methods) or 'reuse'"
                )
            method = None
        elif method is None:
            raise ValueError(f"protocol {protocol!r} needs a method, e.g. gemfilter.GemFilter(topk=1024)")
        else:
            method = resolve(model, method)
        if protocol in SELECTING:
            check_reselect(model, method)
        check_max_holes(max_holes)
        self.model, self.method, self.tokenizer, self.protocol, self.keep = model, method, tokenizer, protocol, keep
        self.max_holes = float(max_holes)
        if context_tokens is not None and (
            protocol not in CONTEXT_FIRST
            or isinstance(context_tokens, bool)
            or not isinstance(context_tokens, int)
            or context_tokens < 1
        ):
            raise ValueError(
                f"context_tokens is a whole number >= 1 (how many of the history's first tokens are the context), "
                f"for protocols {', '.join(CONTEXT_FIRST[:-1])} and {CONTEXT_FIRST[-1]} only; "
                f"got {context_tokens!r} with protocol {protocol!r}"
            )
        check_max_fresh(max_fresh, protocol)
        if fresh_by not in FRESH_BY:
            raise ValueError(f"unknown fresh_by {fresh_by!r}; allowed: {', '.join(FRESH_BY)}")
        if fresh_holes not in FRESH_HOLES:
            raise ValueError(f"unknown fresh_holes {fresh_holes!r}; allowed: {', '.join(FRESH_HOLES)}")
        check_whole_runs_cap(max_fresh, fresh_by, (protocol,))
        check_outgrown(outgrown, (protocol,))
        self.max_fresh, self.fresh_by, self.fresh_holes = max_fresh, fresh_by, fresh_holes
        self.outgrown = outgrown
        self._boundary = context_tokens  # the context-first layouts: history indices below it are the context
        self._layout = None  # stable: the generation cache's slots
        self._handle = None  # reuse: apply()'s handle, which forks its caches
        self.history = None  # (1, L) every token so far: questions and answers
        self.turns: list[Turn] = []
        self._stack = None
        self._cache = None  # reuse/full: the generation cache; reselect: the selector's layers 0..r
        self._tail = None  # reselect: the query rows of the history's last tokens, for window scores
        self._memory = PeakMemory(next(model.parameters()).device)

    def __enter__(self):
        self._stack = ExitStack()
        if self.protocol == "reuse":
            self._handle = self._stack.enter_context(apply(self.model, self.method, tokenizer=self.tokenizer))
        if self.protocol in SELECTING and self.method.scores_sliding_layers:
            self._cache = unwindowed_cache()  # its scores read every key of windowed layers too
        else:
            self._cache = dynamic_cache(self.model.config)
        # reselect with a method that reads more than the last query row: the earlier tokens' rows
        self._tail = (
            QueryTail(self.method.query_rows) if self.protocol in SELECTING and self.method.query_rows > 1 else None
        )
        self._layout = (
            Layout(self.model, croppable=self.protocol in CONTEXT_FIRST) if self.protocol in LAYOUTS else None
        )
        return self

    def __exit__(self, *exc):
        self._stack.close()
        self._stack = self._cache = self._handle = None
        return False

    def prefill(self, context) -> float:
        """Add ``context`` (text or ids) to the history without answering (SCBench's shared context, before
        ``keep="context"`` questions); returns the seconds it took. reselect: layers 0..r run on it;
        reuse: the method's prefill compresses it; full: the whole cache holds it."""
        if self._stack is None:
            raise RuntimeError("Conversation.prefill() runs inside `with Conversation(...) as chat:`")
        new = self._encode(context)
        history = new if self.history is None else torch.cat([self.history, new], dim=1)
        self._check_length(history)
        start = time.perf_counter()
        with _Checkpoint(self), torch.no_grad():
            if self.protocol == "reselect":
                self._select(history, self._cache, self._tail)
            elif self.protocol in LAYOUTS:  # the context's own selection: the layout each question starts from
                want = self._select(history, self._cache, self._tail)[0].indices[0].tolist()
                self._place(self._layout, history, want)
            else:  # one new token, never fed: the cache ends holding the history alone
                self.model.generate(history, max_new_tokens=1, do_sample=False, **cache_kwargs(self._cache))
            self.history = history
        return time.perf_counter() - start

    def ask(self, question, **generate_kwargs) -> Turn:
        """Append ``question`` (text, or ids (t,) / (1, t)) to the history and answer it; ``keep`` says what stays.

        generate_kwargs go to ``model.generate`` (greedy unless you say otherwise). Returns the :class:`Turn`.
        """
        if self._stack is None:
            raise RuntimeError("Conversation.ask() runs inside `with Conversation(...) as chat:`")
        new = self._encode(question)
        history = new if self.history is None else torch.cat([self.history, new], dim=1)
        generate_kwargs.setdefault("do_sample", False)
        generate_kwargs.setdefault("num_beams", 1)
        if "streamer" in generate_kwargs:
            raise ValueError("Conversation.ask() times the first token with its own streamer: leave `streamer` out")
        if generate_kwargs["num_beams"] != 1:
            raise ValueError(
                f"Conversation.ask() answers with one sequence per turn, as its caches go on: num_beams "
                f"must be 1, got {generate_kwargs['num_beams']!r}"
            )
        limit = generate_kwargs.get("max_new_tokens")
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
            raise ValueError(
                f"max_new_tokens must be a whole number >= 1, got {limit!r}; to add text to the history "
                "without an answer, use Conversation.prefill()"
            )
        if self.keep == "context" and self.history is None:
            raise ValueError("keep='context' asks every question over the context: call prefill(context) first")
        self._check_length(history)
        with _Checkpoint(self):
            return self._ask(history, generate_kwargs)

    def _ask(self, history, generate_kwargs) -> Turn:
        try:  # CPU memory comes from Linux's /proc; elsewhere a turn reports no peak
            self._memory.baseline = self._memory.now()
            self._memory.reset_peak()
            measured = True
        except OSError:
            measured = False
        clock = FirstTokenClock(self._memory if measured else None, _sync(self._memory))
        start = time.perf_counter()
        selection, kept, recomputed, rebuilt, select_s = None, None, None, None, None
        if self.protocol in LAYOUTS:
            answer, selection, kept, recomputed, rebuilt, select_s = self._stable(history, clock, generate_kwargs)
        elif self.protocol == "reselect":
            if self.keep == "context":  # the question is asked over the context alone: nothing of it stays
                selection, select_s = self._select(
                    history, copy.deepcopy(self._cache), None if self._tail is None else self._tail.copy()
                )
            else:
                selection, select_s = self._select(history, self._cache, self._tail)
            with apply(self.model, Preselected(self.method, selection), tokenizer=self.tokenizer) as handle:
                out = self.model.generate(history, streamer=clock, **generate_kwargs)
            kept = recomputed = handle.calls[-1].kept[0]
            answer = _new(out, history)
        else:  # reuse (inside apply(), entered for the conversation) and full: the history's cache goes on
            before = self.history.shape[1] if self.history is not None else 0  # keep="context": the context
            prefills = len(self._handle.budgets) if self._handle is not None else 0
            answer, cache = self._generate(history, clock, generate_kwargs)
            kept = self._rows_before(cache, answer.shape[1])
            recomputed = history.shape[1] - before
            if self._handle is not None and len(self._handle.budgets) > prefills:  # reuse's first prefill: what the
                recomputed = self._handle.budgets[prefills].propagated  # method ran through the last layer (k, or n)
        total = time.perf_counter() - start
        ttft = (clock.first_token - start) if clock.first_token is not None else total
        peak = max(self._memory.peak(), clock.prompt_peak or 0.0) if measured else None
        text = self.tokenizer.decode(answer[0], skip_special_tokens=True) if self.tokenizer is not None else None
        turn = Turn(
            new_tokens=answer[0],
            text=text,
            kept=int(kept),
            history_tokens=history.shape[1],
            ttft_s=ttft,
            total_s=total,
            peak_mib=peak,
            selection=selection,
            recomputed=recomputed,
            rebuilt=rebuilt,
            select_s=select_s,
        )
        if self.keep == "answers":
            self.history = torch.cat([history, answer], dim=1)
        elif self.keep == "questions":
            self.history = history
        self.turns.append(turn)
        return turn

    def _stable(self, history, clock, kwargs) -> tuple:
        """(answer (1, t), selection, kept, recomputed, rebuilt, select_s) under ``stable``: select as reselect
        does, lay the selection out on the layout (a copy for a question over the context alone), answer greedily
        on it (on a copy when the answer is dropped)."""
        from .compiled import check_keywords

        settings = check_keywords(self.model, {k: v for k, v in kwargs.items() if k != "streamer"})
        context = self.keep == "context"
        cache = copy.deepcopy(self._cache) if context else self._cache
        tail = None if self._tail is None else (self._tail.copy() if context else self._tail)
        selection, select_s = self._select(history, cache, tail)
        layout = self._layout.copy() if context else self._layout
        clock.put(history.cpu())  # as generate hands its streamer the prompt first
        want = selection.indices[0].tolist()
        logits, rebuilt, written = self._place(layout, history, want, selection.scores[0])
        if self.protocol == "stable":
            on = layout if self.keep == "answers" else (layout if context else layout.copy())
        else:  # the context-first layouts: the answer's slots go with the conversation's next turn, which cuts them
            on = layout
        kept = on.kept
        answer = on.decode(logits, settings, history.shape[1], clock)
        return answer, selection, kept, written, rebuilt, select_s

    def _place(self, layout, history, want, scores=None) -> tuple:
        """Lay the selection ``want`` out on ``layout`` as the protocol does (a prefill's or a turn's; scores (L,): the
        selection's, for ``max_fresh``); returns :meth:`gemfilter.stable.Layout.place`'s (logits, rebuilt, slots
        written)."""
        if self.protocol == "stable":  # the earlier history: what self.history holds
            asked_from = 0 if self.history is None else self.history.shape[1]
            return layout.place(history, want, self.max_holes, self._cap(scores, asked_from))
        if self._boundary is None:  # the context-first layouts without context_tokens: the first prefill or question
            self._boundary = history.shape[1]
        if self.protocol == "stable-cf":  # the conversation's kept tokens run again after the context's slots
            limit = self._cap(scores, self._boundary)  # the cap reads the context's tokens alone
            return layout.place_context_first(history, want, self._boundary, self.max_holes, limit)
        # stable-gap, -front, -late: the conversation's slots stay; an answer that left the history has its slots cut
        cut, front = self.keep != "answers", self.protocol == "stable-front"
        late, whole = self.protocol in ("stable-late", "stable-late-runs"), self.protocol == "stable-late-runs"
        limit = self._cap(scores, self._boundary)  # the cap reads the context's tokens alone
        reopen = self.outgrown == "reopen"
        return layout.place_gap(
            history, want, self._boundary, self.max_holes, cut, front, late, whole, limit=limit, reopen=reopen
        )

    def _cap(self, scores, asked_from: int) -> Cap | None:
        """The :class:`gemfilter.stable.Cap` of a turn whose tokens from ``asked_from`` on always run (None without
        ``max_fresh``, or without the selection's scores (L,))."""
        if self.max_fresh is None or scores is None:
            return None
        return Cap(self.max_fresh, self.fresh_by, scores.float().tolist(), asked_from, self.fresh_holes)

    @property
    def selector_tokens(self) -> int:
        """reselect, stable: how many history tokens the selector's layers 0..r cache holds (0 outside the block)."""
        return self._cache.get_seq_length() if self.protocol in SELECTING and self._cache is not None else 0

    def _encode(self, question) -> torch.Tensor:
        device = next(self.model.parameters()).device
        if isinstance(question, str):
            if self.tokenizer is None:
                raise ValueError("a text question needs the tokenizer: Conversation(model, method, tokenizer)")
            # Special tokens (BOS) only at the start of the conversation, as in one long prompt.
            ids = self.tokenizer(question, return_tensors="pt", add_special_tokens=self.history is None)["input_ids"]
        elif torch.is_tensor(question) or (
            isinstance(question, (list, tuple))
            and all(isinstance(t, int) and not isinstance(t, bool) for t in question)
        ):
            ids = torch.as_tensor(question)
        else:
            raise TypeError(
                f"a question is text, or token ids as a 1-D / (1, t) tensor or a list of ints; got "
                f"{type(question).__name__}"
            )
        ids = ids.reshape(1, -1) if ids.dim() == 1 else ids
        if ids.dim() != 2 or ids.shape[0] != 1 or ids.shape[1] == 0 or ids.dtype not in (torch.long, torch.int):
            raise ValueError(
                f"a question is text or a non-empty 1-D / (1, t) tensor of token ids, got "
                f"{tuple(ids.shape)} {ids.dtype}: one conversation per Conversation"
            )
        vocab = int(self.model.config.get_text_config().vocab_size)
        bad = (ids < 0) | (ids >= vocab)
        if bool(bad.any()):
            where = int(bad[0].nonzero()[0])
            raise ValueError(
                f"token ids must lie in [0, {vocab}) (the model's vocabulary); position {where} of the "
                f"question holds {int(ids[0, where])}"
            )
        return ids.long().to(device)

    def _check_length(self, history) -> None:
        """Refuse a history longer than the model's positions (as ``gemfilter serve`` refuses such a prompt)."""
        limit = getattr(self.model.config.get_text_config(), "max_position_embeddings", None)
        if limit and history.shape[1] > limit:
            raise ValueError(
                f"the conversation would hold {history.shape[1]} tokens with this question, more than "
                f"the model's max_position_embeddings ({limit})"
            )

    def _select(self, history, cache, tail) -> tuple:
        """(the method's :class:`Selection` over ``history`` (1, L), its seconds), running only the tokens ``cache``
        has not seen (and ``tail``, a :class:`~gemfilter.selection.QueryTail`, holds the query rows of the ones it
        has). The seconds end after a device sync, so a GPU's queued work is counted where it ran."""
        start = time.perf_counter()
        selection = select_cached(self.model, self.method, history, cache, self.tokenizer, tail=tail)
        _sync(self._memory)()
        return selection, time.perf_counter() - start

    def _fork(self):
        """A copy of the history's cache to answer on, so the answer (and, for ``context``, the question) is dropped."""
        return self._handle.fork(self._cache) if self.protocol == "reuse" else copy.deepcopy(self._cache)

    def _generate(self, history, clock, kwargs) -> tuple:
        """(answer (1, t), the cache it was generated on) under reuse / full, as ``keep`` says.

        questions: the history's cache takes the question (generate of one token, never fed), then the answer
        goes on from a fork; context: the whole turn runs on a fork; answers: on the history's cache itself.
        """
        if self.keep == "answers":
            return _new(
                self.model.generate(history, streamer=clock, **cache_kwargs(self._cache), **kwargs), history
            ), self._cache
        if self.keep == "context":
            fork = self._fork()
            return _new(self.model.generate(history, streamer=clock, **cache_kwargs(fork), **kwargs), history), fork
        limit = kwargs.pop("max_new_tokens", None)
        first = _new(
            self.model.generate(history, streamer=clock, max_new_tokens=1, **cache_kwargs(self._cache), **kwargs),
            history,
        )
        eos = self.model.generation_config.eos_token_id
        stop = {eos} if isinstance(eos, int) else set(eos or ())
        if (limit is not None and limit <= 1) or int(first[0, -1]) in stop:
            return first, self._cache
        fork = self._fork()
        prompt = torch.cat([history, first], dim=1)
        rest = _new(
            self.model.generate(
                prompt, **({} if limit is None else {"max_new_tokens": limit - 1}), **cache_kwargs(fork), **kwargs
            ),
            prompt,
        )
        return torch.cat([first, rest], dim=1), fork

    @staticmethod
    def _rows_before(cache, answer_tokens: int) -> int:
        """KV rows of the full-attention layers when the answer began (generate never feeds its last token)."""
        layers = [la for la in cache.layers if getattr(la, "sliding_window", None) is None] or cache.layers
        return min(int(layer.keys.shape[-2]) for layer in layers) - (answer_tokens - 1)


def _new(out, prompt):
    """The new tokens (1, t) of a generate output (a tensor or a ModelOutput) after ``prompt`` (1, L)."""
    seq = out if torch.is_tensor(out) else out.sequences
    return seq[:, prompt.shape[1] :]


def _sync(memory):
    if memory.cuda:
        return lambda: memory.torch.cuda.synchronize(memory.device)
    return lambda: None


def check_reselect(model, method) -> None:
    """reselect needs a prompt method that scores with the last query row at a full-attention layer.

    model: a model or its config (no weights needed: the benchmarks check before loading); method: a method object
    (its layer None: the model's default)."""
    if not isinstance(method, PromptMethod):
        raise ValueError(
            f"protocol 'reselect' selects prompt tokens; {method.name} is not a prompt method. Use "
            "'reuse' for it (its compressed cache goes on), or gemfilter / gemfilter-span"
        )
    if not method.selects_from_cache:
        raise ValueError(
            f"protocol 'reselect' reuses the history's layers 0..r, which gives the same scores only "
            f"for methods that read the last query rows; {method.name} reads another row. Use 'reuse'"
        )
    layer = method.layer if method.layer is not None else default_layer(model)
    if sliding_window_of(model, layer) is not None and not method.scores_sliding_layers:
        raise ValueError(
            f"protocol 'reselect': filter layer {layer} has a sliding window, so its cache keeps "
            "only the window's keys and could not select from the whole history; choose a "
            "full-attention layer"
        )


class _Checkpoint:
    """The conversation as it is, restored if the block fails (any exception, Ctrl-C included), so a failed turn
    leaves no trace: a turn must not leave its question in a cache but not in the history.

    Held by reference, not copied: cache layers rebind their tensors on every update (``torch.cat``), so the old
    tensors stay as they were. Saved: the history and turns; each cache layer's attributes (tensors, counters);
    under ``reuse``, the ``apply()`` handle's per-cache state (the call's decoded positions and masks, the consumed
    tokens), its calls and budgets.
    """

    def __init__(self, chat: Conversation):
        self.chat = chat

    def __enter__(self):
        chat, cache = self.chat, self.chat._cache
        self.history, self.turns = chat.history, len(chat.turns)
        self.layers = list(cache.layers)
        self.states = [dict(vars(layer)) for layer in self.layers]
        self.tail = None if chat._tail is None else dict(chat._tail.by_layer)
        self.layout = None if chat._layout is None else chat._layout.snapshot()
        self.boundary = chat._boundary
        self.handle = handle = chat._handle
        if handle is not None:
            self.entries = {
                name: getattr(handle, name).get(cache) for name in ("_by_cache", "_consumed", "_prefilling")
            }
            self.objects = [(obj, _shallow(obj)) for obj in self.entries.values() if obj is not None]
            self.lengths = len(handle.calls), len(handle.budgets)
        return self

    def __exit__(self, kind, error, trace):
        if kind is None:
            return False
        chat, cache = self.chat, self.chat._cache
        chat.history = self.history
        del chat.turns[self.turns :]
        cache.layers[:] = self.layers
        for layer, state in zip(self.layers, self.states):
            vars(layer).clear()
            vars(layer).update(state)
        if self.tail is not None:
            chat._tail.by_layer = self.tail
        if self.layout is not None:
            chat._layout.restore(self.layout)
        chat._boundary = self.boundary
        handle = self.handle
        if handle is not None:
            for name, obj in self.entries.items():
                table = getattr(handle, name)
                table.pop(cache, None)
                if obj is not None:
                    table[cache] = obj
            for obj, state in self.objects:
                vars(obj).clear()
                vars(obj).update(state)
            del handle.calls[self.lengths[0] :]
            del handle.budgets[self.lengths[1] :]
        return False


def _shallow(obj) -> dict:
    """``vars(obj)`` with its dicts and lists copied (a call's decode steps mutate those in place)."""
    return {k: copy.copy(v) if isinstance(v, (dict, list)) else v for k, v in vars(obj).items()}
