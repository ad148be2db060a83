"""Fourier metrics for the learned embeddings (Ch. 4, Figs. 4.1-4.3).

For a real vector u of length p (an odd prime), the DFT is u_hat[j] = sum_a u(a) exp(-2 pi i j a / p).
We use the one-sided spectrum: frequency j = 1..(p-1)/2 gets |u_hat[j]|^2 + |u_hat[p-j]|^2, so a pure
cosine cos(2 pi j a / p + phi) puts all its power on j (a two-sided spectrum would give it only 0.5).
The constant frequency j = 0 is left out of both numerator and denominator.
"""

from __future__ import annotations

import torch


def one_sided_power(u: torch.Tensor) -> torch.Tensor:
    """Power per non-constant frequency. u: (..., p) real. Returns (..., (p-1)//2) for j = 1..(p-1)//2."""
    p = u.shape[-1]
    if p < 3:
        raise ValueError(f"vectors of length {p}: need length >= 3 to have a non-constant frequency")
    spec = torch.fft.fft(u.double(), dim=-1).abs().square()
    half = (p - 1) // 2
    j = torch.arange(1, half + 1)
    return spec[..., j] + spec[..., p - j]


def max_normalised_power(u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Maximum normalised power and its frequency per vector.

    u: (..., p). Returns (power (...,) in [1/((p-1)/2), 1], freq (...,) long in 1..(p-1)/2).
    """
    power = one_sided_power(u)
    best, idx = power.max(dim=-1)
    return (best / power.sum(dim=-1).clamp_min(1e-30)).float(), idx + 1


def neuron_power(emb: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-neuron maximum normalised power of its k input embeddings taken together.

    emb: (k, m, p), emb[j, i] = u_{i,j}. The k spectra of neuron i are summed before the max and the
    normalisation, so the power is 1 exactly when all k embeddings are pure cosines of one shared
    frequency (the form of the max-margin solution, Thm. 4.2). Returns (power (m,), freq (m,)).
    """
    if emb.dim() != 3:
        raise ValueError(f"embeddings of shape {tuple(emb.shape)}: expected (k, m, p)")
    power = one_sided_power(emb).sum(dim=0)
    best, idx = power.max(dim=-1)
    return (best / power.sum(dim=-1).clamp_min(1e-30)).float(), idx + 1


def frequency_histogram(freq: torch.Tensor, p: int) -> list[int]:
    """Number of neurons whose argmax frequency is j, for j = 1..(p-1)/2 (index 0 is j = 1)."""
    return torch.bincount(freq.long() - 1, minlength=(p - 1) // 2).tolist()


def dft2(w: torch.Tensor) -> torch.Tensor:
    """|2-D DFT|^2 of a (p, p) matrix, with the constant (0, 0) term zeroed; shape (p, p)."""
    spec = torch.fft.fft2(w.double()).abs().square()
    spec[0, 0] = 0.0
    return spec


def dft2_sparsity(w: torch.Tensor, top: int = 4) -> tuple[float, tuple[int, int]]:
    """Share of the non-constant 2-D power in the ``top`` largest coefficients, and the dominant one.

    A 2-D cosine cos(2 pi (j1 a + j2 b)/p + phi) has 2 non-zero coefficients, a product of cosines
    cos(2 pi j1 a/p) cos(2 pi j2 b/p) has 4, so top=4 scores both as 1. The dominant frequency pair is
    folded to 0 <= j <= (p-1)/2 per axis.
    """
    spec = dft2(w)
    p = w.shape[-1]
    flat = spec.flatten()
    share = float(flat.topk(min(top, flat.numel())).values.sum() / flat.sum().clamp_min(1e-30))
    i = int(flat.argmax())
    j1, j2 = divmod(i, spec.shape[1])
    return share, (min(j1, p - j1), min(j2, spec.shape[1] - j2))


def dft2_interaction_share(w: torch.Tensor, top: int = 4) -> float:
    """Top-``top`` share of the 2-D power with j1 != 0 and j2 != 0 (the part of W^{KQ} that depends on both
    tokens). W[a, b] = f(a) + g(b) has no such part; cos(2 pi j (a - b)/p) scores 1. w: (p, p)."""
    spec = dft2(w)
    spec[0, :] = 0.0
    spec[:, 0] = 0.0
    flat = spec.flatten()
    return float(flat.topk(min(top, flat.numel())).values.sum() / flat.sum().clamp_min(1e-30))
