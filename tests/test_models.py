"""load_model: local paths pass options through; unreachable ids fail clearly (no network needed)."""

import pytest
import torch
from tiny_models import BUILDERS

import gemfilter
from gemfilter.models import EMBEDDED_NAME


def test_local_path_passes_dtype_and_attention_through(tiny_model_dir):
    model = BUILDERS["llama"]()
    loaded, tok = gemfilter.load_model(
        str(tiny_model_dir), dtype=torch.float16, attn_implementation="eager", device_map="cpu"
    )
    assert loaded.dtype == torch.float16
    assert loaded.config._attn_implementation == "eager"
    assert tok.padding_side == "left" and tok.pad_token is not None
    assert not loaded.training
    same = {k: v for k, v in model.state_dict().items()}
    for k, v in loaded.state_dict().items():
        assert torch.allclose(v.float(), same[k].float().half().float()), k


def test_unreachable_id_names_the_embedded_default(monkeypatch):
    # The hub reads HF_HUB_OFFLINE at import time, so patch the constant, not the environment.
    import huggingface_hub.constants as hub_constants

    monkeypatch.setattr(hub_constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(OSError, match=EMBEDDED_NAME):
        gemfilter.load_model("no-such-org/no-such-model-gemfilter-test")
