"""The Sec. 5.5 experiments (Z. Shi 2024, Thms 5.5.1-5.5.2, the mechanism of Figs. 5.1-5.3): config, presets, units.

Parts, each a list of units with one JSONL row per finished unit (an interrupted run resumes):

- ``closed`` (v1, v2): Thm 5.5.1's g1* and g2*, the subset check, the exact N -> infinity hinge loss on S1 and S2,
  and the signal term of Thm 5.5.2 (zero hinge loss on S1) over every S1 task and query sign.
- ``loss`` (v1, v2, N): hinge loss and accuracy of g1*, g2* on prompts of N examples from S1 and from S2.
- ``ratio`` (v1, v2, M): E||P_D1(Xi)||^2 / E||P_D2(Xi)||^2 by Monte Carlo against (v1 + 1)/(v2 + 1); also the same
  ratio for the noise the heads see in real prompts of M examples.
- ``flips`` (v1, v2, M): accuracy of g1* and g2* on S1 prompts of M examples as in-context labels are flipped
  (exactly round(rate M) per prompt, nested across rates) or get Gaussian noise.
- ``train`` (v1, v2, m, kind, seed): the m-head model trained from small initialisation (``train.py``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from icl_probes.common import as_stored
from icl_probes.io import append_jsonl, read_jsonl, remove_jsonl_rows
from icl_probes.sparse_parity.data import (
    PAIR_VALUES,
    TaskLaw,
    flip_labels,
    flip_ranks,
    random_orthonormal,
    sample_prompts,
    task_sets,
)
from icl_probes.sparse_parity.model import closed_form, exact_limit_loss, forward, hinge, signal_term
from icl_probes.sparse_parity.theory import d_matrix, projection_energy, projector, sample_xi, subset_check
from icl_probes.sparse_parity.train import TrainSettings, TrainUnit, train_heads

PARTS = ("closed", "loss", "ratio", "flips", "train")


@dataclass(frozen=True)
class SparseParityRun:
    """One run of every part. pairs: (v1, v2) with k = 2^v1, d = 2^v2; gamma in (0, 1/4); seed: G and all draws;
    loss_ns: prompt lengths N of the loss part; prompts: prompts per (set, N) and per flips unit; chunk: the most
    examples (prompts x N) held at once; ratio_ms, ratio_samples: the Monte Carlo of Thm 5.5.2's ratio; flip_ms,
    flip_rates, noise_sigmas: the flips part; train: the training units; train_seeds; train_settings."""

    pairs: tuple = ((1, 3), (2, 4))
    gamma: float = 0.125
    seed: int = 0
    loss_ns: tuple = (16, 64, 256, 1024, 4096)
    prompts: int = 2000
    chunk: int = 1 << 19
    ratio_ms: tuple = (16, 64, 256, 1024, 4096)
    ratio_samples: int = 20000
    flip_ms: tuple = (64, 256, 1024, 4096)
    flip_rates: tuple = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5)
    noise_sigmas: tuple = (0.0, 1.0, 2.0, 4.0)
    train: tuple = (
        TrainUnit(1, 3, 4, "full", 8000),
        TrainUnit(1, 3, 8, "full", 20000),
        TrainUnit(1, 3, 16, "full", 12000),
        TrainUnit(1, 3, 8, "diagonal", 20000),
        TrainUnit(2, 4, 6, "full", 6000),
        TrainUnit(2, 4, 10, "full", 6000),
    )
    train_seeds: tuple = (0,)
    train_settings: TrainSettings = field(default_factory=lambda: TrainSettings(batch=1024))
    note: str = ""

    def check(self) -> None:
        if not self.pairs or any(not 1 <= v1 < v2 <= 6 for v1, v2 in self.pairs):
            raise ValueError(f"pairs={self.pairs}: need 1 <= v1 < v2 <= 6 (d = 2^v2 at most 64)")
        TaskLaw(4, 2, self.gamma).check()
        lengths = self.loss_ns + self.ratio_ms + self.flip_ms
        if min(lengths, default=0) < 1 or self.prompts < 1 or self.ratio_samples < 2:
            raise ValueError(
                f"prompt lengths {lengths} must be >= 1, prompts={self.prompts} >= 1 "
                f"and ratio_samples={self.ratio_samples} >= 2"
            )
        if any(not 0 <= r <= 0.5 for r in self.flip_rates) or any(s < 0 for s in self.noise_sigmas):
            raise ValueError(
                f"flip rates {self.flip_rates} must lie in [0, 1/2] (XOR labels are invariant when every "
                f"label is negated) and noise sigmas {self.noise_sigmas} must be >= 0"
            )
        for unit in self.train:
            unit.check()
        self.train_settings.check()


PRESETS = {
    "cpu": SparseParityRun(note="(v1, v2) = (1, 3) and (2, 4), gamma = 1/8, 2000 prompts per cell, one training seed"),
    "train-seeds": SparseParityRun(
        train=(
            TrainUnit(1, 3, 4, "full", 8000),
            TrainUnit(1, 3, 8, "full", 20000),
            TrainUnit(1, 3, 16, "full", 12000),
            TrainUnit(1, 3, 8, "diagonal", 20000),
        ),
        train_seeds=(1, 2),
        note="cpu's (1, 3) training units with seeds 1 and 2 (run with --parts train)",
    ),
    "train-long": SparseParityRun(
        train=(TrainUnit(2, 4, 6, "full", 24000), TrainUnit(2, 4, 10, "full", 24000)),
        note="cpu's (2, 4) training units, 4x the steps (run with --parts train)",
    ),
    "tiny": SparseParityRun(
        pairs=((1, 2),),
        loss_ns=(8, 64),
        prompts=200,
        ratio_ms=(16, 64),
        ratio_samples=2000,
        flip_ms=(32,),
        flip_rates=(0.0, 0.25, 0.5),
        noise_sigmas=(0.0, 1.0),
        train=(TrainUnit(1, 2, 4, "full", 200), TrainUnit(1, 2, 4, "diagonal", 200)),
        note="smoke test size",
    ),
}


def _law(cfg: SparseParityRun, v1: int, v2: int) -> TaskLaw:
    return TaskLaw(2**v2, 2**v1, cfg.gamma)


def _unit_seed(cfg: SparseParityRun, unit: tuple) -> int:
    """A deterministic seed per unit from its key (Python's hash of strings is salted per process, so not that)."""
    text = repr((cfg.seed,) + tuple(unit))
    return sum((i + 1) * ord(c) for i, c in enumerate(text)) % (2**31)


def _setup(cfg: SparseParityRun, unit: tuple):
    """(law, G, generator) of a unit ("part", v1, v2, ...): G depends on (seed, d) only, so every part of a pair sees
    the same dictionary; the generator is the unit's own."""
    v1, v2 = unit[1], unit[2]
    G = random_orthonormal(2**v2, torch.Generator().manual_seed(cfg.seed))
    return _law(cfg, v1, v2), G, torch.Generator().manual_seed(_unit_seed(cfg, unit))


def _prompt_chunks(cfg, n: int, total: int):
    """Sizes of prompt batches that keep prompts x n <= cfg.chunk."""
    per = max(1, cfg.chunk // max(n, 1))
    return [min(per, total - i) for i in range(0, total, per)]


def run_closed(cfg: SparseParityRun, v1: int, v2: int) -> dict:
    """Thm 5.5.1's neurons, the subset check and the exact N -> infinity losses; Thm 5.5.2's signal term on S1."""
    law = _law(cfg, v1, v2)
    g1, g2 = closed_form(v1, v2, cfg.gamma), closed_form(v2, v2, cfg.gamma)
    s1, s2 = task_sets(law.d, law.k)
    out = dict(part="closed", v1=v1, v2=v2, d=law.d, k=law.k, p_t_bound=law.p_t_bound())
    for name, h in (("g1", g1), ("g2", g2)):
        out[name] = dict(
            index=list(h.index),
            a=h.a.tolist(),
            diag_times_4gamma=(h.diag() * 4 * cfg.gamma).tolist(),
            norm=float(h.V.pow(2).sum()),
            s1=exact_limit_loss(h.a, h.V, s1, cfg.gamma),
            s2=exact_limit_loss(h.a, h.V, s2, cfg.gamma),
        )
        # Thm 5.5.2, first bullet: the signal part on every S1 task and every sign of (phi_q,i, phi_q,j)
        pairs = s1.repeat_interleave(4, dim=0)
        phi_q = torch.ones(len(pairs), law.d, dtype=torch.float64)
        signs = torch.tensor(PAIR_VALUES, dtype=torch.float64).repeat(len(s1), 1)
        phi_q.scatter_(1, pairs, signs)
        y_q = signs.prod(dim=1)
        z = y_q * signal_term(h, pairs, phi_q, cfg.gamma)
        out[name]["signal_s1"] = dict(max_hinge=float(hinge(z).max()), min_margin=float(z.min()))
    out["subset"] = subset_check(g1, g2)
    return out


def run_loss(cfg: SparseParityRun, v1: int, v2: int, n: int) -> dict:
    """Hinge loss and accuracy (y_q g > 0) of g1*, g2* on cfg.prompts prompts of n examples, S1 and S2 tasks."""
    law, G, gen = _setup(cfg, ("loss", v1, v2, n))
    heads = {"g1": closed_form(v1, v2, cfg.gamma), "g2": closed_form(v2, v2, cfg.gamma)}
    weights = {name: h.weights(G) for name, h in heads.items()}
    out = dict(part="loss", v1=v1, v2=v2, n=n)
    for which in ("s1", "s2"):
        sums = {name: [0.0, 0.0, 0.0] for name in heads}  # hinge sum, hinge square sum, correct
        for b in _prompt_chunks(cfg, n, cfg.prompts):
            pr = sample_prompts(law, G, n, b, gen, which)
            for name in heads:
                z = pr.y_q * forward(heads[name].a, weights[name], pr.X, pr.y, pr.x_q)
                loss = hinge(z)
                sums[name][0] += float(loss.sum())
                sums[name][1] += float((loss**2).sum())
                sums[name][2] += float((z > 0).sum())
        for name, (s, sq, right) in sums.items():
            mean = s / cfg.prompts
            se = (max(sq / cfg.prompts - mean**2, 0.0) / cfg.prompts) ** 0.5
            out[f"{name}_{which}"] = dict(loss=mean, loss_se=se, acc=right / cfg.prompts)
    return out


def run_ratio(cfg: SparseParityRun, v1: int, v2: int, m: int) -> dict:
    """Thm 5.5.2's ratio by Monte Carlo over Xi (common draws for both projections), against (v1+1)/(v2+1) and the
    rank formula rank(D)/M; and the same energies for the noise of real S1 prompts of m examples, r = h o phi_q -
    2 gamma phi_hat_q with h = (1/m) sum_l y_l phi_l (the head input diag(V)^T (h o phi_q) minus its signal)."""
    law, G, gen = _setup(cfg, ("ratio", v1, v2, m))
    p1 = projector(d_matrix(closed_form(v1, v2, cfg.gamma)))
    p2 = projector(d_matrix(closed_form(v2, v2, cfg.gamma)))
    xi = sample_xi(m, law.d, cfg.ratio_samples, gen)
    e1, se1 = projection_energy(p1, xi)
    e2, se2 = projection_energy(p2, xi)
    per = ((xi @ p1) ** 2).sum(1) - (v1 + 1) / (v2 + 1) * ((xi @ p2) ** 2).sum(1)  # delta method for the ratio's s.e.
    out = dict(
        part="ratio",
        v1=v1,
        v2=v2,
        m=m,
        formula=(v1 + 1) / (v2 + 1),
        rank1=int(torch.linalg.matrix_rank(p1)),
        rank2=int(torch.linalg.matrix_rank(p2)),
        xi_e1=e1,
        xi_e1_se=se1,
        xi_e2=e2,
        xi_e2_se=se2,
        xi_ratio=e1 / e2,
        xi_ratio_se=float(per.std() / len(per) ** 0.5 / e2),
    )
    n_prompts = min(cfg.prompts, cfg.ratio_samples)
    r_all = []
    for b in _prompt_chunks(cfg, m, n_prompts):
        pr = sample_prompts(law, G, m, b, gen, "s1")
        h = torch.einsum("bn,bnd->bd", pr.y, pr.phi) / m
        hat = torch.zeros_like(pr.phi_q)
        hat.scatter_(1, pr.pairs, torch.gather(pr.phi_q, 1, pr.pairs))
        r_all.append(h * pr.phi_q - 2 * cfg.gamma * hat)
    r = torch.cat(r_all)
    f1, fse1 = projection_energy(p1, r)
    f2, fse2 = projection_energy(p2, r)
    out.update(
        prompt_e1=f1, prompt_e1_se=fse1, prompt_e2=f2, prompt_e2_se=fse2, prompt_ratio=f1 / f2, prompts=n_prompts
    )
    return out


def run_flips(cfg: SparseParityRun, v1: int, v2: int, m: int) -> dict:
    """Accuracy (and mean hinge loss) of g1*, g2* on cfg.prompts S1 prompts of m examples, per flip rate (the same
    prompts and nested flips for every rate and both models) and per Gaussian label-noise sigma (y + sigma eps)."""
    law, G, gen = _setup(cfg, ("flips", v1, v2, m))
    heads = {"g1": closed_form(v1, v2, cfg.gamma), "g2": closed_form(v2, v2, cfg.gamma)}
    weights = {name: h.weights(G) for name, h in heads.items()}
    keys = [("flip", r) for r in cfg.flip_rates] + [("noise", s) for s in cfg.noise_sigmas]
    sums = {(kind, lvl, name): [0.0, 0.0] for kind, lvl in keys for name in heads}
    for b in _prompt_chunks(cfg, m, cfg.prompts):
        pr = sample_prompts(law, G, m, b, gen, "s1")
        ranks = flip_ranks(pr.y, gen)
        eps = torch.randn(pr.y.shape, generator=gen, dtype=torch.float64)
        for kind, lvl in keys:
            y = flip_labels(pr.y, lvl, ranks) if kind == "flip" else pr.y + lvl * eps
            for name in heads:
                z = pr.y_q * forward(heads[name].a, weights[name], pr.X, y, pr.x_q)
                sums[(kind, lvl, name)][0] += float((z > 0).sum())
                sums[(kind, lvl, name)][1] += float(hinge(z).sum())
    rows = [
        dict(
            kind=kind,
            level=lvl,
            **{f"{name}_acc": sums[(kind, lvl, name)][0] / cfg.prompts for name in heads},
            **{f"{name}_loss": sums[(kind, lvl, name)][1] / cfg.prompts for name in heads},
        )
        for kind, lvl in keys
    ]
    return dict(part="flips", v1=v1, v2=v2, m=m, rows=rows)


def run_train(cfg: SparseParityRun, unit: TrainUnit, seed: int) -> dict:
    return dict(part="train", **train_heads(unit, cfg.train_settings, cfg.gamma, seed))


def units(cfg: SparseParityRun, parts=PARTS) -> list[tuple]:
    """Every unit of the chosen parts, as (part, key...) tuples; the key is what a row stores."""
    out = []
    for v1, v2 in cfg.pairs:
        if "closed" in parts:
            out.append(("closed", v1, v2))
        out += [("loss", v1, v2, n) for n in cfg.loss_ns] if "loss" in parts else []
        out += [("ratio", v1, v2, m) for m in cfg.ratio_ms] if "ratio" in parts else []
        out += [("flips", v1, v2, m) for m in cfg.flip_ms] if "flips" in parts else []
    if "train" in parts:
        out += [("train", u.v1, u.v2, u.m, u.kind, u.steps, s) for u in cfg.train for s in cfg.train_seeds]
    return out


def key_of(row: dict) -> tuple:
    """The unit a row belongs to (see ``units``)."""
    part = row["part"]
    if part == "closed":
        return (part, row["v1"], row["v2"])
    if part in ("loss",):
        return (part, row["v1"], row["v2"], row["n"])
    if part in ("ratio", "flips"):
        return (part, row["v1"], row["v2"], row["m"])
    return (part, row["v1"], row["v2"], row["m"], row["kind"], row["steps"], row["seed"])


def compute(cfg: SparseParityRun, unit: tuple) -> dict:
    part = unit[0]
    t0 = time.time()
    if part == "closed":
        row = run_closed(cfg, *unit[1:])
    elif part == "loss":
        row = run_loss(cfg, *unit[1:])
    elif part == "ratio":
        row = run_ratio(cfg, *unit[1:])
    elif part == "flips":
        row = run_flips(cfg, *unit[1:])
    else:
        _, v1, v2, m, kind, steps, seed = unit
        row = run_train(cfg, TrainUnit(v1, v2, m, kind, steps), seed)
        row["steps"] = steps
    row["seconds"] = time.time() - t0
    return row


def settings_of(cfg: SparseParityRun) -> dict:
    """What a row must share with the config to be reused: everything but the note."""
    return {k: v for k, v in as_stored(cfg).items() if k != "note"}


def run_all(cfg: SparseParityRun, jsonl_path=None, parts=PARTS, force: bool = False, progress: bool = True) -> list:
    """compute() for every unit of the chosen parts; a row in jsonl_path with the same settings and unit is reused,
    each new row is appended. force: recompute these units (their old rows are removed first)."""
    from gemfilter.toolkit import loop

    cfg.check()
    todo = units(cfg, parts)
    settings = settings_of(cfg)
    done = {}
    if jsonl_path is not None:
        if force:
            ours = set(todo)
            remove_jsonl_rows(jsonl_path, lambda r: r.get("settings") == settings and key_of(r) in ours)
        else:
            done = {key_of(r): r for r in read_jsonl(jsonl_path, ("part",)) if r.get("settings") == settings}
    return loop.every_row(
        todo,
        done,
        lambda unit: dict(compute(cfg, unit), settings=settings),
        (lambda row: append_jsonl(jsonl_path, row)) if jsonl_path is not None else None,
        desc="sparse parity",
        noun="unit",
        progress=progress,
    )
