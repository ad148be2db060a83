"""The paper's architectures as data: shipped configs against hand-written published values, fast
random-weight builds, forced generation lengths, and the bench's CUDA bookkeeping with stand-ins.

Full-size models are only built on the meta device (shapes, no memory). Runnable models use
``--layers 2`` plus the TESTS-ONLY shrink (widths / 8, vocabulary 1024): a 2-layer Llama 3.1 8B at
full width still carries 2 x 525M embedding parameters, too big for a unit test on 2 cores.
"""

import math
from types import SimpleNamespace

import pytest
import torch

import gemfilter
from gemfilter.lab.bench import archs
from gemfilter.lab.bench.core import device_name, forced_kwargs, warmup_tokens
from gemfilter.measure import PeakMemory
from gemfilter.methods import get_method

# Written from the published config.json files (see gemfilter/configs/SOURCES.md), not read from them.
PUBLISHED = {
    "llama-3.1-8b": dict(
        model_type="llama",
        num_hidden_layers=32,
        hidden_size=4096,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=128,
        intermediate_size=14336,
        vocab_size=128256,
        max_position_embeddings=131072,
        rope_theta=500000.0,
        tie_word_embeddings=False,
        rope_scaling={
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
    ),
    "mistral-nemo-12b": dict(
        model_type="mistral",
        num_hidden_layers=40,
        hidden_size=5120,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=128,
        intermediate_size=14336,
        vocab_size=131072,
        max_position_embeddings=1024000,
        rope_theta=1000000.0,
        tie_word_embeddings=False,
        rope_scaling=None,
        sliding_window=None,
    ),
    "phi-3.5-mini": dict(
        model_type="phi3",
        num_hidden_layers=32,
        hidden_size=3072,
        num_attention_heads=32,
        num_key_value_heads=32,
        head_dim=96,
        intermediate_size=8192,
        vocab_size=32064,
        max_position_embeddings=131072,
        original_max_position_embeddings=4096,
        rope_theta=10000.0,
        tie_word_embeddings=False,
        sliding_window=262144,
    ),
}
# Phi 3.5's longrope factors at a few positions, from the published config.json.
PHI_LONG = {0: 1.0800000429153442, 7: 2.620000123977661, 23: 44.96000289916992, 47: 64.83999633789062}
PHI_SHORT = {0: 1.0, 1: 1.0199999809265137, 24: 1.9899996519088745, 47: 2.8399994373321533}
# Parameter counts the model cards publish (Llama: the hub's safetensors index; the others: 12.2B, 3.8B).
PUBLISHED_PARAMS = {"llama-3.1-8b": 8_030_261_248, "mistral-nemo-12b": 12_247_782_400, "phi-3.5-mini": 3_821_079_552}


@pytest.mark.parametrize("arch", sorted(PUBLISHED))
def test_shipped_config_key_fields(arch):
    cfg = archs.published_config("config:" + arch)
    want = PUBLISHED[arch]
    for key, value in want.items():
        if key == "head_dim":
            got = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
        else:
            got = cfg.get(key)
        assert got == value, f"{arch}: {key} is {got!r}, published {value!r}"
    assert cfg["torch_dtype"] == "bfloat16"


def test_phi_longrope_factors_are_the_published_lists():
    rope = archs.published_config("config:phi-3.5-mini")["rope_scaling"]
    assert rope["type"] == "longrope"
    assert len(rope["long_factor"]) == len(rope["short_factor"]) == 96 // 2  # one factor per rotary frequency
    for i, v in PHI_LONG.items():
        assert rope["long_factor"][i] == v
    for i, v in PHI_SHORT.items():
        assert rope["short_factor"][i] == v
    assert rope["long_factor"] == sorted(rope["long_factor"])  # the published lists are non-decreasing


def _hand_param_count(p):
    """Embeddings + per-layer attention, MLP (gate, up, down) and two norms + final norm + lm_head."""
    h, d, heads, kv = p["hidden_size"], p["head_dim"], p["num_attention_heads"], p["num_key_value_heads"]
    attn = h * heads * d + 2 * h * kv * d + heads * d * h
    mlp = 3 * h * p["intermediate_size"]
    return 2 * p["vocab_size"] * h + p["num_hidden_layers"] * (attn + mlp + 2 * h) + h


@pytest.mark.parametrize("arch", sorted(PUBLISHED))
def test_full_model_builds_on_meta_with_the_published_parameter_count(arch):
    model = archs.build_model("config:" + arch, device="meta", dtype="bf16")
    count = sum(p.numel() for p in model.parameters())
    assert _hand_param_count(PUBLISHED[arch]) == PUBLISHED_PARAMS[arch] == count
    assert gemfilter.selection.num_layers(model) == PUBLISHED[arch]["num_hidden_layers"]


def test_layers_keeps_the_first_n_and_the_built_config_keeps_rope():
    cfg = archs.arch_config("config:llama-3.1-8b", layers=8)
    assert cfg.num_hidden_layers == 8 and cfg.gemfilter_changes == ["first 8 of 32 decoder layers"]
    rope = cfg.rope_parameters
    assert (rope["rope_type"], rope["factor"], rope["original_max_position_embeddings"]) == ("llama3", 8.0, 8192)
    assert rope["rope_theta"] == 500000.0
    phi = archs.arch_config("config:phi-3.5-mini")
    assert phi.sliding_window is None  # 262144 > 131072 positions: can never mask, dropped and recorded
    assert any("sliding_window 262144" in c for c in phi.gemfilter_changes)
    with pytest.raises(ValueError, match="1..32"):
        archs.arch_config("config:llama-3.1-8b", layers=33)
    with pytest.raises(ValueError, match="shipped: config:llama-3.1-8b"):
        archs.arch_config("config:llama-9b")


@pytest.mark.parametrize("arch", sorted(PUBLISHED))
def test_scaled_model_builds_in_bf16_with_init_scaled_weights(arch):
    model = archs.build_model("config:" + arch, layers=2, dtype="bf16", device="cpu", test_shrink=True)
    params = dict(model.named_parameters())
    assert all(p.dtype == torch.bfloat16 for p in params.values())
    assert gemfilter.selection.num_layers(model) == 2
    emb = params["model.embed_tokens.weight"].float()
    assert emb.std().item() == pytest.approx(0.02, rel=0.05) and abs(emb.mean().item()) < 1e-3
    assert all(p.float().eq(1).all() for n, p in params.items() if "layernorm" in n)
    ids = archs.random_prompt(model.config.vocab_size, 40)
    assert ids.shape == (1, 40) and int(ids.max()) < model.config.vocab_size
    with torch.no_grad():
        logits = model(input_ids=ids).logits
    assert torch.isfinite(logits).all()


METHODS = ("full", "gemfilter", "snapkv", "h2o", "gemfilter-one-run")


def test_every_method_generates_exactly_the_forced_tokens_even_when_eos_wins():
    """A model whose greedy choice is always EOS (all logits 0, EOS = token 0) stops after one token
    unforced; with the bench's keywords every method must still produce exactly 5."""
    model = archs.build_model("config:llama-3.1-8b", layers=2, dtype="fp32", device="cpu", test_shrink=True)
    with torch.no_grad():
        model.model.norm.weight.zero_()
    model.generation_config.eos_token_id = 0
    model.generation_config.pad_token_id = 0
    ids = archs.random_prompt(model.config.vocab_size, 120, seed=3)
    plain = gemfilter.generate(model, ids, method=gemfilter.get_method("full"), max_new_tokens=5)
    assert plain.new_tokens.shape[1] == 1  # the control: EOS really stops an unforced run
    for name in METHODS:
        method = gemfilter.get_method(name, layer=1, topk=48)
        out = gemfilter.generate(model, ids, method=method, **forced_kwargs(5))
        assert out.new_tokens.shape[1] == 5, name
        assert 0 not in out.new_tokens[0].tolist(), name


class _FakeCuda:
    def __init__(self):
        self.calls = []
        self.allocated = 3 * 2**30

    def get_device_name(self, device):
        self.calls.append(("name", str(device)))
        return "NVIDIA H100 80GB HBM3"

    def synchronize(self, device):
        self.calls.append(("sync", str(device)))

    def reset_peak_memory_stats(self, device):
        self.calls.append(("reset", str(device)))

    def max_memory_allocated(self, device):
        self.calls.append(("max", str(device)))
        return self.allocated

    def memory_allocated(self, device):
        return 2**30


def test_device_name_uses_the_gpu_name_on_cuda_and_the_cpu_model_otherwise():
    fake = _FakeCuda()
    assert device_name(torch.device("cuda:0"), cuda=fake) == "NVIDIA H100 80GB HBM3"
    assert fake.calls == [("name", "cuda:0")]
    cpu = device_name(torch.device("cpu"))
    assert cpu and "H100" not in cpu


def test_cuda_memory_is_synchronised_max_memory_allocated_per_phase():
    memory = PeakMemory(torch.device("cuda:1"))  # not the default GPU: every call must name it
    memory.torch = SimpleNamespace(cuda=_FakeCuda())
    fake = memory.torch.cuda
    memory.baseline = memory.now()  # memory_allocated after the load: 1 GiB
    memory.reset_peak()
    assert fake.calls == [("sync", "cuda:1"), ("reset", "cuda:1")]  # sync first: no queued kernel escapes
    assert memory.peak_abs() == 3 * 1024 and memory.peak() == 2 * 1024
    assert fake.calls[-2:] == [("sync", "cuda:1"), ("max", "cuda:1")]  # and before reading the peak


def test_warmup_is_long_enough_on_cuda_for_the_method_path():
    assert warmup_tokens(torch.device("cuda"), n=120 * 1024, topk=1024) == 1024 + 256
    # FastKV's TSP fires only past tsp_len: the warm-up must run it (the H200 run's 4K FastKV cell did not)
    from gemfilter.lab.bench.core import warmup_budget
    from gemfilter.methods import FastKV, GemFilter

    assert warmup_budget(FastKV(topk=1024, tsp_len=2048)) == 2048 and warmup_budget(GemFilter(topk=512)) == 512
    assert warmup_tokens(torch.device("cuda"), n=4096, topk=warmup_budget(FastKV(topk=1024, tsp_len=2048))) > 2048
    assert warmup_budget(get_method("full")) is None
    assert warmup_tokens(torch.device("cuda"), n=500, topk=1024) == 500
    assert warmup_tokens(torch.device("cpu"), n=4096, topk=1024) == 300


def test_measure_warms_up_before_the_timed_run(monkeypatch, device):
    from gemfilter.lab.bench import core as bench

    calls = []
    real = gemfilter.generate

    def spy(model, inputs, **kw):
        calls.append((inputs["input_ids"].shape[1], kw.get("streamer") is not None, kw.get("max_new_tokens")))
        return real(model, inputs, **kw)

    monkeypatch.setattr(gemfilter, "generate", spy)
    row = bench.measure(
        "config:llama-3.1-8b", "gemfilter", 400, 3, 64, 1, layers=2, dtype="fp32", device=str(device), test_shrink=True
    )
    w = warmup_tokens(device, 400, 64)  # 300 on CPU; k + 256 = 320 on CUDA
    assert calls == [(w, False, 2), (400, True, 3)]  # untimed warm-up first, then the timed, streamed run
    assert row["new_tokens"] == 3 and row["warmup_tokens"] == w and row["weights"] == "random"
    assert row["device"].startswith(device.type)
    assert row["prompt_peak_abs_mib"] >= row["prompt_peak_mib"] and row["device_name"]
    assert row["dtype"] == "float32" and row["layer"] == 1 and row["m"] == 2


def test_random_prompt_is_seeded():
    a, b = archs.random_prompt(1000, 64, seed=5), archs.random_prompt(1000, 64, seed=5)
    assert torch.equal(a, b) and not torch.equal(a, archs.random_prompt(1000, 64, seed=6))
    assert math.isclose(archs.random_prompt(1000, 20000).float().mean().item(), 499.5, rel_tol=0.05)
