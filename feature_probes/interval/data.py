"""Interval-labelling data of Z. Shi's dissertation, App. A.7 (Table A.2, Figs. A.3-A.4).

The parity experiment's data model (Sec. 2.3, ``feature_probes.parity.data``) with another labelling function:
phi in {0,1}^D; x_tilde = M phi with M (d, D) of orthonormal columns; A a random k-subset of [D];

    y = +1 if t1 <= sum_{i in A} phi_i <= t2, else -1          (the law named ``interval``)

with d = 500, D = 100, k = 30, t1 = 20, t2 = 30. With input structure the phi_i are independent with
Pr[phi_i = 1] = 2/3 on A and 1/2 off A; without structure 1/2 everywhere. Since t2 = k, the label is the
threshold s >= 20 on s = sum_A phi_i.

Sampling (ours, "otherwise as Sec. 2.3", whose 50000 points are 25000 per class): ``balanced`` draws exactly
n/2 points per class from the class-conditional law: s from P(s | y), then s ones on uniformly random
positions of A (the bits on A are exchangeable given s), and independent Bernoulli(1/2) bits off A. This is
the law conditioned on the class, not an oversampled stream. ``natural`` draws the product law as is
(P(y = +1) = 0.585 with structure, 0.049 without).

Inputs are normalised as in Sec. 2.3.1, x = (x_tilde - E x_tilde) / sigma_tilde, with the exact mean and scale
of the law that is sampled (balanced or natural), computed from the binomial law of s.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class IntervalSpec:
    """The interval law. d: input dimension; D: hidden bits; k: |A|; [t1, t2]: the interval of s = sum_A phi;
    p_a: Pr[phi_i = 1] on A with structure (1/2 off A, and everywhere without); structured: the p_a law (True)
    or all bits Bernoulli(1/2) (False, 'input structure removed'); balanced: n/2 points per class (True) or the
    natural law (False)."""

    d: int = 500
    D: int = 100
    k: int = 30
    t1: int = 20
    t2: int = 30
    p_a: float = 2 / 3
    structured: bool = True
    balanced: bool = True

    def check(self) -> None:
        if not 1 <= self.k <= self.D <= self.d:
            raise ValueError(f"k={self.k}, D={self.D}, d={self.d}: need 1 <= k <= D <= d")
        if not 0 <= self.t1 <= self.t2 <= self.k:
            raise ValueError(f"t1={self.t1}, t2={self.t2}: need 0 <= t1 <= t2 <= k={self.k}")
        if not 0.0 < self.p_a < 1.0:
            raise ValueError(f"p_a={self.p_a}: must lie in (0, 1)")
        share = self.positive_share()
        if self.balanced and not 0.0 < share < 1.0:
            raise ValueError(
                f"the interval [{self.t1}, {self.t2}] holds probability {share:g} of s; a balanced "
                "split needs both classes"
            )

    def on_a_prob(self) -> float:
        """Pr[phi_i = 1] for i in A under the product law: p_a with structure, 1/2 without."""
        return self.p_a if self.structured else 0.5

    def s_pmf(self) -> list[float]:
        """P(s = 0..k) for s = sum_A phi under the product law (Binomial(k, on_a_prob))."""
        p = self.on_a_prob()
        return [math.comb(self.k, s) * p**s * (1 - p) ** (self.k - s) for s in range(self.k + 1)]

    def inside(self, s: int) -> bool:
        return self.t1 <= s <= self.t2

    def positive_share(self) -> float:
        """P(y = +1) under the product law (natural sampling)."""
        return sum(q for s, q in enumerate(self.s_pmf()) if self.inside(s))

    def sampled_s_pmf(self) -> list[float]:
        """P(s) under the law that is sampled: the product law, or with balanced sampling the mixture
        1/2 P(s | y = +1) + 1/2 P(s | y = -1)."""
        pmf = self.s_pmf()
        if not self.balanced:
            return pmf
        pos = self.positive_share()
        return [q * (0.5 / pos if self.inside(s) else 0.5 / (1 - pos)) for s, q in enumerate(pmf)]

    def class_s_pmf(self, label: int) -> list[float]:
        """P(s | y = label) under the product law (the same for both samplings)."""
        pmf = [q if self.inside(s) == (label > 0) else 0.0 for s, q in enumerate(self.s_pmf())]
        total = sum(pmf)
        return [q / total for q in pmf]

    def centre_and_scale(self) -> tuple[torch.Tensor, float]:
        """([E phi_i on A, E phi_j off A], sigma_tilde) of the sampled law; sigma_tilde^2 = sum_j Var(phi_j)
        (M has orthonormal columns), with Var(phi_i) = mu (1 - mu) for a {0,1} bit of mean mu."""
        mu = sum(s * q for s, q in enumerate(self.sampled_s_pmf())) / self.k  # the bits on A are exchangeable
        sigma2 = self.k * mu * (1 - mu) + (self.D - self.k) * 0.25
        return torch.tensor([mu, 0.5]), math.sqrt(sigma2)

    def gamma(self) -> float:
        """gamma = E[y phi_i] - E[y] E[phi_i] for i in A, on the sampled law: Cov(y, s)/k by exchangeability
        (y is a function of s). Positive here even without structure: a threshold on s correlates with each bit."""
        pmf = self.sampled_s_pmf()
        y = [1.0 if self.inside(s) else -1.0 for s in range(self.k + 1)]
        ey = sum(q * v for q, v in zip(pmf, y))
        es = sum(s * q for s, q in enumerate(pmf))
        eys = sum(s * q * v for s, (q, v) in enumerate(zip(pmf, y)))
        return (eys - ey * es) / self.k

    def majority_share(self) -> float:
        """Accuracy of the best constant classifier on the sampled law (1/2 when balanced)."""
        pos = 0.5 if self.balanced else self.positive_share()
        return max(pos, 1 - pos)

    def linear_ceiling(self) -> float:
        """The best accuracy of a classifier sign(alpha s + beta) (a threshold on s, either way round) on the
        sampled law. With t2 = k the label is the threshold s >= t1 itself, so 1."""
        pmf = self.sampled_s_pmf()
        best = 0.0
        for t in range(self.k + 2):
            acc = sum(q for s, q in enumerate(pmf) if (s >= t) == self.inside(s))
            best = max(best, acc, 1 - acc)
        return best


def interval_labels(phi: torch.Tensor, A: torch.Tensor, t1: int, t2: int) -> torch.Tensor:
    """The interval law: y = +1 iff t1 <= sum_{i in A} phi_i <= t2, else -1. phi: (n, D) in {0, 1}; (n,) float."""
    s = phi[:, A].sum(dim=1)
    return ((s >= t1) & (s <= t2)).float() * 2 - 1


def sample_phi(spec: IntervalSpec, A: torch.Tensor, n: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """n draws of phi (n, D) in {0, 1} and their labels (n,): the product law, or exactly n/2 per class in a
    random order (balanced; n must be even)."""
    off = (torch.rand(n, spec.D, generator=gen) < 0.5).float()
    if not spec.balanced:
        phi = off
        phi[:, A] = (torch.rand(n, spec.k, generator=gen) < spec.on_a_prob()).float()
        return phi, interval_labels(phi, A, spec.t1, spec.t2)
    if n % 2:
        raise ValueError(f"n={n}: a balanced split needs an even number of points")
    y = torch.cat([torch.ones(n // 2), -torch.ones(n // 2)])[torch.randperm(n, generator=gen)]
    s = torch.empty(n, dtype=torch.long)
    for label in (1, -1):
        rows = (y == label).nonzero().squeeze(1)
        pmf = torch.tensor(spec.class_s_pmf(label), dtype=torch.float64)
        s[rows] = torch.multinomial(pmf, len(rows), replacement=True, generator=gen)
    ranks = torch.rand(n, spec.k, generator=gen).argsort(dim=1).argsort(dim=1)  # a uniform permutation per row
    phi = off
    phi[:, A] = (ranks < s[:, None]).float()  # s ones on uniformly random positions of A
    return phi, y


def normalise(spec: IntervalSpec, M: torch.Tensor, A: torch.Tensor, phi: torch.Tensor) -> torch.Tensor:
    """x = (M phi - M E phi) / sigma_tilde with the exact mean and scale of the sampled law. (n, d)"""
    means, sigma = spec.centre_and_scale()
    mean = torch.full((spec.D,), float(means[1]))
    mean[A] = float(means[0])
    return (phi - mean) @ M.T / sigma


def make_split(spec: IntervalSpec, problem, n: int, gen: torch.Generator):
    """n labelled points of the problem (M, A) (``feature_probes.parity.data.Problem``).
    Returns (x (n, d) normalised, y (n,) in {-1, +1}, phi (n, D))."""
    phi, y = sample_phi(spec, problem.A, n, gen)
    return normalise(spec, problem.M, problem.A, phi), y, phi
