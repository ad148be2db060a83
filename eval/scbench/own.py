"""This project's conversation tasks in SCBench's protocol: retrieval sized for the embedded model.

Not SCBench's tasks (their names start ``gf_``, their labels ``GF.``): on Gemma 3 270M SCBench's own tasks score
near 0 even with the whole cache, so they cannot separate methods. These are built from RULER's generators and
needle styles (NVIDIA/RULER ``scripts/data/synthetic/niah.py`` and ``variable_tracking.py``; the model solves
RULER's single-needle tasks at 4K, not its variable tracking), asked one question per turn over one context, in
SCBench's two modes with its gold history and per-turn aggregation (:mod:`eval.scbench.prompts`,
:mod:`eval.scbench.scoring`). Each sample is drawn from ``random.Random(seed)`` alone; ``size`` is the haystack's
length (essay words or noise sentences), which :func:`eval.scbench.generate.make_sample` fits to the window.

- ``gf_facts`` (GF.Facts): five facts of different kinds in an essay haystack (a magic number, a passphrase, where a
  key is hidden, a train's platform, Kamradt's San Francisco sentence), each at its own depth; turn i asks one.
  Harder for one-shot compression than one needle: each turn needs another sentence, which a selection made for an
  earlier question may have dropped.
- ``gf_multikey`` (GF.MultiKey): RULER's multi-key needles under five keys in an essay haystack, worded as the
  question asks (:data:`MULTIKEY_NEEDLE`), each key of another kind (:data:`MULTIKEY_KINDS`); turn i asks one key,
  the others are distractors for it. A cache compressed for one key keeps that key's needle and loses the next
  one's.
- ``gf_vt`` (GF.VarTrack): RULER's variable tracking in its noise haystack, one chain of ``VT_HOPS`` assignments per
  turn; turn i asks which variables hold chain i's value. A turn needs every line of its chain, spread over the
  context.

Answers are text (a chain's variables joined with ", "), so that a multi-turn follow-up starts with the previous
answer as written. Scored with RULER's ``string_match_all`` on the answer's comma-separated parts (the share found,
any case), which SCBench's Retr.MultiHop also uses (:func:`score`).
"""

from __future__ import annotations

import random
import string

FACTS_HEAD = (
    "Some facts are hidden within the following text. Make sure to memorize them. I will quiz you about "
    "them afterwards.\n"
)
MULTIKEY_HEAD = (
    "Some special magic numbers are hidden within the following text. Make sure to memorize it. I will "
    "quiz you about the numbers afterwards.\n"
)
VT_HEAD = "Memorize and track the chain(s) of variable assignment hidden in the following text.\n\n"
#: GF.MultiKey's needle. RULER's reads "One of the special magic numbers for {key} is: {value}."; this wording, the
#: question's own, was chosen on seeds 0-5 (docs/scbench.md gives the scores of the seeds it never saw). Part of
#: the identity of a folder that runs gf_multikey.
MULTIKEY_NEEDLE = "The special magic number for {key} is: {value}."
# Needles under distinct keys, each asked once, so a turn's distractors are the other keys' needles: five turns need
# five keys, and more keys only add distractors
MULTIKEY_KEYS = 5
#: GF.MultiKey's keys: one of each of MULTIKEY_KEYS kinds drawn from these seven, so that no two keys of a sample are
#: alike. With RULER's keys (adjective-noun words such as "abortive-enigma") the embedded model finds the needles
#: and answers another key's number (docs/scbench.md). Chosen on seeds 0-5; the docs give the seeds it never saw.
MULTIKEY_KINDS = (
    ("the blue umbrella", "the red kettle", "the green lamp", "the yellow bicycle"),  # objects
    ("Maria", "Jonas", "Priya", "Kenji"),  # first names
    ("the zebra", "the otter", "the falcon", "the tortoise"),  # animals
    ("Lisbon", "Oslo", "Vienna", "Prague"),  # cities
    ("October", "March", "July", "December"),  # months
    ("the baker", "the pilot", "the surgeon", "the librarian"),  # professions
    ("the violin", "the trumpet", "the harp", "the drum"),  # instruments
)
#: How GF.MultiKey draws its keys, part of the identity of a folder that runs it (written out, so that a change of
#: the lists changes the identity).
MULTIKEY_KEY_STYLE = f"one of each of {MULTIKEY_KEYS} kinds among: " + "; ".join(", ".join(k) for k in MULTIKEY_KINDS)
VT_HOPS = 1  # assignments after the value's first line: 1 gives chains of two variables
CITIES = ("Lisbon", "Oslo", "Vienna", "Prague", "Dublin", "Krakow", "Ghent", "Porto", "Bergen", "Turin")
OBJECTS = ("the red vase", "the old piano", "the blue rug", "the garden bench", "the kitchen clock", "the oak desk")
COLOURS = ("green", "silver", "yellow", "black", "white", "orange")


def _number(rng: random.Random) -> str:
    return str(rng.randint(1000000, 9999999))  # RULER's 7-digit numbers


def _key(rng: random.Random) -> str:
    from eval.ruler.sources import niah_words

    words = niah_words()
    return words[rng.randrange(len(words))]


def _fact(kind: int, rng: random.Random) -> tuple:
    """(the sentence put in the haystack, the question with its answer prefix, the answer) of one fact kind."""
    if kind == 0:
        key, value = _key(rng), _number(rng)
        return (
            f"The special magic number for {key} is: {value}.",
            f"What is the special magic number for {key} mentioned in the provided text? The special magic "
            f"number for {key} mentioned in the provided text is",
            value,
        )
    if kind == 1:
        key, word = _key(rng), "".join(rng.choices(string.ascii_lowercase, k=8))
        return (
            f"The secret passphrase for {key} is: {word}.",
            f"What is the secret passphrase for {key} mentioned in the provided text? The secret passphrase "
            f"for {key} mentioned in the provided text is",
            word,
        )
    if kind == 2:
        colour, place = rng.choice(COLOURS), rng.choice(OBJECTS)
        return (
            f"The key to the {colour} box is hidden under {place}.",
            f"Where is the key to the {colour} box hidden? The key to the {colour} box is hidden under",
            place.split(" ", 1)[1],
        )
    if kind == 3:
        city, platform = rng.choice(CITIES), str(rng.randint(2, 19))
        return (
            f"The train to {city} leaves from platform {platform}.",
            f"From which platform does the train to {city} leave? The train to {city} leaves from platform",
            platform,
        )
    return (
        "The best thing to do in San Francisco is eat a sandwich and sit in Dolores Park on a sunny day.",
        "What is the best thing to do in San Francisco? The best thing to do in San Francisco is",
        "Dolores Park",
    )


def said(answer: str) -> str:
    """A turn's gold answer as a multi-turn follow-up starts with it: the previous prompt ended with the question's
    answer prefix ("... is"), so the answer completes that sentence: " <answer>."."""
    return f" {answer}."


def _insert(rng: random.Random, words: list, sentences: list) -> str:
    """``words`` joined with each of ``sentences`` inserted at a random word position (RULER inserts at random
    depths), in random order."""
    spots = sorted(rng.randint(0, len(words)) for _ in sentences)
    order = list(range(len(sentences)))
    rng.shuffle(order)
    out, last = [], 0
    for spot, i in zip(spots, order):
        out += words[last:spot] + [sentences[i]]
        last = spot
    return " ".join(out + words[last:])


def _essay(rng: random.Random, size: int) -> list:
    from eval.ruler.sources import essay_words

    words = essay_words()
    start = rng.randrange(max(1, len(words) - size))
    return list(words[start : start + size])


def facts(rng: random.Random, size: int, turns: int) -> dict:
    """GF.Facts: ``size`` essay words with five facts of different kinds; turn i asks the i-th drawn kind."""
    if turns > 5:
        raise ValueError(f"gf_facts has 5 kinds of fact; asked for {turns} turns")
    kinds = rng.sample(range(5), turns)
    made = [_fact(k, rng) for k in kinds]
    context = _insert(rng, _essay(rng, size), [m[0] for m in made])
    return {"context": context, "multi_turns": [{"input": q, "answer": a, "said": said(a)} for _, q, a in made]}


def multikey(rng: random.Random, size: int, turns: int) -> dict:
    """GF.MultiKey: ``size`` essay words with ``MULTIKEY_KEYS`` needles, under keys of distinct kinds; turn i asks a
    different key."""
    if turns > MULTIKEY_KEYS:
        raise ValueError(f"gf_multikey has {MULTIKEY_KEYS} keys; asked for {turns} turns")
    keys = [rng.choice(MULTIKEY_KINDS[kind]) for kind in rng.sample(range(len(MULTIKEY_KINDS)), MULTIKEY_KEYS)]
    values = [_number(rng) for _ in keys]
    needles = [MULTIKEY_NEEDLE.format(key=k, value=v) for k, v in zip(keys, values)]
    context = _insert(rng, _essay(rng, size), needles)
    asked = rng.sample(range(MULTIKEY_KEYS), turns)
    question = (
        "What is the special magic number for {k} mentioned in the provided text? The special magic number for "
        "{k} mentioned in the provided text is"
    )
    return {
        "context": context,
        "multi_turns": [
            {"input": question.format(k=keys[i]), "answer": values[i], "said": said(values[i])} for i in asked
        ],
    }


def noise_chains(rng: random.Random, size: int, turns: int, hops: int, assign: str, link: str) -> tuple:
    """RULER's variable tracking in its noise haystack: (sentences, chains (variable names), values), one chain of
    ``hops`` + 1 variables per turn. assign/link: the line formats (``VAR {a} = {v}``, ``VAR {b} = VAR {a}``)."""
    from eval.ruler.sources import NOISE

    names = []
    while len(names) < (hops + 1) * turns:
        name = "".join(rng.choices(string.ascii_uppercase, k=5))
        if name not in names:
            names.append(name)
    values = rng.sample(range(10000, 100000), turns)
    sentences, chains = [NOISE] * size, []
    for c in range(turns):
        var = names[c * (hops + 1) : (c + 1) * (hops + 1)]
        chains.append(var)
        chain = [assign.format(a=var[0], v=values[c])] + [link.format(b=var[j + 1], a=var[j]) for j in range(hops)]
        # RULER's insertion: sorted random slots, each shifted by the lines already inserted, so a chain reads in order
        for j, pos in enumerate(sorted(rng.sample(range(len(sentences)), len(chain)))):
            sentences.insert(pos + j, chain[j])
    return sentences, chains, values


def vt(rng: random.Random, size: int, turns: int) -> dict:
    """GF.VarTrack: ``size`` noise sentences with one chain of ``VT_HOPS`` + 1 variables per turn."""
    sentences, chains, values = noise_chains(rng, size, turns, VT_HOPS, "VAR {a} = {v}.", "VAR {b} = VAR {a}.")
    context = " ".join(sentences)
    ask = (
        "Question: Find all variables that are assigned the value {v} in the text above. Answer: According to "
        "the chain(s) of variable assignment in the text above, {n} variables are assigned the value {v}, they "
        "are:"
    )
    return {
        "context": VT_HEAD + context,
        "multi_turns": [
            {
                "input": ask.format(v=values[c], n=VT_HOPS + 1),
                "answer": ", ".join(chains[c]),
                "said": said(", ".join(chains[c])),
            }
            for c in range(turns)
        ],
    }


def score(pred: str, label: str) -> float:
    """RULER's ``string_match_all`` of ``pred`` against the comma-separated parts of ``label``."""
    refs = [part.strip() for part in str(label).split(",") if part.strip()]
    return round(sum(1.0 if r.lower() in pred.lower() else 0.0 for r in refs) / len(refs), 2)


#: generator key -> (generator, smallest size it accepts), merged into eval.scbench.generate.GENERATORS
GENERATORS = {"gf_facts": (facts, 0), "gf_multikey": (multikey, 0), "gf_vt": (vt, VT_HOPS + 1)}
