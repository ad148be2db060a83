"""Two-layer multi-head reduced linear self-attention and Thm 5.5.1's closed-form optimum (Z. Shi 2024, Sec. 5.5).

One head is a neuron f(X, y, x_q) = (y^T X / N) W x_q; the m-head model is

    g(X, y, x_q) = sum_{i in [m]} a_i ReLU((y^T X / N) W^(i) x_q),   a in [-1, 1]^m, W^(i) in R^{d x d}.

With W = G V G^T and x = G phi, (y^T X / N) W x_q = h^T V phi_q with h = (1/N) sum_l y_l phi_l, whose limit for
N -> infinity on task (i, j) is E[y phi] = 2 gamma (e_i + e_j) (E[phi_i phi_j phi_i] = E[phi_j] = 2 gamma).

Thm 5.5.1 (k = 2^v1, d = 2^v2), with V^(i) diagonal and 1-based feature index s:
- i in [v2]: a_i = -1, V^(i)_ss = (2 digit(bin(s - 1), i) - 1) / (4 gamma) (digit i counted from the right);
- i = v2 + 1: a_i = +1, V^(i) = -v_j / (4 gamma) I for g_j* (j = 1, 2);
- i in {v2 + 2, ..., 2 v2 + 2}: a_i = a_{i - v2 - 1}, V^(i) = -V^(i - v2 - 1).
g2* has these 2(v2 + 1) neurons; g1* has neurons {1..v1, v2 + 1, v2 + 2..v2 + v1 + 1, 2 v2 + 2} (with v1 in
neuron v2 + 1 and its negation).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import torch

from icl_probes.sparse_parity.data import PAIR_VALUES, pair_probs


def digit(z: int, i: int) -> int:
    """digit(z, i): the i-th binary digit of z counted from the right, 1-based (digit(0b01000, 4) = 1)."""
    return (z >> (i - 1)) & 1


@dataclass
class Heads:
    """m neurons in the hidden basis: a (m,), V (m, d, d) with W^(i) = G V^(i) G^T; index: each neuron's number
    in g2*'s numbering (1-based) for a closed form, else None."""

    a: torch.Tensor
    V: torch.Tensor
    index: tuple | None = None

    def diag(self) -> torch.Tensor:
        """diag V^(i) per neuron, (m, d)."""
        return torch.diagonal(self.V, dim1=1, dim2=2)

    def weights(self, G: torch.Tensor) -> torch.Tensor:
        """W^(i) = G V^(i) G^T, (m, d, d)."""
        return G @ self.V @ G.T


def closed_form(v: int, v2: int, gamma: float) -> Heads:
    """Thm 5.5.1's optimum g_j* in dimension d = 2^v2 for v = v_j (v = v2 gives g2*, v < v2 gives g1* with
    k = 2^v): 2(v + 1) neurons, numbered as in g2*. float64."""
    if not 1 <= v <= v2:
        raise ValueError(f"v={v}, v2={v2}: need 1 <= v <= v2")
    d = 2**v2
    a, diags = {}, {}
    for i in range(1, v2 + 1):
        a[i] = -1.0
        diags[i] = torch.tensor([(2 * digit(s - 1, i) - 1) / (4 * gamma) for s in range(1, d + 1)], dtype=torch.float64)
    a[v2 + 1] = 1.0
    diags[v2 + 1] = torch.full((d,), -v / (4 * gamma), dtype=torch.float64)
    for i in range(v2 + 2, 2 * v2 + 3):
        a[i], diags[i] = a[i - v2 - 1], -diags[i - v2 - 1]
    keep = list(range(1, v + 1)) + [v2 + 1] + list(range(v2 + 2, v2 + v + 2)) + [2 * v2 + 2]
    return Heads(
        torch.tensor([a[i] for i in keep], dtype=torch.float64),
        torch.diag_embed(torch.stack([diags[i] for i in keep])),
        tuple(keep),
    )


def forward(a: torch.Tensor, W: torch.Tensor, X: torch.Tensor, y: torch.Tensor, x_q: torch.Tensor) -> torch.Tensor:
    """g(X, y, x_q) = sum_i a_i ReLU((y^T X / N) W^(i) x_q). a (m,), W (m, d, d), X (B, N, d), y (B, N),
    x_q (B, d) -> (B,)."""
    s = torch.einsum("bn,bnd->bd", y, X) / X.shape[1]
    return torch.relu(torch.einsum("bd,mde,be->bm", s, W, x_q)) @ a


def limit_forward(
    a: torch.Tensor, W: torch.Tensor, G: torch.Tensor, pairs: torch.Tensor, x_q: torch.Tensor, gamma: float
) -> torch.Tensor:
    """g for N -> infinity: y^T X / N -> E[y x] = G E[y phi] = 2 gamma (G_i + G_j) for the task (i, j).
    pairs (B, 2), x_q (B, d) -> (B,)."""
    s = 2 * gamma * (G[:, pairs[:, 0]] + G[:, pairs[:, 1]]).T
    return torch.relu(torch.einsum("bd,mde,be->bm", s, W, x_q)) @ a


def signal_term(heads: Heads, pairs: torch.Tensor, phi_q: torch.Tensor, gamma: float) -> torch.Tensor:
    """Thm 5.5.2's signal part sum_i a_i ReLU(diag(V^(i))^T (2 gamma phi_hat_q)), phi_hat_q = phi_q on the task's
    coordinates i, j and 0 elsewhere. pairs (B, 2), phi_q (B, d) -> (B,)."""
    hat = torch.zeros_like(phi_q)
    hat.scatter_(1, pairs, torch.gather(phi_q, 1, pairs))
    return torch.relu(2 * gamma * hat @ heads.diag().T) @ heads.a


def hinge(z: torch.Tensor) -> torch.Tensor:
    """l(z) = max(0, 1 - z), elementwise."""
    return (1 - z).clamp_min(0)


def exact_limit_loss(a: torch.Tensor, V: torch.Tensor, pairs: torch.Tensor, gamma: float, chunk: int = 1 << 20) -> dict:
    """The N -> infinity population hinge loss and accuracy of the heads (a (m,), V (m, d, d) in the hidden basis)
    on the tasks `pairs` (uniform), by enumerating the query: (phi_i, phi_j) over its four values with their
    probabilities, and the other d - 2 coordinates over {+-1}^(d-2), each with probability 2^-(d-2).

    In the limit the head's input is 2 gamma (V[i, :] + V[j, :]) phi_q. Returns {loss, acc, margin}: acc counts
    y_q g > 0; margin is the least y_q g over every query of every task (all have positive probability), so
    heads with margin mu > 0 reach zero loss once V is scaled by 1/mu."""
    d = V.shape[-1]
    rest = torch.tensor(list(itertools.product((1.0, -1.0), repeat=d - 2)), dtype=V.dtype).reshape(-1, d - 2)
    probs = torch.tensor(pair_probs(gamma), dtype=V.dtype)
    values = torch.tensor(PAIR_VALUES, dtype=V.dtype)
    loss = acc = 0.0
    margin = float("inf")
    for i, j in pairs.tolist():
        others = [s for s in range(d) if s not in (i, j)]
        c = 2 * gamma * (V[:, i, :] + V[:, j, :])  # (m, d)
        base = rest @ c[:, others].T  # (2^(d-2), m)
        for (pi, pj), p in zip(values, probs):
            g = torch.relu(base + pi * c[:, i] + pj * c[:, j]) @ a
            yq = pi * pj
            loss += float(p * hinge(yq * g).mean())
            acc += float(p * (yq * g > 0).to(V.dtype).mean())
            margin = min(margin, float((yq * g).min()))
    return dict(loss=loss / len(pairs), acc=acc / len(pairs), margin=margin)
