"""The measured blocks of the docs: the text a page holds between ``<!-- name -->`` and ``<!-- /name -->``.

A page marks each table that a committed run printed with a pair of HTML comments (the opening one may carry a
note after a colon, ``<!-- name: lines from ... -->``); the measured-rows tests read the block and compare it with
the rows scored again. One reader, so that a missing or misspelt marker fails with the page and name, not with an
``AttributeError`` on ``None``.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parents[1] / "docs"


def docs_block(page: str, name: str) -> str:
    """The text of ``docs/<page>`` between its markers ``<!-- name -->`` (or ``<!-- name: note -->``) and
    ``<!-- /name -->``, markers left out."""
    text = (DOCS / page).read_text(encoding="utf-8")
    opening = re.search(rf"<!-- {re.escape(name)}(?::[^>]*)? -->", text)
    closing = text.find(f"<!-- /{name} -->", opening.end() if opening else 0)
    if opening is None or closing < 0:
        pytest.fail(f"docs/{page} has no block <!-- {name} --> ... <!-- /{name} -->")
    return text[opening.end() : closing]


def table_lines(block: str, header: str = "| method") -> list:
    """The table rows of ``block``: its lines that start with ``| ``, less the header rows (those starting with
    ``header``) and the separator rows."""
    return [x for x in block.splitlines() if x.startswith("| ") and not x.startswith(header)]
