"""Rank-r linear self-attention under label noise: closed forms and a Monte Carlo check.

Paper: Z. Shi, dissertation (2024), Ch. 5, Sec. 5.4 (Shi et al. 2024, "Why Larger Language Models
Do In-context Learning Differently?"). Pure torch, float64; nothing here imports transformers.

Model (Sec. 5.4). x ~ N(0, Lambda), Lambda = Q D Q^T, D = diag(lambda_1 >= ... >= lambda_d). A
prompt holds M examples (x_i, y_i) with y_i = <w, x_i> + eps_i, eps_i ~ N(0, sigma^2), and a query
x_q. The one-layer linear self-attention network predicts

    y_hat = x_q^T U h,   h = (1/M) sum_i x_i y_i,   U = W^{KQ}_11 (the product c * 1/c of Thm 5.4.1),

and the model size is r = rank(U). The loss is L = E[(y_hat - <w, x_q>)^2] against the CLEAN query
target, over x_1..x_M, eps and x_q for a fixed w (``expected_loss`` also averages over w ~ N(0, I)).

- Thm 5.4.1: the optimal rank-r U* = Q diag(v*) Q^T with v*_i = N / ((N+1) lambda_i + tr D) for
  i <= r and 0 otherwise, N = the pretraining prompt length.
- Thm 5.4.2: with w = Q(s + xi) (s on the top-r directions, xi on the rest), by the Gaussian
  fourth moment E[x x^T A x x^T] = 2 Lambda A Lambda + tr(A Lambda) Lambda,
      L = (1/M)||s||^2_{V^2 D^3} + (1/M)(||s + xi||^2_D + sigma^2) tr(V^2 D^2)
          + ||xi||^2_D + sum_{i<=r} s_i^2 lambda_i (lambda_i v_i - 1)^2.
- Thm 5.4.3: for w = Q s with s on the top-r directions and r' > r,
      L(r') - L(r) = (1/M)(||s||^2_D + sigma^2) sum_{i=r+1}^{r'} (N lambda_i / ((N+1) lambda_i + tr D))^2,
  so the slope in sigma^2 grows with the rank: larger models are more sensitive to label noise.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch

#: Eigenvalue profiles lambda_i, i = 1..d (one table; the config names one).
SPECTRA = {
    "inverse": lambda i: 1.0 / i,  # the prototype's choice in the spec
    "flat": lambda i: 1.0,
    "geometric": lambda i: 0.7 ** (i - 1),
}


@dataclass(frozen=True)
class TheoryConfig:
    """One theory run. d: input dimension; n_pretrain: N of Thm 5.4.1; m: evaluation prompt length
    M; ranks: model sizes r (1 <= r <= d); sigmas: label-noise standard deviations; samples: Monte
    Carlo prompts (shared by all (r, sigma): common random numbers); gap_s: the size of s = gap_s*e_1
    in the Thm 5.4.3 setting (w = Q s on the top-min(ranks) directions)."""

    d: int = 10
    n_pretrain: int = 1000
    m: int = 16
    ranks: tuple = (1, 2, 4, 6, 8, 10)
    sigmas: tuple = (0.0, 0.5, 1.0, 1.5, 2.0)
    spectrum: str = "inverse"
    samples: int = 100_000
    chunk: int = 20_000
    gap_s: float = 1.0
    seed: int = 0

    def validate(self) -> None:
        if self.spectrum not in SPECTRA:
            raise ValueError(f"unknown spectrum {self.spectrum!r}; allowed: {', '.join(SPECTRA)}")
        for name in ("d", "n_pretrain", "m", "samples", "chunk"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        bad = [r for r in self.ranks if not 1 <= r <= self.d]
        if bad or not self.ranks:
            raise ValueError(f"ranks must be integers in 1..d={self.d}, got {list(self.ranks)}")
        if any(s < 0 for s in self.sigmas) or not self.sigmas:
            raise ValueError(f"sigmas must be >= 0, got {list(self.sigmas)}")


def eigenvalues(d: int, spectrum: str = "inverse") -> torch.Tensor:
    """lambda_1 >= ... >= lambda_d, shape (d,), float64."""
    if spectrum not in SPECTRA:
        raise ValueError(f"unknown spectrum {spectrum!r}; allowed: {', '.join(SPECTRA)}")
    return torch.tensor([SPECTRA[spectrum](i) for i in range(1, d + 1)], dtype=torch.float64)


def random_orthogonal(d: int, gen: torch.Generator) -> torch.Tensor:
    """A Haar-random orthogonal Q, (d, d): QR of a Gaussian matrix with the sign fix of R's diagonal."""
    q, r = torch.linalg.qr(torch.randn(d, d, generator=gen, dtype=torch.float64))
    return q * torch.sign(torch.diagonal(r))


def optimal_v(lam: torch.Tensor, r: int, n_pretrain: int) -> torch.Tensor:
    """Thm 5.4.1: v*_i = N / ((N+1) lambda_i + tr D) for i <= r, else 0. lam: (d,) -> (d,)."""
    v = n_pretrain / ((n_pretrain + 1) * lam + lam.sum())
    v[r:] = 0.0
    return v


def closed_form_loss(lam, v, s, xi, sigma2: float, m: int) -> float:
    """Thm 5.4.2's L for w = Q(s + xi), written term by term as in the theorem.

    lam, v: (d,); s: (d,) zero outside the top-r coordinates; xi: (d,) zero on them (eigenbasis).
    """
    w = s + xi
    tr_v2d2 = (v**2 * lam**2).sum()
    variance = (s**2 * v**2 * lam**3).sum() / m + ((w**2 * lam).sum() + sigma2) * tr_v2d2 / m
    bias = (xi**2 * lam).sum() + (s**2 * lam * (lam * v - 1) ** 2).sum()
    return float(variance + bias)


def expected_loss(lam, v, sigma2: float, m: int) -> float:
    """E_w[L] for w ~ N(0, I): Thm 5.4.2 is linear in the squares w_i^2, whose mean is 1."""
    r = int((v != 0).sum())
    ones = torch.ones_like(lam)
    s, xi = ones.clone(), ones.clone()
    s[r:], xi[:r] = 0.0, 0.0
    return closed_form_loss(lam, v, s, xi, sigma2, m)


def sigma2_slope(lam, v, m: int) -> float:
    """dL/d(sigma^2) = (1/M) tr(V^2 D^2): the label-noise sensitivity of a rank-r model."""
    return float((v**2 * lam**2).sum() / m)


def gap_formula(lam, r: int, r2: int, s, sigma2: float, n_pretrain: int, m: int) -> float:
    """Thm 5.4.3: L(r2) - L(r) for w = Q s, s: (d,) supported on the top-r coordinates, r2 > r."""
    a = n_pretrain * lam / ((n_pretrain + 1) * lam + lam.sum())
    return float(((s**2 * lam).sum() + sigma2) * (a[r:r2] ** 2).sum() / m)


def sample_errors(q, lam, vs: dict, sigmas, m: int, n: int, gen, w=None) -> dict:
    """Squared errors of one batch of n prompts for every (r, sigma), common random numbers.

    q: (d, d) orthogonal; lam: (d,); vs: {r: (d,) v}; w: (d,) fixed task in the STANDARD basis, or
    None to draw w ~ N(0, I) per prompt. Returns {(r, sigma): (n,) squared errors}.
    """
    d = lam.shape[0]
    root = q * lam.sqrt()  # x = Q D^{1/2} z ~ N(0, Q D Q^T)
    x = torch.randn(n, m, d, generator=gen, dtype=torch.float64) @ root.T  # (n, M, d)
    xq = torch.randn(n, d, generator=gen, dtype=torch.float64) @ root.T  # (n, d)
    eps = torch.randn(n, m, generator=gen, dtype=torch.float64)  # (n, M), unit noise
    ws = torch.randn(n, d, generator=gen, dtype=torch.float64) if w is None else w.expand(n, d)
    clean = torch.einsum("nmd,nd->nm", x, ws)
    h_clean = torch.einsum("nmd,nm->nd", x, clean) / m  # h splits into a clean and a noise part,
    h_noise = torch.einsum("nmd,nm->nd", x, eps) / m  # so one draw serves every sigma
    target = (xq * ws).sum(-1)
    out = {}
    for r, v in vs.items():
        u = (q * v) @ q.T
        for sigma in sigmas:
            pred = torch.einsum("nd,de,ne->n", xq, u, h_clean + sigma * h_noise)
            out[(r, sigma)] = (pred - target) ** 2
    return out


def monte_carlo(q, lam, vs, sigmas, m, samples, chunk, gen, w=None, baseline=None) -> dict:
    """Mean and standard error of the squared error per (r, sigma), in chunks of ``chunk`` prompts.

    With ``baseline`` = r0, also the paired gap L(r) - L(r0) per (r, sigma) (same prompts, so its
    standard error is that of the per-prompt differences). Returns {key: (mean, se)} with keys
    ("loss", r, sigma) and ("gap", r, sigma).
    """
    sums = {}
    done = 0
    while done < samples:
        n = min(chunk, samples - done)
        errs = sample_errors(q, lam, vs, sigmas, m, n, gen, w)
        for (r, sigma), e in errs.items():
            items = [(("loss", r, sigma), e)]
            if baseline is not None:
                items.append((("gap", r, sigma), e - errs[(baseline, sigma)]))
            for key, val in items:
                a, b = sums.get(key, (0.0, 0.0))
                sums[key] = (a + float(val.sum()), b + float((val**2).sum()))
        done += n
    out = {}
    for key, (a, b) in sums.items():
        mean = a / samples
        var = max(b / samples - mean**2, 0.0) * samples / max(samples - 1, 1)
        out[key] = (mean, math.sqrt(var / samples))
    return out


def run(cfg: TheoryConfig) -> dict:
    """One seeded run: closed forms vs Monte Carlo for every (r, sigma), slopes and Thm 5.4.3 gaps.

    Returns a JSON-able dict with ``loss`` rows (w ~ N(0, I)), ``gap`` rows (w = Q gap_s e_1),
    ``slopes`` per r and the best rank per sigma.
    """
    cfg.validate()
    gen = torch.Generator().manual_seed(cfg.seed)
    lam = eigenvalues(cfg.d, cfg.spectrum)
    q = random_orthogonal(cfg.d, gen)
    ranks = sorted(set(cfg.ranks))
    vs = {r: optimal_v(lam, r, cfg.n_pretrain) for r in ranks}
    mc = monte_carlo(q, lam, vs, cfg.sigmas, cfg.m, cfg.samples, cfg.chunk, gen)
    loss_rows = []
    for r in ranks:
        for sigma in cfg.sigmas:
            cf = expected_loss(lam, vs[r], sigma**2, cfg.m)
            mean, se = mc[("loss", r, sigma)]
            loss_rows.append(dict(r=r, sigma=sigma, closed_form=cf, mc=mean, mc_se=se, z=(mean - cf) / se))
    slopes = []
    for r in ranks:
        pts = [(row["sigma"] ** 2, row["mc"]) for row in loss_rows if row["r"] == r]
        slopes.append(dict(r=r, closed_form=sigma2_slope(lam, vs[r], cfg.m), mc_fit=_fit_slope(pts)))
    best = {str(s): min(ranks, key=lambda r: expected_loss(lam, vs[r], s**2, cfg.m)) for s in cfg.sigmas}
    # Thm 5.4.3 setting: s on the smallest model's top directions, xi = 0.
    r0 = ranks[0]
    s = torch.zeros(cfg.d, dtype=torch.float64)
    s[:r0] = cfg.gap_s
    gap_mc = monte_carlo(q, lam, vs, cfg.sigmas, cfg.m, cfg.samples, cfg.chunk, gen, w=q @ s, baseline=r0)
    gap_rows = []
    for r in ranks[1:]:
        for sigma in cfg.sigmas:
            mean, se = gap_mc[("gap", r, sigma)]
            gap_rows.append(
                dict(
                    r=r,
                    r0=r0,
                    sigma=sigma,
                    thm_5_4_3=gap_formula(lam, r0, r, s, sigma**2, cfg.n_pretrain, cfg.m),
                    approx=(r - r0) * (float((s**2 * lam).sum()) + sigma**2) / cfg.m,
                    mc=mean,
                    mc_se=se,
                )
            )
    return dict(
        config=asdict(cfg), eigenvalues=lam.tolist(), loss=loss_rows, slopes=slopes, best_rank=best, gap=gap_rows
    )


def _fit_slope(points) -> float:
    """Least-squares slope of y on x for [(x, y), ...] (nan for fewer than 2 distinct x)."""
    xs = torch.tensor([p[0] for p in points], dtype=torch.float64)
    ys = torch.tensor([p[1] for p in points], dtype=torch.float64)
    xc = xs - xs.mean()
    den = float((xc**2).sum())
    return float((xc * (ys - ys.mean())).sum() / den) if den > 0 else float("nan")


def markdown(result: dict) -> str:
    """Tables: closed form vs Monte Carlo, slopes per r, Thm 5.4.3 gaps."""
    lines = ["| r | sigma | closed form | Monte Carlo | MC s.e. | z |", "|---|---|---|---|---|---|"]
    for row in result["loss"]:
        lines.append(
            f"| {row['r']} | {row['sigma']:g} | {row['closed_form']:.4f} | {row['mc']:.4f} | "
            f"{row['mc_se']:.4f} | {row['z']:+.2f} |"
        )
    lines += ["", "| r | slope dL/dsigma^2 (closed form) | slope (MC fit) |", "|---|---|---|"]
    lines += [f"| {s['r']} | {s['closed_form']:.4f} | {s['mc_fit']:.4f} |" for s in result["slopes"]]
    lines += [
        "",
        "Best rank per sigma (closed form): " + ", ".join(f"sigma={k}: r={v}" for k, v in result["best_rank"].items()),
    ]
    if result["gap"]:
        lines += [
            "",
            "| r' | r | sigma | Thm 5.4.3 | (r'-r)(‖s‖²_D+σ²)/M | Monte Carlo (paired) | MC s.e. |",
            "|---|---|---|---|---|---|---|",
        ]
        lines += [
            f"| {g['r']} | {g['r0']} | {g['sigma']:g} | {g['thm_5_4_3']:.4f} | {g['approx']:.4f} | "
            f"{g['mc']:.4f} | {g['mc_se']:.4f} |"
            for g in result["gap"]
        ]
    return "\n".join(lines) + "\n"


def plot(result: dict, path) -> None:
    """Two panels: E_w[L] vs sigma^2 per r (lines: Thm 5.4.2, markers: MC +- 2 s.e.) and the
    Thm 5.4.3 gap L(r) - L(r0) vs sigma^2 (lines: theorem, markers: paired MC)."""
    from ..common import pyplot
    from ..io import save_png

    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    ranks = sorted({row["r"] for row in result["loss"]})
    colors = plt.cm.viridis([i / max(len(ranks) - 1, 1) for i in range(len(ranks))])
    for color, r in zip(colors, ranks):
        rows = [row for row in result["loss"] if row["r"] == r]
        x = [row["sigma"] ** 2 for row in rows]
        axes[0].plot(x, [row["closed_form"] for row in rows], color=color, label=f"r={r}")
        axes[0].errorbar(
            x, [row["mc"] for row in rows], yerr=[2 * row["mc_se"] for row in rows], fmt="o", color=color, ms=4
        )
        grows = [g for g in result["gap"] if g["r"] == r]
        if grows:
            xg = [g["sigma"] ** 2 for g in grows]
            axes[1].plot(xg, [g["thm_5_4_3"] for g in grows], color=color, label=f"r'={r}")
            axes[1].errorbar(
                xg, [g["mc"] for g in grows], yerr=[2 * g["mc_se"] for g in grows], fmt="o", color=color, ms=4
            )
    cfg = result["config"]
    axes[0].set(
        xlabel="label noise σ²",
        ylabel="evaluation loss E_w[L]",
        title=(
            f"Thm 5.4.2, w~N(0,I): lines closed form, dots MC±2se\n(d={cfg['d']}, N={cfg['n_pretrain']}, M={cfg['m']})"
        ),
    )
    r0 = result["gap"][0]["r0"] if result["gap"] else ranks[0]
    axes[1].set(
        xlabel="label noise σ²",
        ylabel=f"L(r') - L({r0})",
        title=f"Thm 5.4.3, w=Q s, s on top-{r0}: larger r, steeper in σ²",
    )
    for ax in axes:
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
    save_png(fig, path)
