"""eval.scbench: generators (format, answers by an independent check, token budget), prompt builders
against the official code path transcribed here, scorers on hand cases. No network, no model weights."""

import json
import os
import re
import statistics

import pytest

from eval.scbench import generate, prompts, scoring, tasks

OFFLINE = ("scbench_kv", "scbench_prefix_suffix", "scbench_vt", "scbench_mf")
CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@pytest.fixture(scope="module")
def tok():
    """A word-level tokenizer (every whitespace-separated chunk is one token) with a ChatML template."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2, "<unk>": 3, **{f"w{i}": i for i in range(4, 96)}}
    raw = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    raw.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    t = PreTrainedTokenizerFast(
        tokenizer_object=raw, eos_token="</s>", bos_token="<s>", unk_token="<unk>", pad_token="<pad>"
    )
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
    assert all(
        isinstance(t["answer"], list) and all(isinstance(a, str) for a in t["answer"])
        for t in samples["scbench_vt"]["multi_turns"]
    )
    mf = samples["scbench_mf"]
    assert isinstance(mf["context"], list) and all(type(v) is int for v in mf["context"])  # hub: sequence int64
    assert all(type(t["answer"]) is int for t in mf["multi_turns"])  # hub: int64, math_find's int branch


@pytest.mark.slow  # builds every task's samples twice more (~15 s)
def test_same_seed_same_sample_other_seed_other(tok, samples):
    for task in OFFLINE:
        assert generate.make_sample(task, tok, 4096, turns=5, seed=3) == samples[task]
        assert generate.make_sample(task, tok, 4096, turns=5, seed=4)["context"] != samples[task]["context"]


def test_kv_answers_by_json_lookup(samples):
    eg = samples["scbench_kv"]
    head = "JSON data:\n"
    assert eg["context"].startswith(head)
    record = json.loads(eg["context"][len(head) :])
    for turn in eg["multi_turns"]:
        key = re.fullmatch(r'Key: "([0-9a-f-]{36})"\nThe value associated with the specified key is: ', turn["input"])[
            1
        ]
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
    expect = {
        "largest number": distinct[-1],
        "second largest number": distinct[-2],
        "third largest number": distinct[-3],
        "smallest number": distinct[0],
        "second smallest number": distinct[1],
        "third smallest number": distinct[2],
        "median number": statistics.median(values),
    }
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


@pytest.mark.slow  # builds every task's samples at 4K and 8K (~30 s)
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


def _runner_samples(tok, max_tokens: int, mode: str, num: int) -> list:
    """(task, sample) of every unit the runner makes for ``mode`` at ``max_tokens`` (its own sizing)."""
    from eval.scbench.runner import RunConfig, SCBench

    config = RunConfig(methods=("full",), tasks=OFFLINE, lengths=(max_tokens,), num_samples=num, modes=(mode,))
    return [(u.data[3], u.data[4]) for u in SCBench(config, tokenizer=lambda: tok).units(None, None, None)]


def _fed_whole(tok, task, sample, max_tokens, mode):
    """Whether the runner feeds ``sample``'s first prompt whole (its middle truncation cuts nothing), and the
    share of the mode's input budget it fills."""
    ids = tok.encode(prompts.build_prompts(sample, task, mode).first)
    limit = prompts.max_input_length(task, max_tokens, 5, mode)
    return prompts.truncate_middle(ids, limit) == ids, len(ids) / limit


@pytest.mark.slow  # builds every task's samples in both modes at 4K and 8K (~2 min)
@pytest.mark.parametrize("max_tokens", [4096, 8192])
@pytest.mark.parametrize("mode", prompts.MODES)
def test_the_runner_feeds_every_context_whole(tok, max_tokens, mode):
    """Each mode's samples fit that mode's official input budget (multi-request's is 1000 tokens smaller): the
    runner's middle truncation cuts nothing, in either mode (it cut 15-27% of multi-request contexts)."""
    for task, sample in _runner_samples(tok, max_tokens, mode, 2):
        whole, filled = _fed_whole(tok, task, sample, max_tokens, mode)
        assert whole, (task, mode, max_tokens)
        assert filled > 0.6, (task, mode, filled)


@pytest.mark.slow
@pytest.mark.parametrize("max_tokens", [4096, 8192])
@pytest.mark.parametrize("mode", prompts.MODES)
def test_the_runner_feeds_every_context_whole_on_the_embedded_tokenizer(max_tokens, mode):
    from transformers import AutoTokenizer

    path = os.path.expanduser("~/.cache/gemfilter/gemma3-270m-dequantized")
    if not os.path.isdir(path):
        pytest.skip("the embedded model's tokenizer is not on this machine")
    real = AutoTokenizer.from_pretrained(path)
    for task, sample in _runner_samples(real, max_tokens, mode, 2):
        assert _fed_whole(real, task, sample, max_tokens, mode)[0], (task, mode, max_tokens)


def test_refusals(tok):
    with pytest.raises(ValueError, match="cannot be generated offline: it needs"):
        generate.make_sample("scbench_qa_eng", tok, 4096)
    with pytest.raises(ValueError, match="allowed: scbench_kv"):
        generate.make_sample("kv", tok, 4096)
    with pytest.raises(ValueError, match="7 distinct statistics"):
        generate.make_sample("scbench_mf", tok, 4096, turns=8)
    with pytest.raises(ValueError, match="smallest sample needs"):
        generate.make_sample("scbench_kv", tok, 300)


# ------------------------------------------------------------------ prompts against the official code path
# eval_utils.py's create_multiturn_prompt (generic and scbench_mf branches) and create_scdq_prompt,
# transcribed statement by statement with the official template strings of these four tasks.

OFFICIAL_T = {
    "scbench_kv": "Extract the value corresponding to the specified key in the JSON object below.\n\n"
    "{context}\n\n{input}",
    "scbench_mf": "{prefix}\n\n{context}\n\n{input}",
    "scbench_vt": "{context}\n\n{input}",
    "scbench_prefix_suffix": "{context}\n\n{input}",
}
OFFICIAL_SCDQ = {
    "scbench_kv": "Extract the value corresponding to the specified key in the JSON object below.\n\n{context}",
    "scbench_mf": "{prefix}\n\n{context}",
    "scbench_vt": "{context}",
    "scbench_prefix_suffix": "{context}",
}
OFFICIAL_FOLLOW = {
    "scbench_kv": "{pre_ans}\n\n{input}",
    "scbench_mf": "{pre_ans}\n\n{prefix}\n\n{input}",
    "scbench_vt": "{pre_ans}\n\n{input}",
    "scbench_prefix_suffix": "{pre_ans}\n\n{input}",
}
OFFICIAL_CHAT = {
    "scbench_kv": "{input}",
    "scbench_mf": "{prefix}\n\n{input}",
    "scbench_vt": "{input}",
    "scbench_prefix_suffix": "{input}",
}


def official_multiturn(eg, data_name, tok, use_chat_template, disable_golden_context=False):
    template = OFFICIAL_T[data_name]
    follow_up_template = OFFICIAL_FOLLOW[data_name]
    if disable_golden_context:
        follow_up_template = OFFICIAL_CHAT[data_name]
    if use_chat_template:
        sys_prompt = tok.apply_chat_template(
            [{"role": "system", "content": ""}],
            add_generation_prompt=True if not disable_golden_context else False,
            tokenize=False,
        )
        chat_t = OFFICIAL_CHAT[data_name]
    turns = eg["multi_turns"]
    input_ = turns[0]["input"]
    prefix = None
    if data_name == "scbench_mf":
        prefix = f"What is {re.findall(r'The .+ is', input_)[0].lower()[:-3]}?"
        first = template.format(prefix=prefix, context=eg["context"], input=input_)
        follow = []
        for i in range(1, len(turns)):
            prefix = f"What is {re.findall(r'The .+ is', turns[i]['input'])[0].lower()[:-3]}?"
            follow.append(
                follow_up_template.format(
                    pre_ans=turns[i - 1]["answer"] if not disable_golden_context else None,
                    prefix=prefix,
                    input=turns[i]["input"],
                )
            )
    else:
        first = template.format(context=eg["context"], input=input_)
        follow = [
            follow_up_template.format(
                pre_ans=turns[i - 1]["answer"] if not disable_golden_context else None, input=turns[i]["input"]
            )
            for i in range(1, len(turns))
        ]
    if use_chat_template:
        first = tok.apply_chat_template(
            [{"role": "user", "content": first}], add_generation_prompt=True, tokenize=False
        )
        follow = [
            tok.apply_chat_template(
                (
                    [{"role": "system", "content": ""}]
                    + [{"role": "assistant", "content": str(turns[i - 1]["answer"])}]
                    if not disable_golden_context
                    else []
                )
                + [{"role": "user", "content": chat_t.format(prefix=prefix, input=turns[i]["input"])}],
                add_generation_prompt=True,
                tokenize=False,
            ).replace(sys_prompt, "")
            for i in range(1, len(turns))
        ]
    return [first] + follow


def official_scdq(eg, data_name, tok, use_chat_template):
    d = "[SEPSEPSEP]"
    if data_name == "scbench_mf":
        context_prompt = OFFICIAL_SCDQ[data_name].format(prefix=eg["multi_turns"][0]["input"], context=eg["context"])
        query_prompts = []
        for turn in eg["multi_turns"]:
            target = re.findall(r"The .+ is", turn["input"])[0].lower()[:-3]
            query_prompts.append(OFFICIAL_CHAT[data_name].format(prefix=f"What is {target}?", input=turn["input"]))
    else:
        context_prompt = OFFICIAL_SCDQ[data_name].format(context=eg["context"])
        query_prompts = [turn["input"] for turn in eg["multi_turns"]]
    if use_chat_template:
        context_prompt = tok.apply_chat_template(
            [{"role": "user", "content": context_prompt + d}], add_generation_prompt=True, tokenize=False
        ).split(d)[0]
        query_prompts = [
            tok.apply_chat_template(
                [{"role": "system", "content": ""}, {"role": "user", "content": d + q}],
                add_generation_prompt=True,
                tokenize=False,
            ).split(d)[1]
            for q in query_prompts
        ]
    return [context_prompt] + query_prompts


@pytest.mark.parametrize("chat", [False, True])
def test_builders_equal_the_official_code_path(tok, samples, chat):
    for task, eg in samples.items():
        assert prompts.build_multi_turn(eg, task, tok, chat=chat).prompts == official_multiturn(eg, task, tok, chat)
        assert prompts.build_multi_turn(eg, task, tok, chat=chat, gold=False).prompts == official_multiturn(
            eg, task, tok, chat, disable_golden_context=True
        )
        assert prompts.build_multi_request(eg, task, tok, chat=chat).prompts == official_scdq(eg, task, tok, chat)


def test_gold_history_and_chat_shapes(tok, samples):
    eg = samples["scbench_kv"]
    p = prompts.build_multi_turn(eg, "scbench_kv")
    assert p.follow_ups[0] == eg["multi_turns"][0]["answer"] + "\n\n" + eg["multi_turns"][1]["input"]
    c = prompts.build_multi_turn(eg, "scbench_kv", tok, chat=True)
    # Stripping the rendering of [system ""] + generation prompt also strips the assistant header: turn 1
    # ends with "<|im_start|>assistant\n", so the follow-up continues with the gold answer's text.
    assert c.follow_ups[0] == (
        f"{eg['multi_turns'][0]['answer']}<|im_end|>\n"
        f"<|im_start|>user\n{eg['multi_turns'][1]['input']}<|im_end|>\n<|im_start|>assistant\n"
    )
    assert c.first.endswith("<|im_start|>assistant\n")
    with pytest.raises(ValueError, match="chat template"):
        prompts.build_multi_turn(eg, "scbench_kv", None, chat=True)
    with pytest.raises(ValueError, match="allowed: multi-turn, multi-request"):
        prompts.build_prompts(eg, "scbench_kv", "scdq")


def test_turn_input_ids(tok, samples):
    eg = samples["scbench_vt"]
    enc = lambda s: tok(s, add_special_tokens=False)["input_ids"]  # noqa: E731
    mt = prompts.build_multi_turn(eg, "scbench_vt")
    first = [tok.bos_token_id] + enc(mt.first) if tok("x")["input_ids"][0] == tok.bos_token_id else enc(mt.first)
    assert prompts.turn_input_ids(mt, tok, 0) == first
    assert prompts.turn_input_ids(mt, tok, 2) == first + enc(mt.follow_ups[0]) + enc(mt.follow_ups[1])
    own = prompts.build_multi_turn(eg, "scbench_vt", gold=False)
    ids = prompts.turn_input_ids(own, tok, 1, answers=["w5 w6"])
    assert ids == prompts.turn_input_ids(own, tok, 0) + [5, 6, tok.eos_token_id] + enc(own.follow_ups[0])
    mr = prompts.build_multi_request(eg, "scbench_vt")
    assert prompts.turn_input_ids(mr, tok, 3) == prompts.turn_input_ids(mr, tok, 0)[
        : -len(enc(mr.follow_ups[0]))
    ] + enc(mr.follow_ups[3])
    assert prompts.truncate_middle(list(range(10)), 4) == [0, 1, 8, 9]
    assert prompts.truncate_middle(list(range(10)), -1) == list(range(10))
    assert prompts.max_input_length("scbench_kv", 131072, 5, "multi-turn") == 131072 - 750
    assert prompts.max_input_length("scbench_kv", 131072, 5, "multi-request") == 131072 - 1750


# ------------------------------------------------------------------ scorers on hand cases


def test_scorers_official_numbers():
    uuid_ = "878b9f6b-57a1-4b71-a975-d279d86dbf11"
    assert scoring.score_one("scbench_kv", f"The value is {uuid_}.", uuid_) == 1.0
    assert scoring.score_one("scbench_kv", uuid_[:-1], uuid_) == 0.0  # a near miss is a miss
    assert scoring.score_one("scbench_prefix_suffix", "abcXYZ", "abcXYZ") == 1.0
    assert scoring.score_one("scbench_mf", " 42, I think 17", 42) == 1.0
    assert scoring.score_one("scbench_mf", "42.9", 42) == 1.0  # int(float("42.9"))
    assert scoring.score_one("scbench_mf", "-5", 5) == 1.0  # the sign is not part of the number found
    assert scoring.score_one("scbench_mf", "17 or 42", 42) == 0.0  # only the first number counts
    assert scoring.score_one("scbench_mf", "none", 42) == 0.0
    assert scoring.score_one("scbench_mf", "2.5", 2.5) == 1.0
    with pytest.raises(TypeError):
        scoring.score_one("scbench_mf", "42", "42")
    refs = ["AAAAA", "BBBBB", "CCCCC"]
    assert scoring.score_one("scbench_vt", "aaaaa, BBBBB, CCCCC", refs) == 1.0
    assert scoring.score_one("scbench_vt", "AAAAA and nothing else", refs) == 0.33
    assert scoring.score_one("scbench_vt", "", refs) == 0.0
    assert scoring.score_one("scbench_choice_eng", "B. the dog", ["the dog", "B"]) == 1.0
    assert scoring.score_one("scbench_choice_eng", "the answer is: C", ["the dog", "B"]) == 0.0
    assert scoring.score_one("scbench_qa_eng", " paris is the capital", ["Paris"]) == 1.0
    assert scoring.score_one("scbench_qa_chn", "北京。", ["北京市"]) == pytest.approx(0.8)  # P=1, R=2/3
    with pytest.raises(ValueError, match="not transcribed"):
        scoring.score_one("scbench_repoqa", "x", "y")


def test_aggregation_per_turn_and_pooled():
    rows = [
        {"id": i, "turn_idx": t, "prediction": p, "ground_truth": "k"}
        for i, preds in enumerate([["k", "k"], ["k", "x"], ["x", "x"], ["k", "x"]])
        for t, p in enumerate(preds)
    ]
    by_turn = scoring.score_by_turn(rows, "scbench_kv")
    assert by_turn == {0: 0.75, 1: 0.25}
    assert scoring.summary_line(by_turn) == "75.000,25.000"
    assert scoring.score_pooled(rows, "scbench_kv") == 0.5
    assert scoring.summary_line(0.5) == "50.000"
    with pytest.raises(ValueError, match="lacks"):
        scoring.score_by_turn([{"prediction": "k"}], "scbench_kv")
