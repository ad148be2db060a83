"""Parity data of Z. Shi's dissertation, Ch. 2 (Eq. 2.1) and App. A.7.1.

phi in {0,1}^D; x_tilde = M phi with M (d, D) of orthonormal columns; y = +1 iff sum_{j in A} phi_j is
odd (|A| = k), i.e. y = prod_{j in A} (2 phi_j - 1) for odd k. With structure the law is
p_o D^(0) + (1 - p_o) D^(1): D^(0) draws every phi_j ~ Bernoulli(1/2); D^(1) sets phi_A to all zeros or
all ones (1/2 each) and phi_j ~ Bernoulli(p_o / (2 - 2 p_o)) off A. Without structure: D^(0) only.
Inputs are normalised, x = (x_tilde - E x_tilde) / sigma_tilde with sigma_tilde^2 = E ||x_tilde - E x_tilde||^2,
both computed exactly from the law (M has orthonormal columns, so sigma_tilde^2 = sum_j Var(phi_j)).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class ParitySpec:
    """d: input dimension; D: number of hidden bits; k: parity size |A|; p_o: weight of D^(0);
    structured: the mixture with D^(1) (True) or D^(0) only (False, 'input structure removed')."""

    d: int = 500
    D: int = 100
    k: int = 5
    p_o: float = 0.5
    structured: bool = True

    def check(self) -> None:
        if not 1 <= self.k <= self.D <= self.d:
            raise ValueError(f"k={self.k}, D={self.D}, d={self.d}: need 1 <= k <= D <= d")
        if self.k % 2 == 0:
            raise ValueError(f"k={self.k}: must be odd (then the all-ones block of D^(1) has label +1)")
        if not 0.0 < self.p_o <= 0.5:
            raise ValueError(f"p_o={self.p_o}: must lie in (0, 1/2] so that p_o/(2-2p_o) is a probability <= 1/2")

    def off_a_prob(self) -> float:
        """Pr[phi_j = 1] for j outside A: 1/2 without structure, p_o*1/2 + (1-p_o)*p_o/(2-2p_o) = p_o with it."""
        return 0.5 if not self.structured else self.p_o

    def centre_and_scale(self) -> tuple[torch.Tensor, float]:
        """E phi (D,) given A is handled by the caller; here the per-coordinate mean on and off A and sigma_tilde."""
        q = self.off_a_prob()
        sigma2 = self.k * 0.25 + (self.D - self.k) * q * (1 - q)
        return torch.tensor([0.5, q]), math.sqrt(sigma2)

    def gamma(self) -> float:
        """gamma = E[y phi_i] - E[y] E[phi_i] for i in A: D^(0) contributes 0 (y is independent of one bit) and
        D^(1) contributes 1/2 (y phi_i = 1 exactly on the all-ones block), so (1 - p_o)/2 = 1/4 in the simulation;
        0 without structure."""
        return (1 - self.p_o) * 0.5 if self.structured else 0.0

    def linear_ceiling(self) -> float:
        """The best accuracy of any classifier linear in s = sum_{j in A} phi_j, sign(alpha s + beta): a threshold
        on s, either way round, under the exact law of s. D^(0) (weight p_o, or 1 without structure) gives
        s ~ Binomial(k, 1/2); D^(1) gives s = 0 or k, 1/2 each. k = 5, p_o = 1/2: 54/64 = 84.4%."""
        w0 = self.p_o if self.structured else 1.0
        prob = [w0 * math.comb(self.k, s) / 2**self.k for s in range(self.k + 1)]
        prob[0] += (1 - w0) / 2
        prob[self.k] += (1 - w0) / 2
        odd = [s % 2 == 1 for s in range(self.k + 1)]  # label +1
        best = 0.0
        for t in range(self.k + 2):  # predict +1 for s >= t, or (the flip) for s < t
            acc = sum(p for s, p in enumerate(prob) if (s >= t) == odd[s])
            best = max(best, acc, 1 - acc)
        return best


@dataclass
class Problem:
    """One draw of the hidden quantities: M (d, D) with orthonormal columns, the parity set A (k,)."""

    M: torch.Tensor
    A: torch.Tensor

    def star(self) -> torch.Tensor:
        """sum_{j in A} M_j, the direction the learned weights should align with (Fig. A.2's stars). (d,)"""
        return self.M[:, self.A].sum(dim=1)


def make_problem(spec: ParitySpec, gen: torch.Generator) -> Problem:
    """M = Q factor of a Gaussian (d, D) matrix (orthonormal columns; our choice of how to draw it);
    A = a uniformly random k-subset of [D]."""
    spec.check()
    q, r = torch.linalg.qr(torch.randn(spec.d, spec.D, generator=gen, dtype=torch.float64))
    q = q * torch.sign(torch.diagonal(r))[None, :]  # a unique Q, so the draw depends only on the seed
    A = torch.randperm(spec.D, generator=gen)[: spec.k].sort().values
    return Problem(q.float(), A)


def sample_phi(spec: ParitySpec, A: torch.Tensor, n: int, gen: torch.Generator) -> torch.Tensor:
    """n draws of phi (n, D) in {0, 1} from the spec's law (mixture or D^(0) only)."""
    phi = (torch.rand(n, spec.D, generator=gen) < 0.5).float()
    if not spec.structured:
        return phi
    from_d1 = torch.rand(n, generator=gen) >= spec.p_o
    off = (torch.rand(n, spec.D, generator=gen) < spec.p_o / (2 - 2 * spec.p_o)).float()
    block = (torch.rand(n, generator=gen) < 0.5).float()[:, None].expand(n, spec.k)
    d1 = off.clone()
    d1[:, A] = block
    return torch.where(from_d1[:, None], d1, phi)


def parity_labels(phi: torch.Tensor, A: torch.Tensor) -> torch.Tensor:
    """y = +1 iff sum_{j in A} phi_j is odd, else -1. (n,) float."""
    return (phi[:, A].sum(dim=1) % 2) * 2 - 1


def make_split(spec: ParitySpec, problem: Problem, n: int, gen: torch.Generator, balanced: bool = True):
    """n labelled points. balanced: exactly n/2 per class (the paper's 25000 per class), taken in draw
    order from an oversampled stream. Returns (x (n, d) normalised, y (n,) in {-1, +1}, phi (n, D))."""
    if balanced and n % 2:
        raise ValueError(f"n={n}: a balanced split needs an even number of points")
    phi = sample_phi(spec, problem.A, n if not balanced else 2 * n + 64, gen)
    y = parity_labels(phi, problem.A)
    if balanced:
        while min(int((y > 0).sum()), int((y < 0).sum())) < n // 2:  # vanishingly rare; draw more
            more = sample_phi(spec, problem.A, n, gen)
            phi, y = torch.cat([phi, more]), torch.cat([y, parity_labels(more, problem.A)])
        pos, neg = (y > 0).nonzero().squeeze(1)[: n // 2], (y < 0).nonzero().squeeze(1)[: n // 2]
        idx = torch.cat([pos, neg])[torch.randperm(n, generator=gen)]
        phi, y = phi[idx], y[idx]
    return normalise(spec, problem, phi), y, phi


def normalise(spec: ParitySpec, problem: Problem, phi: torch.Tensor) -> torch.Tensor:
    """x = (M phi - M E phi) / sigma_tilde with the exact mean and scale of the law. (n, d)"""
    means, sigma = spec.centre_and_scale()
    mean = torch.full((spec.D,), float(means[1]))
    mean[problem.A] = float(means[0])
    return (phi - mean) @ problem.M.T / sigma
