"""Tables and figures of the Sec. 5.5 run (Z. Shi 2024, Thms 5.5.1-5.5.2), built from its rows only.

``markdown(rows)`` is what ``summary.md`` holds and what docs/icl-probes.md quotes; a test builds it again from the
committed rows. ``plot_theory`` draws the loss against N, the noise ratio against M and the accuracy under label
flips and noise; ``plot_train`` the learned heads next to the closed form.
"""

from __future__ import annotations

from icl_probes.common import pyplot
from icl_probes.io import save_png


def _pairs(rows, part):
    return sorted({(r["v1"], r["v2"]) for r in rows if r["part"] == part})


def _closed_table(rows) -> list[str]:
    lines = [
        "| (v1, v2) | d | k | model | neurons (g2* numbering) | ‖W‖² | S1 loss, N→∞ | S2 loss, N→∞ | "
        "S1 signal term: max hinge | p_T bound |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in (r for r in rows if r["part"] == "closed"):
        for name in ("g1", "g2"):
            g = r[name]
            lines.append(
                f"| ({r['v1']}, {r['v2']}) | {r['d']} | {r['k']} | {name}* | "
                f"{','.join(map(str, g['index']))} | "
                f"{g['norm']:.0f} | {g['s1']['loss']:.4f} | {g['s2']['loss']:.4f} | "
                f"{g['signal_s1']['max_hinge']:.3g} | {r['p_t_bound']:.3g} |"
            )
    lines += [
        "",
        "| (v1, v2) | g1* neuron | the same neuron of g2* (a and V) | same up to positive rescaling | "
        "scale (g1* / g2*) |",
        "|---|---|---|---|---|",
    ]
    for r in (r for r in rows if r["part"] == "closed"):
        for s in r["subset"]:
            lines.append(
                f"| ({r['v1']}, {r['v2']}) | {s['index']} | {','.join(map(str, s['exact'])) or 'none'} | "
                f"{','.join(map(str, s['rescaled'])) or 'none'} | "
                f"{', '.join(f'{x:.3g}' for x in s['scale']) or '—'} |"
            )
    return lines


def _loss_table(rows) -> list[str]:
    lines = [
        "| (v1, v2) | N | g1* S1 loss / acc | g2* S1 loss / acc | g1* S2 loss / acc | g2* S2 loss / acc |",
        "|---|---|---|---|---|---|",
    ]
    for v1, v2 in _pairs(rows, "loss"):
        mine = [r for r in rows if r["part"] == "loss" and (r["v1"], r["v2"]) == (v1, v2)]
        for r in sorted(mine, key=lambda r: r["n"]):
            cells = [f"{r[k]['loss']:.3f} / {r[k]['acc']:.3f}" for k in ("g1_s1", "g2_s1", "g1_s2", "g2_s2")]
            lines.append(f"| ({v1}, {v2}) | {r['n']} | " + " | ".join(cells) + " |")
        closed = next((r for r in rows if r["part"] == "closed" and (r["v1"], r["v2"]) == (v1, v2)), None)
        if closed:
            cells = [
                f"{closed[g][s]['loss']:.3f} / {closed[g][s]['acc']:.3f}"
                for g, s in (("g1", "s1"), ("g2", "s1"), ("g1", "s2"), ("g2", "s2"))
            ]
            lines.append(f"| ({v1}, {v2}) | ∞ (exact) | " + " | ".join(cells) + " |")
    return lines


def _ratio_table(rows) -> list[str]:
    lines = [
        "| (v1, v2) | M | E‖P_D1 Ξ‖² (rank/M) | E‖P_D2 Ξ‖² (rank/M) | ratio, Monte Carlo | "
        "(v1+1)/(v2+1) | "
        "ratio on S1 prompts' noise |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in sorted((r for r in rows if r["part"] == "ratio"), key=lambda r: (r["v1"], r["v2"], r["m"])):
        lines.append(
            f"| ({r['v1']}, {r['v2']}) | {r['m']} | {r['xi_e1']:.4g} ({r['rank1'] / r['m']:.4g}) | "
            f"{r['xi_e2']:.4g} ({r['rank2'] / r['m']:.4g}) | {r['xi_ratio']:.3f} ± {r['xi_ratio_se']:.3f} | "
            f"{r['formula']:.3f} | {r['prompt_ratio']:.3f} |"
        )
    return lines


def _flip_table(rows, kind: str) -> list[str]:
    flips = [r for r in rows if r["part"] == "flips"]
    if not flips:
        return []
    levels = [x["level"] for x in flips[0]["rows"] if x["kind"] == kind]
    head = "flip rate" if kind == "flip" else "noise σ"
    lines = [
        "| (v1, v2) | M | " + " | ".join(f"{head} {lv:g}: g1* / g2*" for lv in levels) + " |",
        "|---|---|" + "---|" * len(levels),
    ]
    for r in sorted(flips, key=lambda r: (r["v1"], r["v2"], r["m"])):
        cells = [f"{x['g1_acc']:.3f} / {x['g2_acc']:.3f}" for x in r["rows"] if x["kind"] == kind]
        lines.append(f"| ({r['v1']}, {r['v2']}) | {r['m']} | " + " | ".join(cells) + " |")
    return lines


def _train_key(r: dict) -> tuple:
    return (r["v1"], r["v2"], r["kind"], r["m"], r["seed"])


def _train_table(rows) -> list[str]:
    lines = [
        "| (v1, v2) | m | W | steps | seed | S1 loss | S2 loss | least margin | ‖W‖² | "
        "‖W‖² at margin 1 | "
        "closed form: S2 loss, ‖W‖² | compared with | mean best cos | distinct | off-diagonal share |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in sorted((r for r in rows if r["part"] == "train"), key=_train_key):
        ref = r["closed"]["g1" if r["target"] == "g1*" else "g2"]
        at1 = "—" if r["norm_at_margin_1"] is None else f"{r['norm_at_margin_1']:.0f}"
        lines.append(
            f"| ({r['v1']}, {r['v2']}) | {r['m']} | {r['kind']} | {r['steps']} | {r['seed']} | "
            f"{r['s1_loss']:.2g} | {r['s2_loss']:.3g} | {r['margin']:.3f} | {r['norm']:.0f} | {at1} | "
            f"{ref['s2_loss']:.3g}, {ref['norm']:.0f} | {r['target']} | {r['match']['mean_cos']:.2f} | "
            f"{'yes' if r['match']['distinct'] else 'no'} | {r['match']['offdiag_share']:.2f} |"
        )
    return lines


def markdown(rows: list[dict]) -> str:
    """Every table of the run, in a fixed order (sections left out when the run has no rows of that part)."""
    out = []
    for title, lines in (
        ("Thm 5.5.1: the closed-form neurons (exact, N → ∞)", _closed_table(rows)),
        ("Hinge loss / accuracy against the prompt length N", _loss_table(rows)),
        ("Thm 5.5.2: the noise each model sees", _ratio_table(rows)),
        ("Accuracy on S1 prompts under flipped in-context labels", _flip_table(rows, "flip")),
        ("Accuracy on S1 prompts under Gaussian label noise y + σε", _flip_table(rows, "noise")),
        ("Training the m-head model from small initialisation", _train_table(rows)),
    ):
        if len(lines) > 2:
            out += [f"### {title}", "", *lines, ""]
    return "\n".join(out)


def plot_theory(rows: list[dict], path):
    """Four panels: hinge loss against N (S1, S2; g1*, g2*), the ratio against M with the formula, accuracy against
    the flip rate and against the noise sigma at the largest M."""
    plt = pyplot()
    fig, axes = plt.subplots(1, 4, figsize=(19, 4.2))
    colors = {pair: f"C{i}" for i, pair in enumerate(sorted({(r["v1"], r["v2"]) for r in rows if "v1" in r}))}
    for (v1, v2), c in colors.items():
        loss = sorted((r for r in rows if r["part"] == "loss" and (r["v1"], r["v2"]) == (v1, v2)), key=lambda r: r["n"])
        for key, ls, label in (
            ("g1_s1", "-", "g1* S1"),
            ("g2_s1", "--", "g2* S1"),
            ("g1_s2", ":", "g1* S2"),
            ("g2_s2", "-.", "g2* S2"),
        ):
            if loss:
                axes[0].plot(
                    [r["n"] for r in loss], [r[key]["loss"] for r in loss], ls, color=c, label=f"({v1},{v2}) {label}"
                )
        ratio = sorted(
            (r for r in rows if r["part"] == "ratio" and (r["v1"], r["v2"]) == (v1, v2)), key=lambda r: r["m"]
        )
        if ratio:
            axes[1].errorbar(
                [r["m"] for r in ratio],
                [r["xi_ratio"] for r in ratio],
                yerr=[2 * r["xi_ratio_se"] for r in ratio],
                fmt="o",
                color=c,
                label=f"({v1},{v2}) Ξ, MC ± 2 s.e.",
            )
            axes[1].plot(
                [r["m"] for r in ratio],
                [r["prompt_ratio"] for r in ratio],
                "x",
                color=c,
                label=f"({v1},{v2}) S1 prompts",
            )
            axes[1].axhline(ratio[0]["formula"], color=c, lw=0.8, ls="--")
        flips = [r for r in rows if r["part"] == "flips" and (r["v1"], r["v2"]) == (v1, v2)]
        if flips:
            top = max(flips, key=lambda r: r["m"])
            for ax, kind in ((axes[2], "flip"), (axes[3], "noise")):
                pts = [x for x in top["rows"] if x["kind"] == kind]
                ax.plot(
                    [x["level"] for x in pts],
                    [x["g1_acc"] for x in pts],
                    "-o",
                    color=c,
                    ms=4,
                    label=f"({v1},{v2}) g1* (small), M={top['m']}",
                )
                ax.plot(
                    [x["level"] for x in pts],
                    [x["g2_acc"] for x in pts],
                    "--s",
                    color=c,
                    ms=4,
                    label=f"({v1},{v2}) g2* (large), M={top['m']}",
                )
    axes[0].set(
        xscale="log", xlabel="in-context examples N", ylabel="hinge loss", title="Thm 5.5.1's heads: loss against N"
    )
    axes[1].set(
        xscale="log", xlabel="M", ylabel="E‖P_D1‖² / E‖P_D2‖²", title="Thm 5.5.2: noise ratio (dashed: (v1+1)/(v2+1))"
    )
    axes[2].set(xlabel="share of flipped in-context labels", ylabel="accuracy on S1 tasks", title="label flips")
    axes[3].set(xlabel="label noise σ (y + σ ε)", ylabel="accuracy on S1 tasks", title="Gaussian label noise")
    for ax in axes:
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=6)
    return save_png(fig, path)


def _best_match(row: list, a: float, target: dict) -> tuple:
    """(index into target, cosine) of the closed-form neuron with the same sign of a whose a diag V is closest in
    direction to the learned a_i diag V^(i) (``row``); (len(target), -2) when no neuron has that sign."""
    best = (len(target["a"]), -2.0)
    norm = sum(v * v for v in row) ** 0.5
    for j, (al, dl) in enumerate(zip(target["a"], target["diag_times_4gamma"])):
        if (al > 0) != (a > 0):
            continue
        want = [al * v for v in dl]
        cos = sum(x * y for x, y in zip(row, want)) / max(1e-30, norm * sum(v * v for v in want) ** 0.5)
        best = max(best, (j, cos), key=lambda t: t[1])
    return best


def plot_train(rows: list[dict], path):
    """Per training run: the closed form's a_i 4 gamma diag V^(i) (left) and the learned heads' (right); learned heads
    ordered by the closed-form neuron of the same sign of a they are closest to in direction (labelled i→l)."""
    plt = pyplot()
    runs = sorted((r for r in rows if r["part"] == "train"), key=_train_key)
    closed = {(r["v1"], r["v2"]): r for r in rows if r["part"] == "closed"}
    if not runs:
        fig = plt.figure()
        return save_png(fig, path)
    fig, axes = plt.subplots(
        len(runs),
        2,
        figsize=(9, 1.6 + 1.1 * len(runs) + 0.12 * sum(r["m"] for r in runs)),
        squeeze=False,
        gridspec_kw=dict(width_ratios=(1, 1)),
    )
    for (ax_c, ax_l), r in zip(axes, runs):
        c = closed.get((r["v1"], r["v2"]))
        target = None if c is None else c["g1" if r["target"] == "g1*" else "g2"]
        gamma = r["settings"]["gamma"] if "settings" in r else 0.125
        learned = [[r["a"][i] * 4 * gamma * v for v in r["diag"][i]] for i in range(r["m"])]
        order = list(range(r["m"]))
        labels = [str(i) for i in order]
        if target is not None:
            mat = [[a * v for v in row] for a, row in zip(target["a"], target["diag_times_4gamma"])]
            top = max(abs(v) for row in mat for v in row)
            ax_c.imshow(mat, cmap="RdBu_r", vmin=-top, vmax=top)
            ax_c.set_yticks(range(len(mat)), [str(i) for i in target["index"]], fontsize=6)
            best = [_best_match(learned[i], r["a"][i], target) for i in order]
            order = sorted(order, key=lambda i: (best[i][0], -best[i][1]))
            labels = [f"{i}→{target['index'][best[i][0]]}" for i in order]
        ax_c.set_title(f"{r['target']} (a_i · 4γ diag V^(i))", fontsize=8)
        mat = [learned[i] for i in order]
        vmax = max(1e-12, max(abs(v) for row in mat for v in row))
        ax_l.imshow(mat, cmap="RdBu_r", vmin=-vmax, vmax=vmax)
        ax_l.set_yticks(range(len(order)), labels, fontsize=6)
        ax_l.set_title(
            f"learned: ({r['v1']},{r['v2']}), m={r['m']}, {r['kind']}, S2 loss {r['s2_loss']:.2g}, "
            f"mean best cos {r['match']['mean_cos']:.2f}",
            fontsize=8,
        )
        for ax in (ax_c, ax_l):
            ax.set_xticks([])
    return save_png(fig, path)
