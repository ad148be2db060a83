"""Experiment B (beyond the paper): learn Q, P and the step sizes of the linear looped transformer.

Paper: Z. Shi (2024), Ch. 8 constructs Q and P (Lemma 8.13, Thm 8.14); here they are trained instead, by
Adam on fresh random tasks, in the spirit of Yang et al. 2023 ("Looped transformers are better at
learning learning algorithms"), who train a looped GPT-2 block. The model is exactly the Ch. 8 one:
Z^(t) = Z^(t-1) - eta^(t-1) Attn(Z^(t-1); Q, P) with Q, P (d+1, d+1) and learned eta^(t).

Per task the loss is the relative squared error ||TF^(t)/alpha - theta*||^2 (what Fig. 8.1 plots),
taken at the last training loop ("last") or averaged over loops 1..T ("mean", as Yang et al. average
over loop outputs). The step sizes are either one per loop ("per-loop"; past T the last one is reused)
or one for all loops ("shared"). One model is trained per (loss, eta mode). The evaluation runs up to
``eval_loops`` > T loops and compares the learned Q, P with the construction.

Why the recipe (measured on the cpu preset; icl_probes/looped/README.md, "Deviations and choices"): from a
random init, plain Adam at a constant lr stalls at a one-step solution (error ~0.1) or blows up. A loop
curriculum (train on 1, 2, .., T loops over the first ``curriculum`` steps, as Yang et al. do), a cosine lr
decay and gradient clipping make it converge.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from tqdm.auto import tqdm

from gemfilter.toolkit.loop import Unit, compute, missing
from icl_probes.common import resolve_device, seed_everything
from icl_probes.io import append_jsonl, read_jsonl, replacing
from icl_probes.looped.model import (
    construction,
    gram_spectrum,
    looped_forward_fast,
    query_error,
    relative_sq_error,
    sample_tasks,
)
from icl_probes.looped.outdir import prepare_out

LOSSES = ("last", "mean")
ETA_MODES = ("per-loop", "shared")


@dataclass(frozen=True)
class TrainConfig:
    """d, n: task size; T: loops in training; eval_loops: loops at evaluation (beyond T tests extrapolation);
    steps, batch, lr: Adam on fresh tasks each step, lr with cosine decay to 0; clip: gradient-norm clip;
    curriculum: steps over which the training loop count grows from 1 to T (0: always T);
    losses: objectives ('last', 'mean'); eta_modes: 'per-loop' (T learned step sizes, the last reused
    past T) and/or 'shared' (one step size); one model per (loss, eta mode);
    eval_tasks: held-out tasks; log_every: steps between logged losses and checkpoints; float64: dtype."""

    d: int = 5
    n: int = 20
    T: int = 10
    eval_loops: int = 40
    steps: int = 10000
    batch: int = 256
    lr: float = 1e-2
    clip: float = 1.0
    curriculum: int = 5000
    losses: tuple = LOSSES
    eta_modes: tuple = ETA_MODES
    eval_tasks: int = 4000
    log_every: int = 100
    seed: int = 0
    float64: bool = False
    device: str = "cpu"

    def __post_init__(self):
        for name in ("d", "n", "T", "steps", "batch", "eval_tasks", "log_every"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.eval_loops < self.T:
            raise ValueError(f"eval_loops ({self.eval_loops}) must be >= T ({self.T})")
        if not self.lr > 0 or not self.clip > 0:
            raise ValueError(f"lr and clip must be > 0, got lr={self.lr}, clip={self.clip}")
        if not 0 <= self.curriculum <= self.steps:
            raise ValueError(f"curriculum must be between 0 and steps={self.steps}, got {self.curriculum}")
        bad = [x for x in self.losses if x not in LOSSES]
        if not self.losses or bad:
            raise ValueError(f"losses must be a non-empty subset of {', '.join(LOSSES)}; got {self.losses}")
        bad = [x for x in self.eta_modes if x not in ETA_MODES]
        if not self.eta_modes or bad:
            raise ValueError(f"eta_modes must be a non-empty subset of {', '.join(ETA_MODES)}; got {self.eta_modes}")

    @property
    def dtype(self):
        return torch.float64 if self.float64 else torch.float32

    def runs(self) -> list:
        """The model names, '<loss>/<eta mode>', in training order."""
        return [f"{loss}/{mode}" for mode in self.eta_modes for loss in self.losses]

    def loops_at(self, step: int) -> int:
        """The curriculum: loops trained at ``step`` (0-based), 1 at the start, T from ``curriculum`` on."""
        return self.T if self.curriculum == 0 else min(self.T, 1 + step * self.T // self.curriculum)


PRESETS = {
    "cpu": ({}, "d=5, n=20, T=10, 10000 Adam steps of 256 tasks, 4 models, eval to 40 loops (~3 min on 2 cores)"),
    "paper": (
        dict(
            d=10, n=40, T=20, eval_loops=100, steps=12000, curriculum=6000, batch=1024, eval_tasks=20000, log_every=500
        ),
        "d=10, n=40, T=20, 12000 steps of 1024 tasks, 4 models, eval to 100 loops (GPU)",
    ),
    "smoke": (
        dict(d=3, n=8, T=3, eval_loops=6, steps=20, curriculum=10, batch=16, eval_tasks=64, log_every=10),
        "d=3, n=8, T=3, 20 steps (a test of the plumbing, seconds)",
    ),
}


class LearnedLoop(torch.nn.Module):
    """The Ch. 8 looped linear transformer with trainable Q, P (d+1, d+1) and step sizes eta (T,) or (1,).

    Initialisation is random (no hint of the construction): Q, P ~ N(0, 1/(d+1)) entries and every
    eta = 1/(4 n (d+1)), small enough that the first loops do not blow up. ``init`` is a CPU generator.
    """

    def __init__(self, d: int, n: int, T: int, eta_mode: str, init: torch.Generator, dtype=torch.float32):
        super().__init__()
        std = (d + 1) ** -0.5
        self.T, self.eta_mode = T, eta_mode
        self.Q = torch.nn.Parameter((torch.randn(d + 1, d + 1, generator=init, dtype=torch.float64) * std).to(dtype))
        self.P = torch.nn.Parameter((torch.randn(d + 1, d + 1, generator=init, dtype=torch.float64) * std).to(dtype))
        self.eta = torch.nn.Parameter(
            torch.full((T if eta_mode == "per-loop" else 1,), 1 / (4 * n * (d + 1)), dtype=dtype)
        )

    def schedule(self, loops: int) -> torch.Tensor:
        """The (loops,) step sizes: learned ones for t < T, the last learned one after that."""
        idx = torch.clamp(torch.arange(loops, device=self.eta.device), max=self.eta.numel() - 1)
        return self.eta[idx]

    def forward(self, Z0: torch.Tensor, loops: int) -> torch.Tensor:
        """Z0 (B, n+1, d+1) -> readouts after every loop, (B, loops+1, d) (the fast, equal form of the loop)."""
        return looped_forward_fast(Z0, self.Q, self.P, self.schedule(loops), loops)


def loss_of(outs: torch.Tensor, tasks, objective: str) -> torch.Tensor:
    """Mean relative squared error at the last loop ('last') or averaged over loops 1..T ('mean')."""
    err = relative_sq_error(outs, tasks.theta, tasks.alpha)  # (B, T+1)
    return (err[:, -1] if objective == "last" else err[:, 1:].mean(1)).mean()


def cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    return (torch.dot(a.flatten(), b.flatten()) / (a.norm() * b.norm())).item()


def compare_with_construction(model: LearnedLoop) -> dict:
    """Cosine similarities of the learned weights with the construction (scale-free, so normalised).

    (Q, P) and (cQ, P/c) give the same model for any c != 0, also c < 0, so the sign of cos(Q, I) and
    cos(P, P*) is fixed jointly (cos(Q, I) >= 0). QP is free of that ambiguity; since E[Z^T Z] over
    tasks is n I, eta Q P is the average one-loop update, the construction's being eta diag(I_d, 0).
    """
    Q, P = model.Q.detach().double().cpu(), model.P.detach().double().cpu()
    Qc, Pc = construction(Q.shape[0] - 1)
    d = Q.shape[0] - 1
    sign = 1.0 if cosine(Q, Qc) >= 0 else -1.0
    return {
        "cos_Q": sign * cosine(Q, Qc),
        "cos_P": sign * cosine(P, Pc),
        "cos_QP": cosine(Q @ P, Qc @ Pc),
        "cos_Q_block": sign * cosine(Q[:d, :d], Qc[:d, :d]),
        "cos_P_block": sign * cosine(P[:d, :d], Pc[:d, :d]),
        "Q": Q.tolist(),
        "P": P.tolist(),
        "eta": model.eta.detach().double().cpu().tolist(),
    }


def eval_tasks(cfg: TrainConfig, device):
    """Held-out tasks from their own seed (never seen in training, the same for every model)."""
    return sample_tasks(
        cfg.eval_tasks, cfg.n, cfg.d, torch.Generator().manual_seed(cfg.seed + 10_000), dtype=cfg.dtype, device=device
    )


def error_curves(outs: torch.Tensor, tasks) -> dict:
    """Per loop t = 0..loops: mean and median relative squared error, mean query error |<q,theta*> - alpha|."""
    rel = relative_sq_error(outs, tasks.theta, tasks.alpha)
    return {
        "rel_sq_error_mean": rel.mean(0).tolist(),
        "rel_sq_error_median": rel.median(0).values.tolist(),
        "query_error_mean": query_error(outs, tasks.theta, tasks.alpha).mean(0).tolist(),
    }


@torch.no_grad()
def baselines(cfg: TrainConfig, device) -> dict:
    """The construction with eta = 1/L per task (Thm 8.16) and with the best single eta (tuned at loop T)."""
    tasks = eval_tasks(cfg, device)
    Qc, Pc = construction(cfg.d, dtype=cfg.dtype, device=device)
    L, _ = gram_spectrum(tasks.X)
    out = {
        "construction, eta=1/L": error_curves(
            looped_forward_fast(tasks.input(), Qc, Pc, (1 / L)[:, None].expand(-1, cfg.eval_loops), cfg.eval_loops),
            tasks,
        )
    }
    # Tune the constant eta on separate tasks, at the training loop count, as a learned eta would be.
    tune = sample_tasks(
        cfg.eval_tasks, cfg.n, cfg.d, torch.Generator().manual_seed(cfg.seed + 20_000), dtype=cfg.dtype, device=device
    )
    grid = torch.linspace(0.02, 2.0, 100).tolist()
    score = [
        relative_sq_error(looped_forward_fast(tune.input(), Qc, Pc, c / cfg.n, cfg.T)[:, -1], tune.theta, tune.alpha)
        .mean()
        .item()
        for c in grid
    ]
    score = [s if s == s else float("inf") for s in score]  # a divergent eta gives nan
    best = grid[min(range(len(grid)), key=score.__getitem__)] / cfg.n
    out[f"construction, eta={best:.4f} (tuned)"] = error_curves(
        looped_forward_fast(tasks.input(), Qc, Pc, best, cfg.eval_loops), tasks
    )
    return out


def load_checkpoint(path, device) -> dict:
    """A checkpoint written by :func:`train_one`, loaded with ``weights_only=True``: tensors, numbers and
    dicts only, so a crafted file in --out cannot run code on resume (a full unpickle would)."""
    import pickle

    try:
        state = torch.load(path, map_location=device, weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError, OSError) as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ValueError(
            f"{path}: not a checkpoint this command wrote (refused to unpickle anything but tensors and "
            f"plain values: {first}). Delete it to restart that run from step 0"
        ) from None
    if not isinstance(state, dict) or not {"model", "opt", "data_rng", "step"} <= set(state):
        raise ValueError(
            f"{path}: not a checkpoint this command wrote (it lacks model/opt/data_rng/step). "
            "Delete it to restart that run from step 0"
        )
    return state


def train_one(cfg: TrainConfig, run: str, out, progress: bool = True) -> dict:
    """Train (or resume from out/ckpt_<loss>_<eta mode>.pt) the model ``run``; returns its evaluation row."""
    device = resolve_device(cfg.device)
    objective, eta_mode = run.split("/")
    ckpt_path = out / f"ckpt_{objective}_{eta_mode}.pt"
    init = seed_everything(cfg.seed)  # the same Q, P init for every run: only the objective / eta mode differ
    model = LearnedLoop(cfg.d, cfg.n, cfg.T, eta_mode, init, cfg.dtype).to(device)
    opt = torch.optim.Adam(model.parameters(), lr=cfg.lr)
    data = torch.Generator().manual_seed(cfg.seed + 1)
    step = 0
    if ckpt_path.exists():
        state = load_checkpoint(ckpt_path, device)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        data.set_state(state["data_rng"])
        step = state["step"]
    bar = tqdm(total=cfg.steps, initial=step, desc=f"train {run}", disable=not progress)
    running = []
    while step < cfg.steps:
        tasks = sample_tasks(cfg.batch, cfg.n, cfg.d, data, dtype=cfg.dtype, device=device)
        loss = loss_of(model(tasks.input(), cfg.loops_at(step)), tasks, objective)
        for group in opt.param_groups:  # cosine decay: a late high lr kicks the loop product out of its minimum
            group["lr"] = cfg.lr * 0.5 * (1 + math.cos(math.pi * step / cfg.steps))
        opt.zero_grad()
        loss.backward()
        # Clipping keeps a batch with a badly conditioned X^T X from throwing the step sizes off.
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.clip)
        opt.step()
        step += 1
        running.append(loss.item())
        bar.update(1)
        if step % cfg.log_every == 0 or step == cfg.steps:
            with replacing(ckpt_path) as tmp:  # a kill mid-save leaves the previous checkpoint intact
                torch.save(
                    {"model": model.state_dict(), "opt": opt.state_dict(), "data_rng": data.get_state(), "step": step},
                    tmp,
                )
            append_jsonl(
                out / "rows.jsonl",
                {
                    "kind": "log",
                    "run": run,
                    "step": step,
                    "loops": cfg.loops_at(step - 1),
                    "loss": sum(running) / len(running),
                },
            )
            bar.set_postfix(loss=f"{running[-1]:.2e}")
            running = []
    bar.close()
    with torch.no_grad():
        tasks = eval_tasks(cfg, device)
        row = {
            "kind": "final",
            "run": run,
            **error_curves(model(tasks.input(), cfg.eval_loops), tasks),
            **compare_with_construction(model),
        }
    return row


def run_train(cfg: TrainConfig, out, progress: bool = True) -> list:
    """Experiment B: train one model per (loss, eta mode) (resumable), evaluate, add the construction baselines.

    Writes out/rows.jsonl (logged losses, one 'final' row per model, one 'baselines' row) and the
    checkpoints; returns the rows. ``report.py`` turns them into results.json, table.md and the plot.
    """
    out = prepare_out(out, cfg, "train")
    rows = read_jsonl(out / "rows.jsonl")
    done = {r["run"] for r in rows if r["kind"] == "final"} | {"baselines" for r in rows if r["kind"] == "baselines"}
    units = [Unit("rows.jsonl", run) for run in cfg.runs()] + [Unit("rows.jsonl", "baselines")]
    compute(
        missing(units, {"rows.jsonl": done}),
        lambda u: (
            {"kind": "baselines", **baselines(cfg, resolve_device(cfg.device))}
            if u.key == "baselines"
            else train_one(cfg, u.key, out, progress)
        ),
        lambda u, row: append_jsonl(out / "rows.jsonl", row),
        desc="models",
        noun="model",
        progress=False,  # train_one shows each model's own bar
    )
    return read_jsonl(out / "rows.jsonl")
