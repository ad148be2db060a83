"""Experiment A: Fig. 8.1, the constructed looped transformer against the Thm 8.16 bound.

Paper: Z. Shi (2024), Ch. 8, Fig. 8.1 with Lemma 8.13 / Thm 8.14 (construction) and Thm 8.16 (bound).
Setup: d = 4, n in {16, 32, 64, 128}, T = 200 loops, eta = 1/L with L = ||X^T X||, 10 trials per n.
Each trial runs the looped transformer with the constructed Q and P, reads theta^(t) = TF(Z^(t))/alpha
after every loop and compares log(||theta^(t) - theta*||^2 / ||theta^(0) - theta*||^2) (natural log)
with the bound -t/kappa. Trial i uses the seed ``seed + i`` for every n.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

import torch

from gemfilter.toolkit.loop import Unit, compute, missing
from icl_probes.common import pyplot, resolve_device
from icl_probes.io import append_jsonl, read_jsonl, save_png, write_json, write_text
from icl_probes.looped.model import (
    construction,
    gram_spectrum,
    looped_forward,
    query_error,
    relative_sq_error,
    sample_tasks,
)
from icl_probes.looped.outdir import prepare_out

PAPER_KAPPA = {16: 4.57, 32: 3.13, 64: 2.07, 128: 1.62}  # Ch. 8, Fig. 8.1 legend (mean over 10 trials)


@dataclass(frozen=True)
class Fig81Config:
    """d: feature dimension; ns: context lengths; T: loops; trials: runs per n (paper: 10);
    kappa_trials: extra draws of X per n for the kappa statistics only (the heavy tail needs more than 10);
    seed: trial i uses seed + i; float64: compute in float64 (needed to see the curves down to ~-70)."""

    d: int = 4
    ns: tuple = (16, 32, 64, 128)
    T: int = 200
    trials: int = 10
    kappa_trials: int = 1000
    seed: int = 0
    float64: bool = True
    device: str = "cpu"

    def __post_init__(self):
        if self.d < 1 or self.T < 1 or self.trials < 1:
            raise ValueError(f"d, T and trials must be >= 1, got d={self.d}, T={self.T}, trials={self.trials}")
        if self.kappa_trials < self.trials:
            raise ValueError(
                f"kappa_trials ({self.kappa_trials}) must be >= trials ({self.trials}); "
                "the first `trials` draws are the plotted trials"
            )
        bad = [n for n in self.ns if n < self.d]
        if not self.ns or bad:
            raise ValueError(f"every n must be >= d={self.d} (X^T X must be invertible for kappa); got ns={self.ns}")


def floor_log(dtype) -> float:
    """ln of the smallest relative squared error the dtype resolves: (100 eps)^2. Below it lies rounding noise."""
    return 2 * math.log(100 * torch.finfo(dtype).eps)


def run_trial(cfg: Fig81Config, n: int, trial: int) -> dict:
    """One trial: the constructed looped transformer for T loops on one task; returns a JSON row."""
    dtype = torch.float64 if cfg.float64 else torch.float32
    device = resolve_device(cfg.device)
    gen = torch.Generator().manual_seed(cfg.seed + trial)
    task = sample_tasks(1, n, cfg.d, gen, dtype=dtype, device=device)
    L, kappa = gram_spectrum(task.X)
    Q, P = construction(cfg.d, dtype=dtype, device=device)
    eta = (1 / L)[:, None].expand(-1, cfg.T)  # eta = 1/L in every loop (Thm 8.16)
    outs = looped_forward(task.input(), Q, P, eta, cfg.T, all_loops=True)  # (1, T+1, d)
    log_ratio = torch.log(relative_sq_error(outs, task.theta, task.alpha))[0]
    err = query_error(outs, task.theta, task.alpha)[0]
    # A plain GD loop next to it, so every row records how exactly the transformer followed GD.
    thetas = [torch.zeros_like(task.theta[0])]
    X, y = task.X[0], task.y[0]
    for _ in range(cfg.T):
        thetas.append(thetas[-1] - (X.T @ (X @ thetas[-1] - y)) / L[0])
    gd_dev = (outs[0] - task.alpha[0] * torch.stack(thetas)).abs().max().item()
    k, a, ts = kappa.item(), task.alpha.item(), torch.arange(cfg.T + 1, dtype=dtype, device=device)
    resolved = log_ratio > floor_log(dtype)
    # Empirical minus bound must be <= 0; t = 0 is equality by definition, so it is left out.
    slack = (log_ratio + ts / k)[1:][resolved[1:]]
    err_slack = (err - abs(a) * torch.exp(-ts / (2 * k)))[1:][(err > 100 * torch.finfo(dtype).eps)[1:]]
    return {
        "n": n,
        "trial": trial,
        "seed": cfg.seed + trial,
        "kappa": k,
        "L": L.item(),
        "alpha": a,
        "log_ratio": log_ratio.tolist(),
        "query_error": err.tolist(),
        "max_dev_from_gd": gd_dev,
        "max_slack_theta_bound": slack.max().item() if slack.numel() else None,
        "max_slack_error_bound": err_slack.max().item() if err_slack.numel() else None,
        "t_floor": int((~resolved).nonzero()[0].item()) if (~resolved).any() else None,
    }


def kappa_stats(cfg: Fig81Config, n: int) -> dict:
    """kappa of X^T X over kappa_trials draws (the same seeds as the trials, so the first ones coincide)."""
    ks = [
        gram_spectrum(sample_tasks(1, n, cfg.d, torch.Generator().manual_seed(cfg.seed + i), dtype=torch.float64).X)[
            1
        ].item()
        for i in range(cfg.kappa_trials)
    ]
    return {
        "n": n,
        "kind": "kappa",
        "count": len(ks),
        "mean": statistics.fmean(ks),
        "median": statistics.median(ks),
        "p90": sorted(ks)[int(0.9 * (len(ks) - 1))],
        "max": max(ks),
    }


def run_fig81(cfg: Fig81Config, out, png=None, progress: bool = True) -> dict:
    """Run (or resume) Experiment A into ``out``: rows.jsonl, results.json, table.md and the plot (``png``)."""
    out = prepare_out(out, cfg, "fig81")
    rows_path = out / "rows.jsonl"
    done = {(r["n"], r.get("trial"), r.get("kind", "trial")) for r in read_jsonl(rows_path)}
    units = [Unit(rows_path.name, (n, i, "trial")) for n in cfg.ns for i in range(cfg.trials)]
    units += [Unit(rows_path.name, (n, None, "kappa")) for n in cfg.ns]  # after every trial, as before
    compute(
        missing(units, {rows_path.name: done}),
        lambda u: run_trial(cfg, u.key[0], u.key[1]) if u.key[2] == "trial" else kappa_stats(cfg, u.key[0]),
        lambda u, row: append_jsonl(rows_path, row),
        desc="fig 8.1 trials",
        noun="unit",
        progress=progress,
    )
    results = summarise(cfg, read_jsonl(rows_path))
    write_json(out / "results.json", results)
    write_text(out / "table.md", markdown_table(results))
    plot(cfg, results, png or out / "fig81.png")
    return results


def summarise(cfg: Fig81Config, rows: list) -> dict:
    """Per n: kappa (trials and kappa_trials), GD agreement, bound checks and the mean curve."""
    per_n = {}
    for n in cfg.ns:
        trials = sorted(
            (r for r in rows if r["n"] == n and r.get("kind", "trial") == "trial"), key=lambda r: r["trial"]
        )
        ks = [r["kappa"] for r in trials]
        kap = next(r for r in rows if r["n"] == n and r.get("kind") == "kappa")
        slacks = [r["max_slack_theta_bound"] for r in trials if r["max_slack_theta_bound"] is not None]
        err_slacks = [r["max_slack_error_bound"] for r in trials if r["max_slack_error_bound"] is not None]
        curves = torch.tensor([r["log_ratio"] for r in trials], dtype=torch.float64)
        per_n[str(n)] = {
            "kappa_mean": statistics.fmean(ks),
            "kappa_median": statistics.median(ks),
            "paper_kappa": PAPER_KAPPA.get(n),
            f"kappa_mean_{kap['count']}": kap["mean"],
            f"kappa_median_{kap['count']}": kap["median"],
            "kappas": ks,
            "max_dev_from_gd": max(r["max_dev_from_gd"] for r in trials),
            "trials_below_theta_bound": sum(s <= 0 for s in slacks),
            "max_slack_theta_bound": max(slacks),
            "trials_below_error_bound": sum(s <= 0 for s in err_slacks),
            "trials": len(trials),
            "t_floor_median": statistics.median(
                [r["t_floor"] if r["t_floor"] is not None else cfg.T + 1 for r in trials]
            ),
            "mean_log_ratio": curves.mean(0).tolist(),
            "curves": curves.tolist(),
        }
    return {
        "config": {k: getattr(cfg, k) for k in cfg.__dataclass_fields__},
        "floor_log": floor_log(torch.float64 if cfg.float64 else torch.float32),
        "kappa_trials": cfg.kappa_trials,
        "per_n": per_n,
    }


def markdown_table(results: dict) -> str:
    """The kappa table (ours next to the paper's) and the bound checks."""
    K = results["kappa_trials"]
    lines = [
        f"| n | mean kappa ({results['config']['trials']} trials) | paper | median kappa | mean kappa ({K} draws) | "
        f"median kappa ({K} draws) | below bound (trials) | max slack vs bound | max abs(TF - alpha theta_GD) | "
        "median t at floor |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for n, r in results["per_n"].items():
        paper = f"{r['paper_kappa']:.2f}" if r["paper_kappa"] is not None else "-"
        t_floor = r["t_floor_median"]
        lines.append(
            f"| {n} | {r['kappa_mean']:.2f} | {paper} | {r['kappa_median']:.2f} | {r[f'kappa_mean_{K}']:.2f} | "
            f"{r[f'kappa_median_{K}']:.2f} | {r['trials_below_theta_bound']}/{r['trials']} | "
            f"{r['max_slack_theta_bound']:.1f} | {r['max_dev_from_gd']:.1e} | "
            f"{t_floor if t_floor <= results['config']['T'] else 'not reached'} |"
        )
    lines.append("")
    lines.append(
        "slack = max over t of [log(||theta^(t)-theta*||^2/||theta*||^2) + t/kappa] per trial (its own kappa), "
        f"over the t where the error is above the floating-point floor (ln {results['floor_log']:.1f}); "
        "negative means the curve lies below the Thm 8.16 bound."
    )
    return "\n".join(lines) + "\n"


def plot(cfg: Fig81Config, results: dict, path) -> None:
    """Fig. 8.1: mean empirical log ratio (solid, thin lines per trial) and -t/kappa_mean (dashed), y clipped at the
    floor."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    floor = results["floor_log"]
    ts = torch.arange(cfg.T + 1, dtype=torch.float64)
    for color, (n, r) in zip(plt.rcParams["axes.prop_cycle"].by_key()["color"], results["per_n"].items()):
        curves = torch.tensor(r["curves"])
        # Below the floor the values are rounding noise, not GD progress: each trial's line ends there,
        # and the mean is taken over values clamped up to the floor (which only raises it), until all are there.
        for c in curves:
            hit = (c <= floor).nonzero()
            end = hit[0].item() if hit.numel() else cfg.T + 1
            ax.plot(ts[:end], c[:end], color=color, lw=0.5, alpha=0.3)
        mean = curves.clamp(min=floor).mean(0)
        hit = (mean <= floor + 1e-9).nonzero()
        end = hit[0].item() + 1 if hit.numel() else cfg.T + 1
        ax.plot(ts[:end], mean[:end], color=color, lw=2, label=f"n={n}, empirical (mean of {r['trials']})")
        ax.plot(
            ts,
            -ts / r["kappa_mean"],
            color=color,
            lw=1.5,
            ls="--",
            label=f"n={n}, bound -t/kappa, kappa={r['kappa_mean']:.2f}",
        )
    ax.set_ylim(floor - 5, 2)
    ax.set_xlim(0, cfg.T)
    ax.set_xlabel("loop t")
    ax.set_ylabel(r"$\ln(\|\theta^{(t)}-\theta^*\|^2 / \|\theta^{(0)}-\theta^*\|^2)$")
    ax.set_title(f"Looped transformer = GD (Fig. 8.1), d={cfg.d}, eta=1/L")
    ax.legend(fontsize=7, ncol=2)
    save_png(fig, path)
