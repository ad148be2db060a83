"""Measured causes of two Table A.1 gaps (Z. Shi 2024, App. A.7.1): the One Step cosine and the NTK's test accuracy.

- ``step1_cosines``: Cos Similarity (max_i cos(w_i, sum_{j in A} M_j)) after step 1 (One Step's frozen layer)
  and step 2 (Two Step's), under the spec's step 1 and under changes that could lower it towards the paper's
  0.848: a step-1 gradient from fewer points, a step that keeps part of the initialisation, Lemma A.17's rule.
- ``ntk_spread``: the NTK ridge fit at several training-set sizes, scored on a large test set and on its
  disjoint subsets of the paper's unknown test size, to see how far test accuracy strays above train
  accuracy by sampling alone (the paper reports 84.0 train, 86.4 test).

Both are seeded and structured-law only; rows are JSON-ready dicts.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from feature_probes.parity.experiments import ParityRun, accuracy, cos_to_star, draw, hyper, ntk_ridge_fit
from feature_probes.parity.model import gd_step, hinge, ntk_predict


@dataclass(frozen=True)
class Step1Variant:
    """One way to take steps 1 and 2. n: points in both full-batch steps (0 = all of n_train, the spec);
    keep: the share of w^(0) that step 1 keeps (0 = Thm A.20's lambda_w = 1/(2 eta), which wipes it; 1/2 =
    the same lambda applied as PyTorch's weight_decay, w <- w - eta (grad + lambda w)); rule: the step-1 size
    and smoothing, "thm_a20" or "lemma_a17"; float32_sum: compute step 1 as w - eta (grad + 2 lambda w) in
    float32, as a direct implementation would. With 2 eta lambda = 1 the two w terms cancel only up to
    rounding, about 1e-7 |w| per entry, while eta grad is about 1e-10 |w|; ``model.gd_step`` applies the factor
    (1 - 2 eta lambda) = 0 exactly instead."""

    name: str
    n: int = 0
    keep: float = 0.0
    rule: str = "thm_a20"
    float32_sum: bool = False


STEP1_VARIANTS = (
    Step1Variant("spec: full batch (all n_train points), Thm A.20"),
    *(Step1Variant(f"steps 1-2 on {n} points", n=n) for n in (10000, 1000, 500, 200, 100)),
    Step1Variant("step 1 keeps w^(0)/2 (weight_decay form)", keep=0.5),
    Step1Variant("step 1 as Lemma A.17", rule="lemma_a17"),
    Step1Variant("step 1 as w - eta (grad + 2 lambda w) in float32", float32_sum=True),
)


def _cos_stats(w: torch.Tensor, star: torch.Tensor) -> dict:
    cos = (w @ star / (w.norm(dim=1).clamp_min(1e-30) * star.norm())).abs()
    return dict(
        cos=cos_to_star(w, star), mean_abs_cos=float(cos.mean()), share_above_0_9=float((cos > 0.9).float().mean())
    )


def step1_cosines(cfg: ParityRun, seed: int, variants=STEP1_VARIANTS) -> list[dict]:
    """One row per variant for one seed on the structured law: the cosines at init, after step 1 and step 2.

    Each variant starts from the same problem, data and initial network (those of ``run_parity`` for seed);
    variants asking for more points than cfg.n_train are left out."""
    spec = replace(cfg.spec, structured=True)
    problem, (x, y), _, net, _ = draw(cfg, spec, hyper(cfg), seed)
    star = problem.star()
    start = {k: v.detach().clone() for k, v in net.state_dict().items()}
    rows = []
    for v in [v for v in variants if v.n <= cfg.n_train]:
        h = hyper(replace(cfg, step1=v.rule))
        n = v.n or cfg.n_train
        if n < 1 or not 0 <= v.keep < 1:
            raise ValueError(f"{v.name}: n={v.n} must be >= 0 (0: all points) and keep={v.keep} in [0, 1)")
        net.load_state_dict(start)
        if v.float32_sum:
            net.zero_grad()
            hinge(net(x[:n], h["smooth12"]), y[:n]).backward()
            with torch.no_grad():
                net.w.sub_(h["eta1"] * (net.w.grad + 2 * (1 - v.keep) * h["lam_w1"] * net.w))
                net.b.sub_(h["eta1"] * net.b.grad)
                net.a.sub_(h["eta1"] * net.a.grad)
        else:
            gd_step(net, x[:n], y[:n], h["eta1"], 0.0, (1 - v.keep) * h["lam_w1"], h["smooth12"])
        one = _cos_stats(net.w.detach(), star)
        gd_step(net, x[:n], y[:n], 1.0, 0.5, 0.5, h["smooth12"])
        rows.append(
            dict(
                variant=v.name,
                n=n,
                keep=v.keep,
                rule=v.rule,
                seed=seed,
                init=_cos_stats(start["w"], star),
                step1=one,
                step2=_cos_stats(net.w.detach(), star),
            )
        )
    return rows


def ntk_spread(cfg: ParityRun, seed: int, n_train: int, n_test: int, subset: int, paper_test: float = 0.864) -> dict:
    """The NTK ridge fit (``ntk_ridge_fit``) on a seed's draw of n_train points (as ``run_parity`` draws them,
    with these sizes), scored on n_test fresh points and on their n_test // subset disjoint subsets of `subset` points.

    Returns train and test accuracy, the penalty chosen, and the subsets' accuracies (min, 5th and 95th
    percentile, max) with the share at or above paper_test."""
    spec = replace(cfg.spec, structured=True)
    run = replace(cfg, n_train=n_train, n_test=n_test)
    _, (x, y), (xt, yt), init, _ = draw(run, spec, hyper(run), seed)
    feats, theta, lam, iters, _ = ntk_ridge_fit(run, init, x, y)
    right = ((ntk_predict(feats, theta, xt) > 0).float() * 2 - 1 == yt).float()
    parts = right[: n_test // subset * subset].view(-1, subset).mean(dim=1).sort().values
    q = lambda p: float(parts[min(len(parts) - 1, int(p * len(parts)))])  # noqa: E731
    return dict(
        seed=seed,
        n_train=n_train,
        n_test=n_test,
        lam=lam,
        cg_iters=iters,
        train_acc=accuracy(ntk_predict(feats, theta, x), y),
        test_acc=float(right.mean()),
        subset=subset,
        subsets=len(parts),
        subset_min=float(parts[0]),
        subset_p05=q(0.05),
        subset_p95=q(0.95),
        subset_max=float(parts[-1]),
        share_at_paper=float((parts >= paper_test - 1e-9).float().mean()),
    )


@dataclass(frozen=True)
class Step1Study:
    """``step1_cosines`` for each seed (the paper's Table A.1 averages 5)."""

    run: ParityRun = ParityRun()
    seeds: tuple[int, ...] = (0, 1, 2, 3, 4)
    variants: tuple[Step1Variant, ...] = STEP1_VARIANTS


@dataclass(frozen=True)
class NTKStudy:
    """``ntk_spread`` for each (seed, n_train). The paper's test-set size is not given; subset is the size
    whose sampling spread is shown (its train set: 50000)."""

    run: ParityRun = ParityRun()
    seeds: tuple[int, ...] = (0, 1, 2)
    n_trains: tuple[int, ...] = (12500, 25000, 50000, 100000)
    n_test: int = 100000
    subset: int = 1000

    def check(self) -> None:
        if not self.seeds or min(self.n_trains, default=0) < 10 or not 1 <= self.subset <= self.n_test:
            raise ValueError(
                f"seeds={self.seeds}, n_trains={self.n_trains}, subset={self.subset}, n_test={self.n_test}: "
                "need a seed, training sizes >= 10 and 1 <= subset <= n_test"
            )


def run_step1(study: Step1Study, jsonl_path=None, force: bool = False, progress: bool = True) -> list[dict]:
    """One JSONL row per seed, {seed, variants: [step1_cosines rows]}, resumable."""
    from feature_probes.common import run_resumable

    return run_resumable(
        study,
        jsonl_path,
        ("seeds",),
        [(s,) for s in study.seeds],
        lambda r: (r["seed"],),
        lambda seed: dict(seed=seed, variants=step1_cosines(study.run, seed, study.variants)),
        force=force,
        desc="step 1 cosines" if progress else None,
    )


def run_ntk(study: NTKStudy, jsonl_path=None, force: bool = False, progress: bool = True) -> list[dict]:
    """One JSONL row per (seed, n_train), resumable."""
    from feature_probes.common import run_resumable

    study.check()
    units = [(s, n) for s in study.seeds for n in study.n_trains]
    return run_resumable(
        study,
        jsonl_path,
        ("seeds", "n_trains"),
        units,
        lambda r: (r["seed"], r["n_train"]),
        lambda seed, n: ntk_spread(study.run, seed, n, study.n_test, study.subset),
        force=force,
        desc="NTK ridge fits" if progress else None,
    )


def _ms(values, scale=1.0, digits=3) -> str:
    from feature_probes.common import mean_std

    m, s = mean_std(v * scale for v in values)
    return f"{m:.{digits}f} ± {s:.{digits}f}" if len(values) > 1 else f"{m:.{digits}f}"


def step1_markdown(rows: list[dict]) -> str:
    """Mean ± std over seeds of each variant's cosines; the paper's One Step 0.848, Two Step 0.997."""
    lines = [
        "| steps 1-2 | One Step cos (after step 1) | Two Step cos (after step 2) | "
        "share of neurons with \\|cos\\| > 0.9 after step 1 |",
        "|---|---|---|---|",
    ]
    for i, first in enumerate(rows[0]["variants"]):
        vs = [r["variants"][i] for r in rows]
        lines.append(
            f"| {first['variant']} | {_ms([v['step1']['cos'] for v in vs])} | "
            f"{_ms([v['step2']['cos'] for v in vs])} | {_ms([v['step1']['share_above_0_9'] for v in vs], 100, 1)}% |"
        )
    lines.append(f"| init (RF) | {_ms([r['variants'][0]['init']['cos'] for r in rows])} | | |")
    return "\n".join(lines) + "\n"


def ntk_markdown(rows: list[dict]) -> str:
    """Mean ± std over seeds per n_train: train and test accuracy and the spread over test subsets."""
    lines = [
        "| n_train | train acc (%) | test acc (%) | subset accuracy, 5th–95th percentile (%) | "
        "subset max (%) | share of subsets ≥ 86.4% |",
        "|---|---|---|---|---|---|",
    ]
    for n in sorted({r["n_train"] for r in rows}):
        rs = [r for r in rows if r["n_train"] == n]
        lines.append(
            f"| {n} | {_ms([r['train_acc'] for r in rs], 100, 1)} | {_ms([r['test_acc'] for r in rs], 100, 1)} | "
            f"{_ms([r['subset_p05'] for r in rs], 100, 1)} – {_ms([r['subset_p95'] for r in rs], 100, 1)} | "
            f"{max(r['subset_max'] for r in rs) * 100:.1f} | {_ms([r['share_at_paper'] for r in rs], 100, 0)}% |"
        )
    return "\n".join(lines) + "\n"
