"""LongBench v1 prediction for one record: prompt, middle truncation, optional chat template, greedy generation.

Source: THUDM/LongBench (v1) ``pred.py`` (``get_pred``), steps in its order:

1. ``prompt = template.format(**record)``;
2. tokenize with the tokenizer's default special tokens; if longer than ``max_length`` keep
   ``decode(ids[:half], skip_special_tokens=True) + decode(ids[-half:], skip_special_tokens=True)``
   with ``half = int(max_length / 2)`` (the middle of a long context matters least; both ends hold
   instructions and question);
3. the chat template (optional, never for trec, triviaqa, samsum, lcc, repobench-p), after truncation;
4. greedy generation with the task's ``max_new_tokens``; samsum also stops at a newline token and
   generates at least one token (pred.py's ``min_length=context_length+1``);
5. decode only the new tokens with ``skip_special_tokens=True``.

The generation goes through ``gemfilter.generate`` so any registered method (full, gemfilter,
snapkv, ...) answers the same prompt.
"""

from __future__ import annotations

CONTEXT_MARGIN = 500  # tokens left for the template's question and the answer (official: 4096 -> 3500)


def default_max_length(model) -> int:
    """The model's context window minus :data:`CONTEXT_MARGIN` (official configs: 3500 / 15500 / 31500).

    model: a model or its transformers config (no weights needed).
    """
    window = getattr(getattr(model, "config", model), "max_position_embeddings", None)
    if not isinstance(window, int) or window <= CONTEXT_MARGIN + 1:
        raise ValueError(
            f"cannot derive --max-length from the model's max_position_embeddings={window!r} "
            f"(need > {CONTEXT_MARGIN + 1}); pass --max-length explicitly"
        )
    return window - CONTEXT_MARGIN


def check_max_length(max_length) -> None:
    """ValueError unless ``max_length`` is an int >= 2 (each half keeps max_length // 2 >= 1 tokens)."""
    if isinstance(max_length, bool) or not isinstance(max_length, int) or max_length < 2:
        raise ValueError(
            f"--max-length must be an int >= 2 (prompt tokens kept after middle truncation), got {max_length!r}"
        )


def truncate_middle(prompt: str, tokenizer, max_length: int) -> str:
    """Keep the first and last ``max_length // 2`` tokens of ``prompt`` (pred.py's middle truncation).

    Tokenized with the tokenizer's default special tokens (so a BOS counts), each half decoded with
    ``skip_special_tokens=True`` and the two joined with no separator, exactly as pred.py. Both halves
    use ``int(max_length / 2)``, as pred.py does (Python's ``ids[-max_length//2:]`` would keep one
    more token for an odd max_length). A prompt that fits is returned unchanged, not re-decoded.
    """
    check_max_length(max_length)
    ids = tokenizer(prompt, truncation=False)["input_ids"]
    if len(ids) <= max_length:
        return prompt
    half = max_length // 2
    return tokenizer.decode(ids[:half], skip_special_tokens=True) + tokenizer.decode(
        ids[-half:], skip_special_tokens=True
    )


def apply_chat_template(prompt: str, tokenizer) -> str:
    """The prompt as one user turn of the tokenizer's chat template, with the generation prompt."""
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError(
            "--chat-template was given but this tokenizer has no chat template; "
            "drop --chat-template (the GemFilter paper's Table 9.1 uses none) or use a chat model"
        )
    return tokenizer.apply_chat_template(
        [{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True
    )


def prepare(task, record: dict, tokenizer, max_length: int, chat_template: bool = False):
    """(text, add_special_tokens) to tokenize for generation.

    With a chat template the text already holds the template's special tokens (BOS included), so it is
    tokenized without adding more; otherwise with the defaults, as pred.py tokenizes.
    """
    text = truncate_middle(task.prompt(record), tokenizer, max_length)
    if chat_template and task.chat:
        return apply_chat_template(text, tokenizer), False
    return text, True


def generation_kwargs(task, tokenizer) -> dict:
    """``model.generate`` kwargs: max_new_tokens, plus samsum's newline stop and at least one new token."""
    kw = {"max_new_tokens": task.max_new_tokens}
    if task.config == "samsum":
        # pred.py: eos_token_id=[tokenizer.eos_token_id, tokenizer.encode("\n", add_special_tokens=False)[-1]]
        # stops the model from endlessly repeating "\nDialogue: ..."; min_length=context+1 = one new token.
        newline = tokenizer.encode("\n", add_special_tokens=False)
        stops = [tokenizer.eos_token_id] + newline[-1:]
        kw["eos_token_id"] = [t for t in stops if t is not None]
        kw["min_new_tokens"] = 1
    return kw


def predict(
    model, tokenizer, method, task, record: dict, max_length: int, chat_template: bool = False, generate=None
) -> dict:
    """Generate one record's answer with ``method``; returns pred, kept, prompt_tokens, and the measured
    ``kv_rows`` per layer, ``propagated`` tokens and, for ``gemfilter-asl``, ``selected_layers`` (not for an
    engine's answer).

    model, tokenizer: a causal LM and its tokenizer; method: a resolved registry method object;
    task: a row of ``TASKS``; max_length: prompt tokens kept by middle truncation; generate:
    ``gemfilter.generate`` (the default) or an engine's (``gemfilter.toolkit.serving.engine.generator``).
    """
    import gemfilter

    text, add_special = prepare(task, record, tokenizer, max_length, chat_template)
    enc = tokenizer(text, return_tensors="pt", add_special_tokens=add_special).to(model.device)
    if enc["input_ids"].shape[1] == 0:
        raise ValueError(
            f"{task.config} record {record.get('_id')!r}: the prompt is empty after truncation "
            "(the tokenizer decoded every kept token to nothing); check the tokenizer"
        )
    out = (generate or gemfilter.generate)(
        model, enc, method=method, tokenizer=tokenizer, **generation_kwargs(task, tokenizer)
    )
    from gemfilter.apply import budget_fields

    return {
        "pred": tokenizer.decode(out.new_tokens[0], skip_special_tokens=True),
        "kept": int(out.kept[0]),
        "prompt_tokens": int(enc["input_ids"].shape[1]),
        **budget_fields(out),
    }
