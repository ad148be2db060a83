"""Attention from the label token to the relevant vs an irrelevant sentence (Fig. 5.3).

Paper: Z. Shi, dissertation (2024), Sec. 5.6, Fig. 5.3: an irrelevant sentence (from GSM-IC) is
appended to each SST-2 input; the final layer's last attention row, across all heads, is measured
between the label tokens and (a) the original sentence and (b) the irrelevant sentence. Smaller
models attend mainly to the relevant sentence, larger ones to both.

Our reading (documented in icl_probes/label_flip/README.md, "Deviations and choices"): every input,
exemplars and query, gets one irrelevant sentence appended. The query is followed by "The answer is <word>", where
<word> is the query's
true label word ("correct") or the other one ("wrong"), so the last query row IS the label token
(the word's last token when it has several). From that row of the final layer, per head
(``gemfilter.toolkit.trace``'s ``attn_last_row_heads`` capture, no n x n map), we report

- ``*_norm``: the Frobenius norm of the (heads, span tokens) block, "the norm across all heads";
- ``*_mass``: the attention mass on the span, averaged over heads (a length-aware companion),

for the query's own sentence (relevant) and its appended irrelevant sentence.

The irrelevant sentences below are written for this project in GSM-IC's style (GSM-IC itself is
not downloadable here); ``--irrelevant-file`` reads others, one per line.
"""

from __future__ import annotations

import gc
import random
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path

from gemfilter.toolkit.loop import Unit, compute, missing

from ..io import append_jsonl, read_jsonl
from .data import Example, Task, get_task, load_examples
from .prompts import class_index, eval_indices, format_inputs, format_prefix, n_flips, sample_exemplars

IRRELEVANT = (
    "The shoe size of Ada's brother is 10.",
    "Mary's neighbour owns 3 bicycles.",
    "The bakery on the corner opens at 7 in the morning.",
    "Tom's sister is 12 years old.",
    "The library has 4 floors and a small garden.",
    "A bus ticket in the city costs 2 dollars.",
    "The height of the office building is 80 meters.",
    "Jack planted 15 tomato plants last spring.",
)
KINDS = ("correct", "wrong")


@dataclass(frozen=True)
class AblationPrompt:
    text: str
    relevant: tuple  # (start, end) character span of the query's sentence in text
    irrelevant: tuple  # (start, end) character span of the query's irrelevant sentence


def build(
    task: Task, exemplars, shown, query: Example, label_word: str, irrelevant, rng: random.Random
) -> AblationPrompt:
    """The spec's template with an irrelevant sentence after every input's last field, ending in
    "The answer is <label_word>" (no period, so the label is the last token)."""

    def with_sentence(ex: Example, sentence: str) -> tuple:
        return ex.inputs[:-1] + (f"{ex.inputs[-1]} {sentence}",)

    # one sentence per exemplar in order, then the query's: the same rng draws for every label word
    extended = [replace(ex, inputs=with_sentence(ex, rng.choice(irrelevant))) for ex in exemplars]
    prefix = format_prefix(task, extended, shown)
    extra = rng.choice(irrelevant)
    body = format_inputs(task, with_sentence(query, extra))
    text = f"{prefix}{body}\nThe answer is {label_word}"
    # the relevant span: the query's last field text (for pair tasks, the field the sentence joins)
    start = len(prefix) + body.rindex(query.inputs[-1] + " " + extra)
    rel = (start, start + len(query.inputs[-1]))
    irr = (rel[1] + 1, rel[1] + 1 + len(extra))
    return AblationPrompt(text, rel, irr)


def token_span(offsets, span) -> tuple:
    """(first, last + 1) token positions whose character range overlaps ``span`` = (start, end)."""
    hit = [i for i, (a, b) in enumerate(offsets) if b > a and b > span[0] and a < span[1]]
    if not hit:
        raise ValueError(f"no token covers characters {span}")
    return hit[0], hit[-1] + 1


def measure(model, tok, prompt: AblationPrompt, layer: int = -1) -> dict:
    """Norms and masses of the last row at ``layer`` (default: the final one) on both spans."""
    import torch

    from gemfilter.toolkit.trace import trace

    enc = tok(prompt.text, return_offsets_mapping=True)
    ids = torch.tensor([enc["input_ids"]], device=next(model.parameters()).device)
    tr = trace(model, ids, names=("attn_last_row_heads",))
    layer = layer % tr.layers
    rows = tr[("attn_last_row_heads", layer)]  # (heads, n)
    out = dict(layer=layer, n_tokens=tr.n)
    for name, span in (("relevant", prompt.relevant), ("irrelevant", prompt.irrelevant)):
        a, b = token_span(enc["offset_mapping"], span)
        block = rows[:, a:b]
        out.update(
            {f"{name}_norm": float(block.norm()), f"{name}_mass": float(block.sum(-1).mean()), f"{name}_tokens": b - a}
        )
    return out


def _ablation_row(model, tok, key: tuple, setup: dict) -> dict:
    """One (model, prompt index, kind) row: the last row's attention to the label token and the sentences."""
    mname, i, kind = key
    task, train, queries, m, share, seed = (setup[k] for k in ("task", "train", "queries", "m", "share", "seed"))
    rng = random.Random(f"label_flip-ablation:{seed}:{i}")
    exemplars = sample_exemplars(train, setup["by_class"], m, rng)
    flip = set(rng.sample(range(m), n_flips(share, m)))
    shown = [1 - e.label if j in flip else e.label for j, e in enumerate(exemplars)]
    q = queries[i]
    word = task.label_words[q.label if kind == "correct" else 1 - q.label]
    # the same irrelevant sentences for both kinds: seed the sentence choice by the prompt only
    p = build(task, exemplars, shown, q, word, setup["irrelevant"], random.Random(f"irrelevant:{seed}:{i}"))
    return dict(
        model=mname, dataset=setup["dataset"], index=i, kind=kind, m=m, share=share, seed=seed, **measure(model, tok, p)
    )


def run_ablation(
    models,
    dataset: str,
    out,
    *,
    n_prompts: int = 100,
    m: int = 16,
    share=0,
    seed: int = 100,
    irrelevant=IRRELEVANT,
    data_dir=None,
    loader=None,
    model_loader=None,
    progress: bool = True,
    device: str = "auto",
    attn: str | None = None,
) -> list:
    """One JSONL row per (model, prompt, kind) in ``out/ablation.jsonl``, resumable; returns the rows.

    Exemplars are drawn per prompt (seed, index) and ``share`` percent of their labels flipped
    (default 0: clean exemplars), so the only difference between kinds is the final label word.
    """

    from .llm import default_model_loader

    task = get_task(dataset)
    n_flips(share, m)
    if not irrelevant:
        raise ValueError("the irrelevant-sentence list is empty; give at least one sentence")
    train = load_examples(task, task.train_split, data_dir, loader)
    evals = load_examples(task, task.eval_split, data_dir, loader)
    by_class = class_index(train)
    queries = [evals[i] for i in eval_indices(len(evals), n_prompts)]
    path = Path(out) / "ablation.jsonl"
    # rows of other settings may share the file; only these settings' rows count as done
    rows = [
        r
        for r in read_jsonl(path)
        if r.get("dataset") == dataset and r.get("m") == m and r.get("share") == share and r.get("seed") == seed
    ]
    done = {(r["model"], r["index"], r["kind"]) for r in rows}
    setup = dict(task=task, train=train, by_class=by_class, queries=queries, m=m, share=share, seed=seed)
    setup.update(irrelevant=irrelevant, dataset=dataset)
    jobs = missing(
        [Unit(path.name, (mn, i, k)) for mn in models for i in range(len(queries)) for k in KINDS], {path.name: done}
    )
    for mname in models:  # one model in memory at a time
        mine = [u for u in jobs if u.key[0] == mname]
        if not mine:
            continue
        model, tok = (model_loader or partial(default_model_loader, attn=attn))(mname, device)

        rows += compute(
            mine,
            lambda u, model=model, tok=tok: _ablation_row(model, tok, u.key, setup),
            lambda u, row: append_jsonl(path, row),
            desc=f"ablation {mname}",
            noun="prompt",
            progress=progress,
        )
        del model, tok
        gc.collect()
    return [r for r in rows if r["model"] in models and r["index"] < len(queries)]


def summary(rows) -> str:
    """Markdown: mean norms and masses per model and kind."""
    lines = [
        "| model | label | relevant norm | irrelevant norm | relevant mass | irrelevant mass | prompts |",
        "|---|---|---|---|---|---|---|",
    ]
    for model in sorted({r["model"] for r in rows}):
        for kind in KINDS:
            rs = [r for r in rows if r["model"] == model and r["kind"] == kind]
            if rs:
                mean = {
                    k: sum(r[k] for r in rs) / len(rs)
                    for k in ("relevant_norm", "irrelevant_norm", "relevant_mass", "irrelevant_mass")
                }
                lines.append(
                    f"| {model} | {kind} | {mean['relevant_norm']:.4f} | {mean['irrelevant_norm']:.4f} | "
                    f"{mean['relevant_mass']:.4f} | {mean['irrelevant_mass']:.4f} | {len(rs)} |"
                )
    return "\n".join(lines) + "\n"


def plot(rows, path, metric: str = "norm") -> None:
    """Fig. 5.3 style: per model, the last-row norm (or mass) per prompt for the four series."""
    from ..common import pyplot
    from ..io import save_png

    plt = pyplot()
    models = sorted({r["model"] for r in rows})
    fig, axes = plt.subplots(1, len(models), figsize=(6 * len(models), 3.6), squeeze=False)
    styles = {
        ("correct", "relevant"): ("tab:blue", "-"),
        ("correct", "irrelevant"): ("tab:blue", ":"),
        ("wrong", "relevant"): ("tab:red", "-"),
        ("wrong", "irrelevant"): ("tab:red", ":"),
    }
    for ax, model in zip(axes[0], models):
        layer = "?"
        for (kind, span), (color, ls) in styles.items():
            rs = sorted((r for r in rows if r["model"] == model and r["kind"] == kind), key=lambda r: r["index"])
            ax.plot(
                [r["index"] for r in rs],
                [r[f"{span}_{metric}"] for r in rs],
                color=color,
                ls=ls,
                marker=".",
                label=f"{kind} label, {span}",
            )
            layer = rs[0]["layer"] if rs else layer
        ax.set(
            title=f"{model.split('/')[-1]}: final layer (layer {layer}), last row",
            xlabel="prompt index",
            ylabel=f"attention {metric} (all heads)",
        )
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    save_png(fig, path)
