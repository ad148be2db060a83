"""SCBench through a serving engine (``gemfilter-scbench run --engine URL``): the selection here, the answers there.

Each turn is one request with the token ids the official runner feeds for that turn
(:func:`eval.scbench.prompts.turn_input_ids`: multi-turn, the first prompt and follow-ups 1..t; multi-request,
the context and query t), streamed, greedy, at most the task's ``max_new_tokens``, stopped where the engine's
generation config stops (EOS), as the local path's ``generate``. What is sent:

- ``full``: the whole turn prompt; the engine's own prefix caching serves the part an earlier turn sent;
- a prompt method under ``reselect``: the kept ids of the method on the whole turn prompt, selected by a
  :class:`gemfilter.toolkit.serving.selector.Selector` with its prefix cache on, so a turn runs only its new tokens
  through layers 0..r (the kept ids equal the uncached selection's; tests/test_selector_cache.py).

``reuse`` (a compressed cache that lives on between turns) and KV-cache methods have no form here: an engine
keeps no state of ours between requests. Scores use the same scorer as the local rows; ``ttft_s`` runs from the
turn's start (the selection included) to the engine's first text.
"""

from __future__ import annotations

import json
import time

from .prompts import build_prompts, max_input_length, turn_input_ids
from .scoring import score_one
from .tasks import get_task

#: the selector's prefix cache, bytes of K/V (as ``gemfilter serve``'s default of 1 GB)
CACHE_BYTES = 2**30


def check_engine_labels(labelled: dict) -> None:
    """Refuse, before anything loads, what cannot run through an engine; ``labelled``: {label: (Spec, protocol)}."""
    bad = [label for label, (spec, protocol) in labelled.items() if protocol not in ("full", "reselect")]
    if bad:
        raise ValueError(
            f"--engine runs full (the engine's prefix caching) and prompt methods under --protocols "
            f"reselect; not {', '.join(bad)}: a compressed cache that lives on between turns (reuse, "
            "KV-cache methods) stays in the model here, which an engine does not expose"
        )


class EngineTurns:
    """The engine, and one selector per filter layer (made on first use), for :func:`converse_engine`."""

    def __init__(self, engine: str, model, tokenizer, timeout: float = 600.0):
        from gemfilter.toolkit.serving.upstream import Upstream, check_tokenizer

        self.upstream = Upstream(engine, timeout=timeout)
        self.model_id = self.upstream.default_model()
        check_tokenizer(self.upstream, tokenizer, self.model_id)  # one vocabulary, or the kept ids mean nothing
        self.model, self.tokenizer, self._selectors = model, tokenizer, {}

    def selector(self, layer: int):
        from gemfilter.toolkit.serving.selector import Selector

        if layer not in self._selectors:
            self._selectors[layer] = Selector(self.model, self.tokenizer, layer, cache_bytes=CACHE_BYTES)
        return self._selectors[layer]

    def stream(self, ids: list, max_tokens: int) -> tuple:
        """(text, seconds to the first text, the engine's generated token count or None) for one greedy request."""
        body = {
            "model": self.model_id,
            "prompt": ids,
            "max_tokens": max_tokens,
            "temperature": 0,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        start, first, text, tokens = time.perf_counter(), None, [], None
        for data in self.upstream.stream("/completions", body):
            if data == "[DONE]":
                break
            chunk = json.loads(data)
            if "error" in chunk:
                from gemfilter.toolkit.serving.upstream import UpstreamError

                raise UpstreamError(502, f"the engine's stream failed: {chunk['error']}")
            piece = "".join(c.get("text", "") for c in chunk.get("choices") or [])
            if piece and first is None:
                first = time.perf_counter() - start
            text.append(piece)
            tokens = (chunk.get("usage") or {}).get("completion_tokens", tokens)
        return "".join(text), first, tokens


def converse_engine(
    turns: EngineTurns,
    spec,
    protocol: str,
    mode: str,
    length: int,
    task: str,
    sample: dict,
    topk: int | None = None,
    layer: int | None = None,
) -> dict:
    """One sample's conversation through the engine, with the fields of :func:`eval.scbench.runner.converse`'s rows.

    spec: the method's :class:`~gemfilter.methods.Spec`; protocol: ``full`` or ``reselect``; topk, layer: the
    command line's defaults for a spec that sets none (None: the method's own).
    """
    prompts = build_prompts(sample, task, mode)
    count = len(prompts.ground_truth)
    cut = max_input_length(task, length, count, mode)
    new = get_task(task).max_new_tokens
    from gemfilter.apply import resolve

    layer = None if protocol == "full" else resolve(turns.model, spec.method(length, topk=topk, layer=layer)).layer
    rows = []
    for t in range(count):
        ids = turn_input_ids(prompts, turns.tokenizer, t, max_length=cut)
        start = time.perf_counter()
        kept, reused = ids, 0
        if layer is not None:
            choice = turns.selector(layer).choose(ids, spec, topk)
            kept, reused = choice.ids, choice.reused
        sent = time.perf_counter() - start
        text, first, tokens = turns.stream(kept, new)
        if first is None:  # an empty answer (EOS first): its first token came with the end
            first = time.perf_counter() - start - sent
        truth = prompts.ground_truth[t]
        rows.append(
            {
                "turn_idx": t,
                "prediction": text,
                "ground_truth": truth,
                "score": score_one(task, text, truth),
                "ttft_s": round(sent + first, 4),
                "total_s": round(time.perf_counter() - start, 4),
                "kept": len(kept),
                "history_tokens": len(ids),
                "selection_s": round(sent, 4),
                "selector_cached_tokens": reused,
                "new_tokens": tokens,
            }
        )
    return {"turns": rows, "prefill_s": None}
