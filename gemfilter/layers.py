"""Default filter layers: the paper's choices, the embedded model's measured one, and a rule.

Paper (Shi et al. 2024, Sec. 9.4): Llama 3.1 8B -> 13 of 32 (13-25 all robust), Mistral Nemo 12B -> 19
of 40, Phi 3.5 Mini -> 19 of 32, all 0-based. Layer choice rule from the paper: the first layer whose
top-k reaches the needle (Fig. 9.5); ``gemfilter calibrate`` (``gemfilter.inspection.calibrate``) automates
it and stores its choice per model; this module reads the stored choice (:func:`load_calibration`).

Rule for unknown models: the first full-attention layer at or after ceil(0.4 * m). That gives 13 for
a 32-layer Llama, the paper's choice, and skips sliding-window layers, whose q.k beyond the window
was never trained to mean anything.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

from .io import read_json_object
from .models import EMBEDDED_DIR_NAME, EMBEDDED_NAME, cache_dir
from .selection import num_layers, sliding_window_of

#: name_or_path (lower-cased, or a suffix of it) -> 0-based filter layer.
PAPER_LAYERS = {
    "meta-llama/llama-3.1-8b-instruct": 13,
    "meta-llama/meta-llama-3.1-8b-instruct": 13,
    "mistralai/mistral-nemo-instruct-2407": 19,
    "microsoft/phi-3.5-mini-instruct": 19,
    # Embedded Gemma 3 270M (18 layers; full attention at 5, 11, 17): 11, measured on the Kamradt
    # needle (README, "Choosing the embedded model's layer").
    EMBEDDED_DIR_NAME: 11,
}


def calibration_path(model_name: str) -> Path:
    """cache_dir()/calibration/<model name with unsafe characters replaced>.json"""
    safe = re.sub(r"[^A-Za-z0-9._-]+", "__", model_name.strip("/")) or "model"
    return cache_dir() / "calibration" / f"{safe}.json"


def model_key(model) -> str:
    """The model's name for its calibration file; the embedded model's cache path is machine-specific."""
    name = str(getattr(getattr(model, "config", model), "name_or_path", "") or "model")
    return EMBEDDED_NAME if name.rstrip("/").endswith(EMBEDDED_DIR_NAME) else name


def load_calibration(model) -> dict | None:
    """The stored calibration record of ``model``, or None; CorruptFileError if the file is damaged."""
    path = calibration_path(model_key(model))
    if not path.exists():
        return None
    record = read_json_object(path, "calibration file", fix=f"Delete {path} (the model then uses its documented "
                              "default layer) and rerun 'gemfilter calibrate' to store a new one")
    if not isinstance(record.get("layer"), int) or isinstance(record.get("layer"), bool):
        raise ValueError(f"{path}: this calibration file has no integer 'layer'. Delete it and rerun "
                         "'gemfilter calibrate' to store a new one")
    return record


def rule_layer(model) -> int:
    """First full-attention layer at or after ceil(0.4 m); the last layer if none is full-attention."""
    m = num_layers(model)
    start = min(math.ceil(0.4 * m), m - 1)
    for layer in range(start, m):
        if sliding_window_of(model, layer) is None:
            return layer
    return start


def default_layer(model) -> int:
    """This model's default: its ``gemfilter calibrate`` result if one is stored, else the table
    above, else :func:`rule_layer`. model: a model or its config (no weights needed)."""
    record = load_calibration(model)
    if record is not None:
        return int(record["layer"])
    config = getattr(model, "config", model)
    name = str(getattr(config, "name_or_path", "") or getattr(model, "name_or_path", "")).rstrip("/").lower()
    for key, layer in PAPER_LAYERS.items():
        if name == key or name.endswith("/" + key) or name.endswith(key):
            return layer
    return rule_layer(model)
