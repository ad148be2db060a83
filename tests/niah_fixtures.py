"""Offline NIAH fixtures: a word-level tokenizer whose vocabulary covers the needle, question and a
small haystack, a haystack folder, and a tiny random Llama saved next to that tokenizer."""

from pathlib import Path

SPECIALS = ["<pad>", "<s>", "</s>", "<unk>"]  # ids 0..3: the tiny models' pad/bos/eos ids are 0/1/2
NEEDLE_WORDS = (
    "The best thing to do in San Francisco is eat a sandwich and sit Dolores Park on sunny day . What ?".split()
)
PROMPT_WORDS = "This very long story book : Based the content of Question Answer".split()
HAY_WORDS = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho sigma".split()
# Two small essays (sorted by name they give this order); sentences of 2 to 5 words.
ESSAYS = {
    "a_first.txt": "alpha beta gamma . delta epsilon . zeta eta theta iota . kappa lambda . ",
    "b_second.txt": "mu nu xi omicron pi . rho sigma alpha . beta gamma delta epsilon zeta . ",
}


def vocab() -> dict:
    words = list(dict.fromkeys(SPECIALS + NEEDLE_WORDS + PROMPT_WORDS + HAY_WORDS))
    words += [f"filler{i}" for i in range(96 - len(words))]  # exactly the tiny models' vocab_size
    assert len(words) == 96
    return {w: i for i, w in enumerate(words)}


def word_tokenizer(chat_template=None):
    """Word-level fast tokenizer: splits on whitespace and punctuation; decode joins with spaces."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    raw = Tokenizer(models.WordLevel(vocab=vocab(), unk_token="<unk>"))
    raw.pre_tokenizer = pre_tokenizers.Whitespace()
    tok = PreTrainedTokenizerFast(
        tokenizer_object=raw, pad_token="<pad>", bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    )
    if chat_template:
        tok.chat_template = chat_template
    return tok


def write_haystack(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in ESSAYS.items():
        (folder / name).write_text(text, encoding="utf-8")
    return folder


def save_tiny_model(folder: Path) -> Path:
    from tiny_models import BUILDERS

    BUILDERS["llama"]().save_pretrained(folder)
    word_tokenizer().save_pretrained(folder)
    return folder
