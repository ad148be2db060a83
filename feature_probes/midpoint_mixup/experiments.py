"""Presets and seeded run functions of the Midpoint Mixup probe (Chidambaram et al., ICML 2023).

- ``run_synthetic``: Def. 4.1 data, the Eq. 4.1 network, full-batch GD under ERM, Midpoint and Uniform Mixup;
  per-class feature strengths Lambda_{y,l} and single-view accuracies (Def. 4.5) over training.
- ``run_images``: Table 1's protocol on scikit-learn's digits with a small CNN and Adam.
- ``run_units``: one JSONL row per finished (method, seed), reused when the settings match (resume).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace

import torch

from feature_probes.common import run_resumable
from feature_probes.midpoint_mixup.data import (
    MultiViewSpec,
    concat_views,
    fixed_extras,
    load_digits_split,
    make_multiview,
    pair_classes,
    single_view,
)
from feature_probes.midpoint_mixup.model import METHODS, MultiViewNet, SmallCNN, batch_mixup_loss, mixup_loss
from icl_probes.common import seed_everything


@dataclass(frozen=True)
class SyntheticRun:
    """Sec. 4 experiment. rho = 0 means the paper's rho = 1/k. learned_at: a feature v_{y,l} counts as
    learned when the per-class accuracy on single-view test points keeping only v_{y,l} is at least this
    (Def. 4.5 gives no threshold; ours). pairs: "all" ordered pairs (Eq. 3.1) or "different" classes only."""

    data: MultiViewSpec = field(default_factory=MultiViewSpec)
    n_train: int = 50
    n_test: int = 2000
    m: int = 10
    d: int = 2000
    alpha: float = 8.0
    rho: float = 0.0
    lr: float = 20.0
    steps: int = 400
    pairs: str = "all"
    learned_at: float = 0.9
    eval_every: int = 25
    methods: tuple[str, ...] = METHODS
    seeds: tuple[int, ...] = (0,)
    note: str = ""

    def check(self) -> None:
        self.data.check()
        if self.n_train < 2 or self.n_test < self.data.k:
            raise ValueError(f"n_train={self.n_train}, n_test={self.n_test}: need n_train >= 2 and n_test >= k")
        if self.steps < 1 or self.lr <= 0 or self.m < 1 or self.d < 1:
            raise ValueError("steps, lr, m and d must be positive")
        for method in self.methods:
            if method not in METHODS:
                raise ValueError(f"method {method!r}; allowed: {', '.join(METHODS)}")


@dataclass(frozen=True)
class ImagesRun:
    """Sec. 5 / Table 1 protocol on digits. Adam (0.9, 0.999), lr 1e-3, 100 epochs, batch 750 (the paper's);
    SmallCNN instead of ResNet-18; the split is fixed by split_seed, each run seed redraws the class
    pairing, the extra images, the init, gamma and the batches."""

    n_test: int = 497
    epochs: int = 100
    batch: int = 750
    lr: float = 1e-3
    width: int = 32
    split_seed: int = 0
    methods: tuple[str, ...] = METHODS
    seeds: tuple[int, ...] = (0, 1, 2, 3, 4)
    note: str = ""

    def check(self) -> None:
        if self.epochs < 1 or self.batch < 2 or self.lr <= 0 or self.width < 1:
            raise ValueError("epochs >= 1, batch >= 2, lr > 0 and width >= 1 are required")
        for method in self.methods:
            if method not in METHODS:
                raise ValueError(f"method {method!r}; allowed: {', '.join(METHODS)}")


SYNTHETIC_PRESETS = {
    "cpu": SyntheticRun(
        data=MultiViewSpec(k=10, P=16),
        n_train=40,
        m=5,
        d=500,
        lr=10.0,
        steps=600,
        eval_every=50,
        seeds=(0, 1, 2),
        note="k=10, P=16, C_P=2, Q=2, m=5, d=500, 40 train points, full-batch GD lr 10, 600 steps, 3 seeds",
    ),
    "cpu-d2000": SyntheticRun(
        steps=1000,
        eval_every=50,
        seeds=(0, 1),
        note="k=10, P=30, m=10, d=2000, 50 train points, lr 20, 1000 steps, 2 seeds (about 12 min)",
    ),
    "tiny": SyntheticRun(
        data=MultiViewSpec(k=4, P=8),
        n_train=12,
        n_test=200,
        m=3,
        d=200,
        steps=20,
        eval_every=10,
        note="smoke-test size",
    ),
}
#: The step-size sweep: the cpu preset's problem on seed 0, lr 10 / 1 / 0.1 with budgets growing as 1/lr
#: (lr x steps = 6000), so every setting trains for the same "time". Thm 4.7 takes eta = O(1/poly(k)).
SWEEPS = {"lr": ("lr10", "lr1", "lr0.1")}
SYNTHETIC_PRESETS.update(
    {
        f"lr{lr:g}": replace(
            SYNTHETIC_PRESETS["cpu"],
            lr=lr,
            steps=steps,
            eval_every=steps // 12,
            seeds=(0,),
            note=f"the cpu preset on seed 0 with lr {lr:g} for {steps} steps (lr x steps = 6000)",
        )
        for lr, steps in ((10.0, 600), (1.0, 6000), (0.1, 60000))
    }
)
IMAGES_PRESETS = {
    "cpu": ImagesRun(note="digits (1300 train / 497 test, 8x8), SmallCNN, the paper's Adam settings, 5 seeds"),
    # The paper's FMNIST run takes 60000/750 x 100 = 8000 Adam steps; 1300 digits at batch 750 take 200. Batch 16
    # gives ceil(1300/16) x 100 = 8200 steps, the paper's step count at the paper's epochs.
    "cpu-steps": ImagesRun(
        batch=16, note="as cpu with batch 16: 8200 Adam steps in 100 epochs (the paper's FMNIST runs take 8000)"
    ),
    "tiny": ImagesRun(epochs=2, batch=256, width=4, seeds=(0,), note="smoke-test size"),
}


@torch.no_grad()
def _synthetic_eval(model: MultiViewNet, train, test, views, k: int, learned_at: float) -> dict:
    own, off = model.feature_strength()
    per = torch.zeros(k, 2)
    for ell in (1, 2):
        hit = (model(views[ell]).argmax(dim=1) == test.y).float()
        per[:, ell - 1] = torch.stack([hit[test.y == c].mean() for c in range(k)])
    learned = per >= learned_at
    return dict(
        train_acc=float((model(train.x).argmax(dim=1) == train.y).float().mean()),
        test_acc=float((model(test.x).argmax(dim=1) == test.y).float().mean()),
        single_view_acc=float(per.mean()),
        both_learned=float(learned.all(dim=1).float().mean()),
        one_learned=float((learned.sum(dim=1) == 1).float().mean()),
        none_learned=float((~learned).all(dim=1).float().mean()),
        lam_strong=float(own.max(dim=1).values.mean()),
        lam_weak=float(own.min(dim=1).values.mean()),
        off_class_max=float(off.max()),
        per_class_single_view=per.tolist(),
        lam=own.tolist(),
    )


def run_synthetic(cfg: SyntheticRun, method: str, seed: int, progress: bool = False) -> dict:
    """Train the Eq. 4.1 network with `method` by full-batch GD on one seed's data; JSON-ready dict.

    The data (train and test) and the initialisation follow `seed` only, so the three methods of one seed
    start from the same network on the same points."""
    cfg.check()
    k = cfg.data.k
    gen = seed_everything(seed)
    train = make_multiview(cfg.data, cfg.n_train, gen)
    test = make_multiview(cfg.data, cfg.n_test, gen)
    views = {ell: single_view(test, ell) for ell in (1, 2)}
    model = MultiViewNet(k, cfg.m, cfg.d, cfg.alpha, cfg.rho or 1 / k, gen)
    lam_gen = torch.Generator().manual_seed(seed + 7919)
    history = [dict(step=0, loss=None, **_synthetic_eval(model, train, test, views, k, cfg.learned_at))]
    from tqdm.auto import tqdm

    t0 = time.time()
    for step in tqdm(range(1, cfg.steps + 1), desc=f"{method} seed {seed}", disable=not progress, leave=False):
        loss = mixup_loss(model, train.x, train.y, method, lam_gen, cfg.pairs)
        model.zero_grad()
        loss.backward()
        with torch.no_grad():
            model.w -= cfg.lr * model.w.grad
        if step % cfg.eval_every == 0 or step == cfg.steps:
            history.append(
                dict(
                    step=step,
                    loss=float(loss.detach()),
                    **_synthetic_eval(model, train, test, views, k, cfg.learned_at),
                )
            )
    slim = [{key: val for key, val in row.items() if key not in ("per_class_single_view", "lam")} for row in history]
    return dict(method=method, seed=seed, seconds=time.time() - t0, final=history[-1], init=history[0], history=slim)


def _epoch_batches(n: int, batch: int, gen: torch.Generator) -> list:
    perm = torch.randperm(n, generator=gen)
    return [perm[i : i + batch] for i in range(0, n, batch)]


@torch.no_grad()
def _error(model, x, y) -> float:
    model.eval()
    err = float((model(x).argmax(dim=1) != y).float().mean())
    model.train()
    return err


def run_images(cfg: ImagesRun, method: str, seed: int, progress: bool = False) -> dict:
    """Table 1's protocol on digits for one method and seed: test error (%) per epoch and at the end."""
    cfg.check()
    x, y, xt, yt = load_digits_split(cfg.n_test, cfg.split_seed)
    gen = seed_everything(seed)
    partner = pair_classes(10, gen)
    extra = fixed_extras(y, partner, gen)
    model = SmallCNN(width=cfg.width)
    opt = torch.optim.Adam(model.parameters(), lr=cfg.lr, betas=(0.9, 0.999))
    test_in = concat_views(xt, None, None)
    curve = []
    from tqdm.auto import tqdm

    t0 = time.time()
    for _ in tqdm(range(cfg.epochs), desc=f"{method} seed {seed}", disable=not progress, leave=False):
        gamma = torch.rand(len(x), generator=gen)  # redrawn at every load, as in the authors' code
        inputs = concat_views(x, x[extra], gamma)
        for idx in _epoch_batches(len(x), cfg.batch, gen):
            opt.zero_grad()
            batch_mixup_loss(model, inputs[idx], y[idx], method, gen).backward()
            opt.step()
        curve.append(100 * _error(model, test_in, yt))
    return dict(
        method=method,
        seed=seed,
        seconds=time.time() - t0,
        test_error=curve[-1],
        curve=curve,
        partner=partner.tolist(),
        train_clean_error=100 * _error(model, concat_views(x, None, None), y),
    )


def run_units(run, cfg, jsonl_path=None, progress: bool = True, force: bool = False) -> list[dict]:
    """run(cfg, method, seed) for every method and seed of cfg; rows in jsonl_path with the same settings
    are reused (unless ``force``: recomputed), and each finished unit is appended (so an interrupted sweep
    resumes)."""
    cfg.check()
    units = [(method, seed) for method in cfg.methods for seed in cfg.seeds]
    return run_resumable(
        cfg,
        jsonl_path,
        ("methods", "seeds", "note"),
        units,
        lambda r: (r["method"], r["seed"]),
        lambda method, seed: run(cfg, method, seed, progress),
        force=force,
    )
