"""Experiment B's outputs: results.json, table.md and the error-vs-loops plot from rows.jsonl.

Paper: Z. Shi (2024), Ch. 8 (the construction the learned weights are compared with); beyond the paper.
"""

from __future__ import annotations

from pathlib import Path

from icl_probes.common import pyplot
from icl_probes.io import save_png, write_json, write_text
from icl_probes.looped.train import TrainConfig


def summarise(cfg: TrainConfig, rows: list) -> dict:
    """Per model: error curves, the loss log and the cosines; the construction baselines; the loop checks."""
    finals = {r["run"]: r for r in rows if r["kind"] == "final"}
    base = next((r for r in rows if r["kind"] == "baselines"), {})
    models = {}
    for run in cfg.runs():
        if run not in finals:
            continue
        r = finals[run]
        e = r["rel_sq_error_mean"]
        log = {}
        for row in rows:  # a resumed run may log a step twice; the later row wins
            if row["kind"] == "log" and row["run"] == run:
                log[row["step"]] = row["loss"]
        models[run] = {
            **{k: v for k, v in r.items() if k not in ("kind", "run")},
            "loss_log": sorted(log.items()),
            # "more loops, lower error": within training and past it
            "monotone_to_T": all(e[t + 1] <= e[t] for t in range(cfg.T)),
            "error_at_T": e[cfg.T],
            "error_at_2T": e[min(2 * cfg.T, cfg.eval_loops)],
            "error_at_end": e[cfg.eval_loops],
            "best_loop": min(range(len(e)), key=e.__getitem__),
        }
    return {
        "config": {k: getattr(cfg, k) for k in cfg.__dataclass_fields__},
        "models": models,
        "baselines": {k: v for k, v in base.items() if k != "kind"},
    }


def _fmt(x: float) -> str:
    return f"{x:.1e}" if x == x and abs(x) < 1e30 else ("diverged" if x == x else "nan")


def markdown_table(results: dict) -> str:
    """Error at chosen loop counts for every model and baseline, then the cosines with the construction."""
    cfg = results["config"]
    T, E = cfg["T"], cfg["eval_loops"]
    loops = sorted({1, 2, T // 2, T, min(2 * T, E), E} - {0})
    head = " | ".join(f"t={t}" for t in loops)
    lines = [
        f"Mean relative squared error ||TF/alpha - theta*||^2 on {cfg['eval_tasks']} held-out tasks "
        f"(d={cfg['d']}, n={cfg['n']}, trained with T={T} loops; t > {T} is extrapolation):",
        "",
        f"| model | {head} | query error at t={T} |",
        "|---|" + "---|" * (len(loops) + 1),
    ]
    curves = [(f"learned {k}", v) for k, v in results["models"].items()] + list(results["baselines"].items())
    for name, v in curves:
        e, q = v["rel_sq_error_mean"], v["query_error_mean"]
        lines.append(f"| {name} | " + " | ".join(_fmt(e[t]) for t in loops) + f" | {_fmt(q[T])} |")
    lines += [
        "",
        "Learned weights against the construction (cosine after normalisation; (Q, P) and (cQ, P/c) are the "
        "same model, so the sign is fixed by cos(Q, I) >= 0):",
        "",
        "| model | cos(Q, I) | cos(P, P*) | cos(QP, Q*P*) | cos(Q[:d,:d], I_d) | cos(P[:d,:d], I_d) | "
        "error falls every loop to T | best loop |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for k, v in results["models"].items():
        lines.append(
            f"| {k} | {v['cos_Q']:.3f} | {v['cos_P']:.3f} | {v['cos_QP']:.3f} | {v['cos_Q_block']:.3f} | "
            f"{v['cos_P_block']:.3f} | {'yes' if v['monotone_to_T'] else 'no'} | {v['best_loop']} |"
        )
    return "\n".join(lines) + "\n"


def plot(results: dict, path: Path) -> None:
    """Error against loops (log scale): learned models solid, the construction dashed, T marked."""
    plt = pyplot()
    cfg = results["config"]
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(11, 4.2), gridspec_kw={"width_ratios": [3, 2]})
    for name, v in results["models"].items():
        e = [x if x == x and x < 1e6 else float("nan") for x in v["rel_sq_error_mean"]]  # cut diverged tails
        ax.semilogy(range(len(e)), e, lw=2, label=f"learned, {name}")
    for name, v in results["baselines"].items():
        ax.semilogy(range(len(v["rel_sq_error_mean"])), v["rel_sq_error_mean"], ls="--", lw=1.5, label=name)
    ax.axvline(cfg["T"], color="gray", lw=0.8, ls=":")
    ax.text(cfg["T"], 1e3, " T (training)", color="gray", fontsize=8, va="top")
    ax.set_ylim(None, 1e3)
    ax.set_xlabel("loops t")
    ax.set_ylabel(r"mean $\|TF^{(t)}/\alpha - \theta^*\|^2$")
    ax.set_title(f"Learned looped transformer, d={cfg['d']}, n={cfg['n']}, T={cfg['T']}")
    ax.legend(fontsize=7, loc="lower left")
    for name, v in results["models"].items():
        steps, loss = zip(*v["loss_log"])
        ax2.semilogy(steps, loss, label=name)
    ax2.set_xlabel("training step")
    ax2.set_ylabel("training loss (curriculum: loops grow to T)")
    ax2.legend(fontsize=7)
    save_png(fig, path)


def write_outputs(cfg: TrainConfig, rows: list, out, png=None) -> dict:
    """results.json, table.md and the plot (``png`` or out/train.png); returns the results."""
    out = Path(out)
    results = summarise(cfg, rows)
    write_json(out / "results.json", results)
    write_text(out / "table.md", markdown_table(results))
    plot(results, png or out / "train.png")
    return results
