"""SCBench runner on the one run loop: one row per (mode, length, method, task, sample), holding every turn.

Source: microsoft/MInference ``scbench/run_scbench.py`` and ``eval_utils.py`` (see docs/scbench.md). A
sample is one context with ``turns`` queries; how a turn is fed follows the official runner:

- ``multi-turn``: turn 1 is the first prompt (middle-truncated to ``max_input_length``), each later turn
  appends its follow-up, which starts with the previous turn's gold answer; the model's own answer is
  dropped (``Conversation(keep="questions")``), so turn t reads ``turn_input_ids(prompts, tok, t)``.
- ``multi-request``: the context is prefilled once (``Conversation.prefill``), each query is answered over
  it alone (``keep="context"``).

Protocols (``gemfilter.conversation``): ``full`` for the baseline (the history's whole cache, prefix
reuse); cache methods (snapkv, h2o, fastkv) ``reuse`` their compressed cache; prompt methods (gemfilter,
gemfilter-span) run under each protocol the config names (``reselect``: select again per turn from the
history's layers 0..r; ``reuse``: turn 1's kept tokens go on; ``stable``: select as reselect, keep last turn's
kept tokens in place and run only the new ones, :mod:`gemfilter.stable`; ``stable-cf``: ``stable`` for the
context's kept tokens, the conversation's run again after them each turn; ``stable-gap``: ``stable-cf``'s order in
positions with the conversation's slots kept; ``stable-front``: ``stable-gap`` with its free positions before the
context; ``stable-late``: ``stable-gap`` whose free positions open on the first follow-up that keeps new context;
``stable-late-runs``: ``stable-late`` that writes a newly kept token's run again whole).
A method's label is its spec, with ``@`` and the protocol (``@reuse``, ``@reselect``, ``@stable``, ...) for prompt
methods.

With ``engine`` (a URL), each turn is answered by an OpenAI-compatible engine (:mod:`eval.scbench.engine`):
full and prompt methods under ``reselect`` only; rows record ``engine``, and it is part of the folder's identity.

Files: ``OUT/<mode>/<L>/<label>/<task>.jsonl``, one row per sample: ``_id`` (the sample's seed),
``turns`` ([{turn_idx, prediction, ground_truth, score, ttft_s, total_s, kept, history_tokens, recomputed,
select_s}]; select_s: the selection's part of ttft_s, null for full and reuse), ``prefill_s`` (multi-request: the
context's prefill), ``protocol``, ``method``, ``layer``, ``topk``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from eval.runner import Benchmark, Unit
from eval.runner import RunConfig as BaseRunConfig
from eval.runner import run as run_units
from gemfilter.conversation import (
    CAPPED,
    CONTEXT_FIRST,
    LAYOUTS,
    MAX_HOLES,
    check_max_fresh,
    check_max_holes,
    check_whole_runs_cap,
)
from gemfilter.stable import FRESH_BY, FRESH_HOLES, OUTGROWN, REOPENING
from gemfilter.toolkit.options import check_against_model

from .engine import converse_engine
from .generate import MAX_TURNS, make_sample
from .own import MULTIKEY_KEY_STYLE, MULTIKEY_NEEDLE
from .prompts import MODES, build_prompts, max_input_length, truncate_middle
from .scoring import score_one
from .tasks import OFFLINE, OWN, get_task

#: Fields a stored row must hold to count as done.
ROW_FIELDS = ("_id", "turns")
PROMPT_PROTOCOLS = ("reselect", "reuse", *LAYOUTS)
#: How samples are sized, part of a folder's identity: each mode's sample fits that mode's input budget
#: (``make_sample(mode=...)``). Folders written before say nothing, which means the old sizing: one sample for
#: both modes, whose multi-request context the runner's middle truncation cut by 15-27% at 4K and 8K.
SAMPLE_SIZING = "each mode's input budget"
#: How a multi-request query of this project's tasks follows the context, part of the identity of a folder that runs
#: one of them. Folders written before say nothing, which means the query ran straight on from the context.
OWN_QUERY = "\n\n{input}"
#: GF.MultiKey's needle wording (:data:`eval.scbench.own.MULTIKEY_NEEDLE`) and keys
#: (:data:`eval.scbench.own.MULTIKEY_KEY_STYLE`), part of the identity of a folder that runs it. Folders written
#: before say nothing, which means RULER's wording and RULER's keys, FORMAT_DEFAULTS' below.
FORMAT_DEFAULTS = {
    "samples": "one sample for both modes, cut in multi-request",
    "own_query": "{input}",
    "multikey_needle": "One of the special magic numbers for {key} is: {value}.",
    "multikey_keys": "RULER's adjective-noun words",
    "max_holes": MAX_HOLES,
    "max_fresh": None,
    "fresh_by": "tokens",  # the rule of the first folder that capped (measured/scbench-own-fresh-tokens)
    "fresh_holes": "capped",
    "outgrown": "rebuild",
}


@dataclass(frozen=True)
class RunConfig(BaseRunConfig):
    """One SCBench experiment: :class:`eval.runner.RunConfig`'s fields (``engine`` answers the turns), and:

    protocols: those a prompt method runs under (``reselect``, ``reuse``, ``stable*``); modes: ``multi-turn`` and/or
    ``multi-request``; tasks: official data names with an offline generator; lengths: the window
    (``--max_seq_length``) the samples are sized to; num_samples: samples per task (seeds 0..n-1); turns: queries
    per sample; timeout: seconds to wait for the engine (a connection, a chunk); max_holes: the layouts'
    (``stable*``) rebuild share (:class:`gemfilter.Conversation`), part of the identity of a folder that runs one;
    max_fresh: the layouts' cap on the earlier tokens a follow-up newly keeps (None: no cap), part of the identity of
    a folder that runs one; fresh_by: how that cap picks (:data:`gemfilter.stable.FRESH_BY`) and
    fresh_holes which holes its rebuild rule reads (``capped`` or ``selection``), part of the identity of a folder
    that caps; outgrown: what ``stable-gap`` and ``stable-late*`` do when a follow-up's new context outgrows the free
    positions (:data:`gemfilter.stable.OUTGROWN`: ``rebuild`` or ``reopen``), part of the identity of a folder that
    runs one.
    warmup: before the first timed conversation, run one untimed ``full`` conversation of two turns (locally): the
    first forward passes of a process pay one-time costs (seconds at 4K on CPU) that would land on the first row.
    """

    protocols: tuple = ("reselect",)
    modes: tuple = ("multi-turn",)
    tasks: tuple = OFFLINE
    lengths: tuple = (4096,)
    num_samples: int = 20
    turns: int = MAX_TURNS
    timeout: float = 600.0
    warmup: bool = True
    max_holes: float = MAX_HOLES
    max_fresh: int | None = None
    fresh_by: str = "runs"
    fresh_holes: str = "capped"
    outgrown: str = "rebuild"

    def identity(self) -> dict:
        engine = {"engine": self.engine} if self.engine is not None else {}  # a local folder's identity as it was
        # only folders that run this project's tasks compare how their queries are fed
        own = {"own_query": OWN_QUERY} if any(t in OWN for t in self.tasks) else {}
        if "gf_multikey" in self.tasks:
            own["multikey_needle"] = MULTIKEY_NEEDLE
            own["multikey_keys"] = MULTIKEY_KEY_STYLE
        if any(p in LAYOUTS for p in self.protocols):  # folders before --max-holes ran the default
            own["max_holes"] = self.max_holes
        if any(p in CAPPED for p in self.protocols):  # folders before --max-fresh had no cap
            own["max_fresh"] = self.max_fresh
            if self.max_fresh is not None:
                own["fresh_by"], own["fresh_holes"] = self.fresh_by, self.fresh_holes
        if any(p in REOPENING for p in self.protocols):  # folders before --outgrown rebuilt
            own["outgrown"] = self.outgrown
        return {
            "model": self.model,
            "topk": self.topk,
            "layer": self.layer,
            "turns": self.turns,
            "dtype": self.dtype,
            "samples": SAMPLE_SIZING,
            **engine,
            **own,
        }


def defaults(config: RunConfig) -> dict:
    """The command line's ``--topk`` / ``--layer``: the budget and layer of every spec that sets none."""
    return {"topk": config.topk, "layer": config.layer}


def labelled(config: RunConfig) -> dict:
    """{label: (Spec, protocol)} for every method under every protocol it runs (see the module docstring)."""
    out = {}
    for spec in config.methods:
        own = spec.cls.protocols
        if len(own) == 1:  # full, and the cache methods (reuse): one protocol, so no label suffix
            out[spec.label] = (spec, own[0])
        else:
            out.update({f"{spec.label}@{p}": (spec, p) for p in config.protocols if p in own})
    return out


def validate(config: RunConfig) -> None:
    """Raise ValueError naming the bad setting and what is allowed."""
    for name, values, allowed in (
        ("--protocols", config.protocols, PROMPT_PROTOCOLS),
        ("--modes", config.modes, MODES),
        ("--tasks", config.tasks, OFFLINE),
    ):
        bad = [v for v in values if v not in allowed]
        if bad or not values:
            raise ValueError(f"{name}: {', '.join(bad) or 'empty'}; allowed: {', '.join(allowed)}")
    labelled(config)
    # a protocol no method runs under would give no rows at all, silently
    several = [spec.cls.protocols for spec in config.methods if len(spec.cls.protocols) > 1]
    unused = [p for p in config.protocols if several and not any(p in own for own in several)]
    if unused:
        allowed = sorted({p for own in several for p in own})
        raise ValueError(
            f"--protocols: no method of --methods runs under {', '.join(unused)}; they run under: {', '.join(allowed)}"
        )
    for name, value in (("--num-samples", config.num_samples), ("--turns", config.turns)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a whole number >= 1, got {value!r}")
    if (
        isinstance(config.timeout, bool)
        or not isinstance(config.timeout, (int, float))
        or not math.isfinite(config.timeout)
        or not 0 < config.timeout <= 86400
    ):
        raise ValueError(f"--timeout must be a number of seconds in (0, 86400], got {config.timeout!r}")
    check_max_holes(config.max_holes, "--max-holes")
    if config.max_fresh is not None and not any(p in CAPPED for p in config.protocols):
        raise ValueError(
            f"--max-fresh caps the follow-ups of protocols {', '.join(CAPPED[:-1])} and {CAPPED[-1]}: add one to "
            "--protocols, or leave it out"
        )
    check_max_fresh(config.max_fresh, "stable", "--max-fresh")
    if config.fresh_by not in FRESH_BY:
        raise ValueError(f"--fresh-by: {config.fresh_by}; allowed: {', '.join(FRESH_BY)}")
    check_whole_runs_cap(config.max_fresh, config.fresh_by, config.protocols, "--fresh-by")
    if config.fresh_holes not in FRESH_HOLES:
        raise ValueError(f"--fresh-holes: {config.fresh_holes}; allowed: {', '.join(FRESH_HOLES)}")
    if config.outgrown not in OUTGROWN:
        raise ValueError(f"--outgrown: {config.outgrown}; allowed: {', '.join(OUTGROWN)}")
    if config.outgrown == "reopen" and not any(p in REOPENING for p in config.protocols):
        raise ValueError(f"--outgrown reopen: add one of {', '.join(REOPENING)} to --protocols, or leave it out")
    if config.engine is not None:
        from .engine import check_engine_labels

        check_engine_labels(labelled(config))


class SCBench(Benchmark):
    """SCBench on :func:`eval.runner.run`: a unit is one sample's whole conversation (every turn, one row)."""

    name, noun, required = "SCBench", "conversation", ROW_FIELDS
    format_defaults = FORMAT_DEFAULTS

    def validate(self) -> None:
        validate(self.config)

    def check(self, model_config) -> None:
        """Every method against the model's config, under the protocol it runs, before any weights load."""
        from gemfilter.conversation import SELECTING, check_reselect

        config = self.config
        check_against_model(model_config, layer=config.layer, lengths=config.lengths)
        self.check_methods(model_config, lambda spec: config.lengths)
        for label, (spec, protocol) in labelled(config).items():
            for length in config.lengths if protocol in SELECTING else ():
                try:
                    check_reselect(model_config, self.method_of(spec, length))
                except ValueError as err:
                    raise ValueError(f"{label}: {err}") from None

    def units(self, out, state, say) -> list:
        config, tok = self.config, self.tokenizer()
        # each mode's sample fits that mode's input budget, so the runner's middle truncation never cuts a context
        samples = {
            (mode, L, t, i): make_sample(t, tok, L, config.turns, seed=i, mode=mode)
            for mode in config.modes
            for L in config.lengths
            for t in config.tasks
            for i in range(config.num_samples)
        }
        labels = list(labelled(config))
        # sample-major, so a run cut off leaves every mode, task and method on the same samples
        return [
            Unit(f"{mode}/{L}/{label}/{t}.jsonl", str(i), (mode, L, label, t, samples[mode, L, t, i]))
            for L in config.lengths
            for i in range(config.num_samples)
            for mode in config.modes
            for t in config.tasks
            for label in labels
        ]

    def row_key(self, row: dict) -> str:
        return row["_id"]

    def describe(self, units: list) -> str:
        c = self.config
        return (
            f"SCBench: {len(units)} conversations of {c.turns} turns ({len(labelled(c))} methods x "
            f"{len(c.tasks)} tasks x {len(c.lengths)} lengths x {len(c.modes)} modes)"
        )

    def start(self, model, tok, done: dict):
        labels = labelled(self.config)
        given = defaults(self.config)
        finished = [  # a row's label names its protocol too; its method is the spec's
            {"method": labels[row["method"]][0].label, "layer": row.get("layer")}
            for rows in done.values()
            for row in rows.values()
            if row.get("method") in labels
        ]
        built = self.build_methods(model, finished)
        methods = {
            label: (None if proto == "full" else built[spec.label], proto) for label, (spec, proto) in labels.items()
        }
        engine = None
        if self.config.engine is not None:
            from .engine import EngineTurns

            engine = EngineTurns(self.config.engine, model, tok, timeout=self.config.timeout)
        elif self.config.warmup:
            warm_up(model, tok, self.config)

        settings = ("max_holes", "max_fresh", "fresh_by", "fresh_holes", "outgrown")
        layouts = {k: getattr(self.config, k) for k in settings}

        def predict(unit: Unit) -> dict:
            mode, length, label, task, sample = unit.data
            method, protocol = methods[label]
            if engine is None:
                row = converse(model, tok, method, protocol, mode, length, task, sample, **layouts)
            else:
                row = converse_engine(engine, labels[label][0], protocol, mode, length, task, sample, **given)
                row["engine"] = self.config.engine
            return row | {
                "_id": unit.key,
                "method": label,
                "protocol": protocol,
                "layer": None if method is None else method.layer,
                "topk": None if method is None else method.topk,
            }

        return predict

    def postfix(self, unit: Unit, row: dict) -> dict:
        mean = sum(t["score"] for t in row["turns"]) / len(row["turns"])
        return {"method": unit.data[2], "task": unit.data[3], "acc": f"{mean:.2f}"}


def warm_up(model, tok, config: RunConfig) -> None:
    """One untimed ``full`` conversation of two turns on the first mode, length and task (seed 0), its rows dropped:
    the process's one-time costs (allocations, kernel choices, lazy imports) are paid before any row is timed."""
    mode, length, task = config.modes[0], config.lengths[0], config.tasks[0]
    sample = make_sample(task, tok, length, min(2, config.turns), seed=0, mode=mode)
    converse(model, tok, None, "full", mode, length, task, sample)


def feed(prompts, tok, task: str, length: int) -> tuple:
    """The token ids the official runner feeds a conversation: (the first prompt, encoded with the special tokens
    and middle-truncated to the mode's ``max_input_length`` for a ``length`` window, [each follow-up encoded
    without them]). prompts: :func:`eval.scbench.prompts.build_prompts`'s."""
    budget = max_input_length(task, length, len(prompts.ground_truth), prompts.mode)
    first = truncate_middle(tok.encode(prompts.first), budget)
    return first, [tok.encode(text, add_special_tokens=False) for text in prompts.follow_ups]


def context_end(prompts, sample: dict, tok, first: list) -> int:
    """How many of the first prompt's token ids ``first`` (:func:`feed`'s) hold the context, the question after it
    left out: ``first``'s length less the ids that follow the sample's context text in ``prompts.first`` (the whole
    text's ids less those of the text up to the context's end, encoded alone). A middle cut keeps that end whole."""
    text = prompts.first
    context = str(sample["context"] if "context" in sample else sample["input"])  # as the template formats it
    if context not in text:
        raise ValueError("the first prompt does not hold the sample's context: its end cannot be found")
    end = text.rindex(context) + len(context)
    after = len(tok.encode(text)) - len(tok.encode(text[:end]))
    return len(first) - after


def converse(
    model,
    tok,
    method,
    protocol: str,
    mode: str,
    length: int,
    task: str,
    sample: dict,
    max_holes: float = MAX_HOLES,
    max_fresh: int | None = None,
    fresh_by: str = "runs",
    fresh_holes: str = "capped",
    outgrown: str = "rebuild",
) -> dict:
    """One sample's conversation as the official runner feeds it: {turns: [...], prefill_s}.

    method: a resolved method object (None for ``full``); protocol: ``full``, ``reuse``, ``reselect``, ``stable``,
    ``stable-cf``, ``stable-gap``, ``stable-front``, ``stable-late`` or ``stable-late-runs``; mode: a name in
    :data:`eval.scbench.prompts.MODES`; length: the window the first prompt is cut to fit; max_holes: the layouts'
    rebuild share (``stable*``); max_fresh: the layouts' cap on the earlier tokens a follow-up newly keeps, fresh_by
    how it picks them and fresh_holes which holes its rebuild rule reads (the other protocols ignore all three);
    outgrown: what ``stable-gap`` and ``stable-late*`` do when a follow-up's new context outgrows the free positions
    (the others ignore it).
    """
    import gemfilter

    prompts = build_prompts(sample, task, mode)
    first, pieces = feed(prompts, tok, task, length)
    new = get_task(task).max_new_tokens
    keep = "questions" if mode == "multi-turn" else "context"
    rows, prefill_s = [], None
    # the protocol's own settings; context-first layouts, multi-turn: the context ends before the first question
    where = {}
    if protocol in CONTEXT_FIRST and mode == "multi-turn":
        where["context_tokens"] = context_end(prompts, sample, tok, first)
    if protocol in CAPPED:
        where.update(max_fresh=max_fresh, fresh_by=fresh_by, fresh_holes=fresh_holes)
    if protocol in REOPENING:
        where["outgrown"] = outgrown
    with gemfilter.Conversation(model, method, tok, protocol=protocol, keep=keep, max_holes=max_holes, **where) as chat:
        if mode == "multi-request":
            prefill_s = chat.prefill(first)
            asks = pieces
        else:
            asks = [first, *pieces]
        for t, ids in enumerate(asks):
            turn = chat.ask(ids, max_new_tokens=new)
            truth = prompts.ground_truth[t]
            rows.append(
                {
                    "turn_idx": t,
                    "prediction": turn.text,
                    "ground_truth": truth,
                    "score": score_one(task, turn.text, truth),
                    "ttft_s": round(turn.ttft_s, 4),
                    "total_s": round(turn.total_s, 4),
                    "kept": turn.kept,
                    "history_tokens": turn.history_tokens,
                    "recomputed": turn.recomputed,
                    "select_s": None if turn.select_s is None else round(turn.select_s, 4),
                }
            )
    return {"turns": rows, "prefill_s": prefill_s}


def run(
    config: RunConfig, out, *, state=None, model_and_tokenizer=None, progress: bool = True, max_units: int | None = None
) -> dict | None:
    """Compute the missing conversations of ``config`` into ``out`` (:func:`eval.runner.run`); return
    {file: rows} (None off the main process)."""
    from gemfilter.models import load_tokenizer

    bench = SCBench(config, lambda: model_and_tokenizer[1] if model_and_tokenizer else load_tokenizer(config.model))
    return run_units(
        bench, out, state=state, model_and_tokenizer=model_and_tokenizer, progress=progress, max_units=max_units
    )
