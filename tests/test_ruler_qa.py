"""RULER qa_1 / qa_2: loading SQuAD and HotpotQA from --data-dir (small files written here), from the hub's
row layout (datasets.load_dataset stubbed), the offline error, and generated QA prompts; plus the lazy
NIAH key list against the official brute-force construction."""

import json
import re

import pytest

from eval.ruler import qa as qa_mod
from eval.ruler.prepare import generate
from eval.ruler.tasks import get_task

SQUAD = {
    "version": "v2.0",
    "data": [
        {
            "title": "Paris",
            "paragraphs": [
                {
                    "context": "Paris is the capital of France. It lies on the Seine.",
                    "qas": [
                        {
                            "question": "What is the capital of France?",
                            "id": "q1",
                            "is_impossible": False,
                            "answers": [{"text": "Paris", "answer_start": 0}, {"text": "Paris", "answer_start": 0}],
                        },
                        {
                            "question": "What is the capital of Mars?",
                            "id": "q2",
                            "is_impossible": True,
                            "answers": [],
                            "plausible_answers": [{"text": "Paris", "answer_start": 0}],
                        },
                    ],
                },
                {
                    "context": "The Eiffel Tower was finished in 1889 for the World's Fair.",
                    "qas": [
                        {
                            "question": "When was the Eiffel Tower finished?",
                            "id": "q3",
                            "is_impossible": False,
                            "answers": [{"text": "1889", "answer_start": 33}, {"text": "in 1889", "answer_start": 30}],
                        }
                    ],
                },
            ],
        },
        {
            "title": "Nile",
            "paragraphs": [
                {
                    "context": "The Nile flows north into the Mediterranean Sea.",
                    "qas": [
                        {
                            "question": "Into which sea does the Nile flow?",
                            "id": "q4",
                            "is_impossible": False,
                            "answers": [{"text": "the Mediterranean Sea", "answer_start": 25}],
                        }
                    ],
                }
            ],
        },
    ],
}
HOTPOT = [
    {
        "_id": "h1",
        "question": "Which river flows through the capital of France?",
        "answer": "the Seine",
        "type": "bridge",
        "level": "easy",
        "supporting_facts": [["Paris", 0], ["Seine", 0]],
        "context": [
            ["Paris", ["Paris is the capital of France.", " It lies on the Seine."]],
            ["Seine", ["The Seine flows through Paris."]],
            ["Rome", ["Rome is in Italy."]],
        ],
    },
    {
        "_id": "h2",
        "question": "In which country is Rome?",
        "answer": "Italy",
        "type": "bridge",
        "level": "easy",
        "supporting_facts": [["Rome", 0]],
        "context": [["Rome", ["Rome is in Italy."]], ["Oslo", ["Oslo is the capital of Norway."]]],
    },
]
OFFICIAL_QA = (
    "Answer the question based on the given documents. Only give me the answer and do not output any other "
    "words.\n\nThe following are given documents.\n\n{context}\n\nAnswer the question based on the given "
    "documents. Only give me the answer and do not output any other words.\n\nQuestion: {query} Answer:"
)


@pytest.fixture()
def data_dir(tmp_path):
    (tmp_path / "squad.json").write_text(json.dumps(SQUAD))
    (tmp_path / "hotpotqa.json").write_text(json.dumps(HOTPOT))
    return tmp_path


def test_local_files_read_as_the_official_readers(data_dir):
    squad = qa_mod.load_qa("squad", data_dir)
    # answerable questions only, in file order; documents = the unique paragraphs, sorted
    assert [q["query"] for q in squad.qas] == [
        "What is the capital of France?",
        "When was the Eiffel Tower finished?",
        "Into which sea does the Nile flow?",
    ]
    assert list(squad.docs) == sorted(p["context"] for d in SQUAD["data"] for p in d["paragraphs"])
    assert squad.qas[1]["outputs"] == ["1889", "in 1889"]
    eiffel, paris = (squad.docs.index(SQUAD["data"][0]["paragraphs"][i]["context"]) for i in (1, 0))
    assert squad.qas[1]["context"] == [eiffel] and squad.qas[1]["more_context"] == [paris]
    assert squad.qas[2]["more_context"] == []
    hotpot = qa_mod.load_qa("hotpotqa", data_dir)
    assert len(hotpot.docs) == 4  # "Rome\nRome is in Italy." appears twice
    assert "Paris\nParis is the capital of France. It lies on the Seine." in hotpot.docs
    assert [q["outputs"] for q in hotpot.qas] == [["the Seine"], ["Italy"]]
    assert len(hotpot.qas[0]["context"]) == 3


def test_hub_rows_give_the_same_data_as_the_files(data_dir, monkeypatch):
    import datasets

    squad_rows = [
        {
            "id": q["id"],
            "title": d["title"],
            "context": p["context"],
            "question": q["question"],
            "answers": {
                "text": [a["text"] for a in q["answers"]],
                "answer_start": [a["answer_start"] for a in q["answers"]],
            },
        }
        for d in SQUAD["data"]
        for p in d["paragraphs"]
        for q in p["qas"]
    ]
    hotpot_rows = [
        {
            "id": h["_id"],
            "question": h["question"],
            "answer": h["answer"],
            "context": {"title": [t for t, _ in h["context"]], "sentences": [s for _, s in h["context"]]},
        }
        for h in HOTPOT
    ]
    calls = []

    def fake(repo, config=None, split=None):
        calls.append((repo, config, split))
        return squad_rows if repo == "rajpurkar/squad_v2" else hotpot_rows

    monkeypatch.setattr(datasets, "load_dataset", fake)
    assert qa_mod.load_qa("squad") == qa_mod.load_qa("squad", data_dir)
    assert qa_mod.load_qa("hotpotqa") == qa_mod.load_qa("hotpotqa", data_dir)
    assert calls == [("rajpurkar/squad_v2", None, "validation"), ("hotpotqa/hotpot_qa", "distractor", "validation")]


def test_offline_hub_error_names_data_dir(tmp_path, monkeypatch):
    import datasets
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "cache")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    with pytest.raises(ConnectionError, match=r"could not load rajpurkar/squad_v2 .*pass --data-dir FOLDER"):
        qa_mod.load_qa("squad")


def test_missing_or_bad_local_files_are_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="squad.json not found; --data-dir must hold .*hotpotqa.json"):
        qa_mod.load_qa("squad", tmp_path)
    (tmp_path / "hotpotqa.json").write_text('[{"question": "q"}]')
    with pytest.raises(ValueError, match="hotpotqa data is not in the official layout"):
        qa_mod.load_qa("hotpotqa", tmp_path)


@pytest.fixture(scope="module")
def tokenizer():
    from eval.ruler.runner import load_tokenizer

    return load_tokenizer(None)


@pytest.mark.parametrize("name, dataset", [("qa_1", "squad"), ("qa_2", "hotpotqa")])
def test_generated_qa_prompts(data_dir, tokenizer, name, dataset):
    data = qa_mod.load_qa(dataset, data_dir)
    rows = generate(get_task(name), 1024, len(data.qas), tokenizer, data_dir=str(data_dir))
    for i, row in enumerate(rows):
        text = row["input"] + row["answer_prefix"]
        q = data.qas[i]
        head, tail = OFFICIAL_QA.split("{context}")
        assert text.startswith(head) and text.endswith(tail.format(query=q["query"]))
        assert row["answer_prefix"] == " Answer:" and row["outputs"] == q["outputs"]
        assert row["length"] == len(tokenizer.tokenize(text)) + 32 <= 1024
        context = text[len(head) : len(text) - len(tail.format(query=q["query"]))]
        docs = re.split(r"\n\nDocument \d+:\n", "\n\n" + context)[1:]
        assert [int(n) for n in re.findall(r"(?:^|\n\n)Document (\d+):\n", context)] == list(range(1, len(docs) + 1))
        # the data has fewer documents than the budget holds, so it is repeated: every gold doc is there
        assert all(data.docs[g] in docs for g in q["context"])
        assert any(a in context for a in q["outputs"])


def test_lazy_pair_words_equal_the_official_sorted_set():
    from eval.ruler.sources import PairWords, wonderwords_list

    # the tricky cases of the real lists: adjectives that prefix others ("blue-", "blue-eyed-"), spaces, hyphens
    adjs = ["blue", "blue-eyed", "ad hoc", "ad", "old", "old-fashioned", "x", "x-rated", "teeny", "teeny-tiny", "zany"]
    nouns = ["eyed-ant", "ant", "contact lens", "cop-out", "fashioned-x", "rated", "tiny-cat", "Zebra", "ant"]
    official = sorted(set(f"{a}-{n}" for a in adjs for n in nouns))
    lazy = PairWords(adjs, nouns)
    assert len(lazy) == len(official) and list(lazy) == official
    real_adjs = [a for a in wonderwords_list("adjectivelist.txt")][::9] + ["blue", "blue-eyed", "high", "high-pitched"]
    real_nouns = list(wonderwords_list("nounlist.txt"))[::23]
    official = sorted(set(f"{a}-{n}" for a in real_adjs for n in real_nouns))
    assert list(PairWords(real_adjs, real_nouns)) == official
