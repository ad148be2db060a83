"""The eval runners' ``--engine`` generator: :func:`gemfilter.serve.engine.engine_generate` on a
:class:`~gemfilter.serve.upstream.CheckedUpstream`, so that an engine answering ``{}``, no choices, a cut
body or HTML ends the run with one ``error:`` line (an :class:`~gemfilter.serve.upstream.UpstreamError`,
an OSError) and never becomes a stored row: the cell stays missing, and a rerun computes it.
"""

from __future__ import annotations


def generator(engine: str | None, tokenizer=None, timeout: float = 600.0):
    """``gemfilter.generate`` when ``engine`` is None, else engine generation whose every answer is checked.

    tokenizer: checked against the engine's first (a different tokenizer is refused before any cell).
    """
    from functools import partial

    from gemfilter.serve import engine as serve_engine

    if engine is None:
        return serve_engine.generator(None)
    from gemfilter.serve.cli import check_tokenizer
    from gemfilter.serve.upstream import CheckedUpstream

    upstream = CheckedUpstream(engine, timeout=timeout)
    if tokenizer is not None:
        check_tokenizer(upstream, tokenizer, upstream.default_model())
    return partial(serve_engine.engine_generate, upstream)
