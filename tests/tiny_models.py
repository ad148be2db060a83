"""Tiny random decoder models built from configs (no network), one per supported family."""

import torch
from transformers import (
    Gemma3ForCausalLM,
    Gemma3TextConfig,
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    Phi3Config,
    Phi3ForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
)

COMMON = dict(
    vocab_size=96,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=512,
    pad_token_id=0,
    bos_token_id=1,
    eos_token_id=2,
)


def _build(cls, cfg_cls, **over):
    torch.manual_seed(0)
    cfg = cfg_cls(**{**COMMON, **over})
    model = cls(cfg).eval()
    # Random init gives near-uniform scores; widen q/k so top-k is decided by clear margins.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if any(s in name for s in ("q_proj", "k_proj", "qkv_proj")) and p.dim() == 2:
                p.mul_(4.0)
    return model


BUILDERS = {
    "llama": lambda: _build(LlamaForCausalLM, LlamaConfig),
    # Window 16 < the test prompts' length, so the sliding mask really matters.
    "mistral-sliding": lambda: _build(MistralForCausalLM, MistralConfig, sliding_window=16, head_dim=16),
    "qwen2": lambda: _build(Qwen2ForCausalLM, Qwen2Config),
    "phi3": lambda: _build(Phi3ForCausalLM, Phi3Config, pad_token_id=0, original_max_position_embeddings=512),
    "gemma3": lambda: _build(
        Gemma3ForCausalLM,
        Gemma3TextConfig,
        head_dim=16,
        sliding_window=8,
        query_pre_attn_scalar=16,
        layer_types=["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
    ),
}


def on(model, device):
    """``model`` on ``device``: itself on CPU, a copy elsewhere (a module-scoped CPU model stays where it is)."""
    import copy

    return model if torch.device(device).type == "cpu" else copy.deepcopy(model).to(device)


#: A full-attention filter layer for each family (Mistral has only sliding layers).
FILTER_LAYER = {"llama": 2, "mistral-sliding": 2, "qwen2": 2, "phi3": 2, "gemma3": 1}


class DotTokenizer:
    """Offline stand-in for text-reading methods (gemfilter-span): ids divisible by 7 decode to '.',
    so sentences exist."""

    def decode(self, ids, skip_special_tokens=False):
        return "".join("." if i % 7 == 0 else f" w{i}" for i in ids)


def load_toml(path):
    """A TOML file as a dict: tomllib from Python 3.11, the tomli backport (a dev dependency) on 3.10."""
    try:
        import tomllib
    except ImportError:
        import tomli as tomllib
    with open(path, "rb") as f:
        return tomllib.load(f)
