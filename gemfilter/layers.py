"""Default filter layers: the paper's choices, the embedded model's measured one, and a rule.

Paper (Shi et al. 2024, Sec. 9.4): Llama 3.1 8B -> 13 of 32 (13-25 all robust), Mistral Nemo 12B -> 19
of 40, Phi 3.5 Mini -> 19 of 32, all 0-based. Layer choice rule from the paper: the first layer whose
top-k reaches the needle (Fig. 9.5); ``gemfilter calibrate`` (``gemfilter.lab.inspection.calibrate``) automates
it and stores its choice per model; this module reads the stored choice (:func:`load_calibration`).

Rule for unknown models: the first full-attention layer at or after ceil(0.4 * m). That gives 13 for
a 32-layer Llama, the paper's choice, and skips sliding-window layers, whose q.k beyond the window
was never trained to mean anything.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

from .models import EMBEDDED_DIR_NAME, EMBEDDED_NAME, cache_dir
from .selection import num_layers, sliding_window_of

#: name_or_path (lower-cased, or a suffix of it) -> 0-based filter layer.
PAPER_LAYERS = {
    "meta-llama/llama-3.1-8b-instruct": 13,
    "meta-llama/meta-llama-3.1-8b-instruct": 13,
    "mistralai/mistral-nemo-instruct-2407": 19,
    "microsoft/phi-3.5-mini-instruct": 19,
    # Embedded Gemma 3 270M (18 layers; full attention at 5, 11, 17): 11, measured on the Kamradt
    # needle (docs/evals.md, "Choosing the embedded model's layer").
    EMBEDDED_DIR_NAME: 11,
}


def calibration_path(model_name: str) -> Path:
    """cache_dir()/calibration/<model name with unsafe characters replaced>.json"""
    safe = re.sub(r"[^A-Za-z0-9._-]+", "__", model_name.strip("/")) or "model"
    return cache_dir() / "calibration" / f"{safe}.json"


def _config_sha(config, folder: Path | None) -> str:
    """sha256 (16 hex digits) of the model's config.json: the file's bytes for a local folder, else the config's
    own fields (sorted JSON, without transformers' bookkeeping such as ``_name_or_path``)."""
    import hashlib

    if folder is not None and (folder / "config.json").is_file():
        raw = (folder / "config.json").read_bytes()
    else:
        fields = config.to_dict() if hasattr(config, "to_dict") else {}
        raw = json.dumps(
            {k: v for k, v in fields.items() if not k.startswith("_") and k != "transformers_version"},
            sort_keys=True,
            default=str,
        ).encode()
    return hashlib.sha256(raw).hexdigest()[:16]


def model_identity(model) -> dict:
    """What makes two models the same for a calibration: ``name`` (the resolved absolute path of a local folder,
    else the hub id), ``revision`` (the hub commit, if known) and ``config_sha`` (:func:`_config_sha`).

    model: a model or its config. A relative path is resolved against the current folder: ``m`` here and ``m``
    in another folder are different models; the same folder by absolute or relative path is one."""
    config = getattr(model, "config", model)
    name = str(getattr(config, "name_or_path", "") or "model").rstrip("/") or "/"
    folder = Path(name).expanduser()
    local = folder.is_dir()
    return {
        "name": str(folder.resolve()) if local else name,
        "revision": None if local else getattr(config, "_commit_hash", None),
        "config_sha": _config_sha(config, folder if local else None),
    }


def model_key(model) -> str:
    """The model's name for its calibration file: ``<last name part>-<hash of model_identity>``; the embedded
    model's (whose cache path is machine-specific) is its fixed name."""
    import hashlib

    name = str(getattr(getattr(model, "config", model), "name_or_path", "") or "model")
    if name.rstrip("/").endswith(EMBEDDED_DIR_NAME):
        return EMBEDDED_NAME
    identity = model_identity(model)
    digest = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:16]
    return f"{Path(identity['name']).name or 'model'}-{digest}"


def _legacy_path(model) -> Path | None:
    """The calibration file keyed by the model's name as typed rather than by its identity: read when the
    identity's file is missing, for a hub id or an absolute path, never for a relative path (it may name
    another folder's model)."""
    name = str(getattr(getattr(model, "config", model), "name_or_path", "") or "")
    if not name or name.rstrip("/").endswith(EMBEDDED_DIR_NAME):
        return None
    if Path(name).expanduser().is_dir() and not Path(name).expanduser().is_absolute():
        return None
    return calibration_path(name)


def load_calibration(model) -> dict | None:
    """The stored calibration record of ``model``, or None; CorruptFileError if the file is damaged."""
    path = calibration_path(model_key(model))
    if not path.exists():
        legacy = _legacy_path(model)
        if legacy is None or not legacy.exists():
            return None
        path = legacy
    fix = (
        f"Delete {path} (the model then uses its documented default layer) and rerun 'gemfilter calibrate' to "
        "store a new one"
    )
    try:  # read here, not through the lab's gemfilter.toolkit.io: the plugin's core imports nothing of the lab
        record = json.loads(Path(path).read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"{path}: this calibration file is not valid JSON ({err}). {fix}") from None
    if not isinstance(record, dict):
        raise ValueError(f"{path}: this calibration file must hold a JSON object. {fix}")
    if not isinstance(record.get("layer"), int) or isinstance(record.get("layer"), bool):
        raise ValueError(
            f"{path}: this calibration file has no integer 'layer'. Delete it and rerun "
            "'gemfilter calibrate' to store a new one"
        )
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
