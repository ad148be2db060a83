"""RULER qa_1 (SQuAD 2.0 dev) and qa_2 (HotpotQA dev, distractor): documents, questions, one prompt.

Source: NVIDIA/RULER ``scripts/data/synthetic/qa.py`` (``read_squad``, ``read_hotpotqa``,
``generate_input_output``) and ``json/download_qa_dataset.sh``, which downloads SQuAD's
``dev-v2.0.json`` as ``squad.json`` and HotpotQA's ``hotpot_dev_distractor_v1.json`` as ``hotpotqa.json``.

Data, in this order: ``--data-dir`` holding those two files as downloaded (``squad.json``,
``hotpotqa.json``), else the Hugging Face hub through ``datasets`` (``rajpurkar/squad_v2`` validation;
``hotpotqa/hotpot_qa`` distractor validation), whose rows are regrouped into the same raw layout.
Offline, loading fails with an error that names ``--data-dir``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from gemfilter.toolkit.io import read_json

DOCUMENT_PROMPT = "Document {i}:\n{document}"
FILES = {"squad": "squad.json", "hotpotqa": "hotpotqa.json"}
HUB = {
    "squad": ("rajpurkar/squad_v2", None, "validation"),
    "hotpotqa": ("hotpotqa/hotpot_qa", "distractor", "validation"),
}


@dataclass(frozen=True)
class QAData:
    """qas: [{query, outputs, context (doc ids), more_context (doc ids, SQuAD only)}]; docs: sorted unique texts."""

    qas: tuple
    docs: tuple


def read_squad(data: dict) -> QAData:
    """The official ``read_squad`` on a parsed SQuAD 2.0 JSON: answerable questions, documents = paragraphs."""
    docs = sorted({p["context"] for d in data["data"] for p in d["paragraphs"]})
    ids = {c: i for i, c in enumerate(docs)}
    qas = []
    for d in data["data"]:
        more = [ids[p["context"]] for p in d["paragraphs"]]  # the other paragraphs of the same article
        for p in d["paragraphs"]:
            for q in p["qas"]:
                if not q["is_impossible"]:
                    qas.append(
                        {
                            "query": q["question"],
                            "outputs": [a["text"] for a in q["answers"]],
                            "context": [ids[p["context"]]],
                            "more_context": [i for i in more if i != ids[p["context"]]],
                        }
                    )
    return QAData(tuple(qas), tuple(docs))


def read_hotpotqa(data: list) -> QAData:
    """The official ``read_hotpotqa``: documents are ``title\\n`` + the joined sentences of each paragraph."""
    docs = sorted({f"{t}\n{''.join(p)}" for d in data for t, p in d["context"]})
    ids = {c: i for i, c in enumerate(docs)}
    qas = [
        {
            "query": d["question"],
            "outputs": [d["answer"]],
            "context": [ids[f"{t}\n{''.join(p)}"] for t, p in d["context"]],
        }
        for d in data
    ]
    return QAData(tuple(qas), tuple(docs))


def squad_from_rows(rows) -> dict:
    """Hub rows of squad_v2 (id, title, context, question, answers{text}) -> the raw dev-v2.0 layout.

    Rows come in the file's order, so consecutive rows with the same title / context form one article /
    paragraph; a question without answers is one of SQuAD 2.0's impossible ones.
    """
    articles = []
    for r in rows:
        if not articles or articles[-1]["title"] != r["title"]:
            articles.append({"title": r["title"], "paragraphs": []})
        paras = articles[-1]["paragraphs"]
        if not paras or paras[-1]["context"] != r["context"]:
            paras.append({"context": r["context"], "qas": []})
        texts = list(r["answers"]["text"])
        paras[-1]["qas"].append(
            {"question": r["question"], "answers": [{"text": t} for t in texts], "is_impossible": not texts}
        )
    return {"data": articles}


def hotpotqa_from_rows(rows) -> list:
    """Hub rows of hotpot_qa (question, answer, context{title, sentences}) -> the raw JSON layout."""
    return [
        {
            "question": r["question"],
            "answer": r["answer"],
            "context": [[t, list(s)] for t, s in zip(r["context"]["title"], r["context"]["sentences"])],
        }
        for r in rows
    ]


def load_qa(dataset: str, data_dir=None) -> QAData:
    """SQuAD (``dataset="squad"``) or HotpotQA (``"hotpotqa"``) from ``data_dir`` or the hub."""
    if dataset not in FILES:
        raise ValueError(f"unknown QA dataset {dataset!r}; allowed: {', '.join(FILES)}")
    if data_dir is not None:
        path = Path(data_dir) / FILES[dataset]
        if not path.is_file():
            raise FileNotFoundError(
                f"{path} not found; --data-dir must hold RULER's QA files as its download script "
                f"names them: squad.json (SQuAD dev-v2.0.json) and hotpotqa.json "
                f"(hotpot_dev_distractor_v1.json)"
            )
        raw = read_json(path, "QA data file", fix="Download it again with RULER's download_qa_dataset.sh")
    else:
        import datasets

        repo, config, split = HUB[dataset]
        try:
            rows = datasets.load_dataset(repo, config, split=split)
        except Exception as err:  # noqa: BLE001 - offline, no cache, no network: all get the same advice
            raise ConnectionError(
                f"could not load {repo}{'/' + config if config else ''} ({split}) from the Hugging Face hub "
                f"({type(err).__name__}: {err}). Without the hub, download {FILES[dataset]} elsewhere (SQuAD "
                "dev-v2.0.json -> squad.json, HotpotQA hotpot_dev_distractor_v1.json -> hotpotqa.json) and pass "
                "--data-dir FOLDER."
            ) from err
        raw = squad_from_rows(rows) if dataset == "squad" else hotpotqa_from_rows(rows)
    try:
        return read_squad(raw) if dataset == "squad" else read_hotpotqa(raw)
    except (KeyError, TypeError) as err:
        raise ValueError(
            f"{dataset} data is not in the official layout (missing {err}); expected SQuAD "
            "dev-v2.0.json / HotpotQA hotpot_dev_distractor_v1.json"
        ) from err


def qa(data: QAData, template: str, rng, index: int, num_docs: int) -> tuple:
    """One QA prompt: question ``index`` with its gold document(s) among ``num_docs`` documents.

    SQuAD fills up with the other paragraphs of the same article first, then random ones (official).
    Returns (text, the reference answers).
    """
    if index >= len(data.qas):
        raise ValueError(f"asked for question {index} but the QA data has {len(data.qas)} answerable questions")
    q = data.qas[index]
    gold, more = list(q["context"]), list(q.get("more_context", []))
    if num_docs < len(data.docs):
        if num_docs - len(gold) > len(more):
            taken = set(gold + more)
            extra = [i for i in range(len(data.docs)) if i not in taken]
            chosen = gold + more + rng.py.sample(extra, max(0, num_docs - len(gold) - len(more)))
        else:
            chosen = gold + rng.py.sample(more, num_docs - len(gold))
        docs = [data.docs[i] for i in chosen]
    else:  # repeat the whole collection as often as needed
        docs = (list(data.docs) * ((num_docs + len(data.docs) - 1) // len(data.docs)))[:num_docs]
    rng.fresh_shuffle(docs)
    context = "\n\n".join(DOCUMENT_PROMPT.format(i=i + 1, document=d) for i, d in enumerate(docs))
    return template.format(context=context, query=q["query"]), q["outputs"]
