"""Shared fixtures: a tiny Llama saved on disk with an offline word-level tokenizer; warning filters; the devices
that device-aware tests run on."""

import warnings

import pytest
import torch
from tiny_models import BUILDERS

#: The devices a device-aware test runs on: "cpu" everywhere; "cuda" marked ``cuda`` (``pytest -m cuda`` picks
#: them, as scripts/gpu_check.sh does) and skipped where torch sees no GPU.
DEVICES = [
    "cpu",
    pytest.param(
        "cuda",
        marks=[
            pytest.mark.cuda,
            pytest.mark.skipif(
                not torch.cuda.is_available(), reason="needs a CUDA device (scripts/gpu_check.sh runs these on a GPU)"
            ),
        ],
    ),
]


@pytest.fixture(params=DEVICES)
def device(request):
    """The torch.device a device-aware test runs on (see DEVICES)."""
    return torch.device(request.param)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    path = tmp_path_factory.mktemp("tiny-llama")
    BUILDERS["llama"]().save_pretrained(path)
    # Special tokens get names that no word contains: an added token "w1" would split "w10".
    # <pad> is id 0, the tiny models' pad_token_id; <unk> must differ, or generate would read every
    # unknown word as padding.
    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2, "<unk>": 3, **{f"w{i}": i for i in range(4, 96)}}
    raw = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    raw.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(
        tokenizer_object=raw, eos_token="</s>", bos_token="<s>", unk_token="<unk>", pad_token="<pad>"
    ).save_pretrained(path)
    return path


@pytest.fixture
def quiet():
    """Every warning silenced (use: ``pytestmark = pytest.mark.usefixtures("quiet")``); a test that checks a
    warning records it itself."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


@pytest.fixture
def quiet_sliding_filter_layer():
    """Only the warning that a filter layer is a sliding-window layer silenced (the tiny models' layers)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="filter layer .* sliding-window")
        yield


@pytest.fixture(autouse=True)
def torch_threads_restored():
    """Each test leaves torch's CPU thread count as it found it. A command run in-process sets it from its
    ``--threads`` (2 by default for the probes), and the count would otherwise hold for every later test. CI runs
    its two version jobs at once on 2 cores with one thread each (.ci/run): with two threads each, they wait on
    each other's cores (docs/setup.md gives the measurement)."""
    threads = torch.get_num_threads()
    yield
    if torch.get_num_threads() != threads:
        torch.set_num_threads(threads)
