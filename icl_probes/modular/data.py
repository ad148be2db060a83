"""The modular-addition data set with k inputs (Ch. 4, Sec. 4.2; appendix C.10).

Every a = (a_1, ..., a_k) in Z_p^k is one example; its label is (a_1 + ... + a_k) mod p.
The whole set of p^k examples is shuffled with a seeded generator and split into train and test.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

MAX_EXAMPLES = 20_000_000  # p^k above this would not fit a (p^k, k) int64 tensor comfortably


def is_prime(p: int) -> bool:
    if p < 2:
        return False
    return all(p % d for d in range(2, int(p**0.5) + 1))


def check_kp(k: int, p: int) -> None:
    """Raise ValueError unless k >= 2 and p is an odd prime with p^k small enough to enumerate."""
    if not isinstance(k, int) or k < 2:
        raise ValueError(f"k={k!r}: the number of inputs must be an integer >= 2")
    if not isinstance(p, int) or p < 3 or not is_prime(p):
        raise ValueError(f"p={p!r}: the modulus must be an odd prime (3, 5, 7, 11, ...)")
    if p**k > MAX_EXAMPLES:
        raise ValueError(f"p^k = {p}^{k} = {p**k} examples; at most {MAX_EXAMPLES} are allowed")


def all_inputs(k: int, p: int) -> torch.Tensor:
    """All of Z_p^k in lexicographic order (the order of ``itertools.product(range(p), repeat=k)``).

    Returns a long tensor of shape (p^k, k); row n holds the base-p digits of n, most significant first.
    """
    check_kp(k, p)
    n = torch.arange(p**k)
    powers = torch.tensor([p ** (k - 1 - j) for j in range(k)])
    return (n[:, None] // powers[None, :]) % p


def labels(a: torch.Tensor, p: int) -> torch.Tensor:
    """(a_1 + ... + a_k) mod p for a of shape (N, k); returns shape (N,)."""
    return a.sum(dim=1) % p


@dataclass(frozen=True)
class Split:
    """Train and test examples: x_* long (N, k), y_* long (N,)."""

    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor

    def to(self, device) -> "Split":
        return Split(*(t.to(device) for t in (self.x_train, self.y_train, self.x_test, self.y_test)))


def make_split(k: int, p: int, train_frac: float = 0.5, seed: int = 0) -> Split:
    """Shuffle all p^k examples with ``seed`` and put the first round(train_frac * p^k) in train.

    The paper splits evenly (train_frac = 0.5). Both parts must be non-empty.
    """
    if not 0.0 < train_frac < 1.0:
        raise ValueError(f"train_frac={train_frac!r}: must lie strictly between 0 and 1")
    x = all_inputs(k, p)
    y = labels(x, p)
    n_train = round(train_frac * len(x))
    if n_train < 1 or n_train >= len(x):
        raise ValueError(f"train_frac={train_frac} leaves an empty train or test set for p^k={len(x)}")
    perm = torch.randperm(len(x), generator=torch.Generator().manual_seed(seed))
    tr, te = perm[:n_train], perm[n_train:]
    return Split(x[tr], y[tr], x[te], y[te])
