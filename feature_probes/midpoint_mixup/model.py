"""Models and losses of the Midpoint Mixup probe (Chidambaram et al., ICML 2023).

- ``relu_tilde``: the smoothed ReLU of Def. 4.2.
- ``MultiViewNet``: the two-layer convolutional network of Eq. 4.1, g_y(x) = sum_r sum_p ReLU~(<w_{y,r}, x^(p)>).
- ``mixup_loss``: ERM (Eq. 2.1), Mixup over all N^2 ordered pairs (Eq. 2.2) and Midpoint Mixup (Eq. 3.1).
- ``SmallCNN`` and ``batch_mixup_loss``: Table 1's image protocol (one lambda per batch, random partners).
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from feature_probes.common import smoothed_relu


def relu_tilde(z: torch.Tensor, alpha: float, rho: float) -> torch.Tensor:
    """Def. 4.2: 0 for z <= 0; z^alpha / (alpha rho^(alpha-1)) on [0, rho]; z - (1 - 1/alpha) rho above."""
    return smoothed_relu(z, alpha, rho)


class MultiViewNet(nn.Module):
    """Eq. 4.1: k*m weight vectors, no output layer. Weights live in the feature basis (see ``data``);
    init w_{y,r} ~ N(0, I/d) as in Def. 4.2, i.e. each feature coordinate has variance 1/d.

    forward(x: (B, P, 2k)) -> logits (B, k). ``preact`` gives <w_{y,r}, x^(p)> as (B, k, m, P), which is
    linear in x, so a mixed point's pre-activations are the same mix of the two points' ones.
    """

    def __init__(self, k: int, m: int, d: int, alpha: float, rho: float, gen: torch.Generator):
        super().__init__()
        self.k, self.m, self.alpha, self.rho = k, m, alpha, rho
        self.w = nn.Parameter(torch.randn(k, m, 2 * k, generator=gen) / math.sqrt(d))

    def preact(self, x: torch.Tensor) -> torch.Tensor:
        return torch.einsum("bpf,kmf->bkmp", x, self.w)

    def logits_from_preact(self, a: torch.Tensor) -> torch.Tensor:
        return relu_tilde(a, self.alpha, self.rho).sum(dim=(-1, -2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.logits_from_preact(self.preact(x))

    def correlations(self) -> torch.Tensor:
        """<w_{s,r}, v_{y,l}> as (k_s, m, k_y, 2)."""
        return self.w.detach().view(self.k, self.m, self.k, 2)

    def feature_strength(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Lambda_{y,l} = max_r <w_{y,r}, v_{y,l}> (App. B) and the off-class max_{s != y, r} <w_{s,r}, v_{y,l}>
        (Claim B.1), both (k, 2)."""
        c = self.correlations()
        own = c.diagonal(dim1=0, dim2=2).amax(dim=0).T  # (k, 2)
        mask = torch.eye(self.k, dtype=torch.bool)[:, None, :, None].expand_as(c)
        off = c.masked_fill(mask, -math.inf).amax(dim=(0, 1))
        return own, off


METHODS = ("erm", "midpoint", "uniform")


def mixup_loss(
    model: MultiViewNet,
    x: torch.Tensor,
    y: torch.Tensor,
    method: str,
    gen: torch.Generator | None = None,
    pairs: str = "all",
    chunk: int = 32,
) -> torch.Tensor:
    """Full-batch training loss of Sec. 2.

    erm: Eq. 2.1. midpoint: Eq. 3.1, lambda = 1/2 on every ordered pair (i, j). uniform: Eq. 2.2 with
    lambda ~ Beta(1, 1), one fresh draw per ordered pair per call (a one-sample estimate of E_lambda).
    pairs: "all" averages over all N^2 ordered pairs, i = j included (the paper's Eq. 2.2/3.1);
    "different" averages only over pairs with y_i != y_j (a named variant, the issue's wording).
    x: (N, P, 2k); y: (N,). Mixed pre-activations are mixed per-point pre-activations (exact: linear).
    """
    if method not in METHODS:
        raise ValueError(f"method={method!r}; allowed: {', '.join(METHODS)}")
    if pairs not in ("all", "different"):
        raise ValueError(f"pairs={pairs!r}; allowed: all, different")
    a = model.preact(x)
    if method == "erm":
        return F.cross_entropy(model.logits_from_preact(a), y)
    n = len(x)
    if method == "midpoint":
        return _midpoint_loss(model, a, y, pairs, chunk * n)
    total, count = a.new_zeros(()), 0
    for s in range(0, n, chunk):
        ai, yi = a[s : s + chunk], y[s : s + chunk]
        lam = torch.rand(len(ai), n, generator=gen)
        lv = lam[:, :, None, None, None]
        mixed = lv * ai[:, None] + (1 - lv) * a[None, :]
        logp = F.log_softmax(model.logits_from_preact(mixed), dim=-1)  # (ci, N, k)
        li = logp.gather(-1, yi[:, None, None].expand(-1, n, 1)).squeeze(-1)
        lj = logp.gather(-1, y[None, :, None].expand(len(ai), -1, 1)).squeeze(-1)
        loss = -(lam * li + (1 - lam) * lj)
        if pairs == "different":
            keep = yi[:, None] != y[None, :]
            loss, count = loss[keep], count + int(keep.sum())
        else:
            count += loss.numel()
        total = total + loss.sum()
    return total / max(count, 1)


def _midpoint_loss(model: MultiViewNet, a: torch.Tensor, y: torch.Tensor, pairs: str, block: int) -> torch.Tensor:
    """Eq. 3.1 over all N^2 ordered pairs from the pairs i <= j: (i, j) and (j, i) are the same mixed point
    (a_i + a_j)/2 with the same loss, so a pair i < j counts twice and i = j once. a: (N, k, m, P)."""
    n = len(a)
    i, j = torch.triu_indices(n, n)
    if pairs == "different":
        keep = y[i] != y[j]
        i, j = i[keep], j[keep]
    weight = torch.where(i == j, 1.0, 2.0)  # i < j stands for (i, j) and (j, i)
    total = a.new_zeros(())
    for s in range(0, len(i), block):
        bi, bj = i[s : s + block], j[s : s + block]
        logp = F.log_softmax(model.logits_from_preact(0.5 * (a[bi] + a[bj])), dim=-1)  # (pairs, k)
        loss = -0.5 * (logp.gather(-1, y[bi, None]) + logp.gather(-1, y[bj, None])).squeeze(-1)
        total = total + (loss * weight[s : s + block]).sum()
    return total / weight.sum().clamp_min(1)


# ---- Table 1's image protocol ----


class SmallCNN(nn.Module):
    """A small CNN for 2-channel 8x8 inputs (our stand-in for ResNet-18 on the 8x8 digits):
    conv3x3(2->32)-ReLU-conv3x3(32->64)-ReLU-maxpool2-linear(64*4*4->128)-ReLU-linear(128->10)."""

    def __init__(self, in_channels: int = 2, n_classes: int = 10, width: int = 32):
        super().__init__()
        self.net = nn.Sequential(
            nn.Conv2d(in_channels, width, 3, padding=1),
            nn.ReLU(),
            nn.Conv2d(width, 2 * width, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Flatten(),
            nn.Linear(2 * width * 16, 128),
            nn.ReLU(),
            nn.Linear(128, n_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def batch_mixup_loss(
    model: nn.Module, x: torch.Tensor, y: torch.Tensor, method: str, gen: torch.Generator
) -> torch.Tensor:
    """The authors' per-batch Mixup: one lambda per batch (1/2 for midpoint, Beta(1,1) for uniform),
    partner j = a uniformly random permutation of the batch; loss lambda CE(y_i) + (1-lambda) CE(y_j)
    on lambda x_i + (1-lambda) x_j. erm: plain cross-entropy. x: (B, C, H, W); y: (B,)."""
    if method not in METHODS:
        raise ValueError(f"method={method!r}; allowed: {', '.join(METHODS)}")
    if method == "erm":
        return F.cross_entropy(model(x), y)
    lam = 0.5 if method == "midpoint" else float(torch.rand((), generator=gen))
    j = torch.randperm(len(x), generator=gen)
    out = model(lam * x + (1 - lam) * x[j])
    return lam * F.cross_entropy(out, y) + (1 - lam) * F.cross_entropy(out, y[j])
