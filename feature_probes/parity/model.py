"""Two-layer network and learning process of Z. Shi's dissertation, Ch. 2 (Sec. 2.3.1, Thm A.20, App. A.7.1).

g(x) = sum_{i=1}^{2m} a_i sigma(<w_i, x> + b_i), sigma(z) = min(1, max(z, 0)). In the loss, sigma is
smoothed by Gaussian noise (Eq. 2.3), E sigma(z + xi) = R(z) - R(z - 1), R(mu) = mu Phi(mu/s) + s phi(mu/s).
Loss: hinge max(1 - y g(x), 0) plus sum_i lambda_a a_i^2 + lambda_w ||w_i||^2 (b not regularised).
Also the NTK (the network linearised at its initialisation) and fixed-feature linear classifiers.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn


def clip_relu(z: torch.Tensor) -> torch.Tensor:
    """sigma(z) = min(1, max(z, 0))."""
    return z.clamp(0.0, 1.0)


def smoothed_clip_relu(z: torch.Tensor, s: float) -> torch.Tensor:
    """E_xi sigma(z + xi), xi ~ N(0, s^2), in closed form; s = 0 gives sigma itself."""
    if s == 0:
        return clip_relu(z)

    def ramp(mu):  # E max(mu + xi, 0)
        t = mu / s
        return mu * torch.special.ndtr(t) + s * torch.exp(-0.5 * t * t) / math.sqrt(2 * math.pi)

    return ramp(z) - ramp(z - 1.0)


class TwoLayerNet(nn.Module):
    """2m neurons with the symmetric initialisation of Sec. 2.3.1: w_i ~ N(0, sigma_w^2 I), b_i ~ N(0, sigma_b^2),
    a_i ~ N(0, sigma_a^2), then w_{m+i} = w_i, b_{m+i} = b_i, a_{m+i} = -a_i, so g = 0 at init.

    w: (2m, d); b, a: (2m,). forward(x: (n, d), s) -> (n,), with the noise-smoothed sigma when s > 0.
    """

    def __init__(self, d: int, m: int, sigma_w: float, sigma_b: float, sigma_a: float, gen: torch.Generator):
        super().__init__()
        w = torch.randn(m, d, generator=gen) * sigma_w
        b = torch.randn(m, generator=gen) * sigma_b
        a = torch.randn(m, generator=gen) * sigma_a
        self.w = nn.Parameter(torch.cat([w, w]))
        self.b = nn.Parameter(torch.cat([b, b]))
        self.a = nn.Parameter(torch.cat([a, -a]))

    def hidden(self, x: torch.Tensor, s: float = 0.0) -> torch.Tensor:
        return smoothed_clip_relu(x @ self.w.T + self.b, s)

    def forward(self, x: torch.Tensor, s: float = 0.0) -> torch.Tensor:
        return self.hidden(x, s) @ self.a


def hinge(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """mean max(1 - y out, 0)."""
    return (1 - y * out).clamp_min(0).mean()


def regulariser(net: TwoLayerNet, lam_a: float, lam_w: float) -> torch.Tensor:
    """sum_i lambda_a a_i^2 + lambda_w ||w_i||^2 (a sum over neurons, as in Sec. 2.3.1; b is free)."""
    return lam_a * net.a.pow(2).sum() + lam_w * net.w.pow(2).sum()


def gd_step(net: TwoLayerNet, x, y, lr: float, lam_a: float, lam_w: float, s: float) -> float:
    """One step of Eq. 2.4: theta <- theta - lr * grad(hinge loss with smoothing s + regulariser). Returns the loss."""
    net.zero_grad()
    fit = hinge(net(x, s), y)
    fit.backward()
    loss = fit.detach() + regulariser(net, lam_a, lam_w).detach()
    # The regulariser's part of the step is applied as the factor (1 - 2 lr lambda), computed in Python: step 1
    # has 2 lr lambda_w = 1 exactly, and w - lr (grad + 2 lambda w) in float32 would leave rounding noise of
    # size eps*|w^(0)|, as large as the tiny lr*grad that step 1 is meant to keep.
    with torch.no_grad():
        for p, lam in ((net.w, lam_w), (net.b, 0.0), (net.a, lam_a)):
            p.mul_(1 - 2 * lr * lam).sub_(lr * p.grad)
    return float(loss.detach())


class LinearisedNet(nn.Module):
    """The NTK predictor: g_lin(x) = <theta - theta0, grad_theta g(x; theta0)>, written out per neuron as
    sum_i [da_i sigma(z_i) + a_i sigma'(z_i) (<dw_i, x> + db_i)], z_i = <w_i, x> + b_i at init
    (sigma'(z) = 1 on (0, 1), else 0). Only (da, dw, db) are trained; g_lin = 0 at the start."""

    def __init__(self, net: TwoLayerNet):
        super().__init__()
        self.w0, self.b0, self.a0 = net.w.detach().clone(), net.b.detach().clone(), net.a.detach().clone()
        self.dw = nn.Parameter(torch.zeros_like(self.w0))
        self.db = nn.Parameter(torch.zeros_like(self.b0))
        self.da = nn.Parameter(torch.zeros_like(self.a0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        z = x @ self.w0.T + self.b0
        slope = ((z > 0) & (z < 1)).float() * self.a0
        return clip_relu(z) @ self.da + ((x @ self.dw.T + self.db) * slope).sum(dim=1)


class FixedFeatureHead(nn.Module):
    """A linear classifier a^T z(x) + c on frozen first-layer features (RF, One Step, Two Step), with
    z(x) = (sigma(W x + b) - mean) / std standardised by the training set's statistics (x_train: (n, d)).

    Standardising is our choice for "the best classifier on top": after steps 1-2 the features vary by
    ~1e-2 around a large common offset, and a head on the raw features stays far from its optimum
    within the same number of Adam steps."""

    def __init__(self, w: torch.Tensor, b: torch.Tensor, x_train: torch.Tensor):
        super().__init__()
        self.w, self.b = w.detach().clone(), b.detach().clone()
        with torch.no_grad():
            feats = clip_relu(x_train @ self.w.T + self.b)
            self.mean, self.std = feats.mean(dim=0), feats.std(dim=0).clamp_min(1e-12)
        self.a = nn.Parameter(torch.zeros(len(w)))
        self.c = nn.Parameter(torch.zeros(()))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ((clip_relu(x @ self.w.T + self.b) - self.mean) / self.std) @ self.a + self.c
