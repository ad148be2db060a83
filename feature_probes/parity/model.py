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


class NTKFeatures:
    """The NTK feature map of a TwoLayerNet at its initialisation, phi(x) = grad_theta g(x; theta0), for ridge.

    Per neuron i: d g/d a_i = sigma(z_i), d g/d w_i = a_i sigma'(z_i) x, d g/d b_i = a_i sigma'(z_i), with
    z_i = <w_i, x> + b_i. Two exact reductions keep the ridge problem small:

    - the w-block is written in coordinates of the span of the training inputs (``basis``: (d, r),
      orthonormal): a ridge solution lies in the row space of the training features, so its w-part lies
      in that span and <dw_i, x> = <dw_i, P x> on any x;
    - neuron m+i copies neuron i with a_{m+i} = -a_i (the symmetric init), so its features are neuron i's
      (d/da) or their negation (d/dw, d/db). The ridge solution is then symmetric, and the pair acts as one
      neuron with features scaled by sqrt(2) under the same penalty.

    The penalty ||theta||^2 is the same in these coordinates, so the problem is exactly ridge on all
    2m(d + 2) parameters. Reduced parameters theta = (alpha (m,), v (m, r + 1)): a, and (w in the span, b).
    """

    def __init__(self, net: TwoLayerNet, x_train: torch.Tensor, tol: float = 1e-6):
        self.w0, self.b0, self.a0 = net.w.detach().clone(), net.b.detach().clone(), net.a.detach().clone()
        m = len(self.w0) // 2
        if not (
            torch.equal(self.w0[:m], self.w0[m:])
            and torch.equal(self.b0[:m], self.b0[m:])
            and torch.equal(self.a0[:m], -self.a0[m:])
        ):
            raise ValueError("NTKFeatures needs the symmetric initialisation (neuron m+i = neuron i with -a_i)")
        evals, evecs = torch.linalg.eigh((x_train.T @ x_train).double())
        self.basis = evecs[:, evals > tol * evals.max()].to(x_train.dtype)  # (d, r)

    def blocks(self, x: torch.Tensor) -> tuple:
        """(F, S, C) of the m reduced neurons: sqrt(2) sigma(z) (n, m), sqrt(2) a_i sigma'(z_i) (n, m),
        [P-coordinates of x, 1] (n, r + 1)."""
        m = len(self.w0) // 2
        z = x @ self.w0[:m].T + self.b0[:m]
        slope = ((z > 0) & (z < 1)).to(x.dtype) * self.a0[:m]
        coords = torch.cat([x @ self.basis, torch.ones(len(x), 1, dtype=x.dtype)], dim=1)
        return 2**0.5 * clip_relu(z), 2**0.5 * slope, coords

    def dense(self, x: torch.Tensor) -> torch.Tensor:
        """phi(x) in the original parameters, (n, 2m + 2m d + 2m): [d/da, d/dw (row-major), d/db]; for tests."""
        z = x @ self.w0.T + self.b0
        slope = ((z > 0) & (z < 1)).to(x.dtype) * self.a0
        dw = (slope[:, :, None] * x[:, None, :]).reshape(len(x), -1)
        return torch.cat([clip_relu(z), dw, slope], dim=1)


def _apply(blocks, alpha, v):
    f, s, c = blocks
    return f @ alpha + ((c @ v.T) * s).sum(dim=1)


def _apply_t(blocks, r):
    f, s, c = blocks
    return f.T @ r, (s * r[:, None]).T @ c


class RidgeSystem:
    """The normal equations of ridge regression on the NTK features of one training set, for any penalty.

    What does not depend on the penalty is computed once: the feature blocks of x, the right-hand side
    Phi^T y, and the Gram blocks of the block-Jacobi preconditioner (the a-block whole, one (r+1)^2 block
    per neuron). x: (n, d); y: (n,) in {-1, +1}.
    """

    def __init__(self, feats: NTKFeatures, x: torch.Tensor, y: torch.Tensor):
        self.blocks = feats.blocks(x)
        f, s, c = self.blocks
        self.rhs = _apply_t(self.blocks, y)
        self.gram_a = (f.T @ f).double()
        self.gram_v = torch.stack([((c * (s[:, i : i + 1] ** 2)).T @ c).double() for i in range(s.shape[1])])

    def _preconditioner(self, lam: float):
        """Block-Jacobi inverse of Phi^T Phi + lam I."""
        dtype = self.blocks[0].dtype
        inv_a = torch.linalg.inv(self.gram_a + lam * torch.eye(len(self.gram_a), dtype=torch.float64)).to(dtype)
        inv_v = torch.linalg.inv(self.gram_v + lam * torch.eye(self.gram_v.shape[-1], dtype=torch.float64)).to(dtype)
        return lambda ra, rv: (inv_a @ ra, torch.bmm(inv_v, rv[:, :, None])[:, :, 0])

    def solve(self, lam: float, iters: int = 300, tol: float = 1e-4, start=None) -> tuple:
        """argmin_theta ||phi(x) theta - y||^2 + lam ||theta||^2, by block-Jacobi preconditioned conjugate
        gradients, until the residual is tol times the right-hand side's.

        Returns ((alpha, v), CG iterations used); start: a warm start (alpha, v).
        """
        blocks, rhs = self.blocks, self.rhs
        m, r1 = blocks[0].shape[1], blocks[2].shape[1]
        dtype = blocks[0].dtype
        alpha, v = start if start is not None else (torch.zeros(m, dtype=dtype), torch.zeros(m, r1, dtype=dtype))
        precond = self._preconditioner(lam)

        def normal(a, b):  # (Phi^T Phi + lam I) theta
            ta, tb = _apply_t(blocks, _apply(blocks, a, b))
            return ta + lam * a, tb + lam * b

        def dot(p, q):
            return float((p[0] * q[0]).sum() + (p[1] * q[1]).sum())

        n0 = normal(alpha, v)
        res = (rhs[0] - n0[0], rhs[1] - n0[1])
        z = precond(*res)
        d = z
        rz, goal = dot(res, z), tol**2 * dot(rhs, rhs)
        for it in range(1, iters + 1):
            if dot(res, res) <= goal:
                return (alpha, v), it - 1
            q = normal(*d)
            step = rz / dot(d, q)
            alpha, v = alpha + step * d[0], v + step * d[1]
            res = (res[0] - step * q[0], res[1] - step * q[1])
            z = precond(*res)
            rz_new = dot(res, z)
            d = (z[0] + (rz_new / rz) * d[0], z[1] + (rz_new / rz) * d[1])
            rz = rz_new
        return (alpha, v), iters


def ntk_ridge(
    feats: NTKFeatures, x: torch.Tensor, y: torch.Tensor, lam: float, iters: int = 300, tol: float = 1e-4, start=None
) -> tuple:
    """One penalty's ridge solution on (x, y): ``RidgeSystem(feats, x, y).solve(lam, ...)``."""
    return RidgeSystem(feats, x, y).solve(lam, iters, tol, start)


def ntk_predict(feats: NTKFeatures, theta: tuple, x: torch.Tensor) -> torch.Tensor:
    """g_lin(x) = <theta, phi(x)> for a ridge solution theta = (alpha, v): (n,)."""
    return _apply(feats.blocks(x), *theta)
