"""The one-hidden-layer network with k-th power activation (Ch. 4, Eq. 4.2).

f(theta, a) = sum_{i=1..m} (u_{i,1}(a_1) + ... + u_{i,k}(a_k))^k w_i, with u_{i,j}, w_i in R^p.
The inputs are one-hot, so u_{i,j}(a_j) is entry a_j of neuron i's j-th embedding; the output is the
p logits over Z_p. The paper's width is m = 2^{2k-2} (p - 1) (appendix C.10).
"""

from __future__ import annotations

import torch
from torch import nn


def paper_width(k: int, p: int) -> int:
    """m = 2^{2k-2} (p-1): 2944 for (k, p) = (4, 47), 1536 for (3, 97), 5632 for (5, 23)."""
    return 2 ** (2 * k - 2) * (p - 1)


class PowerMLP(nn.Module):
    """Eq. 4.2. Parameters: U (k, p, m) with U[j, a, i] = u_{i,j}(a); W (m, p) with W[i] = w_i.

    Both are i.i.d. N(0, init_std^2); the paper does not give its initialisation. The network is
    (k+1)-homogeneous in its parameters, so init_std sets how far from the lazy regime training starts.
    """

    def __init__(self, k: int, p: int, m: int, init_std: float = 0.1):
        super().__init__()
        if m < 1:
            raise ValueError(f"width m={m}: must be >= 1")
        self.k, self.p, self.m = k, p, m
        self.U = nn.Parameter(torch.randn(k, p, m) * init_std)
        self.W = nn.Parameter(torch.randn(m, p) * init_std)

    def forward(self, a: torch.Tensor) -> torch.Tensor:
        """a: long (B, k) in [0, p). Returns logits (B, p)."""
        # One-hot rows times the stacked embeddings give h[b, i] = sum_j u_{i,j}(a_j). A dense matmul is
        # about twice as fast on CPU as k gathers, whose backward is a scatter-add.
        onehot = torch.nn.functional.one_hot(a, self.p).to(self.U.dtype).reshape(len(a), self.k * self.p)
        h = onehot @ self.U.reshape(self.k * self.p, self.m)  # (B, m)
        return h.pow(self.k) @ self.W

    def embeddings(self) -> torch.Tensor:
        """The input embeddings as (k, m, p): [j, i] is u_{i,j} over a = 0..p-1."""
        return self.U.detach().permute(0, 2, 1).cpu().clone()  # a copy: on CPU .cpu() would alias the live weights
