"""RULER generators on generated samples, checked independently of the generator code.

For every offline task at 4096 tokens (the embedded model's tokenizer only, no model):
- the token length is what the official sizing counts (prompt tokens without special tokens +
  tokens_to_generate) and within the budget;
- every expected answer is in the context, found by parsing the text (needle sentences, the
  variable chain, word counts), not by asking the generator;
- the number of needles, keys, values, queries, chain variables and words matches synthetic.yaml;
- the prompt is the official template character for character (transcribed below from NVIDIA/RULER
  scripts/data/synthetic/constants.py, with niah.py's singular replacements).
Also: prepare writes byte-identical files for the same seed, and sample i does not depend on how
many samples follow.
"""

import re
from collections import Counter

import pytest

from eval.ruler.prepare import generate
from eval.ruler.tasks import OFFLINE, get_task

LENGTH = 4096
N = 3

# Official templates + answer prefixes (RULER scripts/data/synthetic/constants.py), as prepare.py joins them.
OFFICIAL = {
    "niah": "Some special magic {type_needle_v} are hidden within the following text. Make sure to memorize it. I will "
    "quiz you about the {type_needle_v} afterwards.\n{context}\nWhat are all the special magic {type_needle_v} "
    "for {query} mentioned in the provided text? The special magic {type_needle_v} for {query} mentioned in "
    "the provided text are",
    "variable_tracking": "Memorize and track the chain(s) of variable assignment hidden in the following text.\n\n"
    "{context}\nQuestion: Find all variables that are assigned the value {query} in the text "
    "above. Answer: According to the chain(s) of variable assignment in the text above, {num_v} "
    "variables are assigned the value {query}, they are: ",
    "common_words_extraction": "Below is a numbered list of words. In these words, some appear more often than others. "
    "Memorize the ones that appear most often.\n{context}\nQuestion: What are the 10 most "
    "common words in the above list? Answer: The top 10 words that appear most often in the "
    "list are:",
    "freq_words_extraction": "Read the following coded text and track the frequency of each coded word. Find the three "
    "most frequently appeared coded words. {context}\nQuestion: Do not provide any "
    "explanation. Please ignore the dots '....'. What are the three most frequently appeared "
    "words in the above coded text? Answer: According to the coded text above, the three most "
    "frequently appeared words are:",
}
TOKENS_TO_GENERATE = {"niah": 128, "variable_tracking": 30, "common_words_extraction": 120, "freq_words_extraction": 50}
# synthetic.yaml: (haystack, key type, value type, keys, values, queries)
NIAH = {
    "niah_single_1": ("noise", "words", "numbers", 1, 1, 1),
    "niah_single_2": ("essay", "words", "numbers", 1, 1, 1),
    "niah_single_3": ("essay", "words", "uuids", 1, 1, 1),
    "niah_multikey_1": ("essay", "words", "numbers", 4, 1, 1),
    "niah_multikey_2": ("needle", "words", "numbers", 1, 1, 1),
    "niah_multikey_3": ("needle", "uuids", "uuids", 1, 1, 1),
    "niah_multivalue": ("essay", "words", "numbers", 1, 4, 1),
    "niah_multiquery": ("essay", "words", "numbers", 1, 1, 4),
}
VALUE_RE = {"numbers": r"\d{7}", "uuids": r"[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}"}
KEY_RE = {"words": r"[^,]+-[^,]+", "uuids": VALUE_RE["uuids"]}  # a few wonderwords entries hold spaces


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    from gemfilter.models import embedded_model_dir

    return AutoTokenizer.from_pretrained(str(embedded_model_dir()))


@pytest.fixture(scope="module")
def samples(tokenizer):
    return {name: generate(get_task(name), LENGTH, N, tokenizer) for name in OFFLINE}


def _split(template: str, **fields):
    """The official template's text before and after {context}, filled in."""
    head, tail = template.split("{context}")
    return head.format(**fields), tail.format(**fields)


@pytest.mark.parametrize("name", OFFLINE)
def test_length_is_the_official_token_count_within_the_budget(samples, tokenizer, name):
    ttg = TOKENS_TO_GENERATE[get_task(name).kind]
    for row in samples[name]:
        prompt = row["input"] + row["answer_prefix"]
        n = len(tokenizer.tokenize(prompt))  # RULER's HFTokenizer.text_to_tokens
        assert row["length"] == n + ttg == row["length_w_model_temp"]
        assert row["length"] <= LENGTH
        # The binary search fills the budget; essays step down by 500 words (~650 tokens) when a sample overflows.
        assert row["length"] > 0.8 * LENGTH, row["length"]
    assert [r["index"] for r in samples[name]] == list(range(N))


@pytest.mark.parametrize("name", list(NIAH))
def test_niah_template_answers_and_counts(samples, name):
    hay, ktype, vtype, num_k, num_v, num_q = NIAH[name]
    singular = num_v * num_q == 1
    template = OFFICIAL["niah"]
    if singular:  # niah.py's replacements, in its order
        template = (
            template.replace("Some", "A").replace("are all", "is").replace("are", "is").replace("answers", "answer")
        )
    shown = vtype[:-1] if singular else vtype
    for row in samples[name]:
        text = row["input"] + row["answer_prefix"]
        query = re.search(r"for (.+) mentioned in the provided text\?", row["input"]).group(1)
        head, tail = _split(template, type_needle_v=shown, query=query)
        assert text.startswith(head) and text.endswith(tail)
        assert row["answer_prefix"] == tail[tail.index(" The special magic") :]
        keys = query.replace(", and ", ", ").split(", ")
        assert len(keys) == num_q and all(re.fullmatch(KEY_RE[ktype], k) for k in keys)
        context = text[len(head) : len(text) - len(tail)]
        needles = re.findall(rf"One of the special magic {vtype} for (.+?) is: ([0-9a-f-]+)\.", context)
        expected = [v for k in keys for kk, v in needles if kk == k]
        assert sorted(expected) == sorted(row["outputs"]) and len(row["outputs"]) == num_q * num_v
        assert all(re.fullmatch(VALUE_RE[vtype], v) for v in row["outputs"])
        if hay == "needle":  # every line is a needle; the query's key appears once
            lines = context.split("\n")
            assert len(needles) == len(lines) and sum(k == keys[0] for k, _ in needles) == 1
        else:  # only the real needles: max(keys, queries) keys with num_v values each
            assert len(needles) == max(num_k, num_q) * num_v
            assert len({k for k, _ in needles}) == max(num_k, num_q)
        if hay == "noise":
            assert set(context.split("\n")) - {n for n in context.split("\n") if n.startswith("One of")} == {
                "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
            }
        position = row["token_position_answer"]
        assert 0 <= position < row["length"]


def test_vt_chain_resolves_to_the_outputs(samples):
    for row in samples["vt"]:
        text = row["input"] + row["answer_prefix"]
        value = re.findall(r"assigned the value (\d+) in the text above\.", row["input"])[-1]  # [0]: the example's
        head, tail = _split(OFFICIAL["variable_tracking"], query=value, num_v=5)
        assert text.endswith(tail)
        assert text.count(head) == 2 and text.startswith(head)  # the one-shot example, then the task
        main = text[text.rindex(head) + len(head) : len(text) - len(tail)]
        # follow the assignments independently
        assign = dict(re.findall(r"VAR (\w+) = (VAR \w+|\d+)", main))
        assert len(assign) == 5  # num_chains 1 x (num_hops 4 + 1)

        def resolve(v):
            while assign[v].startswith("VAR "):
                v = assign[v][4:]
            return assign[v]

        assert sorted(v for v in assign if resolve(v) == value) == sorted(row["outputs"])
        assert all(re.fullmatch(r"[A-Z]{5}", v) for v in row["outputs"])
        # the example (3-letter names) answered with its own variables
        example = text[: text.rindex(head)]
        shown = example.rsplit("they are: ", 1)[1].split()
        ex_assign = dict(re.findall(r"VAR (\w+) = (VAR \w+|\d+)", example))
        assert len(shown) == 5 and set(shown) == set(ex_assign) and all(len(v) == 3 for v in shown)


def _numbered(text):
    items = re.findall(r"(\d+)\. (\S+(?: \S+)*?)(?= \d+\. |$)", text)
    assert [int(i) for i, _ in items] == list(range(1, len(items) + 1))
    return [w for _, w in items]


def test_cwe_outputs_are_the_ten_most_common_words(samples):
    for row in samples["cwe"]:
        text = row["input"] + row["answer_prefix"]
        head, tail = _split(OFFICIAL["common_words_extraction"])
        assert text.startswith(head) and text.endswith(tail) and text.count(head) == 2
        main = text[text.rindex(head) + len(head) : len(text) - len(tail)]
        counts = Counter(_numbered(main))
        assert sorted(w for w, c in counts.items() if c == 30) == sorted(row["outputs"])  # freq_cw 30, num_cw 10
        assert len(row["outputs"]) == 10 and set(counts.values()) == {30, 3}  # freq_ucw 3
        example = text[len(head) : text.rindex(head)]
        ex_list, ex_answer = example.split(tail)
        ex_counts = Counter(_numbered(ex_list))
        assert sorted(_numbered(ex_answer.strip())) == sorted(w for w, c in ex_counts.items() if c == 10)
        assert len(ex_counts) == 40


def test_fwe_outputs_are_the_three_most_frequent_coded_words(samples):
    for row in samples["fwe"]:
        text = row["input"] + row["answer_prefix"]
        head, tail = _split(OFFICIAL["freq_words_extraction"])
        assert text.startswith(head) and text.endswith(tail)
        counts = Counter(text[len(head) : len(text) - len(tail)].split(" "))
        ranked = [w for w, _ in counts.most_common() if w != "..."]
        assert ranked[:3] == row["outputs"] and len(row["outputs"]) == 3
        assert counts["..."] > counts[ranked[0]] > counts[ranked[1]] > counts[ranked[2]] > counts[ranked[3]]
        assert all(re.fullmatch(r"[a-z]{6}", w) for w in ranked)


@pytest.mark.slow  # three prepare runs (~17 s)
def test_prepare_is_byte_identical_for_the_same_seed_and_prefix_stable(tmp_path, capsys):
    from eval.ruler.cli import main

    base = ["prepare", "--lengths", "4k", "--no-progress"]
    assert main([*base, "--tasks", "offline", "--num-samples", "2", "--out", str(tmp_path / "a")]) == 0
    assert main([*base, "--tasks", "offline", "--num-samples", "2", "--out", str(tmp_path / "b")]) == 0
    some = ("niah_single_2", "niah_multikey_2", "vt", "cwe", "fwe")  # one per generator, to keep the test short
    assert main([*base, "--tasks", ",".join(some), "--num-samples", "1", "--out", str(tmp_path / "c")]) == 0
    files = sorted(p.relative_to(tmp_path / "a") for p in (tmp_path / "a").rglob("*.json*"))
    assert len(files) == 12  # 11 tasks + prepare.json
    for f in files:
        assert (tmp_path / "a" / f).read_bytes() == (tmp_path / "b" / f).read_bytes(), f
        if f.parent.name in some:  # the 1-sample file is the first line of the 2-sample file
            two = (tmp_path / "a" / f).read_bytes().splitlines(keepends=True)
            assert len(two) == 2 and (tmp_path / "c" / f).read_bytes() == two[0], f
    # another seed gives other samples, and is refused in a folder made with seed 42
    vt = "4096/data/vt/validation.jsonl"
    assert main([*base, "--tasks", "vt", "--num-samples", "1", "--seed", "7", "--out", str(tmp_path / "d")]) == 0
    assert (tmp_path / "d" / vt).read_bytes() != (tmp_path / "c" / vt).read_bytes()
    assert main([*base, "--tasks", "vt", "--num-samples", "1", "--seed", "7", "--out", str(tmp_path / "c")]) == 2
    assert "seed: 42 there, 7 now" in capsys.readouterr().err


def test_lengths_and_tasks_parsing_errors():
    from eval.ruler.tasks import parse_lengths, parse_tasks

    assert parse_lengths("8k,4k,4096") == (4096, 8192)
    with pytest.raises(ValueError, match="not a whole number"):
        parse_lengths("4.5k")
    with pytest.raises(ValueError, match="too small"):
        parse_lengths("100")
    assert [t.name for t in parse_tasks("qa,vt")] == ["vt", "qa_1", "qa_2"]
    with pytest.raises(ValueError, match="unknown RULER task 'bogus'; allowed: niah_single_1"):
        parse_tasks("vt,bogus")
