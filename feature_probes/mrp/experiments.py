"""Presets and seeded run functions of the MRP probe (Pan, Zhou, Yan; teacher-student setting of Sec. 3-4).

- ``run_mrp``: pretrain the encoder by GD on the expected masked-reconstruction loss (Eq. 3) at one mask
  ratio, then fit a linear head on its frozen features with labels.
- ``run_sl``: the supervised baseline from the same initial kernels, same width and steps (Lemma 1).
- ``run_units``: every unit of a preset (SL, then MRP per mask ratio, per seed), one JSONL row each (resume).

Both report which features the kernels capture (Lambda_{i,l} = max_r [<w_r, v_{i,l}>]^+ against a threshold),
how many features each winning kernel holds, and test accuracy on single-view and multi-view data.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from feature_probes.common import run_resumable
from feature_probes.mrp.data import PatchSpec, make_patch_data
from feature_probes.mrp.model import (
    Encoder,
    capture,
    class_scores,
    head_loss,
    mrp_loss_expected,
    sigma0_default,
    teacher_tau,
    varrho_default,
)
from icl_probes.common import seed_everything

DIVERGED = 1e6  # a kernel norm above this, or a non-finite loss, stops training and marks the run diverged


@dataclass(frozen=True)
class MRPRun:
    """Sizes and schedule (all ours; the paper gives no synthetic sizes). sigma0 = 0: 1/k; varrho = 0: 1/log k.
    mask_ratios: 1 - theta values to pretrain with. c_tau: constant of tau's Theta(1/(t+1)) term.
    capture_at = 0: varrho * C_p, i.e. the best kernel's pre-activation on a patch carrying the feature at the
    mean own-feature weight 1/C_p reaches the linear part of ReLU-bar. The head: u^(0) = 0, GD with lr_head
    on z-scored frozen features (eta1 = 0: the encoder stays fixed while fine-tuning)."""

    data: PatchSpec = field(default_factory=PatchSpec)
    m: int = 4
    q: float = 3.0
    varrho: float = 0.0
    sigma0: float = 0.0
    n_train: int = 500
    n_test: int = 1000
    steps: int = 150
    lr_mrp: float = 0.5
    lr_sl: float = 0.5
    c_tau: float = 1.0
    mask_ratios: tuple[float, ...] = (0.25, 0.5, 0.75)
    head_steps: int = 300
    lr_head: float = 1.0
    capture_at: float = 0.0
    eval_every: int = 10
    seeds: tuple[int, ...] = (0,)
    note: str = ""

    def check(self) -> None:
        self.data.check()
        if self.q < 3:
            raise ValueError(f"q={self.q}: the paper needs q >= 3")
        for r in self.mask_ratios:
            if not 0 <= r < 1:
                raise ValueError(f"mask ratio {r}: must lie in [0, 1) (the keep probability theta = 1 - ratio > 0)")
        if self.steps < 1 or self.head_steps < 1 or min(self.lr_mrp, self.lr_sl, self.lr_head) <= 0:
            raise ValueError("steps and head_steps must be >= 1 and the learning rates > 0")

    def resolved(self) -> dict:
        k = self.data.k
        varrho = self.varrho or varrho_default(k)
        return dict(
            varrho=varrho, sigma0=self.sigma0 or sigma0_default(k), capture_at=self.capture_at or varrho * self.data.C_p
        )


PRESETS = {
    "cpu": MRPRun(
        seeds=(0, 1, 2),
        note="k=10, d=100, P=40, C_p=2, m=4 (40 kernels), q=3, 500 points, 150 GD steps "
        "at lr 0.5, mask ratios 0.25/0.5/0.75, 3 seeds",
    ),
    "tiny": MRPRun(
        data=PatchSpec(k=3, d=12, P=12),
        m=2,
        n_train=60,
        n_test=60,
        steps=10,
        head_steps=10,
        mask_ratios=(0.5,),
        eval_every=5,
        note="smoke-test size",
    ),
}


def _data(cfg: MRPRun, seed: int):
    gen = seed_everything(seed)
    train = make_patch_data(cfg.data, cfg.n_train, gen)
    tests = {view: make_patch_data(cfg.data, cfg.n_test, gen, view) for view in ("single", "multi")}
    return gen, train, tests


def _encoder(cfg: MRPRun, gen: torch.Generator) -> Encoder:
    r = cfg.resolved()
    return Encoder(cfg.data.k, cfg.m, cfg.data.d, cfg.q, r["varrho"], r["sigma0"], gen)


def _capture_summary(enc: Encoder, cfg: MRPRun) -> dict:
    k = cfg.data.k
    lam, arg, cap = capture(enc, k, cfg.resolved()["capture_at"])
    winners = arg[cap].tolist()
    per_kernel = [winners.count(r) for r in set(winners)]
    return dict(
        captured=float(cap.float().mean()),
        classes_both=float(cap.all(dim=1).float().mean()),
        classes_none=float((~cap).all(dim=1).float().mean()),
        lam_mean=float(lam.mean()),
        lam_min=float(lam.min()),
        lam_max=float(lam.max()),
        winning_kernels=len(per_kernel),
        max_features_per_kernel=max(per_kernel, default=0),
        lam=lam.tolist(),
        winner=arg.tolist(),
    )


def _diverged(loss: torch.Tensor, enc: Encoder) -> bool:
    return not math.isfinite(float(loss.detach())) or float(enc.w.detach().norm(dim=1).max()) > DIVERGED


@torch.no_grad()
def _fit_head(enc: Encoder, cfg: MRPRun, train, tests) -> dict:
    """Linear head on z-scored frozen features h(X): u^(0) = 0, full-batch GD with lr_head; test accuracies."""
    h = enc(train.x)
    mu, sd = h.mean(dim=0), h.std(dim=0).clamp_min(1e-12)
    z = (h - mu) / sd
    u = torch.zeros(cfg.data.k, h.shape[1], requires_grad=True)
    for _ in range(cfg.head_steps):
        with torch.enable_grad():
            loss = head_loss(u, z, train.y)
            (g,) = torch.autograd.grad(loss, u)
        u -= cfg.lr_head * g
    acc = lambda d: float(((((enc(d.x) - mu) / sd) @ u.T).argmax(dim=1) == d.y).float().mean())  # noqa: E731
    return dict(head_train_acc=acc(train), head_single_acc=acc(tests["single"]), head_multi_acc=acc(tests["multi"]))


def _descend(enc: Encoder, cfg: MRPRun, loss_at, lr: float):
    """Full-batch GD on the kernels for cfg.steps steps: loss_at(t) gives step t's loss. Stops at divergence.

    Returns (history of loss and capture every cfg.eval_every steps, step at which it diverged or None)."""
    history, diverged_at = [], None
    for t in range(cfg.steps):
        loss = loss_at(t)
        enc.zero_grad()
        loss.backward()
        with torch.no_grad():
            enc.w -= lr * enc.w.grad
        if _diverged(loss, enc):
            diverged_at = t + 1
            break
        if (t + 1) % cfg.eval_every == 0 or t + 1 == cfg.steps:
            history.append(
                dict(
                    step=t + 1,
                    loss=float(loss.detach()),
                    **{k: v for k, v in _capture_summary(enc, cfg).items() if k not in ("lam", "winner")},
                )
            )
    return history, diverged_at


def run_mrp(cfg: MRPRun, mask_ratio: float, seed: int, progress: bool = False) -> dict:
    """Pretrain by GD on Eq. 3 with theta = 1 - mask_ratio (teacher tau_t w, detached), then the linear head."""
    cfg.check()
    gen, train, tests = _data(cfg, seed)
    enc = _encoder(cfg, gen)
    theta = 1 - mask_ratio
    init = _capture_summary(enc, cfg)
    t0 = time.time()
    history, diverged_at = _descend(
        enc,
        cfg,
        lambda t: mrp_loss_expected(enc, train.x, theta, teacher_tau(theta, cfg.data.C_p, t, cfg.c_tau)),
        cfg.lr_mrp,
    )
    final = _capture_summary(enc, cfg) if diverged_at is None else None
    head = _fit_head(enc, cfg, train, tests) if diverged_at is None else None
    return dict(
        method="mrp",
        mask_ratio=mask_ratio,
        seed=seed,
        seconds=time.time() - t0,
        diverged_at=diverged_at,
        init=init,
        final=final,
        head=head,
        history=history,
    )


def run_sl(cfg: MRPRun, seed: int, progress: bool = False) -> dict:
    """Supervised learning from the same initial kernels: F_i = sum of class i's m kernels' h_r, cross-entropy,
    full-batch GD, same steps; then its own accuracy and, for comparison, the same linear-head protocol."""
    cfg.check()
    gen, train, tests = _data(cfg, seed)
    enc = _encoder(cfg, gen)
    k, m = cfg.data.k, cfg.m
    init = _capture_summary(enc, cfg)
    t0 = time.time()
    history, diverged_at = _descend(
        enc, cfg, lambda t: F.cross_entropy(class_scores(enc(train.x), k, m), train.y), cfg.lr_sl
    )
    with torch.no_grad():
        acc = lambda d: float((class_scores(enc(d.x), k, m).argmax(dim=1) == d.y).float().mean())  # noqa: E731
        own = dict(train_acc=acc(train), single_acc=acc(tests["single"]), multi_acc=acc(tests["multi"]))
    return dict(
        method="sl",
        mask_ratio=None,
        seed=seed,
        seconds=time.time() - t0,
        diverged_at=diverged_at,
        init=init,
        final=_capture_summary(enc, cfg),
        own=own,
        head=_fit_head(enc, cfg, train, tests),
        history=history,
    )


def run_units(cfg: MRPRun, jsonl_path=None, progress: bool = True, force: bool = False) -> list[dict]:
    """SL and MRP at every mask ratio, for every seed; finished rows with the same settings are reused
    (unless ``force``: recomputed)."""
    cfg.check()
    units = [("sl", None, s) for s in cfg.seeds] + [("mrp", r, s) for r in cfg.mask_ratios for s in cfg.seeds]
    return run_resumable(
        cfg,
        jsonl_path,
        ("seeds", "mask_ratios", "note"),
        units,
        lambda r: (r["method"], r["mask_ratio"], r["seed"]),
        lambda method, ratio, seed: run_sl(cfg, seed) if method == "sl" else run_mrp(cfg, ratio, seed),
        force=force,
        desc="mrp units" if progress else None,
    )
