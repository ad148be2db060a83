"""Offline generators for SCBench's four synthetic tasks, sized to a token budget.

The official data (hub dataset microsoft/SCBench) was generated offline by the authors; their
generation code is not in microsoft/MInference. Each generator below rebuilds the data format the
official code consumes (``{"id", "context", "multi_turns": [{"input", "answer"}, ...]}``) from the
generator SCBench says it follows; docs/scbench.md lists, per task, what is transcribed and what is
inferred, and from which lines.

- ``kv`` (scbench_kv, Retr.KV): InfiniteBench ``data/construct_synthetic_dataset.py:build_kv_retrieval``:
  context ``JSON data:\\n{"<uuid>": "<uuid>", ...}``, input ``Key: "<uuid>"\\nThe value associated with
  the specified key is: ``; one different key per turn.
- ``vt`` (scbench_vt, Retr.MultiHop): RULER ``variable_tracking.py`` (``VAR X = 12345`` then
  ``VAR Y = VAR X `` 4 hops, spread among noise sentences), one chain per turn, each with its own value.
- ``mf`` (scbench_mf, Math.Find): InfiniteBench ``build_math_find`` (a list of integers in [0, 99],
  the official inputs of its seven statistics); one statistic per turn, an odd-length list so that the
  median is an integer (the hub data's answers are int64).
- ``prefix_suffix`` (scbench_prefix_suffix, Retr.Prefix-Suffix): a list of random strings; each turn asks
  for the one string with a given prefix and suffix, with distractors that share only one of them.

Every sample is drawn from ``random.Random(seed)`` alone, so (task, tokenizer, budget, turns, seed)
gives the same sample on every machine.
"""

from __future__ import annotations

import json
import random
import string
import uuid

from . import own
from .prompts import build_multi_request, build_multi_turn, build_prompts, max_input_length, turn_input_ids
from .tasks import get_task

MAX_TURNS = 5  # run_scbench.py's --max_turns default


def _uuid(rng: random.Random) -> str:
    return str(uuid.UUID(int=rng.getrandbits(128), version=4))


def kv(rng: random.Random, size: int, turns: int) -> dict:
    """Retr.KV: ``size`` UUID pairs in a JSON object; turn i asks for the value of a different key."""
    keys = [_uuid(rng) for _ in range(size)]
    values = [_uuid(rng) for _ in range(size)]
    context = "JSON data:\n" + json.dumps(dict(zip(keys, values)))
    picked = rng.sample(range(size), turns)
    return {
        "context": context,
        "multi_turns": [
            {"input": f'Key: "{keys[i]}"\nThe value associated with the specified key is: ', "answer": values[i]}
            for i in picked
        ],
    }


VT_HEAD = "Memorize and track the chain(s) of variable assignment hidden in the following text.\n\n"
VT_QUESTION = (
    "Question: Find all variables that are assigned the value {value} in the text above. Answer: According "
    "to the chain(s) of variable assignment in the text above, {num_v} variables are assigned the value "
    "{value}, they are: "
)
VT_HOPS = 4  # RULER's vt task (synthetic.yaml: num_hops 4)


def vt(rng: random.Random, size: int, turns: int) -> dict:
    """Retr.MultiHop: ``size`` noise sentences with one 4-hop chain per turn; turn i asks for chain i's variables."""
    sentences, chains, values = own.noise_chains(rng, size, turns, VT_HOPS, "VAR {a} = {v}", "VAR {b} = VAR {a} ")
    context = VT_HEAD + "\n".join(sentences).replace(". \n", ".\n")
    return {
        "context": context,
        "multi_turns": [
            {"input": VT_QUESTION.format(value=values[c], num_v=VT_HOPS + 1), "answer": chains[c]} for c in range(turns)
        ],
    }


def _nth(values: list, n: int, pick) -> int:
    """InfiniteBench's n-th largest/smallest: remove every copy of the extreme value n - 1 times."""
    values = list(values)
    for _ in range(n - 1):
        target = pick(values)
        while values and target == pick(values):
            values.remove(pick(values))
    return pick(values)


#: InfiniteBench build_math_find: statistic -> (its official input, how the answer is computed).
MF_STATS = {
    "largest number": (1, max),
    "second largest number": (2, max),
    "third largest number": (3, max),
    "smallest number": (1, min),
    "second smallest number": (2, min),
    "third smallest number": (3, min),
    "median": (0, None),
}
MF_INPUT = "You should answer with only one number, no other words. The {stat} of the list is: "


def mf(rng: random.Random, size: int, turns: int) -> dict:
    """Math.Find: a list of ``2 * size + 1`` integers; turn i asks for a different statistic of it."""
    if turns > len(MF_STATS):
        raise ValueError(f"scbench_mf has {len(MF_STATS)} distinct statistics; asked for {turns} turns")
    lo, hi = rng.randint(0, 19), rng.randint(79, 99)  # InfiniteBench moves min or max per statistic
    values = [rng.randint(lo, hi) for _ in range(2 * size + 1)]
    if len(set(values)) < 3:
        raise ValueError("scbench_mf: the list needs at least 3 distinct values; use a larger size")
    turns_out = []
    for stat in rng.sample(list(MF_STATS), turns):
        n, pick = MF_STATS[stat]
        answer = sorted(values)[len(values) // 2] if pick is None else _nth(values, n, pick)
        wording = "median number" if stat == "median" else stat
        turns_out.append({"input": MF_INPUT.format(stat=wording), "answer": answer})
    return {"context": values, "multi_turns": turns_out}


PS_HEAD = (
    "Below is a list of strings. Each question asks for the string that starts with a given prefix "
    "and ends with a given suffix.\n\n"
)
PS_QUESTION = 'The string that starts with "{prefix}" and ends with "{suffix}" is: '
PS_ALPHABET = string.ascii_letters + string.digits
PS_AFFIX = 4  # prefix and suffix length
PS_DISTRACTORS = 2  # strings sharing only the prefix, and as many sharing only the suffix, per target


def _word(rng, prefix="", suffix=""):
    middle = rng.randint(16, 24) - len(prefix) - len(suffix)
    return prefix + "".join(rng.choices(PS_ALPHABET, k=middle)) + suffix


def prefix_suffix(rng: random.Random, size: int, turns: int) -> dict:
    """Retr.Prefix-Suffix: ``size`` random strings plus, per turn, a target and distractors that share
    only its prefix or only its suffix; turn i asks for target i."""
    targets = []
    while len(targets) < turns:
        t = _word(rng)
        if all(t[:PS_AFFIX] != o[:PS_AFFIX] and t[-PS_AFFIX:] != o[-PS_AFFIX:] for o in targets):
            targets.append(t)
    items = list(targets)
    for t in targets:
        items += [_word(rng, prefix=t[:PS_AFFIX]) for _ in range(PS_DISTRACTORS)]
        items += [_word(rng, suffix=t[-PS_AFFIX:]) for _ in range(PS_DISTRACTORS)]
    items += [_word(rng) for _ in range(size)]
    # a distractor or filler that matches a target's prefix and suffix both would make two answers
    keep = [
        s
        for s in items
        if s in targets or not any(s[:PS_AFFIX] == t[:PS_AFFIX] and s[-PS_AFFIX:] == t[-PS_AFFIX:] for t in targets)
    ]
    rng.shuffle(keep)
    return {
        "context": PS_HEAD + "\n".join(keep),
        "multi_turns": [
            {"input": PS_QUESTION.format(prefix=t[:PS_AFFIX], suffix=t[-PS_AFFIX:]), "answer": t} for t in targets
        ],
    }


#: Task.generator -> (generator, smallest size it accepts).
GENERATORS = {
    "kv": (kv, MAX_TURNS * 2),
    "vt": (vt, VT_HOPS + 1),
    "mf": (mf, 8),
    "prefix_suffix": (prefix_suffix, 0),
    **own.GENERATORS,
}


def sample_tokens(sample: dict, task: str, tokenizer) -> int:
    """The tokens a sample needs in the worse of the two modes (plain templates, gold history).

    Multi-turn: the last turn's input ids (first prompt with special tokens, then every follow-up) plus
    ``max_new_tokens`` for each turn; multi-request: the longest context + query plus ``max_new_tokens``.
    """
    new = get_task(task).max_new_tokens
    turns = len(sample["multi_turns"])
    multi = build_multi_turn(sample, task)
    request = build_multi_request(sample, task)
    return max(
        len(turn_input_ids(multi, tokenizer, turns - 1)) + new * turns,
        max(len(turn_input_ids(request, tokenizer, t)) for t in range(turns)) + new,
    )


def make_sample(
    task: str,
    tokenizer,
    max_tokens: int,
    turns: int = MAX_TURNS,
    seed: int = 0,
    reserve: int = 0,
    mode: str | None = None,
) -> dict:
    """The largest sample of a synthetic task whose whole conversation fits ``max_tokens``.

    task: an official data name with a generator (``eval.scbench.tasks.OFFLINE``); tokenizer: the
    model's (counts as the official runner encodes); max_tokens: the window (``--max_seq_length``);
    turns: queries over the one context; seed: the sample's only source of randomness (also its id);
    reserve: tokens kept free for a chat template's markup; mode: a name in ``eval.scbench.prompts.MODES``:
    the first prompt must also fit that mode's official input budget
    (:func:`eval.scbench.prompts.max_input_length`, 1000 tokens less in multi-request), so the runner's
    middle truncation never cuts it (None: no such bound). ValueError if not even the smallest fits.
    """
    spec = get_task(task)
    if not spec.offline:
        raise ValueError(f"{task} cannot be generated offline: it needs {spec.needs}")
    if turns < 1:
        raise ValueError(f"turns must be at least 1; got {turns}")
    make, smallest = GENERATORS[spec.generator]
    budget = max_tokens - reserve

    limit = None if mode is None else max_input_length(task, max_tokens, turns, mode)

    def build(size):
        sample = {"id": seed, **make(random.Random(seed), size, turns)}
        used = sample_tokens(sample, task, tokenizer)
        if limit is not None and len(tokenizer.encode(build_prompts(sample, task, mode).first)) > limit:
            used = budget + 1  # the runner would cut its first prompt: too large
        return sample, used

    best, used = build(smallest)
    if used > budget:
        raise ValueError(
            f"{task}: even the smallest sample needs more than the {budget} tokens of a {max_tokens}-token "
            f"window for {turns} turns"
            + (f" ({mode}: a first prompt of at most {limit})" if limit else "")
            + "; use a larger max_tokens or fewer turns"
        )
    lower, upper = smallest, smallest * 2 + 8
    while True:  # grow until a size no longer fits, then bisect between the last fit and it
        sample, used = build(upper)
        if used > budget:
            break
        best, lower, upper = sample, upper, upper * 2
    while upper - lower > 1:
        mid = (lower + upper) // 2
        sample, used = build(mid)
        if used <= budget:
            best, lower = sample, mid
        else:
            upper = mid
    return best
