"""Sparse-parity in-context tasks of Z. Shi's dissertation, Sec. 5.5 (Thms 5.5.1 and 5.5.2).

Input space R^d, labels {+-1}. G (d, d) is an unknown orthonormal dictionary; a hidden phi in {+-1}^d gives the
example x = G phi with label y = phi_i phi_j (the XOR of two hidden features) for the task's pair t = (i, j).

- Important features A = [k]; S1 = A x A minus the diagonal; S2 = every ordered pair of [d] with i != j, minus S1.
- A task is drawn uniformly from S1 with probability 1 - p_T and uniformly from S2 with probability p_T.
- Given (i, j): the other d - 2 coordinates of phi are uniform on {+-1}; independently (phi_i, phi_j) is (1, 1)
  with probability 1/4 + gamma, (1, -1) and (-1, 1) with 1/4 each, (-1, -1) with 1/4 - gamma.
- A prompt holds N examples (X (N, d), y (N,)) of one task and a query x_q with label y_q.

Indices are 0-based here: feature s of the paper is column s - 1, A = {0, ..., k-1}. Shapes: a batch of B prompts
has pairs (B, 2), Phi (B, N, d), X (B, N, d), y (B, N), phi_q and x_q (B, d), y_q (B,).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

#: the law of (phi_i, phi_j) for a task (i, j): its four values and their probabilities as functions of gamma
PAIR_VALUES = ((1.0, 1.0), (1.0, -1.0), (-1.0, 1.0), (-1.0, -1.0))


def pair_probs(gamma: float) -> tuple:
    """P((phi_i, phi_j) = v) for v in PAIR_VALUES: 1/4 + gamma, 1/4, 1/4, 1/4 - gamma."""
    return (0.25 + gamma, 0.25, 0.25, 0.25 - gamma)


@dataclass(frozen=True)
class TaskLaw:
    """The data law. d: dimension (2^v2 in Thm 5.5.1); k: |A| (2^v1); gamma in (0, 1/4): the correlation of a
    task's two features; p_t in [0, 1/2): the probability of an S2 task."""

    d: int = 8
    k: int = 2
    gamma: float = 0.125
    p_t: float = 0.0

    def check(self) -> None:
        if not 2 <= self.k <= self.d:
            raise ValueError(f"k={self.k}, d={self.d}: need 2 <= k <= d (S1 needs two important features)")
        if not 0.0 < self.gamma < 0.25:
            raise ValueError(f"gamma={self.gamma}: must lie in (0, 1/4)")
        if not 0.0 <= self.p_t < 0.5:
            raise ValueError(f"p_T={self.p_t}: must lie in [0, 1/2)")

    def p_t_bound(self) -> float:
        """Thm 5.5.1's condition p_T < (1/4 - gamma) / (d(d-1)/2 (1/4 + gamma) + 1/4 - gamma)."""
        g = self.gamma
        return (0.25 - g) / (self.d * (self.d - 1) / 2 * (0.25 + g) + 0.25 - g)


def task_sets(d: int, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(S1 (k(k-1), 2), S2 (d(d-1) - k(k-1), 2)) of ordered pairs (i, j), i != j, 0-based, in lexicographic order."""
    pairs = [(i, j) for i in range(d) for j in range(d) if i != j]
    s1 = [p for p in pairs if p[0] < k and p[1] < k]
    s2 = [p for p in pairs if not (p[0] < k and p[1] < k)]
    return torch.tensor(s1, dtype=torch.long), torch.tensor(s2, dtype=torch.long).reshape(-1, 2)


def random_orthonormal(d: int, gen: torch.Generator) -> torch.Tensor:
    """G (d, d): the Q factor of a Gaussian matrix, with the sign of R's diagonal fixed (Haar-distributed), float64."""
    q, r = torch.linalg.qr(torch.randn(d, d, generator=gen, dtype=torch.float64))
    return q * torch.sign(torch.diagonal(r))


def sample_pairs(law: TaskLaw, n: int, gen: torch.Generator, which: str = "mixture") -> torch.Tensor:
    """n task pairs (n, 2): "mixture" (S1 with probability 1 - p_T, else S2), "s1" or "s2" (uniform within the set)."""
    s1, s2 = task_sets(law.d, law.k)
    if which == "s1":
        return s1[torch.randint(len(s1), (n,), generator=gen)]
    if which == "s2":
        return s2[torch.randint(len(s2), (n,), generator=gen)]
    if which != "mixture":
        raise ValueError(f"which={which!r}; allowed: mixture, s1, s2")
    from_s2 = torch.rand(n, generator=gen) < law.p_t
    return torch.where(
        from_s2[:, None],
        s2[torch.randint(len(s2), (n,), generator=gen)],
        s1[torch.randint(len(s1), (n,), generator=gen)],
    )


def sample_phi(pairs: torch.Tensor, n: int, d: int, gamma: float, gen: torch.Generator) -> torch.Tensor:
    """n hidden vectors per task: (B, n, d) in {+-1}, float64. Uniform coordinates, then (phi_i, phi_j) of each
    prompt's pair (pairs (B, 2)) drawn from the gamma-correlated law."""
    B = len(pairs)
    phi = torch.randint(0, 2, (B, n, d), generator=gen).to(torch.float64) * 2 - 1
    values = torch.tensor(PAIR_VALUES, dtype=torch.float64)
    which = torch.multinomial(
        torch.tensor(pair_probs(gamma), dtype=torch.float64), B * n, replacement=True, generator=gen
    ).view(B, n)
    i = pairs[:, 0][:, None].expand(B, n)
    j = pairs[:, 1][:, None].expand(B, n)
    phi.scatter_(2, i[..., None], values[which, 0][..., None])
    phi.scatter_(2, j[..., None], values[which, 1][..., None])
    return phi


def xor_labels(phi: torch.Tensor, pairs: torch.Tensor) -> torch.Tensor:
    """y = phi_i phi_j for each prompt's pair: phi (B, n, d), pairs (B, 2) -> (B, n)."""
    idx = pairs[:, None, :].expand(phi.shape[0], phi.shape[1], 2)
    return torch.gather(phi, 2, idx).prod(dim=2)


@dataclass
class Prompts:
    """A batch of B prompts: pairs (B, 2); X (B, N, d); y (B, N) the clean in-context labels; x_q (B, d); y_q (B,);
    phi and phi_q, the hidden vectors (for checks)."""

    pairs: torch.Tensor
    X: torch.Tensor
    y: torch.Tensor
    x_q: torch.Tensor
    y_q: torch.Tensor
    phi: torch.Tensor
    phi_q: torch.Tensor


def sample_prompts(
    law: TaskLaw, G: torch.Tensor, n: int, batch: int, gen: torch.Generator, which: str = "mixture"
) -> Prompts:
    """B prompts of N examples each: tasks by ``sample_pairs`` (which), phi by ``sample_phi``, x = G phi."""
    law.check()
    pairs = sample_pairs(law, batch, gen, which)
    phi = sample_phi(pairs, n + 1, law.d, law.gamma, gen)  # the last one is the query
    y = xor_labels(phi, pairs)
    X = phi @ G.T  # x_l = G phi_l, row-wise
    return Prompts(pairs, X[:, :n], y[:, :n], X[:, n], y[:, n], phi[:, :n], phi[:, n])


def flip_ranks(y: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """A uniformly random order of each prompt's N positions (B, N): ``flip_labels`` negates the first
    round(rate N) of them, so the flipped positions are nested across rates (one draw serves every rate)."""
    return torch.rand(y.shape, generator=gen).argsort(dim=1).argsort(dim=1)


def flip_labels(y: torch.Tensor, rate: float, ranks: torch.Tensor) -> torch.Tensor:
    """y (B, N) with exactly round(rate N) labels negated per prompt: those whose rank (``flip_ranks``) is below it."""
    if not 0.0 <= rate <= 1.0:
        raise ValueError(f"flip rate {rate}: must lie in [0, 1]")
    count = int(math.floor(rate * y.shape[1] + 0.5))
    return torch.where(ranks < count, -y, y)
