"""Multi-view patch data of Def. 3.1 in Pan, Zhou, Yan, "Towards Understanding Why Mask Reconstruction
Pretraining Helps in Downstream Tasks" (after Allen-Zhu & Li 2020), and the random patch masks.

The 2k features v_{i,l} are the first 2k standard basis vectors of R^d (orthonormal; the Gaussian noise
and the Gaussian initialisation are rotation invariant, so any orthonormal choice is equivalent):
v_{i,l} = e_{2i + l - 1}, l in {1, 2}.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class PatchSpec:
    """Def. 3.1 with the choices the paper leaves open (ours, reported in feature_probes/mrp/README.md, "Choices").

    k classes, P patches in R^d, C_p patches per present feature. mu: share of single-view points.
    s: each other-class feature joins V'(X) w.p. s/k. Own features (multi-view, and the kept feature of a
    single-view point): total weight sum_p z_p ~ Uni[own_lo, own_hi]; the weak feature of a single-view
    point: ~ Uni[rho, 1.5 rho]; other-class features: ~ Uni[other_lo, other_hi]. A total is split over its
    C_p patches by a flat Dirichlet (our reading of "uniformly distributed over C_p patches").
    alpha_{p,v'} ~ Uni[0, gamma] for every v' in V(X) on every patch. Noise: xi_p ~ N(0, sigma_p^2 I) on
    feature patches with sigma_p = noise_scale / (sqrt(d) log k) (sigma_p read as the std), and
    N(0, gamma^2 k^2 / d I) on the other patches.
    """

    k: int = 10
    d: int = 100
    P: int = 40
    C_p: int = 2
    mu: float = 0.2
    s: float = 1.0
    own_lo: float = 1.0
    own_hi: float = 1.5
    rho: float = 0.1
    other_lo: float = 0.2
    other_hi: float = 0.4
    gamma: float = 0.01
    noise_scale: float = 1.0

    def check(self) -> None:
        if self.k < 2 or self.d < 2 * self.k:
            raise ValueError(f"k={self.k}, d={self.d}: need k >= 2 and d >= 2k (2k orthonormal features)")
        if self.P < 2 * self.k * self.C_p:
            raise ValueError(f"P={self.P}: must be >= 2*k*C_p = {2 * self.k * self.C_p} so every feature set fits")
        if not 0 <= self.mu <= 1 or not 0 <= self.s <= self.k:
            raise ValueError(f"mu={self.mu}, s={self.s}: need 0 <= mu <= 1 and 0 <= s <= k")

    def sigma_p(self) -> float:
        return self.noise_scale / (math.sqrt(self.d) * math.log(self.k))


@dataclass
class PatchData:
    """x: (N, P, d); y: (N,); single: (N,) bool; kept: (N,) the strong feature l-hat in {1, 2} of a
    single-view point (0 for multi-view); weight: (N, 2k) sum_p z_p per feature (0 if absent);
    owner: (N, P) the feature index whose patch p is, -1 for an other patch."""

    x: torch.Tensor
    y: torch.Tensor
    single: torch.Tensor
    kept: torch.Tensor
    weight: torch.Tensor
    owner: torch.Tensor


def make_patch_data(spec: PatchSpec, n: int, gen: torch.Generator, view: str = "mixed") -> PatchData:
    """n points of Def. 3.1. view: "mixed" (D = (1-mu) D_m + mu D_s), "multi" (D_m) or "single" (D_s)."""
    spec.check()
    if view not in ("mixed", "multi", "single"):
        raise ValueError(f"view={view!r}; allowed: mixed, multi, single")
    k, P, C, d, F = spec.k, spec.P, spec.C_p, spec.d, 2 * spec.k
    y = torch.randint(k, (n,), generator=gen)
    single = {
        "mixed": torch.rand(n, generator=gen) < spec.mu,
        "multi": torch.zeros(n, dtype=torch.bool),
        "single": torch.ones(n, dtype=torch.bool),
    }[view]
    kept = torch.where(single, torch.randint(1, 3, (n,), generator=gen), torch.zeros(n, dtype=torch.long))
    feat_class = torch.arange(F) // 2
    present = (torch.rand(n, F, generator=gen) < spec.s / k) & (feat_class[None] != y[:, None])
    u = lambda lo, hi: lo + (hi - lo) * torch.rand(n, F, generator=gen)  # noqa: E731
    weight = torch.where(present, u(spec.other_lo, spec.other_hi), torch.zeros(n, F))
    own = feat_class[None] == y[:, None]
    ell = torch.arange(F)[None] % 2 + 1
    weak = own & single[:, None] & (ell != kept[:, None])
    weight = torch.where(own, u(spec.own_lo, spec.own_hi), weight)
    weight = torch.where(weak, u(spec.rho, 1.5 * spec.rho), weight)
    x = torch.zeros(n, P, d)
    owner = torch.full((n, P), -1, dtype=torch.long)
    order = torch.rand(n, P, generator=gen).argsort(dim=1)
    split = -torch.log(torch.rand(n, F, C, generator=gen))  # flat Dirichlet via normalised exponentials
    split = split / split.sum(dim=2, keepdim=True)
    for i in range(n):
        feats = (weight[i] > 0).nonzero().squeeze(1)
        slots = order[i, : len(feats) * C].view(len(feats), C)
        for f, ps in zip(feats.tolist(), slots):
            x[i, ps, f] = weight[i, f] * split[i, f]
            owner[i, ps] = f
    vmask = (weight > 0).float()  # V(X)
    alpha = spec.gamma * torch.rand(n, P, F, generator=gen) * vmask[:, None, :]
    x[:, :, :F] += alpha
    feature_patch = (owner >= 0)[:, :, None]
    noise = torch.randn(n, P, d, generator=gen)
    x += noise * torch.where(feature_patch, torch.tensor(spec.sigma_p()), torch.tensor(spec.gamma * k / math.sqrt(d)))
    return PatchData(x, y, single, kept, weight, owner)


def sample_mask(n: int, P: int, theta: float, gen: torch.Generator) -> torch.Tensor:
    """epsilon_p i.i.d. Bernoulli(theta): 1 keeps the patch (so 1 - theta is the mask ratio). (n, P) float."""
    if not 0 < theta <= 1:
        raise ValueError(f"theta={theta}: the keep probability must lie in (0, 1]")
    return (torch.rand(n, P, generator=gen) < theta).float()


def apply_mask(x: torch.Tensor, eps: torch.Tensor) -> torch.Tensor:
    """epsilon X: every masked patch (eps_p = 0) becomes exactly zero. x: (n, P, d); eps: (n, P)."""
    return x * eps[:, :, None]
