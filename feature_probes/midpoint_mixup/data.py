"""Data for the Midpoint Mixup probe (Chidambaram, Wang, Wu, Ge, ICML 2023).

- ``make_multiview``: the multi-view patch data of Definition 4.1, with single-view test points (Def. 4.5).
- ``load_digits_split`` and ``pair_classes``/``concat_views``: Table 1's protocol on scikit-learn's digits.

Representation of Def. 4.1. All 2k features are orthonormal and every patch is a combination of them,
so a patch is stored by its coordinates in the feature basis: x has shape (N, P, 2k) and feature
v_{y,l} (l = 1, 2) is coordinate ``2y + l - 1``. This is exact, not an approximation: a weight's
component orthogonal to the features never meets the data, so gradient descent never moves it and the
network's outputs never depend on it; the ambient dimension d only enters through the initialisation
variance 1/d (``model.MultiViewNet``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class MultiViewSpec:
    """Parameters of Def. 4.1 (the paper's symbols).

    k: classes; P: patches per point; C_P: patches per feature; Q: noise classes per point;
    delta1, delta2: beta ~ Uni([delta1, delta2 - delta1]) and each feature pair sums to delta2;
    delta3, delta4: every noise patch has gamma_{j,l} ~ Uni([delta3, delta4]) on the 2Q features of the
    point's Q noise classes (drawn afresh per patch; the Q classes are fixed per point).
    """

    k: int = 10
    P: int = 30
    C_P: int = 2
    Q: int = 2
    delta1: float = 0.1
    delta2: float = 1.0
    delta3: float = 0.02
    delta4: float = 0.04

    def check(self) -> None:
        if self.k < 2:
            raise ValueError(f"k={self.k}: need at least 2 classes")
        if self.C_P < 1 or 2 * self.C_P > self.P:
            raise ValueError(f"C_P={self.C_P}, P={self.P}: need 1 <= C_P and 2*C_P <= P (two disjoint patch sets)")
        if not 1 <= self.Q <= self.k - 1:
            raise ValueError(f"Q={self.Q}: must lie in [1, k-1] = [1, {self.k - 1}]")
        if not 0 <= self.delta1 < self.delta2 / 2:
            raise ValueError(f"delta1={self.delta1}, delta2={self.delta2}: need 0 <= delta1 < delta2/2")
        if not 0 <= self.delta3 <= self.delta4:
            raise ValueError(f"delta3={self.delta3}, delta4={self.delta4}: need 0 <= delta3 <= delta4")


@dataclass
class MultiView:
    """Points of Def. 4.1. x: (N, P, 2k); y: (N,); patches1/patches2: (N, C_P) indices of P_{y,1}, P_{y,2}
    with pi(patches1[:, j]) = patches2[:, j]; beta: (N, C_P); noise_classes: (N, Q)."""

    x: torch.Tensor
    y: torch.Tensor
    patches1: torch.Tensor
    patches2: torch.Tensor
    beta: torch.Tensor
    noise_classes: torch.Tensor


def feature_index(y, ell: int):
    """Coordinate of v_{y,ell} (ell in {1, 2}) in the feature basis."""
    return 2 * y + ell - 1


def make_multiview(spec: MultiViewSpec, n: int, gen: torch.Generator) -> MultiView:
    """Draw n points of Def. 4.1 (see ``MultiViewSpec`` for the choices the paper leaves open).

    P_{y,1}, P_{y,2} are two disjoint uniformly random C_P-subsets of [P] per point; pi pairs them in
    the order drawn. Every other patch is noise on the point's Q noise classes.
    """
    spec.check()
    k, P, C, Q = spec.k, spec.P, spec.C_P, spec.Q
    y = torch.randint(k, (n,), generator=gen)
    order = torch.rand(n, P, generator=gen).argsort(dim=1)
    p1, p2 = order[:, :C], order[:, C : 2 * C]
    beta = spec.delta1 + (spec.delta2 - 2 * spec.delta1) * torch.rand(n, C, generator=gen)
    keys = torch.rand(n, k, generator=gen)
    keys[torch.arange(n), y] = 2.0  # never pick the own class
    noise_classes = keys.argsort(dim=1)[:, :Q]
    x = torch.zeros(n, P, 2 * k)
    gam = spec.delta3 + (spec.delta4 - spec.delta3) * torch.rand(n, P, Q, 2, generator=gen)
    rows = torch.arange(n)[:, None, None, None].expand(n, P, Q, 2)
    pats = torch.arange(P)[None, :, None, None].expand(n, P, Q, 2)
    cols = (2 * noise_classes[:, None, :, None] + torch.arange(2)[None, None, None, :]).expand(n, P, Q, 2)
    x[rows, pats, cols] = gam
    r = torch.arange(n)[:, None]
    x[r, p1] = 0.0
    x[r, p2] = 0.0
    x[r, p1, feature_index(y, 1)[:, None]] = beta
    x[r, p2, feature_index(y, 2)[:, None]] = spec.delta2 - beta
    return MultiView(x, y, p1, p2, beta, noise_classes)


def single_view(data: MultiView, keep: int) -> torch.Tensor:
    """Def. 4.5's test input: x with every patch holding v_{y, 3-keep} set to zero. Returns (N, P, 2k)."""
    if keep not in (1, 2):
        raise ValueError(f"keep={keep}: the feature to keep is 1 or 2")
    x = data.x.clone()
    drop = data.patches2 if keep == 1 else data.patches1
    x[torch.arange(len(x))[:, None], drop] = 0.0
    return x


# ---- Table 1's protocol on a real image data set (scikit-learn's 8x8 digits) ----


def load_digits_split(n_test: int, seed: int):
    """scikit-learn's digits (1797 8x8 images, 10 classes, shipped with the package, no download),
    scaled to [0, 1] and split at random. Returns (x_train (N,1,8,8), y_train, x_test, y_test)."""
    try:
        from sklearn.datasets import load_digits
    except ImportError as err:  # pragma: no cover - scikit-learn is a declared dependency
        raise RuntimeError("the images experiment needs scikit-learn (pip install scikit-learn)") from err
    digits = load_digits()
    x = torch.tensor(digits.images, dtype=torch.float32)[:, None] / 16.0
    y = torch.tensor(digits.target, dtype=torch.long)
    if not 0 < n_test < len(x):
        raise ValueError(f"n_test={n_test}: must lie in [1, {len(x) - 1}]")
    perm = torch.randperm(len(x), generator=torch.Generator().manual_seed(seed))
    te, tr = perm[:n_test], perm[n_test:]
    return x[tr], y[tr], x[te], y[te]


def pair_classes(k: int, gen: torch.Generator) -> torch.Tensor:
    """A random perfect matching of the k classes (k even), paired both ways as in the authors' code:
    partner[partner[c]] = c and partner[c] != c. Returns (k,) long."""
    if k % 2:
        raise ValueError(f"k={k}: pairing classes both ways needs an even number of classes")
    perm = torch.randperm(k, generator=gen)
    partner = torch.empty(k, dtype=torch.long)
    partner[perm[0::2]] = perm[1::2]
    partner[perm[1::2]] = perm[0::2]
    return partner


def fixed_extras(y: torch.Tensor, partner: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """For every training point, the index of one random training image of its partner class, drawn
    once per run. Returns (N,) long indices into the training set."""
    extra = torch.empty(len(y), dtype=torch.long)
    for c in range(len(partner)):
        mine = (y == c).nonzero().squeeze(1)
        pool = (y == partner[c]).nonzero().squeeze(1)
        extra[mine] = pool[torch.randint(len(pool), (len(mine),), generator=gen)]
    return extra


def concat_views(x: torch.Tensor, x_extra: torch.Tensor | None, gamma: torch.Tensor | None) -> torch.Tensor:
    """Channel-wise [gamma * x, (1 - gamma) * x_extra]; with x_extra None, the test input [x, 0].

    x, x_extra: (B, C, H, W); gamma: (B,) in [0, 1]. Returns (B, 2C, H, W).
    """
    if x_extra is None:
        return torch.cat([x, torch.zeros_like(x)], dim=1)
    g = gamma.view(-1, 1, 1, 1)
    return torch.cat([g * x, (1 - g) * x_extra], dim=1)
