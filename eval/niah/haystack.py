"""NIAH context building: the library owns it (``gemfilter.toolkit.haystack``); this module re-exports it.

``gemfilter`` needs the needle, the haystack and the prompt builder too (bench, calibrate, inspect),
and the library never imports ``eval``, so they live in ``gemfilter.toolkit.haystack``. Existing imports
of ``eval.niah.haystack`` keep working.
"""

from gemfilter.toolkit.haystack import (  # noqa: F401
    FINAL_CONTEXT_LENGTH_BUFFER,
    KAMRADT_SUFFIX,
    KAMRADT_SYSTEM,
    NEEDLE,
    PROMPTS,
    PROTOCOLS,
    QUESTION,
    TEMPLATES,
    Haystack,
    NeedleCase,
    build_case,
    chat_prompt,
    default_haystack_dir,
    insert_needle,
    make_haystack,
    period_token_ids,
    read_haystack,
)
