"""RULER ``prepare``: size every sample to the token budget with the model's tokenizer, write one JSONL per task and
length.

Source: NVIDIA/RULER ``scripts/data/prepare.py`` and the ``generate_samples`` / ``sys_*`` functions of
each generator. A length L is RULER's ``max_seq_length``: prompt tokens (counted by the tokenizer
without special tokens, as its ``HFTokenizer.text_to_tokens``) plus ``tokens_to_generate`` must be at
most L. The haystack size is found as the official code finds it:

- niah, vt, cwe, qa: estimate tokens per haystack unit from one sample, then binary-search the largest
  size whose prompt fits; each sample starts from that size and steps down by the increment while it
  does not fit (its random draws can make it longer);
- fwe: grow the word count by L/32 until the text reaches the budget, step back once; each sample steps
  down while it exceeds it.

Output layout (RULER's ``<save_dir>/<task>/validation.jsonl``): ``OUT/<L>/data/<task>/validation.jsonl``,
one row per sample with the official fields ``index``, ``input`` (the prompt up to the answer prefix),
``outputs`` (the expected answers), ``length`` (prompt tokens + tokens_to_generate),
``length_w_model_temp``, ``answer_prefix`` and, for niah, ``token_position_answer``. Rows are written
with sorted keys, so the same seed and tokenizer give byte-identical files. Sample i depends only on
the seed and the samples before it, so a file of N samples starts with the file of n < N samples.
"""

from __future__ import annotations

import json
from pathlib import Path

from gemfilter.toolkit.io import read_json_object, read_jsonl, write_json_atomic, write_text_atomic

from . import synthetic
from .qa import load_qa, qa
from .sources import DEFAULT_SPLITTER, LEGACY_SPLITTER, get_splitter
from .synthetic import Rng
from .tasks import Task

DEFAULT_SEED = 42  # RULER's --random_seed
SUBSET = "validation"


def data_file(out, length: int, task: str) -> Path:
    """``OUT/<length>/data/<task>/validation.jsonl``."""
    return Path(out) / str(length) / "data" / task / f"{SUBSET}.jsonl"


def token_counter(tokenizer):
    """len(tokens) of a text, without special tokens (RULER's ``text_to_tokens``)."""
    return lambda text: len(tokenizer(text, add_special_tokens=False)["input_ids"])


def binary_search(make, count, budget: int, lower: int, upper: int, extra: int):
    """Largest size in [lower, upper] whose text + ``extra`` tokens fits ``budget`` (None if none does)."""
    best = None
    while lower <= upper:
        mid = (lower + upper) // 2
        text = make(mid)[0]
        if count(text) + extra <= budget:
            best, lower = mid, mid + 1
        else:
            upper = mid - 1
    return best


def _fit(make, count, budget: int, start: int, step: int, ttg: int, name: str) -> tuple:
    """One sample at size ``start``, stepping down by ``step`` while it is too long (official retry loop)."""
    used = start
    while True:
        text, answers = make(used)
        length = count(text) + ttg
        if length <= budget:
            return text, answers, length
        if used <= step:  # the official loop would retry forever here
            raise ValueError(
                f"{name}: no haystack size fits {budget} tokens (the template alone is {length}); use a longer length"
            )
        used -= step


def _estimate(make, count, unit: int) -> float:
    return count(make(unit)[0]) / unit


def _niah(
    task: Task, length: int, n: int, rng: Rng, count, *, haystack_dir=None, splitter=DEFAULT_SPLITTER, **_
) -> list:
    args, spec = task.args, task.spec
    essay = args["type_haystack"] == "essay"
    inc = 500 if essay else (5 if length < 4096 else 25)

    def make(size):
        return synthetic.niah(args, spec.full_template, rng, size, haystack_dir, splitter)

    est = int(length / _estimate(make, count, inc) * 3)
    size = binary_search(make, count, length, inc, max(est, inc * 2), spec.tokens_to_generate) or inc
    return [_fit(make, count, length, size, inc, spec.tokens_to_generate, task.name) for _ in range(n)]


def _vt(task: Task, length: int, n: int, rng: Rng, count, **_) -> list:
    args, spec = task.args, task.spec

    # The one-shot example: an ICL chain (3-letter names, value 12345) in at most 500 tokens.
    def make_icl(size):
        return synthetic.variable_tracking(args, spec.full_template, rng, size, is_icl=True)

    est = int(500 / _estimate(make_icl, count, 5) * 3)
    size = binary_search(make_icl, count, 500, 5, max(est, 10), 0) or 5
    text, answers, _ = _fit(make_icl, count, 500, size, 5, 0, task.name)
    example = text + " " + " ".join(answers) + "\n"
    example_tokens = count(example)

    inc = 5 if length < 4096 else 10

    def make(size):
        return synthetic.variable_tracking(args, spec.full_template, rng, size)

    def make_with_example(size):
        text, answers = make(size)
        return synthetic.randomize_icl(example, args["num_hops"], rng) + "\n" + text, answers

    est = int(length / _estimate(make, count, inc) * 3)
    size = binary_search(make, count, length, inc, max(est, inc * 2), example_tokens + spec.tokens_to_generate) or inc
    return [_fit(make_with_example, count, length, size, inc, spec.tokens_to_generate, task.name) for _ in range(n)]


def _cwe(task: Task, length: int, n: int, rng: Rng, count, **_) -> list:
    spec = task.spec
    vocab = synthetic.cwe_vocabulary(rng.seed)

    def make(size):
        return synthetic.common_words(task.args, spec.full_template, rng, size, vocab, length)

    est = int(length // _estimate(make, count, 4096)) * 2
    size = binary_search(make, count, length, 10, max(est, 20), spec.tokens_to_generate) or 10
    return [_fit(make, count, length, size, 10, spec.tokens_to_generate, task.name) for _ in range(n)]


def _fwe(task: Task, length: int, n: int, rng: Rng, count, **_) -> list:
    spec, alpha = task.spec, float(task.args["alpha"])
    budget = length - spec.tokens_to_generate
    vocab_size, inc = budget // 50, budget // 32
    if inc < 1:
        raise ValueError(f"{task.name}: length {length} leaves no room for the coded text")

    def text_of(vocab, words):
        return synthetic.freq_words_text(spec.full_template, vocab, words, alpha, rng)

    vocab = synthetic.fwe_vocabulary(rng, vocab_size)
    words = budget // 6
    while count(text_of(vocab, words)[0]) < budget:
        words += inc
    words -= inc
    rows = []
    for _ in range(n):
        vocab, used = synthetic.fwe_vocabulary(rng, vocab_size), words
        while count(text_of(vocab, used)[0]) > budget:
            used -= inc
        text, answers = text_of(vocab, used)
        rows.append((text, answers, count(text) + spec.tokens_to_generate))
    return rows


def _qa(task: Task, length: int, n: int, rng: Rng, count, *, data_dir=None, qa_data=None, **_) -> list:
    spec = task.spec
    data = qa_data if qa_data is not None else load_qa(task.args["dataset"], data_dir)
    est = int(length / _estimate(lambda size: qa(data, spec.full_template, rng, 0, size), count, 10) * 3)
    size = (
        binary_search(
            lambda s: qa(data, spec.full_template, rng, 0, s), count, length, 10, max(est, 20), spec.tokens_to_generate
        )
        or 10
    )
    return [
        _fit(
            lambda s, i=i: qa(data, spec.full_template, rng, i, s),
            count,
            length,
            size,
            10,
            spec.tokens_to_generate,
            task.name,
        )
        for i in range(n)
    ]


#: generator kind -> function(task, length, num_samples, rng, count, **sources) -> [(text, answers, length)]
PREPARERS = {
    "niah": _niah,
    "variable_tracking": _vt,
    "common_words_extraction": _cwe,
    "freq_words_extraction": _fwe,
    "qa": _qa,
}


def generate(task: Task, length: int, num_samples: int, tokenizer, seed: int = DEFAULT_SEED, **sources) -> list:
    """The rows of one task at one length (see the module docstring for the fields).

    tokenizer: the model's (HF) tokenizer; sources: haystack_dir (essays folder), data_dir (QA files),
    qa_data (an already loaded ``QAData``), splitter (a name in ``sources.SPLITTERS``; essays only).
    """
    if isinstance(num_samples, bool) or not isinstance(num_samples, int) or num_samples < 1:
        raise ValueError(f"--num-samples must be an int >= 1, got {num_samples!r}")
    count = token_counter(tokenizer)
    samples = PREPARERS[task.kind](task, length, num_samples, Rng(seed), count, **sources)
    prefix = task.spec.answer_prefix[:10]  # the official split point: the last occurrence of its first 10 characters
    rows = []
    for index, (text, answers, total) in enumerate(samples):
        cut = text.rfind(prefix)
        row = {
            "index": index,
            "input": text[:cut],
            "outputs": list(answers),
            "length": total,
            "length_w_model_temp": total,
            "answer_prefix": text[cut:],
        }
        if task.kind == "niah":  # tokens before the first answer (niah.py)
            row["token_position_answer"] = count(row["input"][: row["input"].find(answers[0])])
        rows.append(row)
    return rows


def write_rows(path: Path, rows: list) -> None:
    """Write rows as sorted-key JSON lines, atomically (a killed prepare leaves no half file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(path, "".join(json.dumps(r, ensure_ascii=False, sort_keys=True) + "\n" for r in rows))


def prepared_rows(path: Path) -> list:
    """Rows of a prepared file ([] if absent); CorruptFileError naming the line if one is damaged.

    Prepared files are written whole, so a bad line was edited by hand: it is an error, not skipped,
    because a skipped sample would shift every later index.
    """
    return read_jsonl(
        path,
        required=("index", "input", "outputs"),
        strict=True,
        fix=f"Delete {path} and rerun: prepare rewrites it byte-identically from the seed",
    )


IDENTITY = "prepare.json"


def identity(model, seed: int, haystack_dir=None, data_dir=None, splitter: str = DEFAULT_SPLITTER) -> dict:
    """What prepared samples depend on: tokenizer (model), seed, essays folder, QA data source, sentence splitter."""
    return {
        "tokenizer": model or "embedded:gemma3-270m",
        "seed": seed,
        "haystack_dir": None if haystack_dir is None else str(haystack_dir),
        "qa_data": "hub" if data_dir is None else str(data_dir),
        "splitter": get_splitter(splitter).name,
    }


def check_identity(out, ident: dict) -> None:
    """Refuse to add samples of another tokenizer / seed / source to ``OUT``; record them on first use."""
    path = Path(out) / IDENTITY
    if path.is_file():
        old = read_json_object(
            path,
            "RULER prepare identity",
            fix=f"Delete {path} and rerun with the settings the samples were prepared with (tokenizer, seed, sources)",
        )
        old.setdefault("splitter", LEGACY_SPLITTER)  # a prepare.json without the key: LEGACY_SPLITTER made it
        if old != ident:
            diff = ", ".join(f"{k}: {old.get(k)!r} there, {v!r} now" for k, v in ident.items() if old.get(k) != v)
            raise ValueError(
                f"{out} holds samples prepared with other settings ({diff}); use another --out, or "
                "repeat those settings (--splitter for the splitter)"
            )
    else:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_json_atomic(path, dict(sorted(ident.items())))


def prepare(
    tasks, lengths, num_samples: int, tokenizer, out, seed: int = DEFAULT_SEED, *, progress=None, **sources
) -> list:
    """Write ``OUT/<L>/data/<task>/validation.jsonl`` for each task and length; returns [(path, rows written or 0)].

    A file that already holds at least ``num_samples`` rows is kept (samples are prefix-stable, so its
    first rows are the ones a fresh prepare would write). progress: a callable(message) or None.
    """
    written = []
    qa_cache = {}
    for length in lengths:
        for task in tasks:
            path = data_file(out, length, task.name)
            if len(prepared_rows(path)) >= num_samples:
                written.append((path, 0))
                continue
            extra = dict(sources)
            if task.kind == "qa":
                key = task.args["dataset"]
                if key not in qa_cache:
                    qa_cache[key] = load_qa(key, sources.get("data_dir"))
                extra["qa_data"] = qa_cache[key]
            if progress:
                progress(f"prepare {task.name} at {length} tokens: {num_samples} samples")
            rows = generate(task, length, num_samples, tokenizer, seed, **extra)
            write_rows(path, rows)
            written.append((path, len(rows)))
    return written
