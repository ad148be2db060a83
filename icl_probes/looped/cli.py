"""``python -m icl_probes.looped``: the looped-transformer experiments of Ch. 8 (Z. Shi, 2024).

Subcommands: ``fig81`` (Experiment A, Fig. 8.1), ``train`` (Experiment B, learned Q and P) and
``check`` (the construction against a plain gradient-descent loop, to float64 precision).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys

from gemfilter.toolkit.entry import command

EPILOG = """subcommands:
  fig81   Fig. 8.1: the constructed looped transformer (Q = I, P = diag(I_d, 0)) with eta = 1/L against
          the Thm 8.16 bound -t/kappa; kappa table next to the paper's 4.57, 3.13, 2.07, 1.62
  train   beyond the paper: learn Q, P and the step sizes by Adam on random tasks; error against loops
          (also past the trained loop count) and cosine similarity with the construction
  check   TF(Z^(T)) against alpha * theta^(T) from a plain GD loop, random X, several T, varying eta

examples:
  python -m icl_probes.looped fig81 --out results/looped/fig81 --png icl_probes/figures/looped_fig81.png
  python -m icl_probes.looped train --preset cpu --threads 2 --out results/looped/train_cpu
  python -m icl_probes.looped train --preset paper --device cuda --out results/looped/train_paper
  python -m icl_probes.looped check --float64

Every subcommand has its own --help. Runs resume: rerun the same command into the same --out."""


def _ints(text: str) -> tuple:
    try:
        vals = tuple(int(s) for s in text.split(",") if s.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers such as 16,32,64; got {text!r}") from None
    if not vals:
        raise argparse.ArgumentTypeError("expected at least one integer")
    return vals


def _names(allowed):
    def parse(text: str) -> tuple:
        vals = tuple(s.strip() for s in text.split(",") if s.strip())
        bad = [v for v in vals if v not in allowed]
        if not vals or bad:
            raise argparse.ArgumentTypeError(f"expected a comma-separated subset of {','.join(allowed)}; got {text!r}")
        return vals

    return parse


def _common(p, out_default: str, float64_default: bool, float64_help: str):
    p.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    p.add_argument("--float64", action=argparse.BooleanOptionalAction, default=float64_default, help=float64_help)
    p.add_argument(
        "--device", default="cpu", help="auto, cpu, cuda or cuda:N (default cpu; auto picks cuda if present)"
    )
    p.add_argument(
        "--threads", type=int, default=0, help="torch CPU threads (default: torch's choice; use 2 on a shared box)"
    )
    p.add_argument("--out", default=out_default, help=f"output folder (default {out_default})")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def _add_fig81(sub, fmt) -> None:
    """``fig81``: Experiment A: Fig. 8.1 and the kappa table."""
    a = sub.add_parser(
        "fig81",
        formatter_class=fmt,
        help="Experiment A: Fig. 8.1 and the kappa table",
        description="Fig. 8.1: run the constructed looped transformer (Lemma 8.13, Q = I, P = diag(I_d, 0)) "
        "with eta = 1/L for T loops on random tasks and plot ln(||theta^(t)-theta*||^2/||theta*||^2) "
        "(solid) against the Thm 8.16 bound -t/kappa (dashed).",
        epilog="outputs in --out: rows.jsonl (one row per (n, trial), plus kappa statistics per n), "
        "results.json, table.md (mean/median kappa next to the paper's, bound checks, agreement with "
        "plain GD), fig81.png (or --png), config.json.\n\nexamples:\n"
        "  python -m icl_probes.looped fig81 --out results/looped/fig81 --png icl_probes/figures/looped_fig81.png\n"
        "  python -m icl_probes.looped fig81 --n 16,128 --trials 3 --T 50 --out /tmp/fig81_small",
    )
    a.add_argument(
        "--n",
        type=_ints,
        default=(16, 32, 64, 128),
        help="context lengths, comma-separated (default 16,32,64,128); each >= d",
    )
    a.add_argument("--d", type=int, default=4, help="feature dimension (default 4, as in the paper)")
    a.add_argument("--T", type=int, default=200, help="loops (default 200)")
    a.add_argument(
        "--trials", type=int, default=10, help="plotted trials per n (default 10, as in the paper); trial i uses seed+i"
    )
    a.add_argument(
        "--kappa-trials",
        type=int,
        default=1000,
        help="draws of X per n for the kappa mean/median (default 1000; kappa is heavy-tailed at n=16)",
    )
    a.add_argument("--png", default=None, help="where to write the plot (default <out>/fig81.png)")
    _common(
        a,
        "results/looped/fig81",
        True,
        "compute in float64 (default on: the curves reach ~-70 before the "
        "float64 floor; --no-float64 uses float32, whose floor is ~-23)",
    )


def _add_train(sub, fmt) -> None:
    """``train``: Experiment B: learn Q, P and eta by gradient descent."""
    from icl_probes.looped.train import ETA_MODES, LOSSES, PRESETS

    t = sub.add_parser(
        "train",
        formatter_class=fmt,
        help="Experiment B: learn Q, P and eta by gradient descent",
        description="Beyond the paper: train the looped linear transformer's Q, P (random init) and step "
        "sizes with Adam on fresh random tasks, one model per (loss, eta mode), with a loop curriculum, "
        "cosine lr decay and gradient clipping. Evaluate the error against the number of loops, also "
        "past the trained T, next to the construction, and compare the learned Q, P with it.",
        epilog="presets (options given explicitly replace the preset's value):\n"
        + "\n".join(f"  {k:<6} {desc}" for k, (_, desc) in PRESETS.items())
        + "\n\noutputs in --out: rows.jsonl (losses every --log-every steps, one 'final' row per model, the "
        "baselines), ckpt_<loss>_<eta mode>.pt (resume points), results.json, table.md, train.png (or --png), "
        "config.json.\n\nexamples:\n"
        "  python -m icl_probes.looped train --preset cpu --threads 2 --out results/looped/train_cpu "
        "--png icl_probes/figures/looped_train.png\n"
        "  python -m icl_probes.looped train --preset cpu --losses mean --eta-modes shared --steps 4000 --out /tmp/b\n"
        "  python -m icl_probes.looped train --preset paper --device cuda --out results/looped/train_paper",
    )
    t.add_argument("--preset", default="cpu", choices=list(PRESETS), help="named settings (default cpu); see below")
    for name, typ, what in [
        ("d", int, "feature dimension"),
        ("n", int, "in-context examples"),
        ("T", int, "loops during training"),
        ("eval-loops", int, "loops at evaluation (>= T)"),
        ("steps", int, "Adam steps"),
        ("batch", int, "tasks per step"),
        ("lr", float, "peak Adam lr"),
        ("clip", float, "gradient-norm clip"),
        ("curriculum", int, "steps over which the training loops grow from 1 to T (0: no curriculum)"),
        ("eval-tasks", int, "held-out tasks"),
        ("log-every", int, "steps between logged losses and checkpoints"),
    ]:
        t.add_argument(f"--{name}", type=typ, default=None, help=f"{what} (default: the preset's)")
    t.add_argument(
        "--losses",
        type=_names(LOSSES),
        default=None,
        help="objectives, comma-separated: last (error after T loops), mean (averaged over loops 1..T); default both",
    )
    t.add_argument(
        "--eta-modes",
        type=_names(ETA_MODES),
        default=None,
        help="step sizes, comma-separated: per-loop (T of them, the last reused past T), shared (one); default both",
    )
    t.add_argument("--png", default=None, help="where to write the plot (default <out>/train.png)")
    _common(t, "results/looped/train", False, "train in float64 (default float32)")


def _add_check(sub, fmt) -> None:
    """``check``: construction vs a plain GD loop."""
    c = sub.add_parser(
        "check",
        formatter_class=fmt,
        help="construction vs a plain GD loop",
        description="Lemma 8.13 / Thm 8.14 check: for random X, several T and random per-loop step "
        "sizes eta^(t), compare TF(Z^(T)) of the constructed looped transformer with alpha * theta^(T) "
        "from a plain gradient-descent loop on 1/2 ||y - X theta||^2.",
        epilog="outputs in --out: check.json (max abs difference per T); the maximum is also printed.\n\n"
        "examples:\n  python -m icl_probes.looped check --float64\n"
        "  python -m icl_probes.looped check --T 1,5,50 --n 32 --d 8 --float64",
    )
    c.add_argument("--n", type=int, default=16, help="in-context examples (default 16)")
    c.add_argument("--d", type=int, default=4, help="feature dimension (default 4)")
    c.add_argument("--T", type=_ints, default=(1, 2, 10, 100), help="loop counts, comma-separated (default 1,2,10,100)")
    c.add_argument("--tasks", type=int, default=64, help="random tasks per T (default 64)")
    _common(c, "results/looped/check", False, "compute in float64 (agreement ~1e-16 instead of ~1e-6)")


def build_parser() -> argparse.ArgumentParser:
    fmt = argparse.RawDescriptionHelpFormatter
    p = argparse.ArgumentParser(
        prog="python -m icl_probes.looped",
        formatter_class=fmt,
        epilog=EPILOG,
        description="Ch. 8 of Z. Shi (2024): a looped linear transformer Z <- Z - eta Attn(Z; Q, P) with masked "
        "linear attention does multi-step gradient descent on in-context linear regression.",
    )
    sub = p.add_subparsers(dest="command", required=True, metavar="{fig81,train,check}")

    _add_fig81(sub, fmt)
    _add_train(sub, fmt)
    _add_check(sub, fmt)
    return p


def _check(args) -> dict:
    import torch

    from icl_probes.common import resolve_device
    from icl_probes.io import write_json
    from icl_probes.looped.model import construction, gram_spectrum, looped_forward, sample_tasks

    dtype, device = (torch.float64 if args.float64 else torch.float32), resolve_device(args.device)
    gen = torch.Generator().manual_seed(args.seed)
    result = {}
    for T in args.T:
        tasks = sample_tasks(args.tasks, args.n, args.d, gen, dtype=torch.float64)
        L, _ = gram_spectrum(tasks.X)
        eta = torch.rand(args.tasks, T, generator=gen, dtype=torch.float64) * 1.5 / L[:, None]  # eta^(t) in (0, 1.5/L)
        theta = torch.zeros_like(tasks.theta)
        for s in range(T):  # the plain GD loop, in float64 on the CPU
            theta = theta - eta[:, s, None] * torch.einsum(
                "bnd,bn->bd", tasks.X, torch.einsum("bnd,bd->bn", tasks.X, theta) - tasks.y
            )
        Q, P = construction(args.d, dtype=dtype, device=device)
        tf = looped_forward(tasks.input().to(dtype=dtype, device=device), Q, P, eta.to(dtype=dtype, device=device), T)
        result[str(T)] = (tf.double().cpu() - tasks.alpha[:, None] * theta).abs().max().item()
    write_json(f"{args.out}/check.json", {"dtype": str(dtype), "n": args.n, "d": args.d, "max_abs_diff": result})
    print("max |TF - alpha theta_GD| per T:", ", ".join(f"T={k}: {v:.1e}" for k, v in result.items()))
    return result


@command("probes", name="python -m icl_probes.looped")
def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    import torch

    if args.threads < 0:
        parser.error(f"--threads must be >= 0, got {args.threads}")
    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        from icl_probes.io import check_out_dir, check_png_path

        check_out_dir(args.out)  # before any compute
        if getattr(args, "png", None):
            check_png_path(args.png, "--png")
        if args.command == "check":
            _check(args)
        elif args.command == "fig81":
            from icl_probes.looped.fig81 import Fig81Config, run_fig81

            cfg = Fig81Config(
                d=args.d,
                ns=args.n,
                T=args.T,
                trials=args.trials,
                kappa_trials=args.kappa_trials,
                seed=args.seed,
                float64=args.float64,
                device=args.device,
            )
            run_fig81(cfg, args.out, png=args.png, progress=not args.no_progress)
            print(open(f"{args.out}/table.md", encoding="utf-8").read())
        else:
            from icl_probes.looped.train import PRESETS, TrainConfig, run_train
            from icl_probes.looped.train_report import write_outputs

            over = {
                f.name: getattr(args, f.name)
                for f in dataclasses.fields(TrainConfig)
                if f.name not in ("seed", "float64", "device") and getattr(args, f.name, None) is not None
            }
            cfg = TrainConfig(
                **{**PRESETS[args.preset][0], **over, "seed": args.seed, "float64": args.float64, "device": args.device}
            )
            write_outputs(cfg, run_train(cfg, args.out, progress=not args.no_progress), args.out, png=args.png)
            print(open(f"{args.out}/table.md", encoding="utf-8").read())
    except ValueError as err:  # bad values (n < d, a changed config in --out, no GPU, ...) as a usage error
        parser.error(str(err))
    return 0


if __name__ == "__main__":
    sys.exit(main())
