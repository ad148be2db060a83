"""Presets and one seeded run function per experiment (Ch. 4, Figs. 4.1-4.4; appendix C.10).

- ``run_mlp``: the network of Eq. 4.2; per-neuron Fourier power before/after training (Figs. 4.1, 4.2).
- ``run_transformer``: a one-layer transformer; W^{KQ} per head and its 2-D DFT (Fig. 4.3).
- ``run_grokking``: two-layer transformers over several (k, p); train/test accuracy and the grokking
  delay (Fig. 4.4). One JSONL row per finished (k, p), so an interrupted sweep resumes.

Presets are data (the tables below); the paper values come from appendix C.10, and every CPU deviation
is named in the preset's ``note``.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field

import torch

from gemfilter.toolkit.loop import every_row
from icl_probes.common import as_stored, seed_everything
from icl_probes.io import append_jsonl, read_jsonl
from icl_probes.modular.data import check_kp, make_split
from icl_probes.modular.fourier import (
    dft2,
    dft2_interaction_share,
    dft2_sparsity,
    frequency_histogram,
    neuron_power,
    one_sided_power,
)
from icl_probes.modular.mlp import PowerMLP, paper_width
from icl_probes.modular.train import TrainConfig, train
from icl_probes.modular.transformer import ModularTransformer

POWER_THRESHOLD = 0.9  # a neuron counts as one-sparse in Fourier space at this maximum normalised power
ACTIVE_FRACTION = 0.1  # a neuron is active when its parameter norm is at least this share of the largest


@dataclass(frozen=True)
class MLPRun:
    """Eq. 4.2 network on k inputs mod p. m = 0 means the paper width 2^{2k-2}(p-1)."""

    k: int = 2
    p: int = 47
    m: int = 0
    init_std: float = 0.1
    train_frac: float = 0.5
    seed: int = 0
    train: TrainConfig = field(default_factory=TrainConfig)
    note: str = ""


@dataclass(frozen=True)
class TransformerRun:
    """A transformer of n_layers blocks on k inputs mod p (Fig. 4.3 uses one layer)."""

    k: int = 3
    p: int = 17
    n_layers: int = 1
    d_model: int = 128
    n_heads: int = 160
    d_head: int = 32
    d_mlp: int = 512
    train_frac: float = 0.5
    seed: int = 0
    train: TrainConfig = field(default_factory=lambda: TrainConfig(lr=1e-3, weight_decay=1e-3))
    note: str = ""


@dataclass(frozen=True)
class GrokRun:
    """The Fig. 4.4 sweep: one two-layer transformer per (k, p); delay measured at ``threshold`` accuracy.

    stop_after_grok: stop a run this many evaluations after both accuracies reached the threshold
    (-1: never stop early), so fast-grokking k do not spend the whole step budget.
    """

    kps: tuple[tuple[int, int], ...] = ((2, 97), (3, 31), (4, 11), (5, 5))
    n_layers: int = 2
    d_model: int = 128
    n_heads: int = 160
    d_head: int = 32
    d_mlp: int = 512
    train_frac: float = 0.5
    seed: int = 0
    threshold: float = 0.99
    stop_after_grok: int = -1
    train: TrainConfig = field(default_factory=lambda: TrainConfig(lr=1e-3, weight_decay=1e-3))
    note: str = ""


def _tc(**kw) -> TrainConfig:
    return TrainConfig(**kw)


MLP_PRESETS = {
    "cpu": MLPRun(
        k=2,
        p=47,
        train=_tc(steps=3000, lr=5e-3, weight_decay=1.0, batch_size=0, eval_every=100),
        note="CPU: k=2, p=47 (m=184, 1104 train points), full batch, weight decay 1.0 instead of 0.005",
    ),
    "cpu-k3": MLPRun(
        k=3,
        p=23,
        train=_tc(steps=3000, lr=5e-3, weight_decay=1.0, batch_size=0, eval_every=100),
        note="CPU: k=3, p=23 (m=352), full batch, weight decay 1.0 instead of 0.005",
    ),
    "paper": MLPRun(
        k=4,
        p=47,
        m=2944,
        train=_tc(steps=30000, lr=5e-3, weight_decay=0.005, batch_size=1024, eval_every=1000),
        note="C.10.1: k=4, p=47, m=2944, lr 5e-3, lambda 0.005, batch 1024 (steps: our choice)",
    ),
}

TRANSFORMER_PRESETS = {
    "cpu": TransformerRun(
        k=3,
        p=17,
        d_model=64,
        n_heads=8,
        d_head=16,
        d_mlp=256,
        train=_tc(steps=2000, lr=1e-3, weight_decay=1.0, batch_size=1024, eval_every=100),
        note="CPU: k=3, p=17, 8 heads, d_model 64, weight decay 1.0 instead of 0.001",
    ),
    "paper": TransformerRun(
        k=4,
        p=31,
        train=_tc(steps=20000, lr=1e-3, weight_decay=1e-3, batch_size=1024, eval_every=1000),
        note="Fig. 4.3 / C.10: k=4, p=31, 160 heads, d_model 128, lr 1e-3, lambda 1e-3",
    ),
}

GROK_PRESETS = {
    "cpu": GrokRun(
        kps=((2, 97), (3, 23), (4, 11), (5, 7)),
        d_model=64,
        n_heads=4,
        d_head=16,
        d_mlp=256,
        stop_after_grok=5,
        train=_tc(steps=3000, lr=1e-3, weight_decay=1.0, batch_size=1024, eval_every=50),
        note="CPU: 4 heads, d_model 64, weight decay 1.0 instead of 1e-3, (3,23) and (5,7) for (3,31), (5,5)",
    ),
    "paper": GrokRun(
        stop_after_grok=5,
        train=_tc(steps=15000, lr=1e-3, weight_decay=1e-3, batch_size=1024, eval_every=100),
        note="Fig. 4.4 / C.10: 160 heads, d_model 128, lr 1e-3, lambda 1e-3, 50% train",
    ),
}


def _check_frac(train_frac: float) -> None:
    if not 0.0 < train_frac < 1.0:
        raise ValueError(f"train_frac={train_frac}: must lie strictly between 0 and 1")


def _power_summary(model: PowerMLP) -> dict:
    """Per-neuron power and frequency, their summaries, and the same over the *active* neurons.

    Weight decay switches some neurons off (k=3: about half end with a norm ~1e-3 of the largest);
    their leftover direction is noise, so the summary also counts only neurons whose parameter norm
    (u_{i,1..k} and w_i together) is at least ACTIVE_FRACTION of the largest.
    """
    power, freq = neuron_power(model.embeddings())
    norm = (model.U.detach().pow(2).sum(dim=(0, 1)) + model.W.detach().pow(2).sum(dim=1)).sqrt().cpu()
    active = norm >= ACTIVE_FRACTION * norm.max()
    hist = frequency_histogram(freq, model.p)
    return dict(
        power=power.tolist(),
        freq=freq.tolist(),
        norm=norm.tolist(),
        histogram=hist,
        mean_power=float(power.mean()),
        frac_power_ge=float((power >= POWER_THRESHOLD).float().mean()),
        covered=sum(c > 0 for c in hist),
        n_freq=len(hist),
        n_active=int(active.sum()),
        frac_power_ge_active=float((power[active] >= POWER_THRESHOLD).float().mean()),
        covered_active=int(torch.unique(freq[active]).numel()),
    )


def _train_logged(model, split, cfg, log_path, desc: str, progress: bool, deadline) -> tuple[list, float]:
    """Train with cfg.train and cfg.seed; each evaluation row goes to log_path (emptied first) unless it
    is None. Returns (history, seconds)."""
    if log_path is not None:
        open(log_path, "w").close()
    t0 = time.time()
    history = train(
        model,
        split,
        cfg.train,
        cfg.seed,
        desc=desc,
        progress=progress,
        deadline=deadline,
        on_eval=(lambda row: append_jsonl(log_path, row)) if log_path is not None else None,
    )
    return history, time.time() - t0


def run_mlp(
    cfg: MLPRun,
    device: torch.device,
    log_path=None,
    progress: bool = True,
    n_examples: int = 8,
    deadline: float | None = None,
) -> dict:
    """Train the Eq. 4.2 network and measure its Fourier features before and after.

    log_path: JSONL file that receives one row per evaluation (truncated first), or None.
    Returns a JSON-ready dict: config, history, init/final power summaries (per-neuron power and
    argmax frequency, histogram, coverage) and, for the first ``n_examples`` neurons, u_{i,1} and its
    one-sided power spectrum before and after training (the data of Figs. 4.1 and 4.2).
    """
    check_kp(cfg.k, cfg.p)
    _check_frac(cfg.train_frac)
    m = cfg.m or paper_width(cfg.k, cfg.p)
    seed_everything(cfg.seed)
    split = make_split(cfg.k, cfg.p, cfg.train_frac, cfg.seed).to(device)
    model = PowerMLP(cfg.k, cfg.p, m, cfg.init_std).to(device)
    emb0, init_power = model.embeddings(), _power_summary(model)
    history, seconds = _train_logged(model, split, cfg, log_path, f"mlp k={cfg.k} p={cfg.p} m={m}", progress, deadline)
    emb1 = model.embeddings()
    ex = list(range(min(n_examples, m)))
    examples = dict(
        neurons=ex,
        init=emb0[0, ex].tolist(),
        final=emb1[0, ex].tolist(),
        init_spectrum=one_sided_power(emb0[0, ex]).tolist(),
        final_spectrum=one_sided_power(emb1[0, ex]).tolist(),
    )
    return dict(
        experiment="mlp",
        config=asdict(cfg),
        m=m,
        n_train=len(split.x_train),
        n_test=len(split.x_test),
        device=str(device),
        seconds=seconds,
        history=history,
        final=history[-1],
        init_power=init_power,
        final_power=_power_summary(model),
        examples=examples,
    )


def _build_transformer(cfg, k: int, p: int, device) -> ModularTransformer:
    return ModularTransformer(k, p, cfg.n_layers, cfg.d_model, cfg.n_heads, cfg.d_head, cfg.d_mlp).to(device)


def _kq_summary(model: ModularTransformer) -> dict:
    w = model.w_kq(0)
    sparsity = [dft2_sparsity(w[h]) for h in range(len(w))]
    inter = [dft2_interaction_share(w[h]) for h in range(len(w))]
    return dict(
        share=[s for s, _ in sparsity],
        dominant=[list(f) for _, f in sparsity],
        interaction_share=inter,
        norm=w.flatten(1).norm(dim=1).tolist(),
        mean_share=sum(s for s, _ in sparsity) / len(w),
        mean_interaction_share=sum(inter) / len(w),
    )


def run_transformer(
    cfg: TransformerRun,
    device: torch.device,
    log_path=None,
    progress: bool = True,
    n_show: int = 4,
    deadline: float | None = None,
) -> dict:
    """Train a one-layer transformer and measure how 2-D-Fourier-sparse each head's W^{KQ} is.

    Returns config, history, per-head share of W^{KQ}'s non-constant 2-D power in its top 4 DFT
    coefficients (before and after training) and, for the ``n_show`` heads of largest ||W^{KQ}||,
    the matrices and their |2-D DFT|^2 (the data of Fig. 4.3).
    """
    check_kp(cfg.k, cfg.p)
    _check_frac(cfg.train_frac)
    seed_everything(cfg.seed)
    split = make_split(cfg.k, cfg.p, cfg.train_frac, cfg.seed).to(device)
    model = _build_transformer(cfg, cfg.k, cfg.p, device)
    init = _kq_summary(model)
    history, seconds = _train_logged(
        model, split, cfg, log_path, f"transformer k={cfg.k} p={cfg.p}", progress, deadline
    )
    final = _kq_summary(model)
    w = model.w_kq(0)
    show = sorted(range(len(w)), key=lambda h: -final["norm"][h])[:n_show]  # the most active heads
    heads = dict(heads=show, w_kq=[w[h].tolist() for h in show], dft2=[dft2(w[h]).tolist() for h in show])
    return dict(
        experiment="transformer",
        config=asdict(cfg),
        n_train=len(split.x_train),
        n_test=len(split.x_test),
        device=str(device),
        seconds=seconds,
        history=history,
        final=history[-1],
        init_kq=init,
        final_kq=final,
        shown=heads,
    )


def first_step(history: list[dict], key: str, threshold: float):
    """The first evaluated step at which history[key] >= threshold, or None."""
    return next((row["step"] for row in history if row[key] >= threshold), None)


def grokking_delay(history: list[dict], threshold: float = 0.99) -> dict:
    """Steps from train accuracy >= threshold to test accuracy >= threshold (None if either never happens),
    and ``gap_area``, the area between the train and test accuracy curves in accuracy x steps.

    The resolution is the evaluation interval. A negative delay cannot occur in practice but is kept
    as is rather than clipped.
    """
    t_train = first_step(history, "train_acc", threshold)
    t_test = first_step(history, "test_acc", threshold)
    delay = t_test - t_train if t_train is not None and t_test is not None else None
    # The threshold crossing is noisy when both curves hover near it; the area between the curves
    # (sum of max(0, train - test) * step interval) is a threshold-free companion: about the delay for
    # a sharp grokking jump, about 0 when train and test rise together.
    gap = sum(max(0.0, a["train_acc"] - a["test_acc"]) * (b["step"] - a["step"]) for a, b in zip(history, history[1:]))
    return dict(train_step=t_train, test_step=t_test, delay=delay, gap_area=round(gap, 1))


def grok_settings(cfg: GrokRun) -> dict:
    """The settings a grok row depends on besides its (k, p), as stored (tuples as lists, so they
    compare equal to the rows read back from the JSONL file)."""
    return {key: val for key, val in as_stored(cfg).items() if key not in ("kps", "note")}


def _grok_one(cfg, k: int, p: int, device, deadline, progress: bool, settings: dict) -> dict:
    """Train one (k, p) grokking run from its seed; its row (``time_limit`` when ``deadline`` cut it short)."""
    seed_everything(cfg.seed)
    split = make_split(k, p, cfg.train_frac, cfg.seed).to(device)
    model = _build_transformer(cfg, k, p, device)
    evals_since = [0]

    def stop(row):
        if row["train_acc"] >= cfg.threshold and row["test_acc"] >= cfg.threshold:
            evals_since[0] += 1
        return cfg.stop_after_grok >= 0 and evals_since[0] > cfg.stop_after_grok

    t0 = time.time()
    history = train(
        model, split, cfg.train, cfg.seed, progress=progress, desc=f"grok k={k} p={p}", stop=stop, deadline=deadline
    )
    row = dict(
        k=k,
        p=p,
        time_limit=bool(history[-1].get("time_limit")),
        n_train=len(split.x_train),
        n_test=len(split.x_test),
        seconds=time.time() - t0,
        **grokking_delay(history, cfg.threshold),
        final=history[-1],
        history=history,
        settings=settings,
    )
    return row


def run_grokking(
    cfg: GrokRun, device: torch.device, jsonl_path, progress: bool = True, deadline: float | None = None
) -> list[dict]:
    """Train one two-layer transformer per (k, p) in cfg.kps; append one row per finished run to jsonl_path.

    Rows already in jsonl_path with the same (k, p) and the same settings are kept and not rerun
    (resume); a run cut short by ``deadline`` (a time.time() value shared by the whole sweep) is kept
    but rerun on resume. Returns the rows in the order of cfg.kps.
    """
    _check_frac(cfg.train_frac)
    for k, p in cfg.kps:
        check_kp(k, p)
    settings = grok_settings(cfg)
    rows_read = read_jsonl(jsonl_path, required=("k", "p")) if jsonl_path else []
    done = {(r["k"], r["p"]): r for r in rows_read if r.get("settings") == settings and not r.get("time_limit")}
    return every_row(
        [tuple(kp) for kp in cfg.kps],
        done,
        lambda kp: _grok_one(cfg, *kp, device, deadline, progress, settings),
        (lambda row: append_jsonl(jsonl_path, row)) if jsonl_path else None,
        desc="grokking runs",
        noun="run",
        progress=False,  # each run shows its own bar
    )
