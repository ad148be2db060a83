"""``gemfilter inspect`` and ``gemfilter calibrate``: figures and tables from last-row traces.

Paper: Shi et al. 2024, Figs. 9.2, 9.5 and G.5. Every figure is a PNG.
"""

from __future__ import annotations

import sys
from pathlib import Path

from gemfilter.toolkit.entry import require
from gemfilter.toolkit.io import save_png
from gemfilter.toolkit.trace import gemfilter_kept, needle_distances, needle_token_span, snapkv_kept, trace


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _shade_sliding(ax, sliding, horizontal=False):
    for layer, w in enumerate(sliding):
        if w is not None:
            (ax.axhspan if horizontal else ax.axvspan)(layer - 0.5, layer + 0.5, color="0.92", zorder=0)


def plot_needle_distance(distances, sliding, path, title):
    """Fig. 9.5: min |top-k index - needle index| per layer; grey bands are sliding-window layers."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 3.6))
    _shade_sliding(ax, sliding)
    ax.plot(range(len(distances)), distances, marker="o")
    ax.axhline(0, color="green", lw=0.8)
    ax.set_xlabel("layer (grey: sliding-window)")
    ax.set_ylabel("min |top-k index − needle index|")
    ax.set_title(title)
    fig.tight_layout()
    save_png(fig, path, dpi=120)


def plot_attention_map(rows, span, sliding, path, title):
    """Fig. 9.2: last-row attention, layers x input positions (log colour scale)."""
    plt = _plt()
    from matplotlib.colors import LogNorm

    fig, ax = plt.subplots(figsize=(10, 4.2))
    data = rows.clamp(min=1e-6).numpy()
    im = ax.imshow(data, aspect="auto", interpolation="nearest", norm=LogNorm(vmin=1e-6, vmax=1), cmap="viridis")
    ax.axvspan(span[0] - 0.5, span[1] - 0.5, color="red", alpha=0.25, label="needle")
    ax.set_yticks(range(len(sliding)))
    ax.set_yticklabels([f"{i}{'' if w is None else ' (sw)'}" for i, w in enumerate(sliding)], fontsize=7)
    ax.set_xlabel("input position")
    ax.set_ylabel("layer (sw: sliding-window)")
    ax.legend(loc="upper left")
    fig.colorbar(im, ax=ax, label="attention of the last token (head mean)")
    ax.set_title(title)
    fig.tight_layout()
    save_png(fig, path, dpi=120)


def plot_kept(kept: dict, n, span, layers, path, title):
    """Fig. G.5: kept input positions per layer, one panel per method; the needle span is shaded."""
    plt = _plt()
    fig, axes = plt.subplots(1, len(kept), figsize=(6 * len(kept), 4.2), sharey=True)
    for ax, (method, per_layer) in zip(axes, kept.items()):
        for layer, idx in enumerate(per_layer):
            ax.scatter(idx, [layer] * len(idx), s=1.5, color="tab:blue")
        ax.axvspan(span[0], span[1], color="red", alpha=0.3, label="needle")
        ax.set_xlim(0, n)
        ax.set_title(method)
        ax.set_xlabel("input position")
    axes[0].set_ylabel("layer")
    axes[0].set_yticks(range(layers))
    axes[0].legend(loc="upper left")
    fig.suptitle(title)
    fig.tight_layout()
    save_png(fig, path, dpi=120)


def _num_layers(config) -> int:
    from ...compat import text_config

    return int(text_config(config).num_hidden_layers)


def _check_inspect(args) -> Path:
    """Option checks that need no weights (only the model's config); returns the checked --out."""
    from gemfilter.toolkit.io import check_out_dir
    from gemfilter.toolkit.options import check_against_model, check_int, parse_length

    from ...models import load_config

    args.length = parse_length(args.length, "--length")
    check_int(args.topk, "--topk", 1)
    if not 0 <= args.depth <= 100:
        raise ValueError(f"--depth {args.depth} is outside [0, 100] (a percent of the context)")
    config = load_config(args.model)
    check_against_model(config, lengths=(args.length,), length_flag="--length")
    m = _num_layers(config)
    if args.print_selection is not None and not 0 <= args.print_selection < m:
        raise ValueError(f"--print-selection {args.print_selection} is outside [0, {m}): this model has {m} layers")
    return check_out_dir(
        args.out, files=("needle_distance.png", "attention_last_row.png", "kept_per_layer.png", "inspect.json")
    )


def _check_calibrate(args) -> tuple:
    """(lengths, depths, ks), every check that needs no weights, and the calibration folder writable."""
    from gemfilter.toolkit.io import check_out_dir
    from gemfilter.toolkit.options import check_against_model, parse_depths, parse_lengths, parse_positive_ints

    from ...layers import calibration_path
    from ...models import load_config

    lengths = parse_lengths(args.lengths, "--lengths")
    depths = parse_depths(args.depths, "--depths")
    ks = parse_positive_ints(args.topk_grid, "--topk-grid")
    if not 0 < args.threshold <= 1:
        raise ValueError(f"--threshold {args.threshold} is outside (0, 1]: it is the share of probes that must pass")
    check_against_model(load_config(args.model), lengths=lengths)
    if not args.dry_run:
        check_out_dir(calibration_path("x").parent, flag="the calibration folder")
    return lengths, depths, ks


def _cmd_inspect(args) -> int:
    from gemfilter.toolkit.haystack import NEEDLE, build_case
    from gemfilter.toolkit.io import write_json_atomic

    from ...models import load_model

    out = _check_inspect(args)
    require("plots", "gemfilter inspect")
    model, tok = load_model(args.model, attn=args.attn)
    case = build_case(tok, args.length, args.depth, haystack_dir=args.haystack_dir)
    ids = tok(case.prompt, return_tensors="pt")["input_ids"]
    span = needle_token_span(tok, case.prompt, NEEDLE)
    tr = trace(model, ids)
    name = args.model or "embedded Gemma 3 270M"
    dist = needle_distances(tr, span, args.topk)
    plot_needle_distance(
        dist,
        tr.sliding,
        out / "needle_distance.png",
        f"{name}: needle distance per layer (n={tr.n}, k={args.topk}, depth {args.depth}%)",
    )
    plot_attention_map(
        tr.stack("attn_last_row"),
        span,
        tr.sliding,
        out / "attention_last_row.png",
        f"{name}: last-row attention per layer (n={tr.n})",
    )
    kept = {
        "GemFilter": [gemfilter_kept(tr, i, args.topk) for i in range(tr.layers)],
        "SnapKV (head mean)": [snapkv_kept(tr, i, args.topk) for i in range(tr.layers)],
    }
    plot_kept(
        kept, tr.n, span, tr.layers, out / "kept_per_layer.png", f"{name}: kept positions per layer, k={args.topk}"
    )
    record = {
        "n": tr.n,
        "needle": list(span),
        "topk": args.topk,
        "needle_distance": dist,
        "sliding_layers": [i for i, w in enumerate(tr.sliding) if w is not None],
    }
    write_json_atomic(out / "inspect.json", record)
    print("layer  type     needle distance")
    for i, d in enumerate(dist):
        print(f"{i:>5}  {'sliding' if tr.sliding[i] else 'full':<7}  {d}")
    if args.print_selection is not None:
        idx = kept["GemFilter"][args.print_selection]
        print(f"\n--- kept text at layer {args.print_selection} (k={args.topk}) ---")
        print(tok.decode(ids[0, idx]))
    print(f"wrote {out}/needle_distance.png, attention_last_row.png, kept_per_layer.png, inspect.json", file=sys.stderr)
    return 0


def _cmd_calibrate(args) -> int:
    from tqdm import tqdm

    from ...models import load_model
    from .calibrate import calibrate, format_table

    lengths, depths, ks = _check_calibrate(args)
    model, tok = load_model(args.model, attn=args.attn)
    with tqdm(total=len(lengths) * len(depths), desc="calibration probes") as bar:
        record = calibrate(
            model,
            tok,
            lengths=lengths,
            depths=depths,
            ks=ks,
            threshold=args.threshold,
            haystack_dir=args.haystack_dir,
            save=not args.dry_run,
            progress=bar.update,
        )
    print(format_table(record))
    print(
        f"\nrecommended: layer {record['layer']}, k={record['topk']} (the smallest k at which a full-attention "
        f"layer's top-k reaches the needle in >= {args.threshold:.0%} of {len(record['probes'])} probes; the first "
        "such layer)"
    )
    if "path" in record:
        print(f"stored in {record['path']}: generate now uses layer {record['layer']} by default for this model")
    return 0


def add_subcommands(sub) -> None:
    from gemfilter.toolkit.options import add_method_options

    from ...models import add_attn_argument

    p = sub.add_parser(
        "inspect",
        help="per-layer needle distance, last-row attention map, kept positions (PNG)",
        description="Trace one NIAH prompt through every layer, storing only last rows, and plot "
        "Fig. 9.5 (needle distance per layer), Fig. 9.2 (last-row attention) and Fig. G.5 "
        "(GemFilter vs SnapKV kept positions).",
    )
    p.add_argument("--model", default=None, help="HF id or local path (default: embedded Gemma 3 270M)")
    add_attn_argument(p)
    p.add_argument("--length", default="2000", help="context length in tokens, k = thousands, e.g. 2k (default 2000)")
    p.add_argument("--depth", type=float, default=50, help="needle depth in percent (default 50)")
    # k of the traced kept sets, not a method's budget: no method is built, so no --method and its own default
    add_method_options(
        p,
        methods=None,
        layer=False,
        topk_default=256,
        topk_help="k of the kept sets drawn at every layer, GemFilter's and SnapKV's (default 256)",
    )
    p.add_argument("--haystack-dir", default=None, help="folder of .txt files (default: the PG essays)")
    p.add_argument(
        "--print-selection",
        type=int,
        default=None,
        metavar="LAYER",
        help="also print GemFilter's kept text at this layer",
    )
    p.add_argument("--out", default="results/inspect", help="output folder (default results/inspect)")
    p.set_defaults(func=_cmd_inspect)

    p = sub.add_parser(
        "calibrate",
        help="choose a model's filter layer and k from NIAH probes (paper's rule)",
        description="Run short NIAH probes and measure, for every layer and k, how often GemFilter's "
        "top-k reaches the needle. At the smallest k where a full-attention layer does so in at least "
        "--threshold of the probes, recommend the first such layer (the paper's rule) and that k, and "
        "store them as this model's default.",
    )
    p.add_argument("--model", default=None, help="HF id or local path (default: embedded Gemma 3 270M)")
    add_attn_argument(p)
    p.add_argument(
        "--lengths", default="1000,2000,4000", help="probe lengths in tokens, k = thousands (default 1000,2000,4000)"
    )
    p.add_argument("--depths", default="10,50,90", help="probe depths in percent (default 10,50,90)")
    p.add_argument("--topk-grid", default="256,512,1024", help="k values to test (default 256,512,1024)")
    p.add_argument("--threshold", type=float, default=0.8, help="coverage needed (default 0.8)")
    p.add_argument("--haystack-dir", default=None, help="folder of .txt files (default: the PG essays)")
    p.add_argument("--dry-run", action="store_true", help="print the table but do not store the result")
    p.set_defaults(func=_cmd_calibrate)
