"""This project's tasks in SCBench's protocol (eval/scbench/own.py): each sample's answers found by an independent
reading of its context, the runner's sizing (whole contexts, in both modes), the scorer, and their names."""

import re

import pytest

from eval.scbench import generate, own, prompts, scoring, tasks

OWN = ("gf_facts", "gf_multikey", "gf_vt")


@pytest.fixture(scope="module")
def tok():
    """A word-level tokenizer: every whitespace-separated chunk is one token."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    raw = Tokenizer(models.WordLevel(vocab={"<pad>": 0, "<s>": 1, "</s>": 2, "<unk>": 3}, unk_token="<unk>"))
    raw.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(
        tokenizer_object=raw, eos_token="</s>", bos_token="<s>", unk_token="<unk>", pad_token="<pad>"
    )


def test_the_family_is_named_as_this_project_s():
    assert tasks.OWN == OWN
    for name in OWN:
        task = tasks.get_task(name)
        assert task.label.startswith("GF.") and task.offline and task.scorer == "gf_string_match"


@pytest.mark.parametrize("seed", range(4))
def test_facts_answers_are_in_their_sentences(seed):
    """Each turn's answer is read back from the one sentence of its kind in the context (regexes written here)."""
    import random

    sample = own.facts(random.Random(seed), 300, 5)
    context = sample["context"]
    for turn in sample["multi_turns"]:
        q, a = turn["input"], turn["answer"]
        if "special magic number for" in q:
            key = re.search(r"magic number for (\S+) mentioned", q).group(1)
            found = re.search(rf"The special magic number for {re.escape(key)} is: (\d+)\.", context).group(1)
        elif "passphrase" in q:
            key = re.search(r"passphrase for (\S+) mentioned", q).group(1)
            found = re.search(rf"The secret passphrase for {re.escape(key)} is: (\w+)\.", context).group(1)
        elif "box hidden" in q:
            colour = re.search(r"key to the (\w+) box", q).group(1)
            found = re.search(rf"The key to the {colour} box is hidden under the ([\w ]+)\.", context).group(1)
        elif "platform" in q:
            city = re.search(r"train to (\w+) leave", q).group(1)
            found = re.search(rf"The train to {city} leaves from platform (\d+)\.", context).group(1)
        else:
            assert "San Francisco" in q and "Dolores Park" in context
            found = "Dolores Park"
        assert found == a
    assert len({t["input"].split("?")[0] for t in sample["multi_turns"]}) == 5  # five different facts


@pytest.mark.parametrize("seed", range(4))
def test_multikey_asks_distinct_keys_among_distractors(seed):
    import random

    sample = own.multikey(random.Random(seed), 300, 5)
    needles = dict(re.findall(r"The special magic number for ([\w ]+?) is: (\d+)\.", sample["context"]))
    assert len(needles) == own.MULTIKEY_KEYS
    asked = [re.search(r"number for ([\w ]+?) mentioned", t["input"]).group(1) for t in sample["multi_turns"]]
    assert len(set(asked)) == 5 and all(needles[k] == t["answer"] for k, t in zip(asked, sample["multi_turns"]))
    # no two keys of one kind: each key is in its own list of MULTIKEY_KINDS
    kinds = [[i for i, kind in enumerate(own.MULTIKEY_KINDS) if k in kind] for k in needles]
    assert all(len(k) == 1 for k in kinds) and len({k[0] for k in kinds}) == own.MULTIKEY_KEYS


def test_multikey_draws_every_kind_and_every_key_over_seeds():
    """Over many seeds every key of every kind is drawn (the draw is not stuck on a few)."""
    import random

    drawn = set()
    for seed in range(200):
        context = own.multikey(random.Random(seed), 50, 5)["context"]
        drawn |= set(re.findall(r"The special magic number for ([\w ]+?) is:", context))
    assert drawn == {key for kind in own.MULTIKEY_KINDS for key in kind}


@pytest.mark.parametrize("seed", range(4))
def test_vt_answers_follow_the_chains(seed):
    """The variables holding a value, found by following the assignments in the context."""
    import random

    sample = own.vt(random.Random(seed), 60, 5)
    value = {}
    for name, rhs in re.findall(r"VAR (\w+) = (VAR \w+|\d+)\.", sample["context"]):
        value[name] = value[rhs[4:]] if rhs.startswith("VAR ") else rhs
    for turn in sample["multi_turns"]:
        v = re.search(r"assigned the value (\d+) in", turn["input"]).group(1)
        assert sorted(n for n, x in value.items() if x == v) == sorted(turn["answer"].split(", "))


@pytest.mark.slow  # builds each task's samples in both modes at 4K and 8K (~20 s)
@pytest.mark.parametrize("max_tokens", [4096, 8192])
@pytest.mark.parametrize("mode", prompts.MODES)
def test_samples_fit_their_mode_whole(tok, max_tokens, mode):
    for task in OWN:
        sample = generate.make_sample(task, tok, max_tokens, 5, seed=1, mode=mode)
        p = prompts.build_prompts(sample, task, mode)
        limit = prompts.max_input_length(task, max_tokens, 5, mode)
        assert 0.6 * limit < len(tok.encode(p.first)) <= limit, (task, mode)


def test_the_scorer_is_ruler_s_on_the_answer_s_parts():
    assert scoring.score_one("gf_vt", "they are: ABCDE and fghij", "ABCDE, FGHIJ") == 1.0
    assert scoring.score_one("gf_vt", "they are: ABCDE", "ABCDE, FGHIJ") == 0.5
    assert scoring.score_one("gf_facts", " under the kitchen clock.", "kitchen clock") == 1.0
    assert scoring.score_one("gf_multikey", " 1234567.", "7654321") == 0.0


@pytest.mark.parametrize("task", OWN)
def test_a_follow_up_starts_with_the_turn_before_s_answer_as_a_sentence(tok, task):
    sample = generate.make_sample(task, tok, 1024, 5, seed=2, mode="multi-turn")
    p = prompts.build_prompts(sample, task, "multi-turn")
    for i, follow in enumerate(p.follow_ups, 1):
        said, question = follow.split("\n\n", 1)
        previous = sample["multi_turns"][i - 1]
        assert said == " " + previous["answer"] + "."  # it completes the previous prompt's "... is"
        assert question == sample["multi_turns"][i]["input"]


@pytest.mark.parametrize("task", OWN)
def test_a_multi_request_query_is_set_apart_from_the_context(tok, task):
    sample = generate.make_sample(task, tok, 4096, 5, seed=2, mode="multi-request")
    p = prompts.build_prompts(sample, task, "multi-request")
    assert [q for q in p.follow_ups] == ["\n\n" + turn["input"] for turn in sample["multi_turns"]]
    # the multi-turn first prompt is the context and the first question; multi-request feeds the same text
    assert p.first + p.follow_ups[0] == prompts.build_prompts(sample, task, "multi-turn").first
