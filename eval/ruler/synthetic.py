"""RULER's synthetic generators: needle in a haystack, variable tracking, common and frequent words.

Source: NVIDIA/RULER ``scripts/data/synthetic/{niah,variable_tracking,common_words_extraction,
freq_words_extraction}.py``. Each function below builds one prompt (the official ``template +
answer_prefix`` filled in) for a given haystack size and returns ``(text, answers)``; sizing the
haystack to the token budget is ``eval.ruler.prepare``'s job. The random draws follow the official
code call for call (Python's ``random`` and numpy's legacy generator, both seeded with the task seed,
and the official ``random.Random(seed).shuffle`` of a fresh generator wherever it uses one), so the
statistics of the samples are the official ones. What differs is stated in ``eval.ruler.sources``
(the essays and the sentence splitter).
"""

from __future__ import annotations

import random
import string
import uuid
from dataclasses import dataclass, field

import numpy as np

from .sources import DEFAULT_SPLITTER, NOISE, cwe_words, essay_words, niah_words, split_sentences

NEEDLE = "One of the special magic {type_needle_v} for {key} is: {value}."
#: niah.py / variable_tracking.py: needle depths, 40 points from 0 to 100 percent.
DEPTHS = [int(d) for d in np.round(np.linspace(0, 100, num=40, endpoint=True)).astype(int)]


@dataclass
class Rng:
    """The official scripts' global generators, as one explicit object per (task, length).

    seed: the task seed (RULER's ``--random_seed``, 42 by default); py: ``random``; np: numpy's legacy
    RandomState (``np.random.seed`` / ``np.random.randint``).
    """

    seed: int
    py: random.Random = field(init=False)
    np: np.random.RandomState = field(init=False)

    def __post_init__(self):
        self.py = random.Random(self.seed)
        self.np = np.random.RandomState(self.seed)

    def fresh_shuffle(self, items: list) -> None:
        """``random.Random(seed).shuffle(items)``: the official code reshuffles with a fresh generator."""
        random.Random(self.seed).shuffle(items)


# ---------------------------------------------------------------- needle in a haystack (niah.py)


def _random_needle(rng: Rng, kind: str) -> str:
    if kind == "numbers":
        return str(rng.py.randint(10**6, 10**7 - 1))  # 7 digits
    if kind == "words":
        return rng.py.choice(niah_words())
    if kind == "uuids":
        return str(uuid.UUID(int=rng.py.getrandbits(128), version=4))
    raise ValueError(f"unknown needle type {kind!r}; allowed: numbers, words, uuids")


def _essay_text(num_words: int, haystack_dir=None) -> str:
    words = essay_words(haystack_dir)
    if num_words > len(words):  # repeat the essays as often as needed
        words = words * ((num_words + len(words) - 1) // len(words))
    return " ".join(words[:num_words])


def _insert_between_sentences(text: str, inserts: list, rng: Rng, splitter: str = DEFAULT_SPLITTER) -> str:
    """Official essay insertion: each insert at a random depth of DEPTHS, between sentences."""
    sents = split_sentences(text.strip(), splitter)
    cuts = [0] + sorted(int(len(sents) * (d / 100)) for d in rng.py.sample(DEPTHS, len(inserts))) + [len(sents)]
    parts = []
    for i in range(1, len(cuts)):
        parts.append(" ".join(sents[cuts[i - 1] : cuts[i]]))
        if i - 1 < len(inserts):
            parts.append(inserts[i - 1])
    return " ".join(parts)


def niah(
    args: dict, template: str, rng: Rng, num_haystack: int, haystack_dir=None, splitter: str = DEFAULT_SPLITTER
) -> tuple:
    """One NIAH prompt with ``num_haystack`` haystack units (essay words, noise or needle sentences).

    args: the task's yaml arguments (type_haystack, type_needle_k/v, num_needle_k/v/q);
    template: the official template + answer prefix; splitter: a name in ``sources.SPLITTERS`` (essays). Returns (text,
    values of the queried keys).
    """
    kind_k, kind_v = args["type_needle_k"], args["type_needle_v"]
    num_k = max(args["num_needle_k"], args["num_needle_q"])
    keys, values, needles = [], [], []
    for _ in range(num_k):
        keys.append(_random_needle(rng, kind_k))
        value = []
        for _ in range(args["num_needle_v"]):
            value.append(_random_needle(rng, kind_v))
            needles.append(NEEDLE.format(type_needle_v=kind_v, key=keys[-1], value=value[-1]))
        values.append(value)
    rng.fresh_shuffle(needles)

    hay = args["type_haystack"]
    if hay == "essay":
        context = _insert_between_sentences(_essay_text(num_haystack, haystack_dir), needles, rng, splitter)
    elif hay in ("noise", "needle"):
        if hay == "noise":
            sentences = [NOISE] * num_haystack
        else:  # distractors: needles with other keys and values
            sentences = [
                NEEDLE.format(type_needle_v=kind_v, key=_random_needle(rng, kind_k), value=_random_needle(rng, kind_v))
                for _ in range(num_haystack)
            ]
        for index, needle in zip(sorted(rng.py.sample(range(num_haystack), len(needles)), reverse=True), needles):
            sentences.insert(index, needle)
        context = "\n".join(sentences)
    else:
        raise ValueError(f"unknown type_haystack {hay!r}; allowed: essay, noise, needle")

    picked = rng.py.sample(range(num_k), args["num_needle_q"])
    queries = [keys[i] for i in picked]
    answers = [a for i in picked for a in values[i]]
    query = ", ".join(queries[:-1]) + ", and " + queries[-1] if len(queries) > 1 else queries[0]
    type_v = kind_v
    if args["num_needle_q"] * args["num_needle_v"] == 1:  # the official singular wording, same replacements
        template = template.replace("Some", "A").replace("are all", "is").replace("are", "is")
        template = template.replace("answers", "answer")
        type_v = type_v[:-1]
    return template.format(type_needle_v=type_v, context=context, query=query), answers


# ---------------------------------------------------------------- variable tracking (variable_tracking.py)


def _chains(rng: Rng, num_chains: int, num_hops: int, is_icl: bool) -> tuple:
    k = 3 if is_icl else 5
    num_hops = min(10, num_hops) if is_icl else num_hops
    names = ["".join(rng.py.choices(string.ascii_uppercase, k=k)).upper() for _ in range((num_hops + 1) * num_chains)]
    while len(set(names)) < num_chains * (num_hops + 1):
        names.append("".join(rng.py.choices(string.ascii_uppercase, k=k)).upper())
    variables, chains = [], []
    for i in range(0, len(names), num_hops + 1):
        these = names[i : i + num_hops + 1]
        variables.append(these)
        first = "12345" if is_icl else str(rng.np.randint(10000, 99999))
        chain = [f"VAR {these[0]} = {first}"]
        chain += [f"VAR {these[j + 1]} = VAR {these[j]} " for j in range(num_hops)]
        chains.append(chain)
    return variables, chains


def variable_tracking(args: dict, template: str, rng: Rng, num_noises: int, is_icl: bool = False) -> tuple:
    """One variable-tracking prompt: ``num_noises`` noise sentences with the chain(s) spread among them.

    Returns (text, the variables of the first chain, all assigned the queried value).
    """
    if args.get("type_haystack", "noise") != "noise":
        raise ValueError("variable tracking is implemented with the noise haystack (the synthetic.yaml vt task)")
    num_hops = args["num_hops"]
    variables, chains = _chains(rng, args["num_chains"], num_hops, is_icl)
    value = chains[0][0].split("=")[-1].strip()
    sentences = [NOISE] * num_noises
    for chain in chains:
        positions = sorted(rng.py.sample(range(len(sentences)), len(chain)))
        for pos, j in zip(positions, range(len(chain))):
            sentences.insert(pos + j, chain[j])
    context = "\n".join(sentences).replace(". \n", ".\n")
    return template.format(context=context, query=value, num_v=num_hops + 1), variables[0]


def randomize_icl(example: str, num_hops: int, rng: Rng) -> str:
    """The official ``randomize_icl``: fresh names for the example's answer variables and a fresh value."""
    for item in example.strip().split()[-num_hops - 1 :]:
        example = example.replace(item, "".join(rng.py.choices(string.ascii_uppercase, k=len(item))).upper())
    return example.replace("12345", str(rng.np.randint(10000, 99999)))


# ---------------------------------------------------------------- common words (common_words_extraction.py)


class TooFewWords(ValueError):
    """cwe asked for more distinct words than the wonderwords vocabulary holds."""


def cwe_vocabulary(seed: int) -> list:
    """The official word list after its one seeded shuffle (``random.Random(seed).shuffle(words)``)."""
    words = list(cwe_words())
    random.Random(seed).shuffle(words)
    return words


def _cwe_example(rng: Rng, vocab: list, num_words: int, common_repeats: int, uncommon_repeats: int, common_nums: int):
    if num_words > len(vocab):
        raise TooFewWords(
            f"cwe needs {num_words} distinct words but wonderwords has {len(vocab)}; the official code then draws "
            "from its repo's english_words.json, which no package ships. Use a shorter length (up to about 64K)."
        )
    full = rng.py.sample(vocab, num_words)
    common, uncommon = full[:common_nums], full[common_nums:]
    listed = common * int(common_repeats) + uncommon * int(uncommon_repeats)
    rng.fresh_shuffle(listed)
    return " ".join(f"{i + 1}. {w}" for i, w in enumerate(listed)), common


def common_words(
    args: dict, template: str, rng: Rng, num_words: int, vocab: list, max_seq_length: int, num_fewshot: int = 1
) -> tuple:
    """One cwe prompt: a one-shot example, then a numbered list of ``num_words`` distinct words.

    max_seq_length: below 4096 the official code uses smaller repeat counts (6 and 1, example 3 and 1).
    Returns (text, the ``num_cw`` common words).
    """
    num_cw = args["num_cw"]
    shots = []
    if max_seq_length < 4096:
        shots = [_cwe_example(rng, vocab, 20, 3, 1, num_cw) for _ in range(num_fewshot)]
        context, answer = _cwe_example(rng, vocab, num_words, 6, 1, num_cw)
    else:
        shots = [_cwe_example(rng, vocab, 40, 10, 3, num_cw) for _ in range(num_fewshot)]
        context, answer = _cwe_example(rng, vocab, num_words, args["freq_cw"], args["freq_ucw"], num_cw)
    shots = [
        template.format(num_cw=num_cw, context=c, query="") + " " + " ".join(f"{i + 1}. {w}" for i, w in enumerate(a))
        for c, a in shots
    ]
    return "\n".join(shots) + "\n" + template.format(num_cw=num_cw, context=context, query=""), answer


# ---------------------------------------------------------------- frequent words (freq_words_extraction.py)


def zeta(alpha: float) -> float:
    """Riemann zeta(alpha) for alpha > 1 (scipy.special.zeta in the official code), via torch's Hurwitz zeta."""
    import torch

    return float(
        torch.special.zeta(torch.tensor(float(alpha), dtype=torch.float64), torch.tensor(1.0, dtype=torch.float64))
    )


def fwe_vocabulary(rng: Rng, vocab_size: int, coded_wordlen: int = 6) -> list:
    """Random lower-case coded words, sorted, then the fresh seeded shuffle; the top-ranked one becomes '...'."""
    vocab = ["".join(rng.py.choices(string.ascii_lowercase, k=coded_wordlen)) for _ in range(vocab_size)]
    while len(set(vocab)) < vocab_size:
        vocab.append("".join(rng.py.choices(string.ascii_lowercase, k=coded_wordlen)))
    vocab = sorted(set(vocab))
    rng.fresh_shuffle(vocab)
    vocab[0] = "..."  # the most frequent word is treated as noise
    return vocab


def freq_words_text(template: str, vocab: list, num_words: int, alpha: float, rng: Rng) -> tuple:
    """Zipf-distributed coded text: word of rank k appears int(num_words * k^-alpha / zeta(alpha)) times.

    Returns (text, the three most frequent words after the '...' noise).
    """
    k = np.arange(1, len(vocab) + 1)
    counts = (num_words * (k**-alpha) / zeta(alpha)).astype(int)
    words = [w for w, c in zip(vocab, counts) for _ in range(c)]
    rng.fresh_shuffle(words)
    return template.format(context=" ".join(words), query=""), vocab[1:4]
