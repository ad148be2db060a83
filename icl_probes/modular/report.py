"""Markdown summaries of the results of ``experiments`` (the compact tables the CLI prints and writes)."""

from __future__ import annotations


def _train_line(cfg: dict) -> str:
    t = cfg["train"]
    return (
        f"AdamW lr {t['lr']}, betas {tuple(t['betas'])}, weight decay {t['weight_decay']}, warm-up {t['warmup']}, "
        f"{t['schedule']} schedule, batch {t['batch_size'] or 'full'}, {t['steps']} steps, seed {cfg['seed']}"
    )


def _limit(r: dict) -> list[str]:
    f = r["final"]
    return [f"**Stopped by --max-minutes at step {f['step']}.**", ""] if f.get("time_limit") else []


def _run_head(r: dict, title: str) -> list[str]:
    """Title, data and training line, preset note, time-limit line and the accuracy rows of one run."""
    c, fin = r["config"], r["final"]
    return [
        title,
        "",
        f"{r['n_train']} train / {r['n_test']} test examples; {_train_line(c)}; {r['seconds']:.0f} s on {r['device']}.",
        f"Preset note: {c['note'] or '-'}",
        "",
        *_limit(r),
        "| | init | trained |",
        "|---|---|---|",
        f"| train accuracy | {r['history'][0]['train_acc']:.4f} | {fin['train_acc']:.4f} |",
        f"| test accuracy | {r['history'][0]['test_acc']:.4f} | {fin['test_acc']:.4f} |",
    ]


def mlp_markdown(r: dict, command: str = "") -> str:
    """Test accuracy, share of neurons with power >= 0.9 (trained vs init), mean power, frequency coverage."""
    c, i, f = r["config"], r["init_power"], r["final_power"]
    lines = _run_head(r, f"## Eq. 4.2 network: k={c['k']}, p={c['p']}, m={r['m']} (Figs. 4.1, 4.2)") + [
        f"| neurons with max normalised power >= 0.9 | {i['frac_power_ge']:.1%} | {f['frac_power_ge']:.1%} |",
        f"| mean max normalised power | {i['mean_power']:.3f} | {f['mean_power']:.3f} |",
        f"| frequencies covered (of 1..{(c['p'] - 1) // 2}) | {i['covered']}/{i['n_freq']} | "
        f"{f['covered']}/{f['n_freq']} |",
        f"| active neurons (norm >= 0.1 x largest) | {i['n_active']}/{r['m']} | {f['n_active']}/{r['m']} |",
        f"| active neurons with power >= 0.9 | {i['frac_power_ge_active']:.1%} | {f['frac_power_ge_active']:.1%} |",
        f"| frequencies covered by active neurons | {i['covered_active']}/{i['n_freq']} | "
        f"{f['covered_active']}/{f['n_freq']} |",
        "",
        f"Argmax-frequency histogram after training (j=1..): {f['histogram']}",
    ]
    if command:
        lines += ["", f"Command: `{command}`"]
    return "\n".join(lines) + "\n"


def transformer_markdown(r: dict, command: str = "") -> str:
    """Accuracy and the 2-D Fourier sparsity of W^{KQ} per head (top-4 share of non-constant power)."""
    c = r["config"]
    share0, share1 = r["init_kq"]["share"], r["final_kq"]["share"]
    ge = lambda s: sum(x >= 0.5 for x in s) / len(s)  # noqa: E731
    title = f"## One-layer transformer: k={c['k']}, p={c['p']}, {c['n_heads']} heads, d_model {c['d_model']} (Fig. 4.3)"
    lines = _run_head(r, title) + [
        f"| mean top-4 share of W^KQ 2-D power | {sum(share0) / len(share0):.3f} | {sum(share1) / len(share1):.3f} |",
        f"| heads with top-4 share >= 0.5 | {ge(share0):.0%} | {ge(share1):.0%} |",
        f"| mean top-4 share of the interaction part (j1, j2 != 0) | {r['init_kq']['mean_interaction_share']:.3f} "
        f"| {r['final_kq']['mean_interaction_share']:.3f} |",
        "",
        "Shown heads (largest ||W^KQ||): "
        + ", ".join(
            f"{h} (share {share1[h]:.2f}, interaction share {r['final_kq']['interaction_share'][h]:.2f}, "
            f"dominant (j1,j2)={tuple(r['final_kq']['dominant'][h])})"
            for h in r["shown"]["heads"]
        ),
    ]
    if command:
        lines += ["", f"Command: `{command}`"]
    return "\n".join(lines) + "\n"


def grok_markdown(rows: list[dict], cfg: dict, command: str = "") -> str:
    """One table row per (k, p): the steps at which train and test accuracy first reach the threshold."""
    thr = cfg["threshold"]
    lines = [
        f"## Grokking against k: two-layer transformers, {cfg['n_heads']} heads, d_model {cfg['d_model']} (Fig. 4.4)",
        "",
        f"{_train_line(cfg)}; {cfg['train_frac']:.0%} train. Preset note: {cfg['note'] or '-'}",
        "",
        f"| k | p | train examples | step train acc >= {thr} | step test acc >= {thr} | grokking delay (steps) "
        "| train-test gap area (acc x steps) | final train / test acc | seconds |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    fmt = lambda v: "not reached" if v is None else str(v)  # noqa: E731
    for r in rows:
        lines.append(
            f"| {r['k']} | {r['p']} | {r['n_train']} | {fmt(r['train_step'])} | {fmt(r['test_step'])} | "
            f"{fmt(r['delay'])} | {r['gap_area']:.0f} | {r['final']['train_acc']:.3f} / {r['final']['test_acc']:.3f}"
            f"{' (time limit at step %d)' % r['final']['step'] if r.get('time_limit') else ''} | {r['seconds']:.0f} |"
        )
    lines += [
        "",
        f"Delays are measured at the evaluation interval ({cfg['train']['eval_every']} steps). The gap area "
        "sums max(0, train acc - test acc) over steps: about the delay for a sharp jump, about 0 when the "
        "curves rise together.",
    ]
    if command:
        lines += ["", f"Command: `{command}`"]
    return "\n".join(lines) + "\n"
