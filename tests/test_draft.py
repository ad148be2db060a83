"""A draft selector: the selection runs on a small model, a larger one with the same vocabulary generates."""

import pytest
import torch
from reference import reference_indices
from tiny_models import BUILDERS, DotTokenizer, _build
from transformers import LlamaConfig, LlamaForCausalLM

import gemfilter
from gemfilter.methods import get_method

N = 48


def target():
    """Wider and deeper than the 4-layer draft, with its vocabulary (96 ids)."""
    return _build(
        LlamaForCausalLM,
        LlamaConfig,
        hidden_size=96,
        intermediate_size=128,
        num_hidden_layers=6,
        num_attention_heads=6,
        num_key_value_heads=3,
    )


def prompt(n=N, seed=1):
    return torch.randint(3, 96, (1, n), generator=torch.Generator().manual_seed(seed))


def test_selection_on_the_draft_is_the_drafts_own():
    draft, big, ids = BUILDERS["llama"](), target(), prompt()
    sel = gemfilter.select_tokens(big, ids, layer=2, topk=12, selector=draft)
    alone = gemfilter.select_tokens(draft, ids, layer=2, topk=12)
    assert sel.indices[0].tolist() == alone.indices[0].tolist() == reference_indices(draft, ids, 2, 12)[0]
    assert sel.kept_ids[0].tolist() == alone.kept_ids[0].tolist()
    own = gemfilter.select_tokens(big, ids, layer=2, topk=12)
    assert own.indices[0].tolist() != sel.indices[0].tolist()  # the target would have kept others


@pytest.mark.parametrize("name", ["gemfilter", "gemfilter-qwin", "gemfilter-claa", "gemfilter-span"])
def test_the_target_generates_from_the_drafts_kept_tokens(name):
    draft, big, ids = BUILDERS["llama"](), target(), prompt(seed=2)
    method = get_method(name, topk=16, layer=3, tail=4)
    out = gemfilter.generate(big, ids, method=method, selector=draft, tokenizer=DotTokenizer(), max_new_tokens=6)
    alone = gemfilter.select_tokens(draft, ids, layer=3, topk=16, method=method, tokenizer=DotTokenizer())
    assert out.selection.indices[0].tolist() == alone.indices[0].tolist() and out.kept == [16]
    plain = big.generate(alone.kept_ids[0][None], max_new_tokens=6, do_sample=False)
    assert out.new_tokens[0].tolist() == plain[0, 16:].tolist()


def test_the_filter_layer_defaults_to_the_drafts():
    draft, big, ids = BUILDERS["llama"](), target(), prompt(seed=3)
    with gemfilter.apply(big, gemfilter.GemFilter(topk=12), selector=draft) as handle:
        big.generate(ids, max_new_tokens=2, do_sample=False)
    assert handle.method.layer == gemfilter.default_layer(draft) == handle.selection.layer
    assert gemfilter.default_layer(big) != handle.method.layer


def test_budget_ge_n_equals_plain_generate_of_the_target():
    draft, big, ids = BUILDERS["llama"](), target(), prompt(seed=4)
    out = gemfilter.generate(big, ids, layer=2, topk=N, selector=draft, max_new_tokens=6)
    assert torch.equal(out.sequences, big.generate(ids, max_new_tokens=6, do_sample=False))


def test_left_padded_batch_equals_rows_alone():
    draft, big = BUILDERS["llama"](), target()
    short, long = prompt(n=40, seed=5)[0], prompt(seed=6)[0]
    ids, mask = torch.zeros((2, N), dtype=torch.long), torch.zeros((2, N), dtype=torch.long)
    ids[0, N - 40 :], mask[0, N - 40 :] = short, 1
    ids[1], mask[1] = long, 1
    both = gemfilter.generate(
        big, {"input_ids": ids, "attention_mask": mask}, layer=2, topk=20, selector=draft, max_new_tokens=5
    )
    for i, row in enumerate((short, long)):
        alone = gemfilter.generate(big, row[None], layer=2, topk=20, selector=draft, max_new_tokens=5)
        assert both.new_tokens[i].tolist() == alone.new_tokens[0].tolist()


def test_a_vocabulary_mismatch_and_a_cache_method_are_refused():
    big, ids = target(), prompt()
    other = _build(LlamaForCausalLM, LlamaConfig, vocab_size=128)
    with pytest.raises(ValueError, match=r"selector vocabulary \(128 tokens\) differs from the model's \(96\)"):
        gemfilter.select_tokens(big, ids, layer=2, topk=12, selector=other)
    with pytest.raises(ValueError, match="selector vocabulary"):
        gemfilter.generate(big, ids, layer=2, topk=12, selector=other, max_new_tokens=2)
    with pytest.raises(ValueError, match="works with the prompt filters .* not snapkv"):
        gemfilter.generate(
            big, ids, method=get_method("snapkv", topk=40), selector=BUILDERS["llama"](), max_new_tokens=2
        )
