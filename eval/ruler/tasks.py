"""RULER tasks as data: the 13 task configs of ``synthetic.yaml`` on top of the 5 generator kinds.

Source: NVIDIA/RULER ``scripts/synthetic.yaml`` (per task: generator and its arguments),
``scripts/data/synthetic/constants.py`` (per generator: tokens_to_generate, template, answer_prefix)
and ``scripts/eval/synthetic/constants.py`` (per generator: metric). Templates and answer prefixes
are the official ones character for character: the model reads them, so a changed character is a
different benchmark. RULER's ``prepare.py`` builds the generator's template as
``model_template.format(task_template=template) + answer_prefix`` with the ``base`` model template
``"{task_template}"``, so the prompt a model sees is ``input + answer_prefix``.

Columns of :class:`Kind`: ``name`` (the generator), ``tokens_to_generate``, ``template``,
``answer_prefix``, ``metric`` (a name in ``eval.ruler.metrics.METRICS``).
Columns of :class:`Task`: ``name`` (the yaml key), ``kind``, ``args`` (the yaml arguments), ``short``
(report column label), ``offline`` (False for the two QA tasks, which need SQuAD / HotpotQA).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gemfilter.toolkit.options import MAX_TOKENS


@dataclass(frozen=True)
class Kind:
    """One RULER generator with its prompt and metric (``scripts/data/synthetic/constants.py``)."""

    name: str
    tokens_to_generate: int
    template: str
    answer_prefix: str
    metric: str

    @property
    def full_template(self) -> str:
        """What prepare.py hands the generator: the base model template, then the answer prefix."""
        return self.template + self.answer_prefix


KINDS = {
    k.name: k
    for k in (
        Kind(
            "niah",
            128,
            "Some special magic {type_needle_v} are hidden within the following text. Make sure to memorize it. "
            "I will quiz you about the {type_needle_v} afterwards.\n{context}\nWhat are all the special magic "
            "{type_needle_v} for {query} mentioned in the provided text?",
            " The special magic {type_needle_v} for {query} mentioned in the provided text are",
            "string_match_all",
        ),
        Kind(
            "variable_tracking",
            30,
            "Memorize and track the chain(s) of variable assignment hidden in the following text.\n\n{context}\n"
            "Question: Find all variables that are assigned the value {query} in the text above.",
            " Answer: According to the chain(s) of variable assignment in the text above, {num_v} variables are "
            "assigned the value {query}, they are: ",
            "string_match_all",
        ),
        Kind(
            "common_words_extraction",
            120,
            "Below is a numbered list of words. In these words, some appear more often than others. Memorize the "
            "ones that appear most often.\n{context}\nQuestion: What are the 10 most common words in the above list?",
            " Answer: The top 10 words that appear most often in the list are:",
            "string_match_all",
        ),
        Kind(
            "freq_words_extraction",
            50,
            "Read the following coded text and track the frequency of each coded word. Find the three most "
            "frequently appeared coded words. {context}\nQuestion: Do not provide any explanation. Please ignore "
            "the dots '....'. What are the three most frequently appeared words in the above coded text?",
            " Answer: According to the coded text above, the three most frequently appeared words are:",
            "string_match_all",
        ),
        Kind(
            "qa",
            32,
            "Answer the question based on the given documents. Only give me the answer and do not output any other "
            "words.\n\nThe following are given documents.\n\n{context}\n\nAnswer the question based on the given "
            "documents. Only give me the answer and do not output any other words.\n\nQuestion: {query}",
            " Answer:",
            "string_match_part",
        ),
    )
}


@dataclass(frozen=True)
class Task:
    """One RULER task (a ``synthetic.yaml`` entry)."""

    name: str
    kind: str
    short: str
    args: dict = field(default_factory=dict)

    @property
    def spec(self) -> Kind:
        return KINDS[self.kind]

    @property
    def offline(self) -> bool:
        return self.kind != "qa"


def _niah(name, short, haystack, k, v, num_k=1, num_v=1, num_q=1):
    return Task(
        name,
        "niah",
        short,
        {
            "type_haystack": haystack,
            "type_needle_k": k,
            "type_needle_v": v,
            "num_needle_k": num_k,
            "num_needle_v": num_v,
            "num_needle_q": num_q,
        },
    )


# fmt: off
TASKS = (
    _niah("niah_single_1", "S1", "noise", "words", "numbers"),
    _niah("niah_single_2", "S2", "essay", "words", "numbers"),
    _niah("niah_single_3", "S3", "essay", "words", "uuids"),
    _niah("niah_multikey_1", "MK1", "essay", "words", "numbers", num_k=4),
    _niah("niah_multikey_2", "MK2", "needle", "words", "numbers"),
    _niah("niah_multikey_3", "MK3", "needle", "uuids", "uuids"),
    _niah("niah_multivalue", "MV", "essay", "words", "numbers", num_v=4),
    _niah("niah_multiquery", "MQ", "essay", "words", "numbers", num_q=4),
    Task("vt", "variable_tracking", "VT", {"type_haystack": "noise", "num_chains": 1, "num_hops": 4}),
    Task("cwe", "common_words_extraction", "CWE", {"freq_cw": 30, "freq_ucw": 3, "num_cw": 10}),
    Task("fwe", "freq_words_extraction", "FWE", {"alpha": 2.0}),
    Task("qa_1", "qa", "QA1", {"dataset": "squad"}),
    Task("qa_2", "qa", "QA2", {"dataset": "hotpotqa"}),
)
# fmt: on

BY_NAME = {t.name: t for t in TASKS}
OFFLINE = tuple(t.name for t in TASKS if t.offline)
ALIASES = {
    "all": tuple(BY_NAME),
    "offline": OFFLINE,
    "niah": tuple(n for n in BY_NAME if n.startswith("niah")),
    "qa": ("qa_1", "qa_2"),
}


def get_task(name: str) -> Task:
    """The task row for a name; ValueError lists the allowed names."""
    if name not in BY_NAME:
        raise ValueError(
            f"unknown RULER task {name!r}; allowed: {', '.join(BY_NAME)} (or the aliases {', '.join(ALIASES)})"
        )
    return BY_NAME[name]


def parse_tasks(text: str | None) -> tuple:
    """Task rows from a comma-separated list of names and aliases (None: the 11 offline tasks), table order."""
    names = [s.strip() for s in (text or "offline").split(",") if s.strip()]
    if not names:
        raise ValueError(f"--tasks is empty; give names ({', '.join(BY_NAME)}) or an alias ({', '.join(ALIASES)})")
    chosen = set()
    for name in names:
        chosen.update(ALIASES[name] if name in ALIASES else (get_task(name).name,))
    return tuple(t for t in TASKS if t.name in chosen)


def parse_lengths(text) -> tuple:
    """'4k,8k' or '4096,8192' -> (4096, 8192). RULER's lengths are powers of two: k/K means x1024.

    Unlike the other commands' ``k`` (x1000, :func:`gemfilter.toolkit.options.parse_length`), RULER's published
    lengths are 4096, 8192, ..., so here ``4k`` means 4096. Each length is the whole budget: prompt tokens plus
    tokens_to_generate (RULER's max_seq_length).
    """
    items = [s.strip() for s in str(text).split(",") if s.strip()]
    if not items:
        raise ValueError("--lengths is empty; give token budgets like 4k,8k (k = 1024) or 4096,8192")
    out = []
    for item in items:
        scale = 1024 if item[-1] in "kK" else 1
        num = item[:-1] if scale > 1 else item
        try:
            value = int(num) * scale
        except ValueError:
            raise ValueError(f"--lengths: {item!r} is not a whole number; give e.g. 4k,8k (k = 1024) or 4096") from None
        if value < 256:
            raise ValueError(f"--lengths: {item!r} is too small; RULER contexts need at least 256 tokens")
        if value > MAX_TOKENS:
            raise ValueError(
                f"--lengths: {item!r} is {value:,} tokens, more than any model's context window "
                f"(at most {MAX_TOKENS:,} allowed)"
            )
        out.append(value)
    return tuple(sorted(set(out)))
