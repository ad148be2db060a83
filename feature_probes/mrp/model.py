"""Encoder, teacher-student pretraining loss and downstream heads of the MRP probe
(Pan, Zhou, Yan, "Towards Understanding Why Mask Reconstruction Pretraining Helps in Downstream Tasks").

- ``Encoder``: K = k m kernels, h_r(X) = sum_p ReLU-bar(<w_r, x_p>) (Sec. 3.2).
- ``mrp_loss_sampled``: (1/2N) sum_n sum_r (h-hat_r(X_n) - (1/theta) h_r(eps X_n))^2 for drawn masks, with the
  teacher h-hat computed from tau w on the unmasked input and no gradient through it (Fact 2.1).
- ``mrp_loss_expected``: its expectation over the masks in closed form (Eq. 3), which pretraining minimises.
- ``class_scores``: the supervised network F_i = sum_{r in class i's m kernels} h_r (Allen-Zhu & Li's fixed
  output weights 1; our choice for "the same network F").
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from feature_probes.common import smoothed_relu


class Encoder(nn.Module):
    """km kernels w_r in R^d, init N(0, sigma0^2 I). forward(x: (N, P, d)) -> h: (N, km).
    Kernel r belongs to class r // m in the supervised network."""

    def __init__(self, k: int, m: int, d: int, q: float, varrho: float, sigma0: float, gen: torch.Generator):
        super().__init__()
        self.k, self.m, self.q, self.varrho = k, m, q, varrho
        self.w = nn.Parameter(torch.randn(k * m, d, generator=gen) * sigma0)

    def patch_act(self, x: torch.Tensor, w: torch.Tensor | None = None) -> torch.Tensor:
        """ReLU-bar(<w_r, x_p>) as (N, P, km); w defaults to the encoder's own kernels."""
        return smoothed_relu(x @ (self.w if w is None else w).T, self.q, self.varrho)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.patch_act(x).sum(dim=1)

    def feature_corr(self, n_features: int) -> torch.Tensor:
        """<w_r, v_f> for the first n_features basis features, as (km, n_features)."""
        return self.w.detach()[:, :n_features]


def teacher_tau(theta: float, C_p: int, t: int, c_tau: float) -> float:
    """tau_t = 1 + (1 - theta)/(C_p theta) + c_tau/(t + 1) (Sec. 3.2; c_tau is our constant for the Theta term)."""
    return 1 + (1 - theta) / (C_p * theta) + c_tau / (t + 1)


def mrp_loss_expected(enc: Encoder, x: torch.Tensor, theta: float, tau: float) -> torch.Tensor:
    """Eq. 3 averaged over the N points: (1/N) sum_n [1/2 sum_r (sum_p f(tau w_r; x_p) - sum_p f(w_r; x_p))^2
    + 1/2 (1/theta - 1) sum_r sum_p f(w_r; x_p)^2], f(w; x_p) = ReLU-bar(<w, x_p>), teacher detached."""
    with torch.no_grad():
        teacher = enc.patch_act(x, tau * enc.w).sum(dim=1)
    act = enc.patch_act(x)
    rec = 0.5 * (teacher - act.sum(dim=1)).pow(2).sum(dim=1)
    var = 0.5 * (1 / theta - 1) * act.pow(2).sum(dim=(1, 2))
    return (rec + var).mean()


def mrp_loss_sampled(enc: Encoder, x: torch.Tensor, eps: torch.Tensor, theta: float, tau: float) -> torch.Tensor:
    """(1/2N) sum_n sum_r (h-hat_r(X_n) - h'_r(eps X_n))^2 with the decoder h'_r = h_r / theta (b_r = 1/theta).
    x: (N, P, d); eps: (N, P) in {0, 1}, 1 = kept."""
    with torch.no_grad():
        teacher = enc.patch_act(x, tau * enc.w).sum(dim=1)
    student = enc(x * eps[:, :, None]) / theta
    return 0.5 * (teacher - student).pow(2).sum(dim=1).mean()


def class_scores(h: torch.Tensor, k: int, m: int) -> torch.Tensor:
    """F_i(X) = sum_{r in [m]} h_{i m + r}(X): (N, km) -> (N, k)."""
    return h.view(len(h), k, m).sum(dim=2)


def capture(enc: Encoder, k: int, threshold: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Lambda_{i,l} = max_r [<w_r, v_{i,l}>]^+ as (k, 2), the winning kernel per feature (k, 2), and which
    features are captured (Lambda >= threshold) as a (k, 2) bool."""
    c = enc.feature_corr(2 * k).clamp_min(0)
    lam, arg = c.max(dim=0)
    return lam.view(k, 2), arg.view(k, 2), lam.view(k, 2) >= threshold


def head_loss(u: torch.Tensor, h: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of the linear head F = h u^T. u: (k, km); h: (N, km); y: (N,)."""
    return F.cross_entropy(h @ u.T, y)


def sigma0_default(k: int) -> float:
    """sigma0 = 1/k: within the paper's O(1/sqrt(k)) and satisfying sigma0^(q-2) <= 1/k for q = 3."""
    return 1.0 / k


def varrho_default(k: int) -> float:
    """varrho = 1/log k, a 1/polylog(k)."""
    return 1.0 / math.log(k)
