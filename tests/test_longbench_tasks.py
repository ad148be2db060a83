"""LongBench task table, official templates, data loading (local folder, offline hub) and prompt preparation."""

import json

import pytest
from longbench_fixtures import write_words

from eval.longbench import data
from eval.longbench.pipeline import (
    apply_chat_template,
    default_max_length,
    generation_kwargs,
    prepare,
    truncate_middle,
)
from eval.longbench.tasks import BY_NAME, E_TASKS, PAPER_TASKS, TASKS, get_task, parse_tasks


def test_task_table_matches_the_spec():
    table = [(t.config, t.category, t.metric, t.max_new_tokens) for t in TASKS]
    assert table == [
        ("narrativeqa", "single-doc QA", "qa_f1", 128),
        ("qasper", "single-doc QA", "qa_f1", 128),
        ("multifieldqa_en", "single-doc QA", "qa_f1", 64),
        ("hotpotqa", "multi-doc QA", "qa_f1", 32),
        ("2wikimqa", "multi-doc QA", "qa_f1", 32),
        ("musique", "multi-doc QA", "qa_f1", 32),
        ("gov_report", "summarization", "rouge", 512),
        ("qmsum", "summarization", "rouge", 512),
        ("multi_news", "summarization", "rouge", 512),
        ("trec", "few-shot", "classification", 64),
        ("triviaqa", "few-shot", "qa_f1", 32),
        ("samsum", "few-shot", "rouge", 128),
        ("passage_count", "synthetic", "count", 32),
        ("passage_retrieval_en", "synthetic", "retrieval", 32),
        ("lcc", "code", "code_sim", 64),
        ("repobench-p", "code", "code_sim", 64),
    ]
    assert PAPER_TASKS == tuple(t[0] for t in table[:14])
    assert set(E_TASKS) == {
        "qasper",
        "multifieldqa_en",
        "hotpotqa",
        "2wikimqa",
        "gov_report",
        "multi_news",
        "trec",
        "triviaqa",
        "samsum",
        "passage_count",
        "passage_retrieval_en",
        "lcc",
        "repobench-p",
    }
    assert {t.config for t in TASKS if t.first_line} == {"trec", "triviaqa", "samsum"}
    assert {t.config for t in TASKS if not t.chat} == {"trec", "triviaqa", "samsum", "lcc", "repobench-p"}


def test_templates_keep_the_official_characters():
    t = {k: v.template for k, v in BY_NAME.items()}
    assert t["narrativeqa"].count("asconcisely") == 2  # the official typo, twice
    assert "\n\nArticle: {context}\n\n Answer the question based on the above article" in t["qasper"]  # leading space
    assert t["multi_news"].startswith("You are given several news passages. Write a one-page summary of all news. \n\n")
    assert t["passage_count"].endswith("\n\nThe final answer is: ")  # trailing space
    assert t["passage_retrieval_en"].endswith('like "Paragraph 1", "Paragraph 2", etc.\n\nThe answer is: ')
    assert t["lcc"] == "Please complete the code given below. \n{context}Next line of code:\n"
    assert t["trec"] == (
        "Please determine the type of the question below. Here are some examples of questions.\n\n{context}\n{input}"
    )
    assert t["hotpotqa"] == t["2wikimqa"] == t["musique"]
    assert t["multifieldqa_en"].endswith("do not output any other words.\n\nQuestion: {input}\nAnswer:")
    # str.format fills the fields once: braces inside the record stay literal.
    record = {"context": "def f(x): return {x}\n", "input": "y = {input}", "answers": []}
    assert BY_NAME["repobench-p"].prompt(record) == (
        "Please complete the code given below. \ndef f(x): return {x}\ny = {input}Next line of code:\n"
    )


def test_task_names_aliases_and_errors():
    assert [t.config for t in parse_tasks("trec, hotpotqa,trec")] == ["hotpotqa", "trec"]  # table order, no repeats
    assert len(parse_tasks(None)) == 16 and len(parse_tasks(None, e=True)) == 13 and len(parse_tasks("paper")) == 14
    assert get_task("qasper_e") is BY_NAME["qasper"] and BY_NAME["qasper"].e_config() == "qasper_e"
    with pytest.raises(ValueError, match="unknown LongBench task 'lsht'; allowed: narrativeqa, qasper"):
        parse_tasks("lsht")
    with pytest.raises(ValueError, match="--e: narrativeqa, musique has no LongBench-E variant; allowed: qasper"):
        parse_tasks("narrativeqa,musique,hotpotqa", e=True)
    with pytest.raises(ValueError, match="--tasks is empty"):
        parse_tasks(" , ")


def test_local_folder_loading_and_errors(tmp_path):
    folder = write_words(tmp_path / "data", e=True)
    recs = data.load_records("hotpotqa_e", folder, limit=2)
    assert [r["_id"] for r in recs] == ["hotpotqa-000", "hotpotqa-001"] and recs[1]["length"] == 5000
    (folder / "trec.jsonl").write_text(
        json.dumps({"input": "q", "context": "c", "answers": ["Food"], "length": 3, "all_classes": ["Food"]}) + "\n\n"
    )
    assert data.load_records("trec", folder)[0]["_id"] == "trec#1"  # synthesized from the line number
    with pytest.raises(FileNotFoundError, match=r"qasper.jsonl not found; .*found: hotpotqa.jsonl, hotpotqa_e.jsonl"):
        data.load_records("qasper", folder)
    with pytest.raises(FileNotFoundError, match="is not a folder"):
        data.load_records("qasper", tmp_path / "nowhere")
    bad = {
        "bad1": '{"input": "q", "context": "c", "length": 3}',
        "bad2": '{"input": "q",',
        "bad3": '{"input": "q", "context": "c", "answers": "x", "length": 3}',
        "dup": '{"input": "q", "context": "c", "answers": [], "length": 3, "_id": "a"}\n' * 2,
    }
    for name, text in bad.items():
        (folder / f"{name}.jsonl").write_text(text + "\n")
    for name, msg in [
        ("bad1", r"bad1.jsonl:1: record lacks answers"),
        ("bad2", r"bad2.jsonl:1: not valid JSON"),
        ("bad3", "'answers' must be a list"),
        ("dup", "_id 'a' appears twice"),
    ]:
        with pytest.raises(ValueError, match=msg):
            data.load_records(name, folder)
    with pytest.raises(ValueError, match="--limit must be an int >= 1"):
        data.load_records("hotpotqa", folder, limit=0)


def test_offline_hub_error_points_to_the_local_folder(tmp_path, monkeypatch):
    import datasets
    import huggingface_hub.constants

    # The env var is read at import time, so patch the constants (and an empty cache: nothing to reuse).
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "cache")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    with pytest.raises(ConnectionError, match=r"could not load THUDM/LongBench config 'hotpotqa_e'.*--data-dir FOLDER"):
        data.load_records("hotpotqa_e")


def test_hub_records_come_from_load_dataset(monkeypatch):
    import datasets

    calls = []

    def fake_load_dataset(repo, config, split):
        calls.append((repo, config, split))
        return [
            {"input": "q", "context": "c", "answers": ["a"], "length": 9, "all_classes": None, "_id": f"id{i}"}
            for i in range(3)
        ]

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    assert [r["_id"] for r in data.load_records("trec_e", limit=2)] == ["id0", "id1"]
    assert calls == [("THUDM/LongBench", "trec_e", "test")]


@pytest.fixture(scope="module")
def bos_tokenizer():
    """Word tokenizer that adds <s> ... </s>, so truncation meets special tokens at both ends."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2, "<unk>": 3, **{f"w{i}": i for i in range(4, 96)}}
    raw = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    raw.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    raw.post_processor = processors.TemplateProcessing(single="<s> $A </s>", special_tokens=[("<s>", 1), ("</s>", 2)])
    return PreTrainedTokenizerFast(
        tokenizer_object=raw, bos_token="<s>", eos_token="</s>", unk_token="<unk>", pad_token="<pad>"
    )


def test_middle_truncation_keeps_both_halves_and_skips_special_tokens(bos_tokenizer):
    prompt = "w4 w5 w6 w7 w8 w9"  # ids [<s>, w4..w9, </s>]: 8 tokens with the default special tokens
    assert truncate_middle(prompt, bos_tokenizer, 8) is prompt  # fits: returned unchanged
    # max_length 6: half 3 -> decode([<s>, w4, w5]) = "w4 w5" and decode([w8, w9, </s>]) = "w8 w9", no separator
    assert truncate_middle(prompt, bos_tokenizer, 6) == "w4 w5w8 w9"
    # max_length 4 and 5: half = int(5 / 2) = 2 at both ends -> "w4" + "w9"
    assert truncate_middle(prompt, bos_tokenizer, 4) == "w4w9"
    assert truncate_middle(prompt, bos_tokenizer, 5) == "w4w9"
    for bad in (1, 0, 3.5, True):
        with pytest.raises(ValueError, match="--max-length must be an int >= 2"):
            truncate_middle(prompt, bos_tokenizer, bad)


def test_chat_template_comes_after_truncation_and_skips_raw_tasks(bos_tokenizer):
    from copy import deepcopy

    tok = deepcopy(bos_tokenizer)
    record = {"context": "w10 w11 w12 w13 w14 w15", "input": "w20", "answers": []}
    with pytest.raises(ValueError, match="has no chat template"):
        apply_chat_template("w4", tok)
    tok.chat_template = "<s> USER {{ messages[0]['content'] }} BOT"
    # hotpotqa's prompt is far longer than 8 tokens; halves of 4: [<s>, <unk> x3] -> "" and
    # [<unk> "Question:", w20, <unk> "Answer:", </s>] -> "w20" (<unk> is special, so skipped). The chat
    # template then wraps the truncated text, so its own tokens are not truncated away.
    text, add_special = prepare(BY_NAME["hotpotqa"], record, tok, 8, chat_template=True)
    assert (text, add_special) == ("<s> USER w20 BOT", False)  # the template's own <s>, no second one
    text, add_special = prepare(BY_NAME["trec"], record, tok, 100, chat_template=True)
    assert add_special and text == BY_NAME["trec"].prompt(record)  # trec stays raw


def test_samsum_stops_at_newline_and_generates_at_least_one_token():
    class Tok:
        eos_token_id = 1

        def encode(self, text, add_special_tokens=True):
            assert text == "\n" and add_special_tokens is False
            return [5, 108]  # e.g. a prefix-space piece then the newline: pred.py takes the last id

    assert generation_kwargs(BY_NAME["samsum"], Tok()) == {
        "max_new_tokens": 128,
        "eos_token_id": [1, 108],
        "min_new_tokens": 1,
    }
    assert generation_kwargs(BY_NAME["trec"], Tok()) == {"max_new_tokens": 64}


def test_default_max_length_is_the_window_minus_500():
    class M:
        class config:
            max_position_embeddings = 4096

    assert default_max_length(M()) == 3596  # 4096 - 500
    M.config.max_position_embeddings = 400
    with pytest.raises(ValueError, match="pass --max-length explicitly"):
        default_max_length(M())
