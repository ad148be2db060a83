"""NIAH outputs: a heatmap PNG per method, one side-by-side figure, a markdown summary table.

Heatmap conventions (Kamradt / GemFilter repo visualize.py): rows are depth % with 0 at the top,
columns are context length, colormap #F0496E -> #EBB839 -> #0CD79F, vmin 0, vmax 1, thin grey grid,
x label "Token Limit", y label "Depth Percent"; the title names model, method and the average score.
The plotted score is the word recall (the GemFilter repo's plots); cells not run are light grey.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from eval.palette import COLORS
from gemfilter.toolkit.io import save_png, write_text_atomic

from .scoring import METRICS

PLOT_METRIC = "recall"


def methods_in(rows: list) -> list:
    """Method names in first-appearance order."""
    return list(dict.fromkeys(r["method"] for r in rows))


def pivot(rows: list, method: str, metric: str = PLOT_METRIC):
    """(depths, lengths, matrix) for one method; matrix[i, j] = score at depths[i], lengths[j] (NaN if missing).

    The axes are the union over all rows, so every method's heatmap has the same shape.
    """
    depths = sorted({float(r["depth"]) for r in rows})
    lengths = sorted({int(r["length"]) for r in rows})
    grid = np.full((len(depths), len(lengths)), np.nan)
    for r in rows:
        if r["method"] == method:
            grid[depths.index(float(r["depth"])), lengths.index(int(r["length"]))] = r[metric]
    return depths, lengths, grid


def summarize(rows: list) -> list:
    """Per method: cells, mean of every metric, mean kept tokens and mean seconds."""
    out = []
    for m in methods_in(rows):
        mine = [r for r in rows if r["method"] == m]
        entry = {"method": m, "cells": len(mine)}
        for key in (*METRICS, "kept", "prompt_tokens", "seconds"):
            entry[key] = float(np.mean([r[key] for r in mine]))
        out.append(entry)
    return out


def _fmt_depth(d: float) -> str:
    return str(int(d)) if d == int(d) else f"{d:g}"


def draw(ax, rows: list, method: str, model: str, metric: str = PLOT_METRIC, colorbar: bool = True):
    """Draw one method's heatmap on ``ax``; returns the mesh (for a shared colorbar)."""
    from matplotlib.colors import LinearSegmentedColormap

    depths, lengths, grid = pivot(rows, method, metric)
    cmap = LinearSegmentedColormap.from_list("niah", COLORS).with_extremes(bad="#DDDDDD")  # grey: not run
    scale = METRICS[metric].vmax
    # pcolormesh on index edges: one square per cell, grey edges = the grid lines.
    mesh = ax.pcolormesh(
        np.ma.masked_invalid(grid / scale), cmap=cmap, vmin=0, vmax=1, edgecolors="grey", linewidth=0.5
    )
    ax.set_xticks(np.arange(len(lengths)) + 0.5)
    ax.set_xticklabels([str(L) for L in lengths], rotation=45, ha="right")
    ax.set_yticks(np.arange(len(depths)) + 0.5)
    ax.set_yticklabels([_fmt_depth(d) for d in depths])
    ax.set_ylim(len(depths), 0)  # depth 0 at the top
    ax.set_xlabel("Token Limit")
    ax.set_ylabel("Depth Percent")
    avg = float(np.nanmean(grid)) if np.isfinite(grid).any() else float("nan")
    ax.set_title(f"{model} | {method}\naverage score {avg:.3f} ({METRICS[metric].label})")
    if colorbar:
        ax.figure.colorbar(mesh, ax=ax, label="Score")
    return mesh


def _size(rows):
    depths, lengths, _ = pivot(rows, methods_in(rows)[0])
    return max(5.0, 1.5 + 0.45 * len(lengths)), max(3.5, 1.6 + 0.3 * len(depths))


def heatmap_png(rows: list, method: str, model: str, path) -> Path:
    """One method's heatmap, saved to ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    w, h = _size(rows)
    fig, ax = plt.subplots(figsize=(w + 1.5, h + 1), layout="constrained")
    draw(ax, rows, method, model)
    save_png(fig, path, dpi=110)
    return Path(path)


def side_by_side_png(rows: list, model: str, path) -> Path:
    """All methods' heatmaps in one figure (a row of up to 3, else 2 rows of up to 4), one shared colorbar."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    methods = methods_in(rows)
    ncols = len(methods) if len(methods) <= 3 else min(4, math.ceil(len(methods) / 2))
    nrows = math.ceil(len(methods) / ncols)
    w, h = _size(rows)
    fig, axes = plt.subplots(
        nrows, ncols, figsize=(w * ncols + 1.5, (h + 1) * nrows), squeeze=False, layout="constrained"
    )
    mesh = None
    for ax, m in zip(axes.flat, methods):
        mesh = draw(ax, rows, m, model, colorbar=False)
    for ax in list(axes.flat)[len(methods) :]:
        ax.axis("off")
    fig.colorbar(mesh, ax=axes.ravel().tolist(), label="Score", shrink=0.9)
    save_png(fig, path, dpi=110)
    return Path(path)


def markdown_table(rows: list, model: str, settings: str = "") -> str:
    """Per-method averages as a markdown table (score = mean word recall, max 11/12)."""
    lines = [f"# Needle in a Haystack: {model}", ""]
    if settings:
        lines += [settings, ""]
    lines += [
        "| method | average score (word recall) | rouge1 x10 | exact hit | mean kept / prompt tokens "
        "| mean seconds | cells |",
        "|---|---|---|---|---|---|---|",
    ]
    for s in summarize(rows):
        lines.append(
            f"| {s['method']} | {s['recall']:.3f} | {s['rouge1']:.2f} | {s['hit']:.2f} | "
            f"{s['kept']:.0f} / {s['prompt_tokens']:.0f} | {s['seconds']:.2f} | {s['cells']} |"
        )
    return "\n".join(lines) + "\n"


def write_report(rows: list, out, model: str, settings: str = "") -> list:
    """heatmap_<method>.png for each method, heatmaps.png, summary.md; returns the paths written."""
    out = Path(out)
    if not rows:
        raise ValueError(f"no NIAH results in {out}: run the grid first")
    paths = [heatmap_png(rows, m, model, out / f"heatmap_{m}.png") for m in methods_in(rows)]
    paths.append(side_by_side_png(rows, model, out / "heatmaps.png"))
    md = out / "summary.md"
    write_text_atomic(md, markdown_table(rows, model, settings))
    return paths + [md]
