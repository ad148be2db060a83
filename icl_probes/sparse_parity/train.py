"""Training the m-head model from small initialisation at small lambda (Z. Shi 2024, Sec. 5.5, Thm 5.5.1's setting).

The loss is the population hinge loss of Sec. 5.5 at N -> infinity, where y^T X / N = 2 gamma (G_i + G_j) on task
(i, j), plus lambda sum_i ||W^(i)||_F^2, with tasks from S1 with probability 1 - p_T and from S2 with p_T:

    L = (1 - p_T) E_{S1}[l(y_q g)] + p_T E_{S2}[l(y_q g)] + lambda sum_i ||W^(i)||_F^2.

The two expectations are computed separately (stratified), so the rare S2 tasks are not left to chance: exactly, over
every task and every query phi_q in {+-1}^d with its probability, when that is at most ``exact_rows`` rows (d = 8);
otherwise on ``batch`` fresh (task, query) draws per set and step. Adam on (a, W) with a cosine learning-rate decay;
a is clipped to [-1, 1] after every step. The model is trained in the input basis (W, x = G phi) and read in the
hidden basis, V^(i) = G^T W^(i) G.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass

import torch

from icl_probes.sparse_parity.data import (
    PAIR_VALUES,
    TaskLaw,
    pair_probs,
    random_orthonormal,
    sample_pairs,
    sample_phi,
    task_sets,
)
from icl_probes.sparse_parity.model import closed_form, exact_limit_loss, hinge
from icl_probes.sparse_parity.theory import match_heads


@dataclass(frozen=True)
class TrainUnit:
    """One training run: v1, v2 (k = 2^v1, d = 2^v2), m heads; kind "full" (W^(i) in R^{d x d}) or "diagonal"
    (W^(i) = G diag(v^(i)) G^T: the form of Thm 5.5.1's optimum, to see whether off-diagonal entries matter);
    steps of Adam."""

    v1: int
    v2: int
    m: int
    kind: str = "full"
    steps: int = 8000

    def check(self) -> None:
        if not 1 <= self.v1 < self.v2 or self.m < 1 or self.kind not in ("full", "diagonal") or self.steps < 1:
            raise ValueError(f"train unit {self}: need 1 <= v1 < v2, m >= 1, kind full or diagonal, steps >= 1")


@dataclass(frozen=True)
class TrainSettings:
    """Adam at lr (cosine decay to 0 over the unit's steps); init: standard deviation of the Gaussian
    initialisation of a and W ('small'); lam: lambda; p_t_share: p_T as a share of Thm 5.5.1's bound; batch: draws
    per set and step when the loss is sampled; exact_rows: the largest number of (task, query) rows for the exact
    loss."""

    lr: float = 0.01
    init: float = 0.01
    lam: float = 1e-7
    p_t_share: float = 0.5
    batch: int = 4096
    exact_rows: int = 1 << 15

    def check(self) -> None:
        if self.lr <= 0 or self.init <= 0 or self.lam < 0 or self.batch < 1 or self.exact_rows < 0:
            raise ValueError(f"train settings {self}: need lr > 0, init > 0, lam >= 0, batch >= 1, exact_rows >= 0")
        if not 0 <= self.p_t_share < 1:
            raise ValueError(f"p_t_share={self.p_t_share}: must lie in [0, 1) (p_T below Thm 5.5.1's bound)")


def exact_rows(law: TaskLaw, pairs: torch.Tensor, weight: float) -> tuple:
    """Every (task, query) of the tasks `pairs` (uniform, total weight `weight`): (pairs (R, 2), phi_q (R, d),
    probability (R,)), R = len(pairs) 2^d."""
    d = law.d
    every = torch.tensor(list(itertools.product((1.0, -1.0), repeat=d)), dtype=torch.float64)
    prob_of = dict(zip(PAIR_VALUES, pair_probs(law.gamma)))
    out_p, out_phi, out_w = [], [], []
    for i, j in pairs.tolist():
        pij = torch.tensor([prob_of[(float(r[i]), float(r[j]))] for r in every], dtype=torch.float64)
        out_p.append(torch.tensor([[i, j]]).expand(len(every), 2))
        out_phi.append(every)
        out_w.append(pij / 2 ** (d - 2) * weight / len(pairs))
    return torch.cat(out_p), torch.cat(out_phi), torch.cat(out_w)


def _design(G: torch.Tensor, pairs: torch.Tensor, phi_q: torch.Tensor, gamma: float) -> torch.Tensor:
    """Rows s (x) x_q, (R, d^2): the head input is <s (x) x_q, vec W^(i)> with s = 2 gamma (G_i + G_j) and
    x_q = G phi_q."""
    s = 2 * gamma * (G[:, pairs[:, 0]] + G[:, pairs[:, 1]]).T
    x_q = phi_q @ G.T
    return (s[:, :, None] * x_q[:, None, :]).flatten(1)


def train_heads(unit: TrainUnit, settings: TrainSettings, gamma: float, seed: int) -> dict:
    """Train one model and compare it with the closed form; a JSON-ready dict.

    Seed use: G, the initialisation and the sampled batches follow `seed`."""
    unit.check()
    settings.check()
    d, k = 2**unit.v2, 2**unit.v1
    base = TaskLaw(d, k, gamma)
    law = TaskLaw(d, k, gamma, settings.p_t_share * base.p_t_bound())
    gen = torch.Generator().manual_seed(seed)
    G = random_orthonormal(d, gen)
    m = unit.m
    a = (torch.randn(m, generator=gen, dtype=torch.float64) * settings.init).requires_grad_()
    w0 = torch.randn(m, d, d, generator=gen, dtype=torch.float64) * settings.init
    if unit.kind == "diagonal":
        diag = torch.diagonal(G.T @ w0 @ G, dim1=1, dim2=2).clone().requires_grad_()
        params = [a, diag]

        def weights():
            return G @ torch.diag_embed(diag) @ G.T
    else:
        w = w0.requires_grad_()
        params = [a, w]

        def weights():
            return w

    s1, s2 = task_sets(d, k)
    exact = (len(s1) + len(s2)) * 2**d <= settings.exact_rows
    if exact:
        pairs, phi_q, prob = (torch.cat(t) for t in zip(exact_rows(law, s1, 1 - law.p_t), exact_rows(law, s2, law.p_t)))
        design, y_q = _design(G, pairs, phi_q, gamma), torch.gather(phi_q, 1, pairs).prod(dim=1)
    opt = torch.optim.Adam(params, lr=settings.lr)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, unit.steps)
    t0, curve = time.time(), []
    for step in range(1, unit.steps + 1):
        W = weights()
        if exact:
            fit = (prob * hinge(y_q * (torch.relu(design @ W.flatten(1).T) @ a))).sum()
        else:
            fit = 0.0
            for which, share in (("s1", 1 - law.p_t), ("s2", law.p_t)):
                pr = sample_pairs(law, settings.batch, gen, which)
                ph = sample_phi(pr, 1, d, gamma, gen)[:, 0]
                out = torch.relu(_design(G, pr, ph, gamma) @ W.flatten(1).T) @ a
                fit = fit + share * hinge(torch.gather(ph, 1, pr).prod(dim=1) * out).mean()
        loss = fit + settings.lam * W.pow(2).sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        with torch.no_grad():
            a.clamp_(-1.0, 1.0)
        if step % max(1, unit.steps // 20) == 0 or step == unit.steps:
            curve.append([step, float(fit.detach())])
    with torch.no_grad():
        V = G.T @ weights() @ G
        a_fin = a.detach().clone()
    row = compare_with_closed_form(unit, law, a_fin, V, (s1, s2), gamma)
    return dict(row, seed=seed, exact_loss=exact, curve=curve, seconds=time.time() - t0)


def compare_with_closed_form(unit: TrainUnit, law, a_fin, V, sets, gamma: float) -> dict:
    """The trained heads (``a_fin`` (m,), ``V`` (m, d, d) in G's basis) against the closed-form g1* and g2*: losses
    and accuracies on S1 and S2, the margin, the norm, and which closed form the heads match."""
    s1, s2 = sets
    m = unit.m
    on1, on2 = exact_limit_loss(a_fin, V, s1, gamma), exact_limit_loss(a_fin, V, s2, gamma)
    norm = float(V.pow(2).sum())
    margin = min(on1["margin"], on2["margin"])
    target_v = unit.v1 if m <= 2 * (unit.v1 + 1) else unit.v2
    target = closed_form(target_v, unit.v2, gamma)
    t1, t2 = closed_form(unit.v1, unit.v2, gamma), closed_form(unit.v2, unit.v2, gamma)
    closed = {}
    for name, heads in (("g1", t1), ("g2", t2)):
        e1, e2 = exact_limit_loss(heads.a, heads.V, s1, gamma), exact_limit_loss(heads.a, heads.V, s2, gamma)
        closed[name] = dict(
            s1_loss=e1["loss"],
            s2_loss=e2["loss"],
            norm=float(heads.V.pow(2).sum()),
            population_loss=(1 - law.p_t) * e1["loss"] + law.p_t * e2["loss"],
        )
    return dict(
        v1=unit.v1,
        v2=unit.v2,
        m=m,
        kind=unit.kind,
        p_t=law.p_t,
        s1_loss=on1["loss"],
        s2_loss=on2["loss"],
        s1_acc=on1["acc"],
        s2_acc=on2["acc"],
        margin=margin,
        population_loss=(1 - law.p_t) * on1["loss"] + law.p_t * on2["loss"],
        norm=norm,
        norm_at_margin_1=norm / margin**2 if margin > 0 else None,
        closed=closed,
        target=f"g{1 if target_v == unit.v1 else 2}*",
        match=match_heads(a_fin, V, target),
        a=a_fin.tolist(),
        diag=torch.diagonal(V, dim1=1, dim2=2).tolist(),
    )
