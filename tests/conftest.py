"""Shared fixtures: a tiny Llama saved on disk with an offline word-level tokenizer."""

import pytest

from tiny_models import BUILDERS


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    path = tmp_path_factory.mktemp("tiny-llama")
    BUILDERS["llama"]().save_pretrained(path)
    vocab = {f"w{i}": i for i in range(96)}
    raw = Tokenizer(models.WordLevel(vocab=vocab, unk_token="w0"))
    raw.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=raw, eos_token="w2", bos_token="w1").save_pretrained(path)
    return path
