"""Generate through a serving engine: the selection runs here, the generation on the engine (``--engine URL``).

Paper: Shi et al. 2024, Algorithm 2: steps 1-4 (the filter pass) on the local model, step 5 (generate
from the k kept tokens at positions 0..k-1) on any OpenAI-compatible engine, which receives the kept
ids as an ordinary prompt. ``full`` sends the whole prompt. The eval runners call :func:`generator` and
use what it returns in place of :func:`gemfilter.generate`.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

from gemfilter.toolkit.serving.selector import prompt_methods


def check_engine_methods(engine: str | None, classes: dict) -> None:
    """Refuse, before anything loads, methods that cannot run in front of ``engine`` (nothing to check without one).

    classes: {label: method class} (a plan's ``{s.label: s.cls}``); a class says whether it serves an engine.
    """
    bad = [label for label, cls in classes.items() if engine is not None and not cls.serves_engine]
    if bad:
        raise ValueError(
            f"--engine runs the selection here and the generation on the engine, so it takes methods "
            f"that pick prompt tokens: {', '.join(prompt_methods())}; not {', '.join(bad)} (KV-cache "
            "methods evict inside the model)"
        )


@dataclass
class EngineOutput:
    """What :func:`engine_generate` returns; the fields the runners read from :class:`gemfilter.GemFilterOutput`.

    new_tokens: (1, t) generated ids; kept: prompt tokens sent, per row; kept_text: the decoded kept tokens
    (None for ``full``); selection: the local selection (None for ``full``); text: the engine's answer.
    """

    new_tokens: object
    kept: list
    kept_text: list | None
    selection: object
    text: str
    budget: object = None  # the engine's KV cache is not visible from here


def engine_generate(
    upstream,
    model,
    inputs,
    *,
    method,
    tokenizer=None,
    max_new_tokens: int = 50,
    min_new_tokens: int | None = None,
    eos_token_id=None,
    **unused,
) -> EngineOutput:
    """Greedy generation on ``upstream`` (an :class:`~gemfilter.toolkit.serving.upstream.Upstream`) from
    ``method``'s kept tokens.

    inputs: a tokenizer output with ``input_ids`` (1, n); model: the local model the selection runs on;
    eos_token_id: extra stop ids (sent as vLLM's ``stop_token_ids``); min_new_tokens: vLLM's ``min_tokens``.
    """
    import torch

    ids = inputs["input_ids"]
    if ids.shape[0] != 1:
        raise ValueError(f"--engine sends one prompt per request; got a batch of {ids.shape[0]}")
    check_engine_methods(upstream.url, {method.name: type(method)})
    from gemfilter.methods import FullMethod

    selection = None
    if isinstance(method, FullMethod):
        kept = ids[0]
    else:
        selection = method.select(model, ids, tokenizer=tokenizer)
        kept = selection.kept_ids[0]
    body = {
        "model": upstream.default_model(),
        "prompt": kept.tolist(),
        "max_tokens": max_new_tokens,
        "temperature": 0,
        "return_token_ids": True,
    }
    if min_new_tokens:
        body["min_tokens"] = min_new_tokens
    if eos_token_id is not None:
        body["stop_token_ids"] = [eos_token_id] if isinstance(eos_token_id, int) else list(eos_token_id)
    choice = upstream.complete("/completions", body)["choices"][0]  # no choices: UpstreamError (502)
    if not isinstance(choice.get("text", ""), str):
        from gemfilter.toolkit.serving.upstream import UpstreamError

        raise UpstreamError(502, f"the engine at {upstream.url} answered a choice without text: {choice!r:.200}")
    new = choice.get("token_ids")
    if new is None:  # an engine without vLLM's return_token_ids: re-encode its text
        new = tokenizer(choice.get("text", ""), add_special_tokens=False)["input_ids"] if tokenizer is not None else []
    text = None if selection is None or tokenizer is None else selection.kept_text(tokenizer)
    return EngineOutput(
        new_tokens=torch.tensor([new], dtype=torch.long),
        kept=[len(kept)],
        kept_text=text,
        selection=selection,
        text=choice.get("text", ""),
    )


def generator(engine: str | None, tokenizer=None, timeout: float = 600.0):
    """``gemfilter.generate`` when ``engine`` is None, else :func:`engine_generate` bound to that engine.

    With an engine and a tokenizer, the engine's tokenizer is checked against it first.
    """
    if engine is None:
        from gemfilter.apply import generate

        return generate
    from gemfilter.toolkit.serving.upstream import Upstream, check_tokenizer

    upstream = Upstream(engine, timeout=timeout)
    if tokenizer is not None:
        check_tokenizer(upstream, tokenizer, upstream.default_model())
    return partial(engine_generate, upstream)


def engine_field(engine: str | None) -> dict:
    """What an eval row records of the engine: ``{"engine": URL}``, or nothing for a row generated here (whose
    format has no engine field)."""
    return {} if engine is None else {"engine": engine}


def add_engine_argument(parser) -> None:
    """The ``--engine URL`` option the eval commands share."""
    parser.add_argument(
        "--engine",
        default=None,
        metavar="URL",
        help="generate on an OpenAI-compatible engine at URL (e.g. vLLM at http://127.0.0.1:8000/v1, "
        "serving the same model): the selection runs here, the engine generates from the kept "
        "token ids (full rows send the whole prompt); prompt methods only; rows record the engine",
    )
