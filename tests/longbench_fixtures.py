"""Small LongBench-format record files written by the tests (no network, no downloaded data).

- :func:`write_english`: hand-written hotpotqa, triviaqa and passage_retrieval_en records (tasks with
  32-token answers) for the embedded Gemma model, whose tokenizer knows English.
- :func:`write_words`: the same three tasks with contexts of ``w<i>`` words, the vocabulary of the
  ``tiny_model_dir`` word-level tokenizer (its template words all map to <unk>).
- ``e=True`` also writes ``<task>_e.jsonl`` with lengths in each LongBench-E bucket.
"""

import json
import random
from pathlib import Path

TASKS = ("hotpotqa", "triviaqa", "passage_retrieval_en")

ENGLISH = {
    "hotpotqa": [
        (
            "Which city is the capital of the country where the Eiffel Tower stands?",
            "Passage 1:\nEiffel Tower\nThe Eiffel Tower is a wrought-iron lattice tower in France. It was built by "
            "Gustave Eiffel's company for the 1889 World's Fair.\n\nPassage 2:\nFrance\nFrance is a country in Western "
            "Europe. Its capital and largest city is Paris, on the river Seine.\n\nPassage 3:\nSeine\nThe Seine is a "
            "river that flows through Paris into the English Channel.",
            ["Paris"],
        ),
        (
            "Who wrote the novel on which the film Blade Runner is based?",
            "Passage 1:\nBlade Runner\nBlade Runner is a 1982 science fiction film directed by Ridley Scott. It is "
            "based on the novel Do Androids Dream of Electric Sheep?\n\nPassage 2:\nDo Androids Dream of Electric "
            "Sheep?\nDo Androids Dream of Electric Sheep? is a 1968 novel by the American writer Philip K. Dick.",
            ["Philip K. Dick"],
        ),
        (
            "In which year was the composer of the opera Carmen born?",
            "Passage 1:\nCarmen\nCarmen is an opera in four acts by the French composer Georges Bizet.\n\nPassage 2:\n"
            "Georges Bizet\nGeorges Bizet was a French composer of the Romantic era, born in 1838 in Paris.",
            ["1838"],
        ),
    ],
    "triviaqa": [
        (
            "Passage: The Pacific is the largest ocean on Earth.\nQuestion: Which is the largest ocean?\nAnswer:",
            "Passage: Mount Everest is the highest mountain above sea level.\nQuestion: What is the highest "
            "mountain?\nAnswer: Mount Everest\n\nPassage: The Nile flows north through Egypt.\nQuestion: Which river "
            "flows through Egypt?\nAnswer: The Nile",
            ["Pacific", "The Pacific Ocean"],
        ),
        (
            "Passage: Jupiter is the largest planet in the Solar System.\nQuestion: Which is the largest planet?\n"
            "Answer:",
            "Passage: Mercury is the planet closest to the Sun.\nQuestion: Which planet is closest to the "
            "Sun?\nAnswer: Mercury",
            ["Jupiter"],
        ),
        (
            "Passage: William Shakespeare wrote Hamlet.\nQuestion: Who wrote Hamlet?\nAnswer:",
            "Passage: Jane Austen wrote Emma.\nQuestion: Who wrote Emma?\nAnswer: Jane Austen",
            ["William Shakespeare"],
        ),
    ],
    "passage_retrieval_en": [
        (
            "The tower was built for a world's fair in 1889 and became a symbol of Paris.",
            "Paragraph 1: The Great Wall of China is a series of fortifications in northern China.\n\nParagraph 2: "
            "The Eiffel Tower was built for the 1889 World's Fair and is now a global icon of Paris.\n\nParagraph 3: "
            "The Colosseum is an ancient amphitheatre in the centre of Rome.",
            ["Paragraph 2"],
        ),
        (
            "An amphitheatre in Rome that held gladiator contests.",
            "Paragraph 1: The Colosseum is an ancient amphitheatre in Rome, used for gladiator contests.\n\n"
            "Paragraph 2: Big Ben is the nickname of the great bell of the clock in London.",
            ["Paragraph 1"],
        ),
        (
            "A bell tower clock in London.",
            "Paragraph 1: Machu Picchu is an Inca citadel in Peru.\n\nParagraph 2: Big Ben is the great bell of the "
            "clock at the Palace of Westminster in London.",
            ["Paragraph 2"],
        ),
    ],
}
E_LENGTHS = (1200, 5000, 9000)  # one record per LongBench-E bucket: 0-4k, 4-8k, 8k+


def _record(task, i, question, context, answers, length=None):
    return {
        "input": question,
        "context": context,
        "answers": answers,
        "length": len(context.split()) if length is None else length,
        "dataset": task,
        "language": "en",
        "all_classes": None,
        "_id": f"{task}-{i:03d}",
    }


def _write(folder: Path, name: str, records) -> None:
    with open(folder / f"{name}.jsonl", "w", encoding="utf-8") as f:
        f.writelines(json.dumps(r) + "\n" for r in records)


def write_english(folder, e: bool = False) -> Path:
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    for task, items in ENGLISH.items():
        _write(folder, task, [_record(task, i, *item) for i, item in enumerate(items)])
        if e:
            _write(
                folder,
                task + "_e",
                [_record(task, i, *item, length=n) for i, (item, n) in enumerate(zip(items, E_LENGTHS))],
            )
    return folder


def word_records(task: str, n: int = 3, words: int = 30, seed: int = 0) -> list:
    """n records of ``w<i>`` words; the answer is a word of the context ("Paragraph k" for retrieval)."""
    rng = random.Random(f"{seed}-{task}")
    records = []
    for i in range(n):
        context = " ".join(f"w{rng.randrange(4, 96)}" for _ in range(words))
        question = " ".join(f"w{rng.randrange(4, 96)}" for _ in range(4))
        answer = [f"Paragraph {rng.randrange(1, 4)}"] if task == "passage_retrieval_en" else [context.split()[5]]
        records.append(_record(task, i, question, context, answer))
    return records


def write_words(folder, e: bool = False, n: int = 3, words: int = 30) -> Path:
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    for task in TASKS:
        records = word_records(task, n, words)
        _write(folder, task, records)
        if e:
            _write(folder, task + "_e", [{**r, "length": E_LENGTHS[i % 3]} for i, r in enumerate(records)])
    return folder
