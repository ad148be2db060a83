"""Binary classification tasks for the label-flip experiment: one registry, three sources.

Paper: Z. Shi, dissertation (2024), Sec. 5.6 (after Wei et al. 2023 and Min et al. 2022): five
binary GLUE tasks plus Subj; only SST-2 is named, so :data:`PAPER_DATASETS` is our documented guess.

A task is data (a frozen :class:`Task` in :data:`TASKS`): where it lives on the hub, which record
fields form the input and under which names they appear in the prompt, and one label word per
label id. Records are loaded

- from the Hugging Face hub through ``datasets`` (offline: a ConnectionError that says what to do),
- from ``<data_dir>/<task>/<split>.jsonl`` (the same field names as on the hub, one JSON per line),
- or generated here (``synthetic``: sentiment words inside neutral filler, no download).

Every loader returns a list of ``Example(inputs=(text, ...), label=int)``.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Task:
    """One binary task. fields: ((record key, name shown in the prompt), ...); label_words[i] is the
    word for label id i; hub: (path, config) for ``datasets.load_dataset`` or None (generated)."""

    name: str
    fields: tuple
    label_words: tuple
    hub: tuple | None = None
    train_split: str = "train"
    eval_split: str = "validation"  # GLUE test labels are hidden (-1), so we evaluate on validation
    label_key: str = "label"
    note: str = ""


_GLUE = "nyu-mll/glue"
TASKS = {
    t.name: t
    for t in (
        Task(
            "sst2",
            (("sentence", "sentence"),),
            ("negative", "positive"),
            (_GLUE, "sst2"),
            note="movie-review sentiment; 872 validation sentences",
        ),
        Task(
            "subj",
            (("text", "sentence"),),
            ("objective", "subjective"),
            ("SetFit/subj", None),
            eval_split="test",
            note="Pang & Lee subjectivity (SetFit copy: label 0 objective, 1 subjective)",
        ),
        Task(
            "cola",
            (("sentence", "sentence"),),
            ("unacceptable", "acceptable"),
            (_GLUE, "cola"),
            note="grammatical acceptability",
        ),
        Task(
            "rte",
            (("sentence1", "sentence1"), ("sentence2", "sentence2")),
            ("true", "false"),
            (_GLUE, "rte"),
            note="entailment (0) -> true; Min et al. use True/False for sentence pairs",
        ),
        Task(
            "qnli",
            (("question", "question"), ("sentence", "sentence")),
            ("true", "false"),
            (_GLUE, "qnli"),
            note="the sentence answers the question (0 = entailment) -> true",
        ),
        Task(
            "mrpc",
            (("sentence1", "sentence1"), ("sentence2", "sentence2")),
            ("false", "true"),
            (_GLUE, "mrpc"),
            note="paraphrase (1 = equivalent) -> true",
        ),
        Task(
            "qqp",
            (("question1", "question1"), ("question2", "question2")),
            ("false", "true"),
            (_GLUE, "qqp"),
            note="duplicate questions (1) -> true",
        ),
        Task(
            "synthetic",
            (("sentence", "sentence"),),
            ("negative", "positive"),
            None,
            eval_split="test",
            note="generated here: one sentiment word inside neutral filler; no download",
        ),
    )
}

#: ``--preset paper``'s datasets: the paper's five (SST-2, named in its text, and Subj; the spec's candidates RTE,
#: QQP and MRPC, after Wei et al. 2023's binary tasks) plus QNLI, one beyond them (docs/icl-probes.md says so;
#: ``--datasets sst2,rte,qqp,mrpc,subj`` runs the five).
PAPER_DATASETS = ("sst2", "rte", "qqp", "mrpc", "qnli", "subj")


@dataclass(frozen=True)
class Example:
    inputs: tuple  # one string per Task.fields entry
    label: int


def get_task(name: str) -> Task:
    if name not in TASKS:
        raise ValueError(
            f"unknown dataset {name!r}; allowed: {', '.join(TASKS)} "
            "(python -m icl_probes.label_flip datasets lists them)"
        )
    return TASKS[name]


def to_example(task: Task, record: dict, where: str) -> Example:
    """Validate one raw record (hub or JSONL) and turn it into an Example."""
    if not isinstance(record, dict):
        raise ValueError(f"{where}: a record must be a JSON object, got {type(record).__name__}")
    keys = [k for k, _ in task.fields] + [task.label_key]
    missing = [k for k in keys if k not in record]
    if missing:
        raise ValueError(
            f"{where}: record lacks {', '.join(missing)}; {task.name} records need the fields {', '.join(keys)}"
        )
    label = record[task.label_key]
    if isinstance(label, bool) or not isinstance(label, int) or not 0 <= label < len(task.label_words):
        raise ValueError(
            f"{where}: label must be an int in 0..{len(task.label_words) - 1} "
            f"({', '.join(task.label_words)}), got {label!r} (GLUE test splits hide labels as -1: "
            "evaluate on validation)"
        )
    return Example(tuple(str(record[k]).strip() for k, _ in task.fields), label)


def load_local(task: Task, split: str, data_dir) -> list:
    """Examples of ``<data_dir>/<task>/<split>.jsonl``; FileNotFoundError says what is expected."""
    path = Path(data_dir) / task.name / f"{split}.jsonl"
    if not path.is_file():
        raise FileNotFoundError(
            f"{path} not found; --data-dir must hold <task>/<split>.jsonl files with the hub's "
            f"field names, here {task.name}/{split}.jsonl with {', '.join(k for k, _ in task.fields)}, "
            f"{task.label_key}"
        )
    out = []
    for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if line.strip():
            try:
                raw = json.loads(line)
            except json.JSONDecodeError as err:
                raise ValueError(f"{path}:{i}: not valid JSON ({err.msg})") from err
            out.append(to_example(task, raw, f"{path}:{i}"))
    return out


def load_hub(task: Task, split: str) -> list:
    """``datasets.load_dataset(*task.hub, split=split)``; offline -> ConnectionError pointing to --data-dir."""
    import datasets

    path, config = task.hub
    try:
        ds = datasets.load_dataset(path, config, split=split)
    except Exception as err:  # noqa: BLE001 - offline mode, no connection, missing cache: same advice
        raise ConnectionError(
            f"could not load {path}{'/' + config if config else ''} split {split!r} from the Hugging Face hub "
            f"({type(err).__name__}: {err}). Without the hub, export the split elsewhere "
            f"(datasets.load_dataset(...).to_json('{task.name}/{split}.jsonl')) and pass --data-dir FOLDER, "
            f"or run the offline task: --datasets synthetic."
        ) from err
    return [to_example(task, dict(r), f"{path}[{i}]") for i, r in enumerate(ds)]


# Synthetic task: a sentiment word inside neutral filler, so the label is decided by one word.
POSITIVE = (
    "wonderful",
    "excellent",
    "delightful",
    "superb",
    "great",
    "lovely",
    "brilliant",
    "fantastic",
    "pleasant",
    "charming",
    "enjoyable",
    "marvelous",
)
NEGATIVE = (
    "terrible",
    "awful",
    "dreadful",
    "horrible",
    "boring",
    "disappointing",
    "poor",
    "bad",
    "unpleasant",
    "dull",
    "miserable",
    "annoying",
)
SUBJECTS = (
    "the film",
    "the meal",
    "the hotel",
    "the concert",
    "the book",
    "the trip",
    "the game",
    "the show",
    "the class",
    "the museum",
    "the café",
    "the new phone",
)
OPENERS = (
    "on tuesday afternoon",
    "after the long drive",
    "according to my cousin",
    "during the holidays",
    "last weekend",
    "in the old town",
    "before the rain started",
    "at the end of march",
)
TAILS = (
    "and we paid in cash",
    "and the bus left at noon",
    "and the room was on the second floor",
    "and my neighbour came along",
    "and it lasted about two hours",
    "and the tickets were printed",
)


def synthetic_examples(split: str, n: int = 2000) -> list:
    """``n`` generated examples; train and test come from different seeds (different sentences).

    Each sentence is "<opener> , <subject> was <word> <tail>" with a balanced label: the one word
    decides it and the rest is neutral filler.
    """
    rng = random.Random(f"label_flip-synthetic-{split}")
    out = []
    for i in range(n):
        label = i % 2
        word = rng.choice(POSITIVE if label else NEGATIVE)
        text = f"{rng.choice(OPENERS)} , {rng.choice(SUBJECTS)} was {word} {rng.choice(TAILS)}"
        out.append(Example((text,), label))
    rng.shuffle(out)
    return out


def load_examples(task: Task, split: str, data_dir=None, loader=None) -> list:
    """Examples of one split. Order: ``loader(task, split)`` if given (tests, custom sources), the
    generator for tasks without a hub entry, ``data_dir`` if given, else the hub."""
    if loader is not None:
        records = loader(task, split)
        return [
            r if isinstance(r, Example) else to_example(task, r, f"{task.name}/{split}[{i}]")
            for i, r in enumerate(records)
        ]
    if task.hub is None:
        return synthetic_examples(split)
    if data_dir is not None:
        return load_local(task, split, data_dir)
    return load_hub(task, split)


def describe() -> str:
    """One line per registered task (the ``datasets`` subcommand)."""
    rows = []
    for t in TASKS.values():
        src = "generated" if t.hub is None else "/".join(x for x in t.hub if x)
        fields = ", ".join(name for _, name in t.fields)
        rows.append(
            f"{t.name:10s} {src:22s} fields: {fields:22s} labels: {'/'.join(t.label_words):24s} "
            f"eval: {t.eval_split:10s} {t.note}"
        )
    return "\n".join(rows)
