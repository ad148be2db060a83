"""Thm 5.5.2's projections and the comparison of heads (Z. Shi 2024, Sec. 5.5).

- D_j = [diag V^(i)] over g_j*'s neurons, (d, 2(v_j + 1)); P_Z(v) = Z (Z^T Z)^-1 Z^T v. Each column of D_j appears
  with its negation, so Z^T Z is singular (rank v_j + 1); P_Z is taken as the orthogonal projection onto Z's column
  space (the pseudo-inverse), which is what the formula is for a full-rank Z.
- Xi = (1/M) sum_l xi_l with xi_l uniform on {+-1}^d has covariance I/M, so E||P_Z(Xi)||^2 = tr(P_Z)/M = rank(Z)/M
  and E||P_D1(Xi)||^2 / E||P_D2(Xi)||^2 = (v1 + 1)/(v2 + 1).
- ``match_heads``: learned heads against a closed form, up to the symmetries of the model: permutation of the
  heads and, by positive homogeneity of ReLU, a_i ReLU(z) = (a_i c) ReLU(z / c) for c > 0, so a head is compared by
  the sign of a_i and the direction of |a_i| diag V^(i).
"""

from __future__ import annotations

import torch

from icl_probes.sparse_parity.model import Heads


def projector(Z: torch.Tensor, tol: float = 1e-9) -> torch.Tensor:
    """The orthogonal projection onto the column space of Z (d, c), (d, d): U U^T over Z's left singular vectors
    with singular value above tol times the largest."""
    u, s, _ = torch.linalg.svd(Z, full_matrices=False)
    u = u[:, s > tol * s.max()]
    return u @ u.T


def d_matrix(heads: Heads) -> torch.Tensor:
    """D_j = [diag V^(1), ..., diag V^(m)] of g_j*'s neurons, (d, m)."""
    return heads.diag().T


def sample_xi(M: int, d: int, samples: int, gen: torch.Generator) -> torch.Tensor:
    """Xi = (1/M) sum_{l<=M} xi_l, xi_l uniform on {+-1}^d, drawn exactly: each coordinate is (2 Bin(M, 1/2) - M)/M.
    (samples, d) float64."""
    return (2 * _binomial(M, samples, d, gen) - M) / M


def _binomial(M: int, samples: int, d: int, gen: torch.Generator) -> torch.Tensor:
    """Bin(M, 1/2) counts (samples, d) from ``gen``: inverse-CDF of uniforms on the exact pmf (M <= 10^5)."""
    k = torch.arange(M + 1, dtype=torch.float64)
    logpmf = (
        torch.lgamma(torch.tensor(M + 1.0, dtype=torch.float64))
        - torch.lgamma(k + 1)
        - torch.lgamma(M - k + 1)
        - M * torch.log(torch.tensor(2.0, dtype=torch.float64))
    )
    cdf = torch.cumsum(torch.exp(logpmf), 0)
    cdf[-1] = 1.0
    u = torch.rand(samples, d, generator=gen, dtype=torch.float64)
    return torch.searchsorted(cdf, u).clamp_max(M).to(torch.float64)


def projection_energy(P: torch.Tensor, xi: torch.Tensor) -> tuple[float, float]:
    """Mean and standard error of ||P xi||^2 over the rows of xi (samples, d)."""
    e = ((xi @ P) ** 2).sum(dim=1)
    return float(e.mean()), float(e.std() / len(e) ** 0.5)


def effective(a: torch.Tensor, V: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(sign a_i (m,), |a_i| diag V^(i) (m, d)): a head up to positive rescaling."""
    return torch.sign(a), a.abs()[:, None] * torch.diagonal(V, dim1=1, dim2=2)


def match_heads(a: torch.Tensor, V: torch.Tensor, target: Heads, min_share: float = 0.01) -> dict:
    """Each closed-form head of ``target`` against the learned heads (a (m,), V (m, d, d) in the hidden basis).

    A learned head counts if its |a_i| ||V^(i)||_F is at least min_share of the largest. For each target head l:
    the best cosine between its diag V^(l) and |a_i| diag V^(i) over learned heads with the same sign of a
    (cos = -1 when there is none), and the ratio of their norms. Returns per-target rows, the mean best cosine,
    whether the best matches are distinct heads (a permutation), and the learned heads' off-diagonal share
    ||V - diag V||_F / ||V||_F (mean over the heads that count)."""
    sign, eff = effective(a, V)
    size = a.abs() * V.flatten(1).norm(dim=1)
    live = size >= min_share * size.max()
    rows, best_idx = [], []
    for j in range(len(target.a)):
        want = target.diag()[j]
        ok = live & (sign == torch.sign(target.a[j]))
        if not bool(ok.any()):
            rows.append(dict(index=target.index[j] if target.index else j + 1, cos=-1.0, norm_ratio=None, head=None))
            best_idx.append(None)
            continue
        cos = (eff @ want) / (eff.norm(dim=1).clamp_min(1e-30) * want.norm())
        cos = torch.where(ok, cos, torch.full_like(cos, -2.0))
        i = int(cos.argmax())
        rows.append(
            dict(
                index=target.index[j] if target.index else j + 1,
                cos=float(cos[i]),
                norm_ratio=float(eff[i].norm() / want.norm()),
                head=i,
            )
        )
        best_idx.append(i)
    off = (V - torch.diag_embed(torch.diagonal(V, dim1=1, dim2=2))).flatten(1).norm(dim=1)
    off = off / V.flatten(1).norm(dim=1).clamp_min(1e-30)
    return dict(
        rows=rows,
        mean_cos=sum(r["cos"] for r in rows) / len(rows),
        distinct=None not in best_idx and len(set(best_idx)) == len(best_idx),
        live=int(live.sum()),
        offdiag_share=float(off[live].mean()),
    )


def subset_check(small: Heads, large: Heads, tol: float = 1e-12) -> list[dict]:
    """For each neuron of g1* (small): is it a neuron of g2* (large) exactly (same a and V), or up to positive
    rescaling (same sign of a, same direction of |a| diag V)? Rows in g2*'s numbering, with the scale factor."""
    out = []
    s_sign, s_eff = effective(small.a, small.V)
    l_sign, l_eff = effective(large.a, large.V)
    for j in range(len(small.a)):
        exact = [
            int(large.index[i])
            for i in range(len(large.a))
            if abs(float(large.a[i] - small.a[j])) <= tol and float((large.V[i] - small.V[j]).abs().max()) <= tol
        ]
        cos = (l_eff @ s_eff[j]) / (l_eff.norm(dim=1) * s_eff[j].norm())
        same = [i for i in range(len(large.a)) if l_sign[i] == s_sign[j] and float(cos[i]) >= 1 - tol]
        out.append(
            dict(
                index=int(small.index[j]),
                exact=exact,
                rescaled=[int(large.index[i]) for i in same],
                scale=[float(s_eff[j].norm() / l_eff[i].norm()) for i in same],
            )
        )
    return out
