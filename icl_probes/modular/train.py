"""Training loop of appendix C.10.1: cross-entropy, AdamW with betas (0.9, 0.98) and linear warm-up.

One loop serves the network of Eq. 4.2 and both transformers: any module mapping long (B, k) inputs to
(B, p) logits. Full-batch when batch_size is 0 or covers the train set (the small data sets here make
that the fastest choice on CPU); otherwise minibatches from a seeded permutation per epoch.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F

from icl_probes.modular.data import Split


@dataclass(frozen=True)
class TrainConfig:
    """Optimiser and schedule. weight_decay is AdamW's decoupled decay (the paper's lambda).

    schedule: "constant" (the paper: warm-up then constant) or "cosine" (warm-up, then cosine decay to
    lr * min_lr_ratio; a named deviation used by CPU presets to settle the Fourier features sooner).
    """

    steps: int = 3000
    lr: float = 5e-3
    weight_decay: float = 0.005
    betas: tuple[float, float] = (0.9, 0.98)
    warmup: int = 10
    batch_size: int = 1024
    schedule: str = "constant"
    min_lr_ratio: float = 0.0
    eval_every: int = 100

    def check(self) -> None:
        if self.steps < 1:
            raise ValueError(f"steps={self.steps}: must be >= 1")
        if self.lr <= 0:
            raise ValueError(f"lr={self.lr}: must be > 0")
        if self.weight_decay < 0:
            raise ValueError(f"weight_decay={self.weight_decay}: must be >= 0")
        if self.batch_size < 0:
            raise ValueError(f"batch_size={self.batch_size}: must be >= 0 (0 means full batch)")
        if self.schedule not in ("constant", "cosine"):
            raise ValueError(f"schedule={self.schedule!r}: allowed are 'constant' and 'cosine'")
        if self.eval_every < 1:
            raise ValueError(f"eval_every={self.eval_every}: must be >= 1")


def lr_factor(step: int, cfg: TrainConfig) -> float:
    """Multiplier of cfg.lr at ``step`` (0-based): linear warm-up over cfg.warmup steps, then the schedule."""
    if step < cfg.warmup:
        return (step + 1) / cfg.warmup
    if cfg.schedule == "constant":
        return 1.0
    t = (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup)
    return cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * t))


@torch.no_grad()
def evaluate(model, x: torch.Tensor, y: torch.Tensor, chunk: int = 16384) -> tuple[float, float]:
    """(mean cross-entropy, accuracy) of ``model`` on x (N, k), y (N,), in chunks to bound memory."""
    loss, correct = 0.0, 0
    for s in range(0, len(x), chunk):
        logits = model(x[s : s + chunk]).float()
        loss += F.cross_entropy(logits, y[s : s + chunk], reduction="sum").item()
        correct += (logits.argmax(-1) == y[s : s + chunk]).sum().item()
    return loss / len(x), correct / len(x)


def train(
    model: torch.nn.Module,
    split: Split,
    cfg: TrainConfig,
    seed: int = 0,
    on_eval: Callable[[dict], None] | None = None,
    progress: bool = True,
    stop: Callable[[dict], bool] | None = None,
    desc: str = "train",
    deadline: float | None = None,
) -> list[dict]:
    """Train ``model`` on split.x_train and return one row per evaluation.

    split must already be on the model's device. Evaluations happen at step 0, every cfg.eval_every
    steps and at the end; each row {step, lr, train_loss, train_acc, test_loss, test_acc} is passed to
    ``on_eval`` (e.g. to append it to a JSONL file) as soon as it exists. Training ends early when
    ``stop(row)`` returns True for an evaluation row, or at the first step past ``deadline`` (a
    ``time.time()`` value; the row then gets ``time_limit=True``), so a run on a time budget still
    returns its curves.
    """
    from tqdm.auto import tqdm

    cfg.check()
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=cfg.betas, weight_decay=cfg.weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_factor(s, cfg))
    n = len(split.x_train)
    full = cfg.batch_size == 0 or cfg.batch_size >= n
    gen = torch.Generator().manual_seed(seed)
    order, pos = None, n
    history: list[dict] = []

    def log(step: int) -> None:
        model.eval()
        tr_loss, tr_acc = evaluate(model, split.x_train, split.y_train)
        te_loss, te_acc = evaluate(model, split.x_test, split.y_test)
        model.train()
        row = dict(
            step=step,
            lr=opt.param_groups[0]["lr"],
            train_loss=tr_loss,
            train_acc=tr_acc,
            test_loss=te_loss,
            test_acc=te_acc,
        )
        history.append(row)
        if on_eval is not None:
            on_eval(row)
        bar.set_postfix(train=f"{tr_acc:.3f}", test=f"{te_acc:.3f}", loss=f"{tr_loss:.2e}")

    bar = tqdm(range(cfg.steps), desc=desc, disable=not progress, mininterval=2.0)
    model.train()
    log(0)
    for step in bar:
        if full:
            xb, yb = split.x_train, split.y_train
        else:
            if pos + cfg.batch_size > n:  # a fresh seeded permutation each epoch
                order, pos = torch.randperm(n, generator=gen).to(split.x_train.device), 0
            idx = order[pos : pos + cfg.batch_size]
            pos += cfg.batch_size
            xb, yb = split.x_train[idx], split.y_train[idx]
        loss = F.cross_entropy(model(xb).float(), yb)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sched.step()
        if (step + 1) % cfg.eval_every == 0 or step + 1 == cfg.steps:
            log(step + 1)
            if stop is not None and stop(history[-1]):
                break
        if deadline is not None and time.time() > deadline and step + 1 < cfg.steps:
            if history[-1]["step"] != step + 1:
                log(step + 1)
            history[-1]["time_limit"] = True
            break
    bar.close()
    return history
