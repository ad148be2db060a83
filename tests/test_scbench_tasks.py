"""eval.scbench: generators (format, answers by an independent check, token budget), prompt builders
against the official code path transcribed here, scorers on hand cases. No network, no model weights."""

import json
import os
import re
import statistics

import pytest

from eval.scbench import generate, prompts, scoring, tasks

OFFLINE = ("scbench_kv", "scbench_prefix_suffix", "scbench_vt", "scbench_mf")
CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


@pytest.fixture(scope="module")
def tok():
    """A word-level tokenizer (every whitespace-separated chunk is one token) with a ChatML template."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2, "<unk>": 3, **{f"w{i}": i for i in range(4, 96)}}
    raw = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    raw.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    t = PreTrainedTokenizerFast(tokenizer_object=raw, eos_token="</s>", bos_token="<s>", unk_token="<unk>",
                                pad_token="<pad>")
    t.chat_template = CHATML
    return t


@pytest.fixture(scope="module")
def samples(tok):
    return {task: generate.make_sample(task, tok, 4096, turns=5, seed=3) for task in OFFLINE}


# ------------------------------------------------------------------ format and answers

def test_format_is_the_official_one(samples):
    for task, eg in samples.items():
        assert set(eg) == {"id", "context", "multi_turns"}, task
        assert len(eg["multi_turns"]) == 5
        assert all(set(t) == {"input", "answer"} for t in eg["multi_turns"]), task
        assert len({t["input"] for t in eg["multi_turns"]}) == 5, f"{task}: each turn asks a different query"
        json.loads(json.dumps(eg))  # JSON-lines serializable, as the hub's data files
    assert all(isinstance(t["answer"], str) for t in samples["scbench_kv"]["multi_turns"])
    assert all(isinstance(t["answer"], list) and all(isinstance(a, str) for a in t["answer"])
               for t in samples["scbench_vt"]["multi_turns"])
    mf = samples["scbench_mf"]
    assert isinstance(mf["context"], list) and all(type(v) is int for v in mf["context"])  # hub: sequence int64
    assert all(type(t["answer"]) is int for t in mf["multi_turns"])  # hub: int64, math_find's int branch


def test_same_seed_same_sample_other_seed_other(tok, samples):
    for task in OFFLINE:
        assert generate.make_sample(task, tok, 4096, turns=5, seed=3) == samples[task]
        assert generate.make_sample(task, tok, 4096, turns=5, seed=4)["context"] != samples[task]["context"]


def test_kv_answers_by_json_lookup(samples):
    eg = samples["scbench_kv"]
    head = "JSON data:\n"
    assert eg["context"].startswith(head)
    record = json.loads(eg["context"][len(head):])
    for turn in eg["multi_turns"]:
        key = re.fullmatch(r'Key: "([0-9a-f-]{36})"\nThe value associated with the specified key is: ', turn["input"])[1]
        assert record[key] == turn["answer"]


def test_vt_answers_by_following_the_chains(samples):
    eg = samples["scbench_vt"]
    value_of, lines = {}, [ln.strip() for ln in eg["context"].split("\n") if ln.startswith("VAR ")]
    for _ in lines:  # resolve assignments until every variable has a number
        for ln in lines:
            name, rhs = re.fullmatch(r"VAR (\w+) = (.+)", ln).groups()
            ref = re.fullmatch(r"VAR (\w+)", rhs)
            if ref is None:
                value_of[name] = int(rhs)
            elif ref[1] in value_of:
                value_of[name] = value_of[ref[1]]
    assert len(value_of) == len(lines) == 25
    for turn in eg["multi_turns"]:
        value = int(re.search(r"assigned the value (\d+) in the text", turn["input"])[1])
        assert sorted(n for n, v in value_of.items() if v == value) == sorted(turn["answer"])
        assert len(turn["answer"]) == 5


def test_mf_answers_by_statistics(samples):
    eg = samples["scbench_mf"]
    values, distinct = eg["context"], sorted(set(eg["context"]))
    expect = {"largest number": distinct[-1], "second largest number": distinct[-2],
              "third largest number": distinct[-3], "smallest number": distinct[0],
              "second smallest number": distinct[1], "third smallest number": distinct[2],
              "median number": statistics.median(values)}
    assert len(values) % 2 == 1
    for turn in eg["multi_turns"]:
        stat = re.search(r"The (.+) of the list is: $", turn["input"])[1]
        assert turn["answer"] == expect[stat]


def test_prefix_suffix_has_exactly_one_match(samples):
    eg = samples["scbench_prefix_suffix"]
    lines = eg["context"].split("\n\n", 1)[1].split("\n")
    for turn in eg["multi_turns"]:
        p, s = re.fullmatch(r'The string that starts with "(\w+)" and ends with "(\w+)" is: ', turn["input"]).groups()
        assert [ln for ln in lines if ln.startswith(p) and ln.endswith(s)] == [turn["answer"]]
        assert sum(ln.startswith(p) for ln in lines) > 1 and sum(ln.endswith(s) for ln in lines) > 1  # distractors


# ------------------------------------------------------------------ token budget

def _conversation_tokens(tok, task, eg):
    """Independent count: turn 1 with special tokens, each follow-up without, plus every turn's new tokens."""
    p = prompts.build_multi_turn(eg, task)
    n = len(tok(p.first)["input_ids"]) + sum(len(tok(f, add_special_tokens=False)["input_ids"]) for f in p.follow_ups)
    return n + tasks.get_task(task).max_new_tokens * len(eg["multi_turns"])


@pytest.mark.parametrize("max_tokens", [4096, 8192])
def test_budget_holds_and_is_used(tok, max_tokens):
    for task in OFFLINE:
        eg = generate.make_sample(task, tok, max_tokens, turns=5, seed=1)
        used = _conversation_tokens(tok, task, eg)
        assert used <= max_tokens, task
        assert used > 0.9 * max_tokens, f"{task}: sized to {used} of {max_tokens}"
        r = prompts.build_multi_request(eg, task)
        first = len(tok(r.first)["input_ids"])
        assert all(first + len(tok(q, add_special_tokens=False)["input_ids"]) <= max_tokens for q in r.follow_ups)


@pytest.mark.slow
@pytest.mark.parametrize("max_tokens", [4096, 8192])
def test_budget_holds_on_the_embedded_tokenizer(max_tokens):
    from transformers import AutoTokenizer

    path = os.path.expanduser("~/.cache/gemfilter/gemma3-270m-dequantized")
    if not os.path.isdir(path):
        pytest.skip("the embedded model's tokenizer is not on this machine")
    real = AutoTokenizer.from_pretrained(path)
    for task in OFFLINE:
        eg = generate.make_sample(task, real, max_tokens, turns=5, seed=0)
        assert 0.9 * max_tokens < _conversation_tokens(real, task, eg) <= max_tokens, task


def test_refusals(tok):
    with pytest.raises(ValueError, match="cannot be generated offline: it needs"):
        generate.make_sample("scbench_qa_eng", tok, 4096)
    with pytest.raises(ValueError, match="allowed: scbench_kv"):
        generate.make_sample("kv", tok, 4096)
    with pytest.raises(ValueError, match="7 distinct statistics"):
        generate.make_sample("scbench_mf", tok, 4096, turns=8)
    with pytest.raises(ValueError, match="smallest sample needs"):
        generate.make_sample("scbench_kv", tok, 300)
