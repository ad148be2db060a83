"""Presets and the seeded run function of the interval labelling (Z. Shi 2024, App. A.7, Table A.2, Figs. A.3-A.4).

The parity experiment's network, learning process and baselines (``feature_probes.parity``: ``TwoLayerNet``,
Thm A.20's three stages, NTK, RF, One Step, Two Step, all in ``parity.experiments.fit_methods``) run on the
interval law of ``interval.data``. ``run_interval`` does one (law, seed); ``run_table`` appends one JSONL row per
finished unit, so an interrupted table resumes.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from feature_probes.common import run_resumable
from feature_probes.interval.data import IntervalSpec, make_split
from feature_probes.parity.data import make_problem
from feature_probes.parity.experiments import ParityRun, fit_methods, hyper
from feature_probes.parity.model import TwoLayerNet
from icl_probes.common import seed_everything


@dataclass(frozen=True)
class IntervalRun(ParityRun):
    """Table A.2's settings: ParityRun's fields (see its docstring; the same learning process, baselines and
    choices) with the interval law and m = 100, T = 200. n_train = 50000 and the 10000 test points are as in
    the parity run ("otherwise as Sec. 2.3"). gamma and sigma~ of the hyper-parameters come from the structured
    law, also for the law without structure, as in the parity run."""

    spec: IntervalSpec = field(default_factory=IntervalSpec)
    m: int = 100
    steps: int = 200
    eval_every: int = 10


PRESETS = {
    "cpu": IntervalRun(
        note="Table A.2's sizes (d=500, D=100, k=30, t1=20, t2=30, Pr=2/3 on A, m=100, T=200), "
        "50000 train points (25000 per class), 10000 test points, one seed"
    ),
    "paper": IntervalRun(seeds=(0, 1, 2, 3, 4), note="as cpu with 5 seeds"),
    "natural": IntervalRun(
        spec=IntervalSpec(balanced=False),
        seeds=(0, 1, 2, 3, 4),
        note="as paper, but train and test points drawn from the product law as is "
        "(P(y=+1) = 0.585 with structure, 0.049 without) instead of 25000 per class",
    ),
    "tiny": IntervalRun(
        spec=IntervalSpec(d=40, D=12, k=6, t1=4, t2=6),
        m=20,
        n_train=600,
        n_test=300,
        steps=12,
        batch=200,
        eval_every=6,
        note="smoke test size",
    ),
}


def draw(cfg: IntervalRun, spec: IntervalSpec, h: dict, seed: int) -> tuple:
    """What seed draws, in the parity run's order: the problem (M, A), the training split, the test split, the
    initial network, and the generator after them. Returns (problem, (x, y), (xt, yt), net, gen)."""
    gen = seed_everything(seed)
    problem = make_problem(spec, gen)
    x, y, _ = make_split(spec, problem, cfg.n_train, gen)
    xt, yt, _ = make_split(spec, problem, cfg.n_test, gen)
    net = TwoLayerNet(spec.d, cfg.m, h["sigma_w"], h["sigma_b"], h["sigma_a"], gen)
    return problem, (x, y), (xt, yt), net, gen


def law_facts(spec: IntervalSpec) -> dict:
    """The exact numbers of the sampled law: P(y = +1) of the product law, gamma, sigma~, the best constant
    classifier and the best threshold on s."""
    return dict(
        positive_share=spec.positive_share(),
        gamma=spec.gamma(),
        sigma_tilde=spec.centre_and_scale()[1],
        majority=spec.majority_share(),
        linear_ceiling=spec.linear_ceiling(),
    )


def run_interval(cfg: IntervalRun, structured: bool, seed: int, progress: bool = False) -> dict:
    """The network (Thm A.20's process, both third stages) and the baselines on one law and seed; a JSON-ready dict.

    Seed use: the problem (M, A), the data, the initial network and the minibatch order all follow `seed`."""
    cfg.check()
    spec = replace(cfg.spec, structured=structured)
    h = hyper(cfg)
    problem, train, test, net, gen = draw(cfg, spec, h, seed)
    label = f"interval {'structured' if structured else 'no structure'} seed {seed}"
    fit = fit_methods(cfg, h, problem.star(), train, test, net, gen, seed, progress, label, pos_share=True)
    test_pos = float((test[1] > 0).float().mean())
    return dict(
        structured=structured,
        seed=seed,
        A=problem.A.tolist(),
        hyper=h,
        law=law_facts(spec),
        test_pos_share=test_pos,
        **fit,
    )


def run_table(cfg: IntervalRun, jsonl_path=None, progress: bool = True, force: bool = False) -> list[dict]:
    """run_interval for every (law, seed) of cfg; rows already in jsonl_path with the same settings are reused and
    each newly finished unit is appended."""
    cfg.check()
    units = [(structured, seed) for structured in cfg.laws for seed in cfg.seeds]
    return run_resumable(
        cfg,
        jsonl_path,
        ("seeds", "laws", "note"),
        units,
        lambda r: (r["structured"], r["seed"]),
        lambda structured, seed: run_interval(cfg, structured, seed, progress),
        force=force,
    )
