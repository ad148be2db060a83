"""Label-flip ICL prompts: M exemplars in the spec's template, a given share of their labels flipped.

Paper: Z. Shi, dissertation (2024), Sec. 5.6 (Figs. 5.1-5.2), after Wei et al. 2023. Template
(one blank line between exemplars; the query ends at "The answer is"):

    sentence: show us a good time
    The answer is positive.

    sentence: as dumb and cheesy
    The answer is negative.

    sentence: it 's a charming and often affecting journey
    The answer is

Sentence-pair tasks show one "<field>: <text>" line per field. Exactly round(share * M / 100)
exemplar labels are flipped (label -> 1 - label); the query's label never changes.

Sampling is a pure function of the seed (``per_prompt=False``, Min et al. 2022: one exemplar set
per seed, shared by every query, which lets the LLM runner reuse the exemplars' KV cache) or of
(seed, prompt index) (``per_prompt=True``, fresh exemplars for each query). The exemplars and the
order in which positions get flipped do not depend on the flip share, so the flipped sets are nested
across shares and a prompt differs between shares only in its flipped labels.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from .data import Example, Task

FLIP_SHARES = (0, 25, 50, 75, 100)
SEEDS = (100, 13, 21, 42, 87)  # Min et al. 2022's seeds
M_DEFAULT = 16


@dataclass(frozen=True)
class Prompt:
    """One evaluation prompt. shown: label ids written after the exemplars (after flipping);
    flipped: (M,) bools; query_label: the true (never flipped) label of the query."""

    text: str
    prefix: str  # the exemplars and the blank line before the query: text = prefix + query block
    shown: tuple
    original: tuple
    flipped: tuple
    query_label: int


def check_share(share) -> None:
    if isinstance(share, bool) or not isinstance(share, (int, float)) or not 0 <= share <= 100:
        raise ValueError(f"flip share must be a percentage in 0..100, got {share!r}")


def n_flips(share, m: int) -> int:
    """How many of M exemplar labels a share (percent, 0..100) flips: round half up of share*M/100."""
    check_share(share)
    if isinstance(m, bool) or not isinstance(m, int) or m < 1:
        raise ValueError(f"M (in-context exemplars) must be an int >= 1, got {m!r}")
    return int(share * m / 100 + 0.5)


def format_inputs(task: Task, inputs: tuple) -> str:
    return "\n".join(f"{name}: {text}" for (_, name), text in zip(task.fields, inputs))


def format_prefix(task: Task, exemplars, shown) -> str:
    """The exemplars with the shown label words, each followed by a blank line."""
    return "".join(
        f"{format_inputs(task, ex.inputs)}\nThe answer is {task.label_words[lab]}.\n\n"
        for ex, lab in zip(exemplars, shown)
    )


def format_prompt(task: Task, exemplars, shown, query: Example) -> str:
    """The template: exemplars with the shown label words, then the query ending in "The answer is"."""
    return format_prefix(task, exemplars, shown) + f"{format_inputs(task, query.inputs)}\nThe answer is"


def class_index(examples) -> dict:
    """{label: [positions in examples]}: built once per dataset, so sampling a prompt is cheap."""
    out = {}
    for i, ex in enumerate(examples):
        out.setdefault(ex.label, []).append(i)
    return out


def sample_exemplars(train, by_class: dict, m: int, rng: random.Random, balanced: bool = True) -> list:
    """M training examples. Balanced: M//2 per class (the odd one from a random class), shuffled;
    otherwise uniform without replacement."""
    if m > len(train):
        raise ValueError(f"M={m} exemplars asked for, but the training split has only {len(train)} examples")
    if not balanced:
        return [train[i] for i in rng.sample(range(len(train)), m)]
    labels = sorted(by_class)
    counts = {lab: m // len(labels) for lab in labels}
    for lab in rng.sample(labels, m - sum(counts.values())):
        counts[lab] += 1
    picked = []
    for lab in labels:
        if counts[lab] > len(by_class[lab]):
            raise ValueError(
                f"balanced sampling needs {counts[lab]} training examples of label {lab}, "
                f"the split has {len(by_class[lab])}; use fewer exemplars or --unbalanced"
            )
        picked += rng.sample(by_class[lab], counts[lab])
    rng.shuffle(picked)
    return [train[i] for i in picked]


def make_prompt(
    task: Task,
    train,
    by_class,
    query: Example,
    m: int,
    share,
    seed: int,
    index: int,
    balanced: bool = True,
    per_prompt: bool = False,
) -> Prompt:
    """The prompt for (seed, prompt index) at one flip share (percent); see the module docstring."""
    k = n_flips(share, m)
    rng = random.Random(f"label_flip:{seed}:{index}" if per_prompt else f"label_flip:{seed}")
    exemplars = sample_exemplars(train, by_class, m, rng, balanced)
    order = rng.sample(range(m), m)  # positions in the order they get flipped, the same for every share
    flipped = [False] * m
    for pos in order[:k]:
        flipped[pos] = True
    original = tuple(ex.label for ex in exemplars)
    shown = tuple(1 - lab if f else lab for lab, f in zip(original, flipped))
    prefix = format_prefix(task, exemplars, shown)
    return Prompt(format_prompt(task, exemplars, shown, query), prefix, shown, original, tuple(flipped), query.label)


def eval_indices(n_available: int, n_eval: int) -> list:
    """Which evaluation examples are used: a fixed shuffle (seed 0) cut to n_eval, the same for every
    seed, model and share (seeds change the exemplars only)."""
    if isinstance(n_eval, bool) or not isinstance(n_eval, int) or n_eval < 1:
        raise ValueError(f"--n-eval must be an int >= 1, got {n_eval!r}")
    order = list(range(n_available))
    random.Random(0).shuffle(order)
    return order[:n_eval]
