"""Presets and the seeded run function of the parity simulation (Z. Shi 2024, Ch. 2, App. A.7.1, Table A.1).

``run_parity`` trains, on one data law (with or without input structure), the two-layer network by the
three-stage learning process of Thm A.20, and the baselines on the same initial network: NTK (the
linearised network), RF (random first layer frozen), One Step / Two Step (first layer frozen after
step 1 / 2). ``run_table`` runs it for every (structure, seed) and appends one JSONL row per finished unit.
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass, field, replace

import torch

from feature_probes.common import run_resumable
from feature_probes.parity.data import ParitySpec, make_problem, make_split
from feature_probes.parity.model import (
    FixedFeatureHead,
    LinearisedNet,
    NTKFeatures,
    RidgeSystem,
    TwoLayerNet,
    gd_step,
    hinge,
    ntk_predict,
    ntk_ridge,
    regulariser,
)
from icl_probes.common import seed_everything

#: third-stage setting -> its method key in the results (``network`` is the theorem's, as before)
STAGE3 = {"thm_a20": "network", "adam": "network_adam"}


@dataclass(frozen=True)
class ParityRun:
    """One Table A.1 column set. Values the paper does not give are marked (ours).

    step1: "thm_a20" (eta1 = gamma^2 sigma~^2/(k m^3), sigma_xi = 1/k^2) or "lemma_a17"
    (eta1 = gamma^2 sigma~/(k m^3), sigma_xi = 1/k^1.5); step 2: eta = 1, lambda_a = lambda_w = 1/2.
    lr3: step size of steps 3..T (0 = Thm A.20's k^2/(T m^(1/3))); lam3: lambda_a = lambda_w there (ours,
    Thm A.20 only bounds it by k^3/(sigma~ m^(1/3))). stage3: the third-stage settings to run, each from the
    same step-2 network: "thm_a20" (plain minibatch GD at lr3) and "adam" (ours: Adam at adam_lr3 on both
    layers, the same loss and lam3; the paper does not give its third stage). ntk_lams: the ridge
    penalties tried for the NTK's ridge solver, chosen on a held-out ntk_holdout share of the training set.
    Baselines train their linear part with Adam
    (baseline_lr, ours) on the same batches for the same number of steps; RF / One Step / Two Step heads see
    standardised features (``model.FixedFeatureHead``), the NTK its raw linearised features. gamma and sigma~ come from
    the structured law even when ``structured`` is False, so both laws run the same hyper-parameters.
    """

    spec: ParitySpec = field(default_factory=ParitySpec)
    m: int = 300
    n_train: int = 50000
    n_test: int = 10000
    steps: int = 600
    batch: int = 1000
    step1: str = "thm_a20"
    lr3: float = 0.0
    lam3: float = 1e-4
    stage3: tuple[str, ...] = ("thm_a20", "adam")
    adam_lr3: float = 0.01
    ntk_lams: tuple[float, ...] = (1e7, 1e6, 3e5, 1e5, 3e4, 1e4, 1e3)
    ntk_holdout: float = 0.2
    baseline_lr: float = 0.01
    eval_every: int = 25
    seeds: tuple[int, ...] = (0,)
    laws: tuple[bool, ...] = (True, False)
    note: str = ""

    def check(self) -> None:
        self.spec.check()
        if self.step1 not in ("thm_a20", "lemma_a17"):
            raise ValueError(f"step1={self.step1!r}; allowed: thm_a20, lemma_a17")
        if not self.stage3 or set(self.stage3) - set(STAGE3):
            raise ValueError(f"stage3={self.stage3!r}; allowed: a non-empty subset of {', '.join(STAGE3)}")
        if not self.ntk_lams or min(self.ntk_lams) <= 0 or not 0 < self.ntk_holdout < 1:
            raise ValueError(
                f"ntk_lams={self.ntk_lams!r}, ntk_holdout={self.ntk_holdout}: need penalties > 0 and "
                "a held-out share in (0, 1)"
            )
        if self.steps < 3:
            raise ValueError(f"steps={self.steps}: the learning process needs at least 3 steps")
        if not 0 < self.batch <= self.n_train:
            raise ValueError(f"batch={self.batch}: must lie in [1, n_train={self.n_train}]")
        if self.m < 1 or self.n_test < 2 or self.n_train < 2:
            raise ValueError(f"m={self.m}, n_train={self.n_train}, n_test={self.n_test}: must be >= 1, >= 2, >= 2")


PRESETS = {
    "cpu": ParityRun(
        note="the paper's sizes (d=500, D=100, k=5, p_o=1/2, m=300, T=600, 50000 train points, "
        "batch 1000 after step 2), one seed, 10000 test points"
    ),
    "paper": ParityRun(seeds=(0, 1, 2, 3, 4), note="as cpu with the paper's 5 seeds"),
    "tiny": ParityRun(
        spec=ParitySpec(d=40, D=12, k=3),
        m=20,
        n_train=600,
        n_test=300,
        steps=12,
        batch=200,
        eval_every=6,
        note="smoke test size",
    ),
}


def hyper(cfg: ParityRun) -> dict:
    """The numbers of the learning process for cfg (gamma, sigma~ of the structured law, init scales, steps)."""
    k, m, T = cfg.spec.k, cfg.m, cfg.steps
    law = replace(cfg.spec, structured=True)
    gamma, sigma = law.gamma(), law.centre_and_scale()[1]
    if cfg.step1 == "thm_a20":
        eta1, s12 = gamma**2 * sigma**2 / (k * m**3), 1 / k**2
    else:
        eta1, s12 = gamma**2 * sigma / (k * m**3), 1 / k**1.5
    return dict(
        gamma=gamma,
        sigma_tilde=sigma,
        sigma_w=1 / k,
        sigma_b=1 / k**2,
        sigma_a=sigma**2 / (gamma * k**2),
        eta1=eta1,
        lam_w1=1 / (2 * eta1),
        smooth12=s12,
        eta3=cfg.lr3 or k**2 / (T * m ** (1 / 3)),
        lam3=cfg.lam3,
    )


def accuracy(out: torch.Tensor, y: torch.Tensor) -> float:
    return float(((out > 0).float() * 2 - 1 == y).float().mean())


def cos_to_star(w: torch.Tensor, star: torch.Tensor) -> float:
    """max_i cos(w_i, sum_{j in A} M_j) over the rows of w (2m, d)."""
    return float((w @ star / (w.norm(dim=1).clamp_min(1e-30) * star.norm())).max())


def mds2(w: torch.Tensor, star: torch.Tensor) -> list:
    """Fig. A.2's picture: classical MDS of the chordal cosine distances sqrt(2 - 2 cos) between the rows of
    w and the two stars +-star, which equals PCA of the unit-normalised vectors. Returns (2m + 2, 2)."""
    v = torch.cat([w, star[None], -star[None]]).double()
    v = v / v.norm(dim=1, keepdim=True).clamp_min(1e-30)
    v = v - v.mean(dim=0)
    u, s, _ = torch.linalg.svd(v, full_matrices=False)
    return (u[:, :2] * s[:2]).float().tolist()


def _batches(n: int, batch: int, steps: int, gen: torch.Generator):
    """Index tensors of `steps` minibatches drawn without replacement within each epoch."""
    out, perm = [], torch.randperm(n, generator=gen)
    while len(out) < steps:
        if len(perm) < batch:
            perm = torch.randperm(n, generator=gen)
        out.append(perm[:batch])
        perm = perm[batch:]
    return out


def _fit_linear(model, params, x, y, xt, yt, batches, lr, eval_every) -> tuple[list, dict]:
    """Adam on the hinge loss over the given minibatches; returns the test-accuracy curve and final accuracies."""
    opt = torch.optim.Adam(params, lr=lr)
    curve = []
    for t, idx in enumerate(batches, start=1):
        opt.zero_grad()
        hinge(model(x[idx]), y[idx]).backward()
        opt.step()
        if t % eval_every == 0 or t == len(batches):
            with torch.no_grad():
                curve.append([t, accuracy(model(xt), yt)])
    with torch.no_grad():
        return curve, dict(train_acc=accuracy(model(x), y), test_acc=accuracy(model(xt), yt))


def run_parity(cfg: ParityRun, structured: bool, seed: int, progress: bool = False) -> dict:
    """Train the network (Thm A.20 process) and the baselines on one law and seed; a JSON-ready dict.

    Seed use: the problem (M, A), the data, the initial network and the minibatch order all follow `seed`.
    """
    cfg.check()
    spec = replace(cfg.spec, structured=structured)
    h = hyper(cfg)
    problem, train, test, net, gen = draw(cfg, spec, h, seed)
    label = f"parity {'structured' if structured else 'no structure'} seed {seed}"
    fit = fit_methods(cfg, h, problem.star(), train, test, net, gen, seed, progress, label)
    return dict(structured=structured, seed=seed, A=problem.A.tolist(), hyper=h, **fit)


def fit_methods(
    cfg,
    h: dict,
    star: torch.Tensor,
    train: tuple,
    test: tuple,
    net: TwoLayerNet,
    gen: torch.Generator,
    seed: int,
    progress: bool = False,
    label: str = "",
    pos_share: bool = False,
) -> dict:
    """The learning process of Thm A.20 and the baselines on one drawn problem (Table A.1's columns; shared with
    the interval labelling of Table A.2, ``feature_probes.interval``).

    cfg: a config with ParityRun's training fields (m, n_train, steps, batch, stage3, adam_lr3, ntk_lams,
    ntk_holdout, baseline_lr, eval_every); h: ``hyper``'s numbers; star: sum_{j in A} M_j (d,); train, test:
    (x (n, d), y (n,)); net: the initial network (trained in place); gen: the generator after the draw (the
    minibatch order of steps 3..T); seed: the baselines' minibatch order (seed + 1); pos_share: also record
    each method's share of +1 predictions on the test set (``test_pos_share``). Returns {methods, mds,
    seconds, net_seconds}."""
    (x, y), (xt, yt) = train, test
    init = copy.deepcopy(net)  # the baselines' initial network
    w0, b0 = net.w.detach().clone(), net.b.detach().clone()
    batches = _batches(cfg.n_train, cfg.batch, cfg.steps - 2, gen)
    t0 = time.time()
    snaps = dict(init=mds2(w0, star))
    gd_step(net, x, y, h["eta1"], 0.0, h["lam_w1"], h["smooth12"])  # step 1: wipes w's init
    w1, b1 = net.w.detach().clone(), net.b.detach().clone()
    snaps["step1"] = mds2(w1, star)
    gd_step(net, x, y, 1.0, 0.5, 0.5, h["smooth12"])  # step 2
    w2, b2 = net.w.detach().clone(), net.b.detach().clone()
    snaps["step2"] = mds2(w2, star)
    after2 = {k: v.detach().clone() for k, v in net.state_dict().items()}
    methods = {}
    for mode in cfg.stage3:
        net.load_state_dict(after2)
        curve = [[0, 0.5], [2, accuracy(net(xt).detach(), yt)]]
        bar = _bar(progress, cfg.steps, f"{label} {mode}")
        step = _stage3(mode, net, cfg, h)
        for t, idx in enumerate(batches, start=3):
            step(x[idx], y[idx])
            if t % cfg.eval_every == 0 or t == cfg.steps:
                with torch.no_grad():
                    curve.append([t, accuracy(net(xt), yt)])
            bar.update(1)
        bar.close()
        with torch.no_grad():
            methods[STAGE3[mode]] = dict(
                train_acc=accuracy(net(x), y), test_acc=accuracy(net(xt), yt), cos=cos_to_star(net.w, star), curve=curve
            )
            if pos_share:
                methods[STAGE3[mode]]["test_pos_share"] = _pos_share(net(xt))
    net_seconds = time.time() - t0
    # Baselines: the same initial network (w0, b0, a0), the same batches (steps 3..T) plus two more.
    base_batches = _batches(cfg.n_train, cfg.batch, cfg.steps, torch.Generator().manual_seed(seed + 1))
    methods["ntk_ridge"] = _ntk_ridge(cfg, init, x, y, xt, yt, pos_share)
    ntk = LinearisedNet(init)
    for name, model, params, w in (
        ("ntk", ntk, list(ntk.parameters()), None),
        ("rf", FixedFeatureHead(w0, b0, x), None, w0),
        ("one_step", FixedFeatureHead(w1, b1, x), None, w1),
        ("two_step", FixedFeatureHead(w2, b2, x), None, w2),
    ):
        curve_b, acc = _fit_linear(
            model, params or list(model.parameters()), x, y, xt, yt, base_batches, cfg.baseline_lr, cfg.eval_every
        )
        methods[name] = dict(**acc, cos=None if w is None else cos_to_star(w, star), curve=curve_b)
        if pos_share:
            with torch.no_grad():
                methods[name]["test_pos_share"] = _pos_share(model(xt))
    return dict(methods=methods, mds=snaps, seconds=time.time() - t0, net_seconds=net_seconds)


def _stage3(mode: str, net: TwoLayerNet, cfg: ParityRun, h: dict):
    """One step of steps 3..T on a minibatch (x, y): Thm A.20's plain GD at eta3, or Adam on both layers."""
    if mode == "thm_a20":
        return lambda xb, yb: gd_step(net, xb, yb, h["eta3"], h["lam3"], h["lam3"], 0.0)
    opt = torch.optim.Adam(net.parameters(), lr=cfg.adam_lr3)

    def adam_step(xb, yb):
        opt.zero_grad()
        (hinge(net(xb), yb) + regulariser(net, h["lam3"], h["lam3"])).backward()
        opt.step()

    return adam_step


def _ntk_ridge(cfg: ParityRun, init: TwoLayerNet, x, y, xt, yt, pos_share: bool = False) -> dict:
    """Ridge regression on the NTK features of the initial network (labels +-1), the penalty chosen on a
    held-out share of the training set, then refit on all of it (``ntk_ridge_fit``)."""
    feats, theta, best, iters, scores = ntk_ridge_fit(cfg, init, x, y)
    out = dict(
        train_acc=accuracy(ntk_predict(feats, theta, x), y),
        test_acc=accuracy(ntk_predict(feats, theta, xt), yt),
        cos=None,
        lam=best,
        cg_iters=iters,
        search=scores,
        curve=[],
    )
    if pos_share:
        out["test_pos_share"] = _pos_share(ntk_predict(feats, theta, xt))
    return out


def _pos_share(out: torch.Tensor) -> float:
    """The share of +1 predictions (out > 0)."""
    return float((out > 0).float().mean())


def ntk_ridge_fit(cfg: ParityRun, init: TwoLayerNet, x, y) -> tuple:
    """The NTK ridge fit on (x (n, d), y (n,)): the penalty of cfg.ntk_lams best on the last cfg.ntk_holdout
    share of x, then refit on all of x. Warm starts from the previous penalty.
    Returns (features, theta, penalty, CG iterations, the search's rows)."""
    feats = NTKFeatures(init, x)
    cut = int(len(x) * (1 - cfg.ntk_holdout))
    fit = RidgeSystem(feats, x[:cut], y[:cut])  # one set of normal equations for every penalty tried
    scores, theta = [], None
    for lam in sorted(cfg.ntk_lams, reverse=True):
        theta, iters = fit.solve(lam, start=theta)
        scores.append(dict(lam=lam, heldout_acc=accuracy(ntk_predict(feats, theta, x[cut:]), y[cut:]), cg_iters=iters))
    best = max(scores, key=lambda r: r["heldout_acc"])["lam"]
    theta, iters = ntk_ridge(feats, x, y, best)
    return feats, theta, best, iters, scores


def draw(cfg: ParityRun, spec: ParitySpec, h: dict, seed: int) -> tuple:
    """What seed draws, in run_parity's generator order: the problem (M, A), the training split (x (n_train, d),
    y (n_train,)), the test split, the initial network (hyper-parameters h), and the generator after them
    (run_parity draws its minibatch order from it). Returns (problem, (x, y), (xt, yt), net, gen)."""
    gen = seed_everything(seed)
    problem = make_problem(spec, gen)
    x, y, _ = make_split(spec, problem, cfg.n_train, gen)
    xt, yt, _ = make_split(spec, problem, cfg.n_test, gen)
    net = TwoLayerNet(spec.d, cfg.m, h["sigma_w"], h["sigma_b"], h["sigma_a"], gen)
    return problem, (x, y), (xt, yt), net, gen


def _bar(progress: bool, total: int, desc: str):
    from tqdm.auto import tqdm

    return tqdm(total=total - 2, desc=desc, disable=not progress, leave=False)


def run_table(cfg: ParityRun, jsonl_path=None, progress: bool = True, force: bool = False) -> list[dict]:
    """run_parity for every (law, seed) of cfg; rows already in jsonl_path with the same settings are reused,
    each newly finished unit is appended (so an interrupted table resumes)."""
    cfg.check()
    units = [(structured, seed) for structured in cfg.laws for seed in cfg.seeds]
    return run_resumable(
        cfg,
        jsonl_path,
        ("seeds", "laws", "note"),
        units,
        lambda r: (r["structured"], r["seed"]),
        lambda structured, seed: run_parity(cfg, structured, seed, progress),
        force=force,
    )
