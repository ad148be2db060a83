"""The paper's architectures as data: random-weight models built from their published configs.

Paper: Shi et al. 2024, Fig. 9.3 (Llama 3.1 8B Instruct) and Fig. 9.6 (Mistral Nemo 12B Instruct,
Phi 3.5 Mini Instruct). Time and memory do not depend on the values of the weights, so a model with
the real architecture and random weights measures what those figures measure, without a download.

``gemfilter/configs/*.json`` hold the config values of the public ``config.json`` files (no weights;
``gemfilter/configs/SOURCES.md`` says where each copy came from). A model is named ``config:<arch>``, e.g.
``config:llama-3.1-8b``.

Building is fast: the modules are created directly on the target device in the target dtype with
``transformers.initialization.no_init_weights`` (no slow fp32 init on CPU), then every Linear and
Embedding weight is drawn once from N(0, initializer_range), as the models' own init does; biases
are zero, norms keep the ones their constructors set. With std 0.02 the activations of a random
model stay far from bf16/fp16 overflow.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources

import torch

PREFIX = "config:"


@dataclass(frozen=True)
class Arch:
    """One shipped architecture.

    file: JSON under gemfilter/configs; hub_id: the model whose config.json it copies;
    paper_layer: the paper's 0-based filter layer for it; figure: where the paper reports its speed.
    """

    file: str
    hub_id: str
    paper_layer: int
    figure: str


ARCHS = {
    "llama-3.1-8b": Arch("llama-3.1-8b.json", "meta-llama/Llama-3.1-8B-Instruct", 13, "Fig. 9.3"),
    "mistral-nemo-12b": Arch("mistral-nemo-12b.json", "mistralai/Mistral-Nemo-Instruct-2407", 19, "Fig. 9.6"),
    "phi-3.5-mini": Arch("phi-3.5-mini.json", "microsoft/Phi-3.5-mini-instruct", 19, "Fig. 9.6"),
}

#: TESTS ONLY (``test_shrink=True``): widths and head counts are divided by this, the vocabulary is
#: cut to TEST_VOCAB. Head dims and RoPE settings are kept. Such a model no longer has the paper's
#: architecture, so its timings mean nothing; the report marks it.
TEST_SHRINK = 8
TEST_VOCAB = 1024

DTYPES = {
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
    "float32": torch.float32,
    "fp32": torch.float32,
}


def is_config_name(name) -> bool:
    return isinstance(name, str) and name.startswith(PREFIX)


def arch_of(name: str) -> Arch:
    """The :class:`Arch` for ``config:<arch>``; a clear error that lists the shipped ones otherwise."""
    key = name[len(PREFIX) :] if is_config_name(name) else name
    if key not in ARCHS:
        raise ValueError(f"unknown architecture {name!r}; shipped: {', '.join(PREFIX + k for k in ARCHS)}")
    return ARCHS[key]


def published_config(name: str) -> dict:
    """The shipped config values of ``config:<arch>``, exactly as published."""
    text = resources.files("gemfilter").joinpath("configs", arch_of(name).file).read_text()
    return json.loads(text)


def resolve_dtype(dtype, device) -> torch.dtype:
    """None/"auto": bf16 (the published torch_dtype) on CUDA, and on CPUs that do bf16 natively; else fp32."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype in (None, "auto"):
        if torch.device(device).type == "cuda" or cpu_has_bf16():
            return torch.bfloat16
        return torch.float32
    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; allowed: auto, {', '.join(DTYPES)}")
    return DTYPES[dtype]


def cpu_has_bf16() -> bool:
    """True when oneDNN runs bf16 matmuls natively on this CPU (AVX512-BF16 or AMX)."""
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


def arch_config(name: str, layers: int | None = None, test_shrink: bool = False):
    """A transformers config for ``config:<arch>``, keeping the first ``layers`` decoder layers.

    Changes to the published values, each recorded in ``config.gemfilter_changes``:
    - ``num_hidden_layers`` (and ``layer_types``) cut to ``layers``;
    - a ``sliding_window`` at least as long as ``max_position_embeddings`` (Phi 3.5: 262144 > 131072)
      is dropped: it can never mask a key, so attention is unchanged, but left in place it would make
      this project's cache methods treat every layer as windowed and never evict (see
      ``gemfilter.methods.cache``);
    - ``test_shrink``: the TESTS-ONLY shrink (TEST_SHRINK, TEST_VOCAB); special ids beyond the
      vocabulary are mapped into it.
    """
    from transformers import AutoConfig

    from ...models import drop_unreachable_window

    values = published_config(name)
    changes = []
    total = values["num_hidden_layers"]
    if layers is not None:
        if isinstance(layers, bool) or not isinstance(layers, int) or not 1 <= layers <= total:
            raise ValueError(f"layers={layers!r}: {name} has {total} decoder layers; give 1..{total}")
        values["num_hidden_layers"] = layers
        if "layer_types" in values:
            values["layer_types"] = values["layer_types"][:layers]
        if layers != total:
            changes.append(f"first {layers} of {total} decoder layers")
    if test_shrink:
        _shrink_for_tests(values)
        changes.append(f"TEST SHRINK: widths and heads / {TEST_SHRINK}, vocabulary {TEST_VOCAB}")
    model_type = values.pop("model_type")
    config = AutoConfig.for_model(model_type, **values)
    dropped = drop_unreachable_window(config)
    if dropped:
        changes.insert(len(changes) - bool(test_shrink), dropped)  # published-value changes before the test shrink
    config.name_or_path = name
    config.gemfilter_changes = changes
    return config


def _shrink_for_tests(values: dict) -> None:
    head_dim = values.get("head_dim") or values["hidden_size"] // values["num_attention_heads"]
    values["num_attention_heads"] //= TEST_SHRINK
    values["num_key_value_heads"] = max(1, values["num_key_value_heads"] // TEST_SHRINK)
    values["hidden_size"] //= TEST_SHRINK
    values["intermediate_size"] //= TEST_SHRINK
    if "head_dim" not in values:  # keep the published head dim, so the RoPE settings still fit
        values["head_dim"] = head_dim
    values["vocab_size"] = TEST_VOCAB
    for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
        ids = values.get(key)
        if isinstance(ids, list):
            values[key] = [i % TEST_VOCAB for i in ids]
        elif ids is not None:
            values[key] = ids % TEST_VOCAB


def build_model(
    name: str,
    *,
    layers: int | None = None,
    dtype=None,
    device=None,
    test_shrink: bool = False,
    attn: str | None = None,
    seed: int = 0,
):
    """Random-weight causal LM of ``config:<arch>``, in eval mode, on ``device`` in ``dtype``.

    layers: keep the first N decoder layers (None: all). dtype: "auto" (see :func:`resolve_dtype`),
    bf16, fp16 or fp32. device: "cpu", "cuda", "cuda:1", ... (None or "auto": cuda if available, else cpu;
    "meta": shapes only, no memory, no values)
    attn: attention kernel (None: transformers' default, SDPA). seed: for the random weights.
    """
    from transformers import AutoModelForCausalLM

    from ...compat import no_init_weights

    if device in (None, "auto"):
        device = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(device)
    dtype = resolve_dtype(dtype, device)
    config = arch_config(name, layers, test_shrink)
    kw = {} if attn is None or attn == "banded" else {"attn_implementation": attn}
    with no_init_weights(), device:
        model = AutoModelForCausalLM.from_config(config, dtype=dtype, **kw)
    if device.type == "meta":  # shapes only: parameter counts, memory plans
        return model.eval()
    generator = torch.Generator(device=device).manual_seed(seed)
    std = float(getattr(config, "initializer_range", 0.02))
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, (torch.nn.Linear, torch.nn.Embedding)):
                module.weight.normal_(0.0, std, generator=generator)
            if isinstance(module, torch.nn.Linear) and module.bias is not None:
                module.bias.zero_()
    if attn == "banded":
        from ...models import set_attention

        set_attention(model, attn)
    return model.eval()


def random_prompt(vocab_size: int, length: int, seed: int = 0, device="cpu") -> torch.Tensor:
    """(1, length) random token ids: the benchmark's prompt (no tokenizer needed)."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab_size, (1, length), generator=generator).to(device)
