"""Figures in the style of Figs. 4.1-4.4 (Ch. 4), drawn from the result dicts of ``experiments``.

Every function takes the JSON-ready result (so a finished run can be re-plotted without retraining)
and a PNG path, and returns the path.
"""

from __future__ import annotations

import numpy as np

from icl_probes.common import pyplot
from icl_probes.io import save_png


def plot_neurons(result: dict, path, n: int = 6):
    """Fig. 4.1: u_{i,1}(a) over a for the first n neurons after training (top) and its one-sided
    Fourier power over frequencies 1..(p-1)/2 (bottom), with the power at initialisation as outlines."""
    plt = pyplot()
    ex = result["examples"]
    n = min(n, len(ex["neurons"]))
    p = result["config"]["p"]
    fig, axes = plt.subplots(2, n, figsize=(2.6 * n, 4.6), squeeze=False)
    freqs = np.arange(1, (p - 1) // 2 + 1)
    for c in range(n):
        i = ex["neurons"][c]
        u, spec, spec0 = np.array(ex["final"][c]), np.array(ex["final_spectrum"][c]), np.array(ex["init_spectrum"][c])
        top = axes[0, c]
        top.plot(np.arange(p), u, "o-", ms=2.5, lw=1)
        top.set_title(f"neuron {i}: " + r"$u_{i,1}(a)$", fontsize=9)
        top.set_xlabel("a", fontsize=8)
        bot = axes[1, c]
        bot.bar(freqs, spec / spec.sum(), color="C1", label="trained")
        bot.step(freqs, spec0 / spec0.sum(), where="mid", color="k", lw=0.8, label="init")
        bot.set_ylim(0, 1.05)
        bot.set_xlabel("frequency j", fontsize=8)
        bot.set_title(f"max power {spec.max() / spec.sum():.2f} (init {spec0.max() / spec0.sum():.2f})", fontsize=8)
        if c == 0:
            bot.set_ylabel("normalised power")
            bot.legend(fontsize=7)
    k, m = result["config"]["k"], result["m"]
    fig.suptitle(
        f"Eq. 4.2 network, k={k}, p={p}, m={m}: trained embeddings and their Fourier power "
        f"(test acc {result['final']['test_acc']:.3f})",
        fontsize=10,
    )
    fig.tight_layout()
    return save_png(fig, path)


def plot_frequencies(result: dict, path):
    """Fig. 4.2: histogram of each neuron's argmax frequency after training (left) and the per-neuron
    maximum normalised power at initialisation vs after training (right)."""
    plt = pyplot()
    init, final = result["init_power"], result["final_power"]
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 3.8))
    hist = final["histogram"]
    a.bar(np.arange(1, len(hist) + 1), hist, color="C0")
    a.set_xlabel("argmax frequency j")
    a.set_ylabel("number of neurons")
    a.set_title(f"frequencies after training: {final['covered']}/{final['n_freq']} covered")
    bins = np.linspace(0, 1, 41)
    b.hist(init["power"], bins=bins, alpha=0.6, label=f"init (mean {init['mean_power']:.2f})", color="C7")
    b.hist(final["power"], bins=bins, alpha=0.7, label=f"trained (mean {final['mean_power']:.2f})", color="C1")
    b.axvline(0.9, color="k", ls="--", lw=0.8)
    b.set_xlabel("maximum normalised power per neuron")
    b.set_ylabel("number of neurons")
    b.set_title(f"power >= 0.9: {final['frac_power_ge']:.0%} trained vs {init['frac_power_ge']:.0%} at init")
    b.legend()
    cfg = result["config"]
    fig.suptitle(f"k={cfg['k']}, p={cfg['p']}, m={result['m']}", fontsize=10)
    fig.tight_layout()
    return save_png(fig, path)


def plot_kq(result: dict, path):
    """Fig. 4.3: W^{KQ} over token pairs (a, b) for the most active heads (top) and |2-D DFT|^2 with the
    constant term removed (bottom)."""
    plt = pyplot()
    shown = result["shown"]
    n = len(shown["heads"])
    fig, axes = plt.subplots(2, n, figsize=(3.2 * n, 6.2), squeeze=False)
    for c, h in enumerate(shown["heads"]):
        w, f = np.array(shown["w_kq"][c]), np.array(shown["dft2"][c])
        lim = np.abs(w).max()
        axes[0, c].imshow(w, cmap="RdBu_r", vmin=-lim, vmax=lim)
        axes[0, c].set_title(f"head {h}: $W^{{KQ}}$[a, b]", fontsize=9)
        axes[0, c].set_xlabel("b (query token)", fontsize=8)
        axes[0, c].set_ylabel("a (key token)", fontsize=8)
        axes[1, c].imshow(f, cmap="viridis")
        share, inter = result["final_kq"]["share"][h], result["final_kq"]["interaction_share"][h]
        axes[1, c].set_title(f"|2-D DFT|$^2$: top-4 share {share:.2f}\n(interaction part {inter:.2f})", fontsize=9)
        axes[1, c].set_xlabel("frequency j2", fontsize=8)
        axes[1, c].set_ylabel("frequency j1", fontsize=8)
    cfg = result["config"]
    fig.suptitle(
        f"one-layer transformer, k={cfg['k']}, p={cfg['p']}, {cfg['n_heads']} heads: the {n} heads "
        f"with largest ||W^KQ|| (mean top-4 share over all heads {result['final_kq']['mean_share']:.2f}, "
        f"init {result['init_kq']['mean_share']:.2f})",
        fontsize=9,
    )
    fig.tight_layout()
    return save_png(fig, path)


def plot_grokking(rows: list[dict], path):
    """Fig. 4.4: train and test accuracy against steps, one panel per (k, p), with the steps at which
    each first reaches the threshold and the grokking delay between them."""
    plt = pyplot()
    n = len(rows)
    fig, axes = plt.subplots(1, n, figsize=(3.6 * n, 3.4), squeeze=False)
    for ax, r in zip(axes[0], rows):
        steps = [h["step"] for h in r["history"]]
        ax.plot(steps, [h["train_acc"] for h in r["history"]], label="train", color="C0")
        ax.plot(steps, [h["test_acc"] for h in r["history"]], label="validation", color="C3")
        for key, color in (("train_step", "C0"), ("test_step", "C3")):
            if r[key] is not None:
                ax.axvline(r[key], color=color, ls=":", lw=1)
        delay = "not reached" if r["delay"] is None else f"{r['delay']} steps"
        ax.set_title(f"k={r['k']}, p={r['p']}: delay {delay}, gap area {r['gap_area']:.0f}", fontsize=9)
        ax.set_xlabel("step")
        ax.set_ylim(-0.02, 1.02)
    axes[0, 0].set_ylabel("accuracy")
    axes[0, 0].legend(fontsize=8)
    fig.tight_layout()
    return save_png(fig, path)
