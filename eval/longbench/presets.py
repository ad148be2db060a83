"""LongBench run presets, as data: what the GemFilter paper's Table 9.1 runs set.

Source: SalesforceAIResearch/GemFilter ``eval/LongBench/pred.py`` and ``config/model2maxlen.json``.
The official runs truncate H2O's prompts to 8,192 tokens (its eager n x n attention cannot go
further) and every other method's to 128,000 for the paper's three models; they load the models in
fp16, apply no chat template to Llama 3.1 / Mistral Nemo / Phi 3.5, and score the first 14 tasks.
Here H2O's column sums are blockwise, so the 8K cut is a protocol choice, not a memory limit.
"""

from __future__ import annotations

from gemfilter.toolkit.options import parse_length

#: model2maxlen.json for the paper's models (name_or_path, lower-cased, matched as a suffix).
PAPER_MAX_LENGTH = {
    "meta-llama/llama-3.1-8b-instruct": 128000,
    "meta-llama/meta-llama-3.1-8b-instruct": 128000,
    "mistralai/mistral-nemo-instruct-2407": 128000,
    "microsoft/phi-3.5-mini-instruct": 128000,
}

#: name -> settings. ``max_length`` None: the table above for the paper's models, else the model's
#: window minus 500 (the runner's default). Explicit command-line options win.
PRESETS = {
    "gemfilter-paper": {
        "description": "GemFilter paper, Table 9.1: 14 tasks, full,gemfilter,snapkv-per-head,h2o-per-head, "
        "H2O cut to 8192 tokens, no chat template, float16 on GPU",
        "tasks": "paper",
        "methods": ("full", "gemfilter", "snapkv-per-head", "h2o-per-head"),
        "method_max_length": {"h2o": 8192, "h2o-per-head": 8192},
        "chat_template": False,
        "dtype": "float16",
    },
}


def paper_max_length(model_name) -> int | None:
    """model2maxlen.json's value for one of the paper's models, else None."""
    name = str(model_name or "").rstrip("/").lower()
    for key, value in PAPER_MAX_LENGTH.items():
        if name == key or name.endswith("/" + key) or name.endswith(key):
            return value
    return None


def parse_method_lengths(text: str | None) -> dict:
    """'h2o=8192,snapkv=4000' -> {'h2o': 8192, 'snapkv': 4000}; ValueError naming the bad item."""
    out = {}
    for item in (x.strip() for x in (text or "").split(",") if x.strip()):
        name, sep, value = item.partition("=")
        if not sep or not name.strip() or not value.strip():
            raise ValueError(f"--max-length-per-method: {item!r} must look like METHOD=TOKENS, e.g. h2o=8192")
        out[name.strip()] = parse_length(value, f"--max-length-per-method {name.strip()}")
    return out
