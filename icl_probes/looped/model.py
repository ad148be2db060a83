"""The linear looped transformer of Ch. 8 (Z. Shi, 2024): linear attention, the loop, the construction, tasks.

Paper: Ch. 8, Def. of the masked linear attention and the looped transformer, Lemma 8.13 and Thm 8.14
(the explicit Q and P that make every loop one gradient-descent step), Thm 8.16 (the error bound).

Shapes (a batch of B tasks): X (B, n, d), theta* (B, d), y (B, n), alpha (B,), Z (B, n+1, d+1),
Q and P (d+1, d+1), eta a scalar, a (T,) schedule or a (B, T) per-task schedule.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


def attention_mask(n: int, dtype=torch.float32, device=None) -> torch.Tensor:
    """The mask M of Ch. 8, shape (n+1, n+1): zero except the last row, which is 1 on the first n columns.

    Only the query row (the last) is written to, and it reads only the n examples (not itself), so
    the examples X, y stay fixed through all loops and the output depends on them linearly.
    """
    if n < 1:
        raise ValueError(f"n must be a positive number of in-context examples, got {n}")
    mask = torch.zeros(n + 1, n + 1, dtype=dtype, device=device)
    mask[n, :n] = 1
    return mask


def linear_attention(Z: torch.Tensor, Q: torch.Tensor, P: torch.Tensor) -> torch.Tensor:
    """Masked linear attention Attn(Z; Q, P) = (M o (Z Q Z^T)) Z P (Ch. 8).

    Z: (B, n+1, d+1) or (n+1, d+1); Q, P: (d+1, d+1). Returns the same shape as Z. The full
    (n+1) x (n+1) score matrix is formed on purpose: this is the definition the tests check, not a
    shortcut that could hide a wrong mask.
    """
    mask = attention_mask(Z.shape[-2] - 1, dtype=Z.dtype, device=Z.device)
    scores = Z @ Q @ Z.transpose(-1, -2)
    return (mask * scores) @ Z @ P


def build_input(X: torch.Tensor, y: torch.Tensor, alpha: torch.Tensor) -> torch.Tensor:
    """Z^(0) = [[X, y], [q^(0)^T, alpha]] with q^(0) = 0.

    X: (B, n, d); y: (B, n); alpha: (B,). Returns Z^(0): (B, n+1, d+1).
    """
    B, n, d = X.shape
    top = torch.cat([X, y.unsqueeze(-1)], dim=-1)
    last = torch.zeros(B, 1, d + 1, dtype=X.dtype, device=X.device)
    last[:, 0, d] = alpha
    return torch.cat([top, last], dim=1)


def readout(Z: torch.Tensor) -> torch.Tensor:
    """TF = -(last row of Z, first d entries): (B, n+1, d+1) -> (B, d)."""
    return -Z[..., -1, :-1]


def _schedule(eta, T: int, batch: int, like: torch.Tensor) -> torch.Tensor:
    """A scalar, a (T,) schedule or a (B, T) per-task schedule, as a (B, T) tensor."""
    eta = torch.as_tensor(eta, dtype=like.dtype, device=like.device)
    if eta.dim() == 0:
        return eta.expand(batch, T)
    if eta.dim() == 1 and eta.shape[0] == T:
        return eta.unsqueeze(0).expand(batch, T)
    if eta.dim() == 2 and eta.shape == (batch, T):
        return eta
    raise ValueError(
        f"eta must be a scalar, a (T,)=({T},) schedule or a (B, T)=({batch}, {T}) tensor; got shape {tuple(eta.shape)}"
    )


def looped_forward(Z0: torch.Tensor, Q: torch.Tensor, P: torch.Tensor, eta, T: int, all_loops: bool = False):
    """Run Z^(t) = Z^(t-1) - eta^(t-1) Attn(Z^(t-1); Q, P) for t = 1..T (Ch. 8) and read out.

    Z0: (B, n+1, d+1); eta: scalar, (T,) or (B, T). Returns TF(Z^(T)) of shape (B, d), or with
    all_loops=True the readouts after every loop, shape (B, T+1, d) (index 0 is Z^(0), i.e. zeros).
    """
    if T < 0:
        raise ValueError(f"T (the number of loops) must be >= 0, got {T}")
    etas = _schedule(eta, T, Z0.shape[0], Z0)
    Z = Z0
    outs = [readout(Z)]
    for t in range(T):
        Z = Z - etas[:, t, None, None] * linear_attention(Z, Q, P)
        if all_loops:
            outs.append(readout(Z))
    return torch.stack(outs, dim=1) if all_loops else readout(Z)


def looped_forward_fast(Z0: torch.Tensor, Q: torch.Tensor, P: torch.Tensor, eta, T: int) -> torch.Tensor:
    """The same loop as ``looped_forward(..., all_loops=True)``, in O(d^2) per loop instead of O(n^2 d).

    Why it is the same: M keeps only the last row r = [q, alpha] of Attn, and that row reads only the
    n example rows Z_x = [X, y], which never change. So one loop is r <- r - eta r Q (Z_x^T Z_x) P, and
    A = Q Z_x^T Z_x P is formed once. Used for training; the tests check it against the definition.
    Z0: (B, n+1, d+1); eta: scalar, (T,) or (B, T). Returns readouts after every loop, (B, T+1, d).
    """
    if T < 0:
        raise ValueError(f"T (the number of loops) must be >= 0, got {T}")
    etas = _schedule(eta, T, Z0.shape[0], Z0)
    Zx = Z0[:, :-1, :]
    A = Q @ (Zx.transpose(-1, -2) @ Zx) @ P  # (B, d+1, d+1)
    r = Z0[:, -1:, :]
    outs = [-r[:, 0, :-1]]
    for t in range(T):
        r = r - etas[:, t, None, None] * (r @ A)
        outs.append(-r[:, 0, :-1])
    return torch.stack(outs, dim=1)


def construction(d: int, dtype=torch.float64, device=None) -> tuple:
    """The explicit weights of Lemma 8.13 / Thm 8.14: Q = I_{d+1}, P = [[I_d, 0], [0, 0]].

    With them a loop adds -eta (q^T X^T X + alpha y^T X) to the query row, so theta^(t) = -q^(t)/alpha
    follows gradient descent on 1/2 ||y - X theta||^2 and TF(Z^(T)) = alpha theta^(T).
    """
    if d < 1:
        raise ValueError(f"d must be >= 1, got {d}")
    Q = torch.eye(d + 1, dtype=dtype, device=device)
    P = torch.zeros(d + 1, d + 1, dtype=dtype, device=device)
    P[:d, :d] = torch.eye(d, dtype=dtype, device=device)
    return Q, P


@dataclass
class Tasks:
    """A batch of in-context regression tasks: X (B, n, d), theta (B, d), y (B, n), alpha (B,)."""

    X: torch.Tensor
    theta: torch.Tensor
    y: torch.Tensor
    alpha: torch.Tensor

    def input(self) -> torch.Tensor:
        return build_input(self.X, self.y, self.alpha)


def sample_tasks(
    batch: int, n: int, d: int, generator: torch.Generator, alpha_range=(0.5, 2.0), dtype=torch.float32, device="cpu"
) -> Tasks:
    """Sample the Ch. 8 task: X_ij ~ N(0,1), theta* uniform on the unit sphere, y = X theta*.

    alpha ~ +-U[alpha_range] with a random sign (any alpha != 0 is a valid query; the looped model is
    linear in the query row, so its magnitude only rescales the error). Sampling happens on the CPU
    generator, then moves to ``device``, so a seed gives the same tasks on every device.
    """
    if batch < 1 or n < 1 or d < 1:
        raise ValueError(f"batch, n and d must be >= 1, got batch={batch}, n={n}, d={d}")
    lo, hi = alpha_range
    if not 0 < lo <= hi:
        raise ValueError(f"alpha_range must satisfy 0 < low <= high, got {alpha_range}")
    X = torch.randn(batch, n, d, generator=generator, dtype=torch.float64)
    theta = torch.randn(batch, d, generator=generator, dtype=torch.float64)
    theta = theta / theta.norm(dim=-1, keepdim=True)  # a normalised Gaussian is uniform on the sphere
    sign = torch.randint(0, 2, (batch,), generator=generator).to(torch.float64) * 2 - 1
    alpha = sign * (lo + (hi - lo) * torch.rand(batch, generator=generator, dtype=torch.float64))
    y = (X @ theta.unsqueeze(-1)).squeeze(-1)
    to = dict(dtype=dtype, device=device)
    return Tasks(X.to(**to), theta.to(**to), y.to(**to), alpha.to(**to))


def gram_spectrum(X: torch.Tensor) -> tuple:
    """L = lambda_max(X^T X) and kappa = lambda_max / lambda_min for X (B, n, d); both (B,)."""
    ev = torch.linalg.eigvalsh(X.transpose(-1, -2) @ X)
    return ev[..., -1], ev[..., -1] / ev[..., 0]


def query_error(out: torch.Tensor, theta: torch.Tensor, alpha: torch.Tensor) -> torch.Tensor:
    """The Ch. 8 error |<q, theta*> - alpha| for outputs out (..., d), theta (B, d), alpha (B,)."""
    if out.dim() == 3:  # (B, T+1, d): every loop
        return ((out * theta[:, None, :]).sum(-1) - alpha[:, None]).abs()
    return ((out * theta).sum(-1) - alpha).abs()


def relative_sq_error(out: torch.Tensor, theta: torch.Tensor, alpha: torch.Tensor) -> torch.Tensor:
    """||out/alpha - theta*||^2 / ||theta*||^2 (= ||theta^(t) - theta*||^2 / ||theta^(0) - theta*||^2)."""
    if out.dim() == 3:
        return ((out / alpha[:, None, None] - theta[:, None, :]) ** 2).sum(-1) / (theta**2).sum(-1, keepdim=True)
    return ((out / alpha[:, None] - theta) ** 2).sum(-1) / (theta**2).sum(-1)
