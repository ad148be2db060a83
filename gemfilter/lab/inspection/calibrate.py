"""Automatic filter-layer calibration: the paper's rule, as a command.

Paper: Shi et al. 2024, Sec. 9.4 and Fig. 9.5. The filter layer is "the first layer whose top-k
reaches the needle". We run short NIAH probes over a few lengths and depths, trace every layer once
per probe, and measure per layer and k the fraction of probes whose GemFilter top-k reaches the
needle (needle distance 0). For the smallest k of the grid at which some full-attention layer has
coverage >= ``threshold``, the recommendation is the first such layer, and that k. The result is stored per model as
JSON under the cache dir
(``gemfilter.layers.calibration_path``), and ``default_layer`` uses it from then on. A model is its identity
(``gemfilter.layers.model_identity``): the resolved absolute path of a local folder (or the hub id and
revision) and a hash of its config.json, so a relative ``--model m`` in another folder is another model.
"""

from __future__ import annotations

from gemfilter.toolkit.io import write_json_atomic
from gemfilter.toolkit.trace import needle_distances, needle_token_span, trace

from ...layers import calibration_path, model_identity, model_key


def coverage_table(distances: list, ks: list) -> dict:
    """distances[probe][k][layer] -> {k: [fraction of probes with distance 0, per layer]}."""
    table = {}
    for k in ks:
        layers = len(distances[0][k])
        table[k] = [sum(1 for p in distances if p[k][layer] == 0) / len(distances) for layer in range(layers)]
    return table


def recommend(table: dict, sliding: list, threshold: float):
    """(layer, k): the paper's rule (first layer whose top-k reaches the needle) applied at the smallest
    k of the grid where any full-attention layer passes; all layers count if none is full-attention.

    Trying small k first is the point of GemFilter: a layer that needs a larger budget to find the
    needle buys less speed. If no layer passes at any k, the best-covering layer at the largest k.
    """
    ks = sorted(table)
    candidates = [i for i, w in enumerate(sliding) if w is None] or list(range(len(sliding)))
    for k in ks:
        for layer in candidates:
            if table[k][layer] >= threshold:
                return layer, k
    best = max(candidates, key=lambda i: (table[ks[-1]][i], -i))
    return best, ks[-1]


def calibrate(
    model,
    tokenizer,
    *,
    lengths=(1000, 2000, 4000),
    depths=(10, 50, 90),
    ks=(256, 512, 1024),
    threshold: float = 0.8,
    haystack_dir=None,
    save: bool = True,
    progress=None,
) -> dict:
    """Run the probes and return (and by default store) the calibration record."""
    from gemfilter.toolkit.haystack import NEEDLE, build_case, make_haystack

    if not 0 < threshold <= 1:
        raise ValueError(f"threshold must be in (0, 1], got {threshold}")
    if not ks or min(ks) < 1:
        raise ValueError(f"ks must be positive integers, got {ks}")
    hay = make_haystack(tokenizer, max(lengths), haystack_dir=haystack_dir)  # tokenized once, cut per probe
    probes, distances, sliding = [], [], None
    for length in lengths:
        for depth in depths:
            case = build_case(tokenizer, length, depth, haystack=hay)
            ids = tokenizer(case.prompt, return_tensors="pt")["input_ids"]
            span = needle_token_span(tokenizer, case.prompt, NEEDLE)
            tr = trace(model, ids, names=("qk_last_row",))
            sliding = tr.sliding
            distances.append({k: needle_distances(tr, span, k) for k in ks})
            probes.append({"length": length, "depth": depth, "n": tr.n, "needle": list(span)})
            if progress:
                progress()
    table = coverage_table(distances, list(ks))
    layer, k = recommend(table, sliding, threshold)
    record = {
        "model": model_key(model),
        "identity": model_identity(model),
        "layer": layer,
        "topk": k,
        "threshold": threshold,
        "sliding_layers": [i for i, w in enumerate(sliding) if w is not None],
        "coverage": {str(k): v for k, v in table.items()},
        "probes": probes,
        "distances": [{str(k): v for k, v in d.items()} for d in distances],
    }
    if save:
        path = calibration_path(record["model"])
        write_json_atomic(path, record)  # a crash or a full disk never leaves half a calibration behind
        record["path"] = str(path)
    return record


def format_table(record: dict) -> str:
    """Markdown coverage table: one row per layer, one column per k; sliding layers marked."""
    ks = sorted(record["coverage"], key=int)
    sliding = set(record["sliding_layers"])
    lines = ["| layer | type | " + " | ".join(f"k={k}" for k in ks) + " |", "|---|---|" + "---|" * len(ks)]
    for layer in range(len(record["coverage"][ks[0]])):
        kind = "sliding" if layer in sliding else "full"
        mark = " **←**" if layer == record["layer"] else ""
        cells = " | ".join(f"{record['coverage'][k][layer]:.2f}" for k in ks)
        lines.append(f"| {layer}{mark} | {kind} | {cells} |")
    return "\n".join(lines)
