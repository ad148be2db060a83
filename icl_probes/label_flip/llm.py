"""Label-flip ICL with LLMs: accuracy against the share of flipped exemplar labels (Figs. 5.1-5.2).

Paper: Z. Shi, dissertation (2024), Sec. 5.6, after Wei et al. 2023. For every (model, dataset,
flip share, seed, prompt) one prompt (see :mod:`.prompts`) is scored and one JSONL row written, so
an interrupted sweep resumes where it stopped.

Prediction:
- ``logprob`` (default): log p(" " + word | prompt) for each label word, summed over the word's
  tokens (a multi-token word is scored as its whole continuation; single-token words, as with
  Gemma's " positive"/" negative", need one forward pass); the larger wins.
- ``generate``: greedy decoding of a few tokens; the first word, lower-cased and stripped of
  punctuation, must equal a label word, otherwise the row counts as wrong (pred = -1).
"""

from __future__ import annotations

import copy
import gc
import re
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path

import torch

from gemfilter.compat import cache_kwargs, output_cache
from gemfilter.toolkit.loop import Unit, compute, missing

from ..io import append_jsonl, read_jsonl, write_json
from .data import get_task, load_examples
from .prompts import FLIP_SHARES, M_DEFAULT, SEEDS, check_share, class_index, eval_indices, make_prompt

PREDICT = ("logprob", "generate")
EMBEDDED = "embedded"


@dataclass(frozen=True)
class SweepConfig:
    """One sweep. models: "embedded" or HF ids / local paths; datasets: registry names; shares:
    flip shares in percent; seeds; m: exemplars per prompt; n_eval: evaluation prompts per dataset
    (fewer if the split is smaller); predict: logprob | generate; per_prompt: fresh exemplars for
    each query instead of one set per seed (Min et al.), slower (no shared KV cache)."""

    models: tuple = (EMBEDDED,)
    datasets: tuple = ("synthetic",)
    shares: tuple = FLIP_SHARES
    seeds: tuple = SEEDS
    m: int = M_DEFAULT
    n_eval: int = 1000
    predict: str = "logprob"
    balanced: bool = True
    per_prompt: bool = False
    max_new_tokens: int = 5
    data_dir: str | None = None
    device: str = "auto"
    attn: str | None = None  # attention kernel (None: the model's default); exact kernels, so not compared
    extra: dict = field(default_factory=dict)

    def validate(self) -> None:
        for name in self.datasets:
            get_task(name)
        for s in self.shares:
            check_share(s)
        if self.predict not in PREDICT:
            raise ValueError(f"unknown --predict {self.predict!r}; allowed: {', '.join(PREDICT)}")
        if not self.models or not self.datasets or not self.shares or not self.seeds:
            raise ValueError("models, datasets, shares and seeds must each name at least one value")
        if isinstance(self.m, bool) or not isinstance(self.m, int) or self.m < 1:
            raise ValueError(f"-M must be an int >= 1, got {self.m!r}")
        eval_indices(1, self.n_eval)

    def identity(self) -> dict:
        """Settings a resumed run must share with the rows already written."""
        return dict(
            m=self.m,
            n_eval=self.n_eval,
            predict=self.predict,
            balanced=self.balanced,
            per_prompt=self.per_prompt,
            max_new_tokens=self.max_new_tokens if self.predict == "generate" else None,
        )


def continuation_ids(tok, prompt_ids: list, prompt: str, word: str) -> list:
    """Token ids of " " + word after the prompt, as the tokenizer splits prompt + " " + word.

    If joining changes the prompt's own tokens (a merge across the boundary), falls back to the
    word's standalone tokens.
    """
    full = tok(prompt + " " + word)["input_ids"]
    if full[: len(prompt_ids)] == prompt_ids and len(full) > len(prompt_ids):
        return full[len(prompt_ids) :]
    return tok.encode(" " + word, add_special_tokens=False)


class LabelScorer:
    """Summed log-probabilities of the label words' continuations after a prompt.

    The exemplar prefix's KV cache is kept and reused while consecutive prompts share it (the
    per-seed exemplars of Min et al.), so a query costs its own ~20 tokens instead of the whole
    prompt. Only the logits that are needed are computed (``logits_to_keep``): Gemma's 262k-word
    head would otherwise cost more than the body. If the prompt does not tokenize as prefix + rest
    (a merge across the boundary), the whole prompt is run without the cache.
    """

    def __init__(self, model, tok, use_cache: bool = True):
        self.model, self.tok, self.use_cache = model, tok, use_cache
        self.device = next(model.parameters()).device
        self._prefix, self._ids, self._cache = None, None, None
        self.cache_hits = 0

    def _prefix_state(self, prefix: str):
        if prefix != self._prefix:
            ids = self.tok(prefix)["input_ids"]
            out = self.model(torch.tensor([ids], device=self.device), use_cache=True, logits_to_keep=1)
            self._prefix, self._ids, self._cache = prefix, ids, output_cache(out)
        return self._ids, self._cache

    def _logits(self, seq: list, keep: int, prefix: str | None) -> torch.Tensor:
        """Log-softmax rows (keep, vocab) for the last ``keep`` positions of token list ``seq``."""
        if prefix and self.use_cache:
            pids, cache = self._prefix_state(prefix)
            if seq[: len(pids)] == pids and len(seq) - len(pids) >= keep:
                self.cache_hits += 1
                rest = torch.tensor([seq[len(pids) :]], device=self.device)
                out = self.model(rest, **cache_kwargs(copy.deepcopy(cache)), use_cache=True, logits_to_keep=keep)
                return out.logits[0].float().log_softmax(-1)
        out = self.model(torch.tensor([seq], device=self.device), logits_to_keep=keep)
        return out.logits[0].float().log_softmax(-1)

    @torch.no_grad()
    def __call__(self, prompt: str, words, prefix: str | None = None) -> list:
        ids = self.tok(prompt)["input_ids"]
        conts = [continuation_ids(self.tok, ids, prompt, w) for w in words]
        if all(len(c) == 1 for c in conts):  # one pass: the next-token distribution after the prompt
            lp = self._logits(ids, 1, prefix)[-1]
            return [float(lp[c[0]]) for c in conts]
        out = []
        for c in conts:  # rows predicting c are the last len(c)+1 positions of ids + c, minus the last
            lp = self._logits(ids + c, len(c) + 1, prefix)[:-1]
            out.append(float(lp[torch.arange(len(c)), torch.tensor(c, device=lp.device)].sum()))
        return out


def label_logprobs(model, tok, prompt: str, words) -> list:
    """Summed log-probabilities of each label word's continuation after ``prompt`` (no cache reuse)."""
    return LabelScorer(model, tok, use_cache=False)(prompt, words)


@torch.no_grad()
def generate_label(model, tok, prompt: str, words, max_new_tokens: int = 5) -> tuple:
    """(label id or -1, generated text) from greedy decoding."""
    enc = tok(prompt, return_tensors="pt").to(next(model.parameters()).device)
    out = model.generate(**enc, max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=tok.pad_token_id)
    text = tok.decode(out[0, enc["input_ids"].shape[1] :], skip_special_tokens=True)
    first = re.sub(r"[^\w]", "", text.strip().split()[0]).lower() if text.strip() else ""
    lowered = [w.lower() for w in words]
    return (lowered.index(first) if first in lowered else -1), text


def default_model_loader(name: str, device: str = "auto", attn: str | None = None):
    """(model, tokenizer) through gemfilter.load_model; "embedded" is the embedded Gemma 3 270M.
    attn: attention kernel (None: the model's default, ``banded`` for the embedded model)."""
    import gemfilter

    from ..common import resolve_device

    model, tok = gemfilter.load_model(None if name == EMBEDDED else name, attn=attn)
    return model.to(resolve_device(device)), tok


def _key(row) -> tuple:
    return (row["model"], row["dataset"], row["share"], row["seed"], row["index"])


def _score_prompt(cfg, data: dict, model, tok, scorer, mname: str, dname: str, share, seed, i: int) -> dict:
    """One prompt's row: its flipped exemplars, the model's prediction (log-probabilities or generated text)."""
    task, train, by_class, queries = data[dname]
    p = make_prompt(task, train, by_class, queries[i], cfg.m, share, seed, i, cfg.balanced, cfg.per_prompt)
    row = dict(
        model=mname,
        dataset=dname,
        share=share,
        seed=seed,
        index=i,
        label=p.query_label,
        n_flipped=sum(p.flipped),
        **cfg.identity(),
    )
    if cfg.predict == "logprob":
        lps = scorer(p.text, task.label_words, p.prefix)
        row.update(pred=int(max(range(len(lps)), key=lps.__getitem__)), logprobs=lps)
    else:
        pred, text = generate_label(model, tok, p.text, task.label_words, cfg.max_new_tokens)
        row.update(pred=pred, generated=text)
    row["correct"] = int(row["pred"] == p.query_label)
    return row


def run_sweep(cfg: SweepConfig, out, *, loader=None, model_loader=None, progress: bool = True) -> list:
    """Run every pending (model, dataset, share, seed, prompt) and return all rows of ``out/label_flip.jsonl``.

    loader: optional ``(task, split) -> records`` stand-in for the hub; model_loader: optional
    ``(name, device) -> (model, tokenizer)``. A model whose rows are all present is not loaded.
    """

    cfg.validate()
    out = Path(out)
    path = out / "label_flip.jsonl"
    rows = read_jsonl(path)
    for row in rows:
        mismatch = {k: (row.get(k), v) for k, v in cfg.identity().items() if row.get(k) != v}
        if mismatch:
            raise ValueError(
                f"{path} holds rows made with other settings {mismatch} (stored, asked); "
                "use another --out folder or the same settings"
            )
    done = {_key(r) for r in rows}
    data = {}
    for name in cfg.datasets:  # load data before any model, so a missing dataset fails fast
        task = get_task(name)
        train = load_examples(task, task.train_split, cfg.data_dir, loader)
        evals = load_examples(task, task.eval_split, cfg.data_dir, loader)
        data[name] = (task, train, class_index(train), [evals[i] for i in eval_indices(len(evals), cfg.n_eval)])
    jobs = [
        (mname, d, share, seed, i)
        for mname in cfg.models
        for d in cfg.datasets
        for share in cfg.shares
        for seed in cfg.seeds
        for i in range(len(data[d][3]))
    ]
    pending = missing([Unit(path.name, j) for j in jobs], {path.name: done})
    for mname in cfg.models:  # one model in memory at a time
        mine = [u for u in pending if u.key[0] == mname]
        if not mine:
            continue
        model, tok = (model_loader or partial(default_model_loader, attn=cfg.attn))(mname, cfg.device)
        scorer = LabelScorer(model, tok)
        rows += compute(
            mine,
            lambda u, model=model, tok=tok, scorer=scorer: _score_prompt(cfg, data, model, tok, scorer, *u.key),
            lambda u, row: append_jsonl(path, row),
            desc=f"label-flip {mname}",
            noun="prompt",
            progress=progress,
        )
        del model, tok, scorer
        gc.collect()
    write_json(out / "settings.json", asdict(cfg))
    wanted = set(jobs)
    return [r for r in rows if _key(r) in wanted]


def summarize(rows) -> dict:
    """{model: {dataset or "average": {share: (mean accuracy over seeds, std over seeds, n prompts)}}}.

    The average over datasets is taken per seed first, then over seeds.
    """
    acc = {}
    for r in rows:
        acc.setdefault((r["model"], r["dataset"], r["share"], r["seed"]), []).append(r["correct"])
    per_seed = {k: sum(v) / len(v) for k, v in acc.items()}
    counts = {k: len(v) for k, v in acc.items()}
    out = {}
    models = sorted({k[0] for k in per_seed})
    for model in models:
        datasets = sorted({k[1] for k in per_seed if k[0] == model})
        shares = sorted({k[2] for k in per_seed if k[0] == model})
        seeds = sorted({k[3] for k in per_seed if k[0] == model})
        res = {}
        for d in datasets + ["average"]:
            res[d] = {}
            for s in shares:
                vals = []
                for seed in seeds:
                    if d == "average":
                        parts = [per_seed.get((model, dd, s, seed)) for dd in datasets]
                        if None not in parts:
                            vals.append(sum(parts) / len(parts))
                    elif (model, d, s, seed) in per_seed:
                        vals.append(per_seed[(model, d, s, seed)])
                if vals:
                    mean = sum(vals) / len(vals)
                    std = (sum((v - mean) ** 2 for v in vals) / len(vals)) ** 0.5
                    n = sum(
                        counts.get((model, dd, s, seed), 0)
                        for dd in (datasets if d == "average" else [d])
                        for seed in seeds
                    )
                    res[d][s] = (mean, std, n)
        out[model] = res
    return out


def markdown(summary: dict) -> str:
    lines = ["| model | dataset | " + " | ".join(f"{s}% flipped" for s in _shares(summary)) + " |"]
    lines.append("|---|---|" + "---|" * len(_shares(summary)))
    for model, res in summary.items():
        for d, cells in res.items():
            lines.append(
                f"| {model} | {d} | "
                + " | ".join(f"{cells[s][0]:.3f} ± {cells[s][1]:.3f}" if s in cells else "" for s in _shares(summary))
                + " |"
            )
    return "\n".join(lines) + "\n"


def _shares(summary) -> list:
    return sorted({s for res in summary.values() for cells in res.values() for s in cells})


def plot(summary: dict, path, title: str = "") -> None:
    """One panel per dataset plus the average: accuracy (mean ± std over seeds) vs flip share, a line per model."""
    from ..common import pyplot
    from ..io import save_png

    plt = pyplot()
    panels = sorted({d for res in summary.values() for d in res if d != "average"})
    if len(panels) > 1:
        panels.append("average")
    fig, axes = plt.subplots(1, len(panels), figsize=(4 * len(panels), 3.6), squeeze=False)
    for ax, d in zip(axes[0], panels):
        for model, res in summary.items():
            cells = res.get(d, {})
            xs = sorted(cells)
            ax.errorbar(
                xs,
                [cells[s][0] for s in xs],
                yerr=[cells[s][1] for s in xs],
                marker="o",
                capsize=3,
                label=model.split("/")[-1],
            )
        ax.axhline(0.5, color="gray", ls="--", lw=1, label="chance")
        ax.set(title=d, xlabel="flipped exemplar labels (%)", ylabel="accuracy", ylim=(0, 1.02), xticks=FLIP_SHARES)
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=8)
    if title:
        fig.suptitle(title, fontsize=10)
    save_png(fig, path)
