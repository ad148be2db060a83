"""FastKV against a reconstruction of the official code and a single-pass masked reference.

The references do not call the library:

- ``official_update_kv`` transcribes ``FastKVCluster.update_kv`` of dongwonjo/FastKV (repeat_kv, window
  logits with the causal window mask, fp32 softmax, sum over the window, pooling, GQA sum, top-k + window,
  and TSP's sum over KV heads).
- ``masked_reference`` runs the whole model once over prompt + generated tokens with an attention kernel
  registered by the test: a token at layer l sees exactly the keys FastKV gives it (all prompt tokens in
  the early layers, the propagated ones in later layers, each layer's kept cache rows for decode
  queries), at true positions. FastKV's per-step logits must equal its logits.
"""

import dataclasses

import pytest
import torch
import torch.nn.functional as F
from tiny_models import BUILDERS, FILTER_LAYER, on
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

import gemfilter
from gemfilter.compat import output_cache
from gemfilter.methods import FastKV, get_method
from gemfilter.methods.fastkv import tsp_default_layer

N = 48
pytestmark = pytest.mark.usefixtures("quiet_sliding_filter_layer")


def prompt(n=N, seed=1):
    return torch.randint(3, 96, (1, n), generator=torch.Generator().manual_seed(seed))


def official_update_kv(query, key, window, kernel, pooling, capacity, tsp_len, scaling, groups, tsp_layer):
    """dongwonjo/FastKV ``FastKVCluster.update_kv`` for one prefill (b = 1), indices only.

    Returns (kept rows (h_kv, capacity) or None, tsp indices (tsp_len,) or None)."""
    q_len = query.shape[-2]
    if q_len < capacity:
        return None, None
    k_rep = key[:, :, None].expand(-1, -1, groups, -1, -1).reshape(key.shape[0], -1, q_len, key.shape[-1])
    attn = torch.matmul(query[..., -window:, :].float(), k_rep.float().transpose(2, 3)) * scaling
    mask = torch.full((window, window), torch.finfo(attn.dtype).min)
    cond = torch.arange(window)
    mask.masked_fill_(cond < (cond + 1).view(window, 1), 0)
    attn[:, :, -window:, -window:] += mask[None, None]
    attn = F.softmax(attn, dim=-1, dtype=torch.float32)
    summed = attn[:, :, -window:, :-window].sum(dim=-2)
    pool = F.avg_pool1d if pooling == "avg" else F.max_pool1d
    cache = pool(summed, kernel_size=kernel, padding=kernel // 2, stride=1)
    cache = cache.view(1, -1, groups, q_len - window).sum(dim=-2)
    top = cache.topk(capacity - window, dim=-1).indices
    kept = torch.cat([top, torch.arange(q_len - window, q_len).expand(1, top.shape[1], window)], dim=-1)[0]
    tsp = None
    if tsp_layer and q_len > tsp_len:
        t = cache.sum(dim=-2).topk(tsp_len - window, dim=-1).indices[0]
        tsp = torch.cat([t, torch.arange(q_len - window, q_len)]).sort().values
    return kept.sort(-1).values, tsp


class Reference:
    """A test-registered attention kernel: per layer, an (h_kv or 1, T, T) allowed-keys matrix."""

    name = "fastkv_test_reference"

    def __init__(self, model):
        self.model, self.allowed, self.qk = model, None, {}
        AttentionInterface.register(self.name, self.kernel)
        AttentionMaskInterface.register(self.name, sdpa_mask)

    def kernel(self, module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
        i = module.layer_idx
        self.qk[i] = (query, key)
        g = query.shape[1] // key.shape[1]
        allowed = self.allowed(i)  # (h_kv or 1, T, T)
        allowed = allowed.repeat_interleave(g, 0) if allowed.shape[0] > 1 else allowed
        logits = (query.float() @ key.float().repeat_interleave(g, 1).transpose(-1, -2)) * scaling
        logits = logits.masked_fill(~allowed[None], float("-inf"))
        out = logits.softmax(-1).to(value.dtype) @ value.repeat_interleave(g, 1)
        return out.transpose(1, 2).contiguous(), None

    def forward(self, ids, allowed, position_ids=None):
        self.allowed, self.qk = allowed, {}
        base = self.model.config._attn_implementation
        self.model.set_attn_implementation(self.name)
        try:
            with torch.no_grad():
                return self.model(
                    input_ids=ids, attention_mask=torch.ones_like(ids), position_ids=position_ids, use_cache=False
                ).logits
        finally:
            self.model.set_attn_implementation(base)


def windows_of(model):
    from gemfilter.selection import num_layers, sliding_window_of

    return [sliding_window_of(model, i) for i in range(num_layers(model))]


def masked_reference(model, method, ids, generated):
    """Per-step logits of FastKV rebuilt by masking: (steps, vocab); plus the reference's kept sets."""
    n, tsp, win = ids.shape[1], method.layer, windows_of(model)
    ref = Reference(model)
    T = n

    def base(i, T):
        p = torch.arange(T)
        ok = p[None, :] <= p[:, None]
        if win[i] is not None:
            ok = ok & (p[None, :] > p[:, None] - win[i])
        return ok

    # prefill reference: early layers see everything; later layers only the propagated tokens
    ref.forward(ids, lambda i: base(i, n)[None])
    h_kv = ref.qk[0][1].shape[1]
    groups = ref.qk[0][0].shape[1] // h_kv
    scaling = model.model.layers[0].self_attn.scaling
    _, kept = official_update_kv(
        *ref.qk[tsp], method.window, method.kernel, method.pooling, method.topk, method.tsp_len, scaling, groups, True
    )
    in_p = torch.zeros(n, dtype=torch.bool)
    in_p[kept] = True

    def prefill_allowed(i):
        ok = base(i, n)
        if i > tsp:
            ok = ok & (in_p[None, :] | torch.eye(n, dtype=torch.bool))
        return ok[None]

    ref.forward(ids, prefill_allowed)
    caches = {}
    for i, (q, k) in ref.qk.items():
        if win[i] is not None:
            continue
        if i > tsp:
            q, k = q[:, :, kept], k[:, :, kept]
        rows, _ = official_update_kv(
            q, k, method.window, method.kernel, method.pooling, method.topk, method.tsp_len, scaling, groups, False
        )
        prompt_pos = torch.arange(n) if i <= tsp else kept
        caches[i] = prompt_pos[rows] if rows is not None else prompt_pos.expand(h_kv, -1)
    seq = torch.cat([ids, generated[None, :-1]], dim=1)
    T = seq.shape[1]

    def step_allowed(i):
        ok = base(i, T).expand(h_kv, T, T).clone()
        prompt_rows = prefill_allowed(i)[0]
        ok[:, :n, :n] &= prompt_rows
        cached = torch.zeros(h_kv, n, dtype=torch.bool)
        if win[i] is not None:
            cached[:] = True if i <= tsp else in_p
        else:
            cached.scatter_(1, caches[i], True)
        ok[:, n:, :n] &= cached[:, None, :]
        return ok

    logits = ref.forward(seq, step_allowed)[0, n - 1 :]
    return logits, kept, caches


@pytest.mark.parametrize("family", ["llama", "gemma3", "mistral-sliding"])
@pytest.mark.parametrize("topk,tsp_len", [(N, 20), (24, 32), (16, 20)])
def test_fastkv_equals_the_masked_reference_and_the_official_indices(family, topk, tsp_len):
    model = BUILDERS[family]()
    ids = prompt()
    method = FastKV(layer=FILTER_LAYER[family], topk=topk, tsp_len=tsp_len)
    with gemfilter.apply(model, method) as handle:
        out = model.generate(ids, max_new_tokens=6, do_sample=False, return_dict_in_generate=True, output_scores=True)
    generated = out.sequences[0, N:]
    logits, kept, caches = masked_reference(model, method, ids, generated)
    assert torch.equal(handle.selection.indices[0], kept)
    assert torch.allclose(torch.stack(out.scores)[:, 0], logits, atol=1e-4, rtol=1e-4)
    # after decoding, each full-attention layer's cache holds its kept rows, then the generated tokens
    for i, layer in enumerate(output_cache(out).layers):
        if i in caches:
            assert layer.keys.shape[2] == caches[i].shape[1] + len(generated) - 1, i


def test_kept_kv_rows_equal_the_official_code_path():
    """The stored K/V of a compressed early layer are the official rows of the full-context keys."""
    model = BUILDERS["llama"]()
    ids = prompt()
    method = FastKV(layer=2, topk=24, tsp_len=32)
    with gemfilter.apply(model, method):
        out = model.generate(ids, max_new_tokens=1, do_sample=False, return_dict_in_generate=True)
    cache = output_cache(out)
    ref = Reference(model)
    ref.forward(ids, lambda i: (torch.arange(N)[None, :] <= torch.arange(N)[:, None])[None])
    for i in (0, 1, 2):
        q, k = ref.qk[i]
        rows, _ = official_update_kv(
            q, k, 8, 7, "avg", 24, 32, model.model.layers[i].self_attn.scaling, q.shape[1] // k.shape[1], False
        )
        want = k.gather(2, rows[None, :, :, None].expand(-1, -1, -1, k.shape[-1]))
        assert torch.allclose(cache.layers[i].keys, want, atol=1e-5), i
    assert cache.layers[3].keys.shape[2] == 24  # the later layer compressed its 32 propagated tokens to 24


@pytest.mark.parametrize("family", ["llama", "gemma3", "mistral-sliding"])
def test_budgets_at_least_n_equal_plain_generate(family, device):
    model = on(BUILDERS[family](), device)
    ids = prompt().to(device)
    full = model.generate(ids, max_new_tokens=8, do_sample=False)
    for topk, tsp_len in [(N, N), (N + 16, 2048), (1024, N)]:
        out = gemfilter.generate(
            model, ids, method=FastKV(layer=FILTER_LAYER[family], topk=topk, tsp_len=tsp_len), max_new_tokens=8
        )
        assert torch.equal(out.sequences, full), (topk, tsp_len)


def test_banded_kernel_gives_the_same_fastkv_answer():
    sdpa = BUILDERS["gemma3"]()
    banded = BUILDERS["gemma3"]()
    gemfilter.set_attention(banded, "banded")
    ids = prompt(n=64)
    method = FastKV(layer=1, topk=24, tsp_len=32)
    outs = [
        gemfilter.generate(m, ids, method=method, max_new_tokens=6, output_scores=True, return_dict_in_generate=True)
        for m in (sdpa, banded)
    ]
    assert torch.equal(outs[0].sequences, outs[1].sequences)
    assert torch.allclose(torch.stack(outs[0].output.scores), torch.stack(outs[1].output.scores), atol=1e-4)
    assert banded.config._attn_implementation == "banded"


@pytest.mark.parametrize("family", ["llama", "gemma3", "mistral-sliding"])
def test_gemfilter_orig_pos_keeps_original_positions(family):
    """Reference: the model on the kept tokens at their original positions, each sliding window measured in
    those positions (a test kernel), greedy."""
    model = BUILDERS[family]()
    ids = prompt()
    layer = FILTER_LAYER[family]
    out = gemfilter.generate(
        model, ids, method=get_method("gemfilter-orig-pos", layer=layer, topk=20), max_new_tokens=6
    )
    kept = out.selection.indices[0]
    plain = gemfilter.generate(model, ids, method=get_method("gemfilter", layer=layer, topk=20), max_new_tokens=6)
    assert torch.equal(plain.selection.indices[0], kept)  # the same selection; only the positions differ
    win, ref = windows_of(model), Reference(model)
    seq, pos = ids[:, kept], kept
    for t in range(6):

        def allowed(i, p=pos):
            ok = p[None, :] <= p[:, None]
            return (ok & (p[None, :] > p[:, None] - win[i]) if win[i] is not None else ok)[None]

        logits = ref.forward(seq, allowed, position_ids=pos[None])
        seq = torch.cat([seq, logits[:, -1:].argmax(-1)], dim=1)
        pos = torch.cat([pos, torch.tensor([N + t])])
    assert torch.equal(out.new_tokens[0], seq[0, len(kept) :])


def test_gemfilter_orig_pos_padded_batch_equals_single_rows():
    model = BUILDERS["gemma3"]()
    a, b = prompt(), prompt(n=40, seed=2)
    ids = torch.cat([a, torch.cat([torch.zeros(1, 8, dtype=torch.long), b], dim=1)])
    mask = torch.ones_like(ids)
    mask[1, :8] = 0
    method = get_method("gemfilter-orig-pos", layer=1, topk=20)
    both = gemfilter.generate(model, {"input_ids": ids, "attention_mask": mask}, method=method, max_new_tokens=5)
    for row, single in ((0, a), (1, b)):
        one = gemfilter.generate(model, single, method=method, max_new_tokens=5)
        assert torch.equal(both.new_tokens[row], one.new_tokens[0]), row


def test_default_tsp_layer_is_the_official_choice():
    from transformers import AutoConfig

    from gemfilter.lab.bench.archs import arch_config

    for name, layer in [("llama-3.1-8b", 15), ("mistral-nemo-12b", 19)]:
        assert tsp_default_layer(arch_config(f"config:{name}")) == layer
    gemma = BUILDERS["gemma3"]().config  # 4 layers, full attention at 1 and 3: m/2 - 1 = 1
    assert tsp_default_layer(gemma) == 1
    cfg = AutoConfig.for_model(
        "gemma3_text",
        num_hidden_layers=18,
        layer_types=["full_attention" if i in (5, 11, 17) else "sliding_attention" for i in range(18)],
    )
    assert tsp_default_layer(cfg) == 11  # the embedded model: m/2 - 1 = 8 is a sliding layer
    model = BUILDERS["llama"]()
    from gemfilter.apply import resolve

    # resolve() fills in the TSP rule (1 on the tiny Llama: m/2 - 1), not GemFilter's filter layer (2)
    assert resolve(model, FastKV()).layer == 1 != resolve(model, get_method("gemfilter")).layer


def test_bad_parameters_are_refused_with_what_is_allowed():
    with pytest.raises(ValueError, match="pooling must be 'avg'"):
        FastKV(pooling="mean")
    with pytest.raises(ValueError, match="tsp_len=8 must exceed the window"):
        FastKV(tsp_len=8)
    model = BUILDERS["llama"]()
    with pytest.raises(ValueError, match="topk=8 .* must exceed the window"):
        gemfilter.generate(model, prompt(), method=FastKV(layer=2, topk=8), max_new_tokens=1)
    ids = torch.cat([prompt(), prompt(seed=2)])
    mask = torch.ones_like(ids)
    mask[1, :4] = 0
    with pytest.raises(ValueError, match="left-padded batches are not supported"):
        gemfilter.generate(
            model,
            {"input_ids": ids, "attention_mask": mask},
            method=FastKV(layer=2, topk=24, tsp_len=32),
            max_new_tokens=1,
        )


def test_batch_rows_equal_single_rows():
    model = BUILDERS["llama"]()
    ids = torch.cat([prompt(), prompt(seed=2)])
    method = FastKV(layer=2, topk=24, tsp_len=32)
    both = gemfilter.generate(model, ids, method=method, max_new_tokens=5).sequences
    for r in range(2):
        one = gemfilter.generate(model, ids[r : r + 1], method=method, max_new_tokens=5).sequences
        assert torch.equal(both[r : r + 1], one)


def test_replace_keeps_validation():
    with pytest.raises(ValueError, match="window=0"):
        dataclasses.replace(FastKV(), window=0)


def test_methods_command_documents_every_default(capsys):
    from gemfilter.lab.cli import main

    assert main(["methods", "fastkv"]) == 0
    out = capsys.readouterr().out
    for line in ("layer = None", "topk = 512", "tsp_len = 2048", "window = 8", "kernel = 7", "pooling = 'avg'"):
        assert line in out
    assert "TSP fires when" in out and "official" in out
    assert main(["methods", "fast"]) == 2
    assert "unknown method 'fast'; allowed: fastkv" in capsys.readouterr().err


def official_update_kv_casts(query, key, window, kernel, pooling, capacity, tsp_len, groups):
    """``FastKVCluster.update_kv`` with its own casts, line by line (b = 1): logits in the model's dtype
    divided by sqrt(head_dim), the window mask at finfo(dtype).min, softmax in fp32 cast back, window sum,
    pooling and GQA sum in the model's dtype. Returns (kept rows (h_kv, capacity) sorted, tsp (tsp_len,))."""
    import math

    bsz, _, q_len, head_dim = query.shape
    key_states_temp = key[:, :, None].expand(-1, -1, groups, -1, -1).reshape(bsz, -1, q_len, head_dim)
    attn_weights = torch.matmul(query[..., -window:, :], key_states_temp.transpose(2, 3)) / math.sqrt(head_dim)
    mask = torch.full((window, window), torch.finfo(attn_weights.dtype).min, device=attn_weights.device)
    mask_cond = torch.arange(mask.size(-1), device=mask.device)
    mask.masked_fill_(mask_cond < (mask_cond + 1).view(mask.size(-1), 1), 0)
    attn_weights[:, :, -window:, -window:] += mask[None, None, :, :]
    attn_weights = F.softmax(attn_weights, dim=-1, dtype=torch.float32).to(query.dtype)
    attn_weights_sum = attn_weights[:, :, -window:, :-window].sum(dim=-2)
    pool = F.avg_pool1d if pooling == "avg" else F.max_pool1d
    attn_cache = pool(attn_weights_sum, kernel_size=kernel, padding=kernel // 2, stride=1)
    attn_cache = attn_cache.view(bsz, -1, groups, q_len - window).sum(dim=-2)
    indices = attn_cache.topk(capacity - window, dim=-1).indices
    tail = torch.arange(q_len - window, q_len, device=indices.device).expand(1, indices.shape[1], window)
    kept = torch.cat([indices, tail], dim=-1)[0].sort(-1).values
    tsp = attn_cache.sum(dim=-2).topk(tsp_len - window, dim=-1).indices
    tsp = torch.cat([tsp, torch.arange(q_len - window, q_len, device=tsp.device)[None]], dim=-1).sort(dim=1).values[0]
    return kept, tsp


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_half_precision_kept_rows_follow_the_official_casts(dtype, device):
    """The default score_dtype='model' keeps exactly the official rows and TSP tokens in fp16/bf16/fp32;
    the all-fp32 option differs from them somewhere in half precision (so the choice is real)."""
    differs = 0
    for case in range(48):
        gen = torch.Generator().manual_seed(case)
        h, h_kv, n, d = (4, 1, 64, 16) if case % 2 else (8, 2, 96, 32)
        scale = 3.0 if case % 3 else 1.0  # peaked and flat attention
        query = (torch.randn(1, h, n, d, generator=gen) * scale).to(device, dtype)
        key = (torch.randn(1, h_kv, n, d, generator=gen) * scale).to(device, dtype)
        valid = torch.ones(1, n, dtype=torch.bool, device=device)
        topk, tsp_len = (24, 40) if case % 4 < 2 else (16, 20)
        want_rows, want_tsp = official_update_kv_casts(query, key, 8, 7, "avg", topk, tsp_len, h // h_kv)
        method = FastKV(layer=0, topk=topk, tsp_len=tsp_len)
        pooled = method.scores(query, key, valid, d**-0.5)
        assert pooled.dtype == dtype
        assert torch.equal(method.keep_plan(pooled, h_kv, valid)[0], want_rows), case
        assert torch.equal(method.propagate(pooled, h_kv, valid)[0][0], want_tsp), case
        fp32 = dataclasses.replace(method, score_dtype="fp32")
        pooled32 = fp32.scores(query, key, valid, d**-0.5)
        differs += not (
            torch.equal(fp32.keep_plan(pooled32, h_kv, valid)[0], want_rows)
            and torch.equal(fp32.propagate(pooled32, h_kv, valid)[0][0], want_tsp)
        )
    assert (differs > 0) == (dtype != torch.float32), differs


def test_score_dtype_is_checked():
    with pytest.raises(ValueError, match="score_dtype must be 'model' .* or 'fp32', got 'fp16'"):
        FastKV(score_dtype="fp16")


def test_all_sliding_model_with_a_wide_window_is_refused_not_reported_as_compressed():
    """Mistral-style config, every layer a 48-token window, n=60, topk=24: each layer would cache 47 rows under
    'kept 24'. fastkv refuses by name; with topk >= 47 it runs and every layer caches at most topk rows."""
    from tiny_models import COMMON
    from transformers import MistralConfig, MistralForCausalLM

    torch.manual_seed(0)
    model = MistralForCausalLM(MistralConfig(**{**COMMON, "sliding_window": 48, "head_dim": 16})).eval()
    ids = prompt(60)
    with pytest.raises(
        ValueError,
        match=r"fastkv compresses only full-attention layers.*each would cache 47 rows, "
        r"more than topk=24",
    ):
        gemfilter.generate(model, ids, method=FastKV(layer=2, topk=24, tsp_len=32), max_new_tokens=1)
    with gemfilter.apply(model, FastKV(layer=2, topk=47, tsp_len=32)):
        out = model.generate(ids, max_new_tokens=1, do_sample=False, return_dict_in_generate=True)
    assert max(layer.keys.shape[2] for layer in output_cache(out).layers) <= 47
