"""The selector's prefix cache: exact, bounded, and safe under concurrent requests.

Every check compares against the selector without a cache (a fresh pass over the whole prompt).
"""

import threading

import pytest
import torch
from serve_fixtures import CharTokenizer, make_proxy, model, stub  # noqa: F401
from tiny_models import BUILDERS, FILTER_LAYER

from gemfilter.toolkit.serving.prefix_cache import PrefixCache, block_keys, cache_bytes
from gemfilter.toolkit.serving.selector import Selector

pytestmark = pytest.mark.usefixtures("quiet")


def selector_model(family):
    """The tiny model cut to layers 0..r, as load_selector cuts a real one (its base model, no LM head)."""
    from gemfilter.toolkit.serving.selector import cut_config

    full = BUILDERS[family]()
    layer = FILTER_LAYER[family]
    base = type(full.model)(cut_config(full.config, layer + 1)).eval()
    base.load_state_dict(full.model.state_dict(), strict=False)
    return base, layer


def conversation(turns=5, seed=0):
    """Prompts of a 5-turn conversation: each is the last one plus an answer and a question (token ids)."""
    gen = torch.Generator().manual_seed(seed)
    prompt, out = [], []
    for t in range(turns):
        prompt = prompt + torch.randint(3, 96, (60 if t == 0 else 23,), generator=gen).tolist()
        out.append(list(prompt))
    return out


@pytest.mark.parametrize("family", ["llama", "gemma3"])
@pytest.mark.parametrize("method", ["gemfilter", "gemfilter-span"])
def test_kept_ids_with_the_cache_equal_a_fresh_selection_over_five_turns(family, method):
    model, layer = selector_model(family)
    plain = Selector(model, CharTokenizer(), layer)
    cached = Selector(model, CharTokenizer(), layer, cache_bytes=2**30)
    for t, ids in enumerate(conversation()):
        assert cached.choose(ids, method, 24).ids == plain.choose(ids, method, 24).ids, t
    assert cached.prefix_cache.hits == 4 and cached.prefix_cache.misses == 1  # turn 1 ran whole, then prefixes hit


def test_eviction_keeps_the_cache_under_its_budget():
    model, layer = selector_model("llama")
    one = PrefixCache(2**30)
    sel = Selector(model, CharTokenizer(), layer, cache_bytes=2**30)
    sel.choose(conversation()[0], "gemfilter", 24)
    entry = sel.prefix_cache.used  # one 48-token prefix
    budget = int(2.5 * entry)
    small = Selector(model, CharTokenizer(), layer, cache_bytes=budget)
    plain = Selector(model, CharTokenizer(), layer)
    for seed in range(4):  # four conversations, each storing growing prefixes
        for ids in conversation(seed=seed):
            assert small.choose(ids, "gemfilter", 24).ids == plain.choose(ids, "gemfilter", 24).ids
            assert small.prefix_cache.used <= budget
    assert 0 < len(small.prefix_cache) <= 2
    assert not one.store(list(range(16)), _cache_of(2**31))  # larger than the whole budget: not stored
    assert one.used == 0


def _cache_of(nbytes):
    class Layer:
        keys = torch.empty(nbytes // 8, dtype=torch.float32)
        values = torch.empty(nbytes // 8, dtype=torch.float32)

    class Cache:
        layers = [Layer()]

    return Cache()


def test_concurrent_requests_on_shared_prefixes_answer_as_sequential_ones():
    model, layer = selector_model("llama")
    plain = Selector(model, CharTokenizer(), layer)
    prompts = [ids for seed in range(3) for ids in conversation(seed=seed)]
    want = [plain.choose(ids, "gemfilter", 24).ids for ids in prompts]
    shared = Selector(model, CharTokenizer(), layer, cache_bytes=2**30)
    got = [None] * len(prompts)
    gate = threading.Barrier(len(prompts))

    def run(i):
        gate.wait()
        got[i] = shared.choose(prompts[i], "gemfilter", 24).ids

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert got == want


def test_block_keys_name_prefixes_and_the_store_checks_alignment():
    ids = list(range(40))
    keys = block_keys(ids, 16)
    assert len(keys) == 2 and keys == block_keys(ids[:32], 16) and keys[0] == block_keys(ids[:16], 16)[0]
    assert block_keys([1] + ids[1:], 16)[1] != keys[1]  # a change in block 1 changes every later key
    with pytest.raises(ValueError, match="whole number of 16-token blocks, got 20"):
        PrefixCache(100).store(ids[:20], _cache_of(8))
    assert cache_bytes(_cache_of(64)) == 64


@pytest.mark.parametrize("family", ["llama", "gemma3"])
def test_scores_from_the_cached_prefix_equal_a_fresh_pass(family):
    """Stronger than equal kept ids: every token's pooled score, turn by turn, within float error."""
    from gemfilter.methods import get_method

    model, layer = selector_model(family)
    sel = Selector(model, CharTokenizer(), layer, cache_bytes=2**30)
    method = get_method("gemfilter", layer=layer, topk=24)
    for t, ids in enumerate(conversation()):
        with torch.no_grad():
            got, reused = sel._select_cached(method, ids)
            want = method.select(model, torch.tensor([ids]))
        assert reused == (0 if t == 0 else (len(conversation()[t - 1]) - 1) // 16 * 16), t  # the last turn's blocks
        assert torch.allclose(got.scores, want.scores, rtol=1e-5, atol=1e-5), t
        assert torch.equal(got.indices[0], want.indices[0]), t


def test_through_the_proxy_a_conversation_sends_the_same_ids_with_and_without_the_cache(make_proxy, stub, model):
    """Five chat turns (each resends the history) through a proxy with the cache and one without: the engine
    receives the same kept ids every turn."""
    from serve_fixtures import LAYER, post

    cached = Selector(model, CharTokenizer(), LAYER, cache_bytes=2**30)
    with_cache = make_proxy(selector=cached)
    without = make_proxy()
    messages, sent = [], {}
    for t in range(5):
        messages.append({"role": "user", "content": f"turn {t}: the harbour owls count stars."})
        for name, url in (("cache", with_cache), ("plain", without)):
            status, answer, _ = post(url + "/v1/chat/completions", {"messages": messages, "max_tokens": 4})
            assert status == 200 and not answer["gemfilter"]["passthrough"], answer
            sent.setdefault(name, []).append(stub.bodies[-1]["prompt"])
        messages.append({"role": "assistant", "content": answer["choices"][0]["message"]["content"]})
    assert sent["cache"] == sent["plain"]
    assert cached.prefix_cache.hits == 4  # turns 2..5 started from the stored prefix of the one before


@pytest.mark.parametrize("family", ["llama", "gemma3"])
def test_questions_over_one_document_start_from_the_document_once_a_second_question_shows_it(family):
    """Multi-request: each prompt is the document (100 tokens: 6 whole blocks) and a 30-token question of its own.
    The first question's entry reaches into its question; the second finds where it leaves the first and stores
    the document's 96 tokens; every later question starts there. The kept ids equal the uncached selection's."""
    model, layer = selector_model(family)
    plain = Selector(model, CharTokenizer(), layer)
    cached = Selector(model, CharTokenizer(), layer, cache_bytes=2**30)
    gen = torch.Generator().manual_seed(3)
    doc = torch.randint(3, 96, (100,), generator=gen).tolist()
    reused = []
    for q in range(4):
        ids = doc + [3 + q] + torch.randint(3, 96, (29,), generator=gen).tolist()
        got = cached.choose(ids, "gemfilter", 24)
        assert got.ids == plain.choose(ids, "gemfilter", 24).ids, q
        reused.append(got.reused)
    assert reused == [0, 0, 96, 96]
