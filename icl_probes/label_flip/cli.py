"""``python -m icl_probes.label_flip``: label-flip ICL (Ch. 5 of Z. Shi's 2024 dissertation).

Subcommands: ``datasets`` (the registry), ``llm`` (Figs. 5.1-5.2), ``ablation`` (Fig. 5.3),
``theory`` (Sec. 5.4). transformers and the model code are imported only by ``llm`` and ``ablation`` (``icl_probes.io``
writes the files).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from gemfilter.toolkit.entry import command
from icl_probes.io import check_out_dir, check_png_path, read_text, replacing, write_json, write_text

FIG_DIR = Path(__file__).resolve().parents[1] / "figures"

EPILOG = """examples:
  python -m icl_probes.label_flip datasets
  python -m icl_probes.label_flip llm --preset cpu-demo            # embedded Gemma 3 270M, synthetic task, ~3 min
  python -m icl_probes.label_flip llm --preset paper --models meta-llama/Llama-2-7b-hf,meta-llama/Llama-2-13b-hf
  python -m icl_probes.label_flip ablation --n-prompts 30           # Fig. 5.3 on the synthetic task
  python -m icl_probes.label_flip theory                            # Thms 5.4.1-5.4.3, closed form vs Monte Carlo

Every subcommand has its own --help."""

PRESETS = {
    # the CPU demo: one small offline task, 3 seeds x 60 prompts x 5 shares (~3 minutes on 2 cores)
    "cpu-demo": dict(models="embedded", datasets="synthetic", seeds="100,13,21", n_eval=60),
    # the paper's scale: six tasks, 5 seeds, 1000 prompts (needs the hub or --data-dir, and big models)
    "paper": dict(models="embedded", datasets="sst2,rte,qqp,mrpc,qnli,subj", seeds="100,13,21,42,87", n_eval=1000),
}


def _ints(text: str, what: str) -> tuple:
    try:
        return tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise ValueError(f"{what} must be comma-separated integers, got {text!r}") from None


def _names(text: str) -> tuple:
    return tuple(x.strip() for x in text.split(",") if x.strip())


def _add_datasets(sub, fmt) -> None:
    """``datasets``: list the registered binary tasks."""
    sub.add_parser(
        "datasets",
        help="list the registered binary tasks",
        formatter_class=fmt,
        description="List the task registry: hub source, prompt fields, label words, evaluation split.",
    )


def _add_llm(sub, fmt) -> None:
    """``llm``: accuracy vs flipped-label share for one or more LLMs (Figs. 5.1-5.2)."""
    from gemfilter.models import add_attn_argument

    llm = sub.add_parser(
        "llm",
        help="accuracy vs flipped-label share for one or more LLMs (Figs. 5.1-5.2)",
        formatter_class=fmt,
        description=(
            "Score M-shot prompts whose exemplar labels are flipped at each share; one JSONL row per "
            "(model, dataset, share, seed, prompt) in OUT/label_flip.jsonl (an interrupted run resumes).\n"
            "Writes OUT/summary.md and OUT/label_flip.png (a panel per dataset plus the average)."
        ),
        epilog="examples:\n  python -m icl_probes.label_flip llm --preset cpu-demo --fig "
        "icl_probes/figures/label_flip_demo.png\n  python -m icl_probes.label_flip llm --datasets sst2 "
        "--data-dir glue_jsonl --models embedded,meta-llama/Llama-3.2-1B --n-eval 200 --seeds 100,13\n"
        "outputs: OUT/label_flip.jsonl, OUT/settings.json, OUT/summary.md, OUT/label_flip.png",
    )
    llm.add_argument(
        "--preset",
        choices=PRESETS,
        default="cpu-demo",
        help="defaults for models/datasets/seeds/n-eval (explicit options win); default: %(default)s",
    )
    llm.add_argument("--models", help="comma-separated: 'embedded' (Gemma 3 270M) or HF ids / local paths")
    llm.add_argument("--datasets", help="comma-separated registry names (see the datasets subcommand)")
    llm.add_argument("--shares", default="0,25,50,75,100", help="flip shares in percent, 0..100 (default: %(default)s)")
    llm.add_argument("--seeds", help="comma-separated seeds; one exemplar set per seed (Min et al.: 100,13,21,42,87)")
    llm.add_argument("--n-eval", type=int, help="evaluation prompts per dataset (fewer if the split is smaller)")
    llm.add_argument("-M", "--m", type=int, default=16, help="in-context exemplars per prompt (default: %(default)s)")
    llm.add_argument(
        "--predict",
        choices=("logprob", "generate"),
        default="logprob",
        help="compare label-word log-probs (default) or parse greedy generations",
    )
    llm.add_argument(
        "--per-prompt", action="store_true", help="fresh exemplars for every query (slower: no shared cache)"
    )
    llm.add_argument("--unbalanced", action="store_true", help="sample exemplars uniformly instead of M/2 per class")
    llm.add_argument("--data-dir", help="local <task>/<split>.jsonl files instead of the hub")
    llm.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N (default: %(default)s)")
    add_attn_argument(llm)
    llm.add_argument("--threads", type=int, default=2, help="torch CPU threads (default: %(default)s)")
    llm.add_argument("--out", default="results/label_flip", help="output folder (default: %(default)s)")
    llm.add_argument("--fig", help="also copy the plot to this PNG path")


def _add_ablation(sub, fmt) -> None:
    """``ablation``: last-row attention: label token vs relevant/irrelevant sentence (Fig. 5.3)."""
    from gemfilter.models import add_attn_argument

    ab = sub.add_parser(
        "ablation",
        help="last-row attention: label token vs relevant/irrelevant sentence (Fig. 5.3)",
        formatter_class=fmt,
        description=(
            "Append an irrelevant sentence to every input, end the prompt with the correct or the wrong "
            "label word, and measure the final layer's last attention row per head on the query sentence "
            "and on its irrelevant sentence (Frobenius norm over heads x span, and mean mass)."
        ),
        epilog="examples:\n  python -m icl_probes.label_flip ablation --n-prompts 30 --fig "
        "icl_probes/figures/label_flip_ablation.png\n"
        "outputs: OUT/ablation.jsonl, OUT/ablation.md, OUT/ablation.png",
    )
    ab.add_argument("--models", default="embedded", help="comma-separated models (default: %(default)s)")
    ab.add_argument("--dataset", default="synthetic", help="registry name (paper: sst2); default: %(default)s")
    ab.add_argument("--n-prompts", type=int, default=100, help="prompts (paper: 100); default: %(default)s")
    ab.add_argument("-M", "--m", type=int, default=16, help="exemplars per prompt (default: %(default)s)")
    ab.add_argument("--share", type=float, default=0, help="percent of exemplar labels flipped (default: %(default)s)")
    ab.add_argument("--seed", type=int, default=100)
    ab.add_argument("--irrelevant-file", help="one irrelevant sentence per line (e.g. from GSM-IC)")
    ab.add_argument("--data-dir", help="local <task>/<split>.jsonl files instead of the hub")
    ab.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N (default: %(default)s)")
    add_attn_argument(ab)
    ab.add_argument("--threads", type=int, default=2)
    ab.add_argument("--out", default="results/label_flip")
    ab.add_argument("--fig", help="also copy the plot to this PNG path")


def _add_theory(sub, fmt) -> None:
    """``theory``: rank-r linear attention under label noise: closed form vs Monte Carlo (Sec. 5.4)."""
    th = sub.add_parser(
        "theory",
        help="rank-r linear attention under label noise: closed form vs Monte Carlo (Sec. 5.4)",
        formatter_class=fmt,
        description=(
            "Thm 5.4.1's optimal rank-r U*, Thm 5.4.2's loss in closed form against a Monte Carlo estimate "
            "for every (r, sigma), slopes in sigma^2 per r, and Thm 5.4.3's gap L(r') - L(r). Pure torch."
        ),
        epilog="examples:\n  python -m icl_probes.label_flip theory --fig icl_probes/figures/label_flip_theory.png\n"
        "  python -m icl_probes.label_flip theory --ranks 1,5,10 --sigmas 0,1,3 --samples 20000\n"
        "outputs: OUT/theory.json, OUT/theory.md, OUT/theory.png",
    )
    th.add_argument("--d", type=int, default=10, help="input dimension (default: %(default)s)")
    th.add_argument("--n-pretrain", type=int, default=1000, help="N, pretraining prompt length (default: %(default)s)")
    th.add_argument("-M", "--m", type=int, default=16, help="evaluation prompt length (default: %(default)s)")
    th.add_argument("--ranks", default="1,2,4,6,8,10", help="model sizes r (default: %(default)s)")
    th.add_argument("--sigmas", default="0,0.5,1,1.5,2", help="label-noise std values (default: %(default)s)")
    th.add_argument("--spectrum", default="inverse", help="eigenvalues: inverse (1/i), flat, geometric (0.7^(i-1))")
    th.add_argument("--samples", type=int, default=100_000, help="Monte Carlo prompts (default: %(default)s)")
    th.add_argument("--seed", type=int, default=0)
    th.add_argument("--out", default="results/label_flip")
    th.add_argument("--fig", help="also copy the plot to this PNG path")


def build_parser() -> argparse.ArgumentParser:
    fmt = argparse.RawDescriptionHelpFormatter
    p = argparse.ArgumentParser(
        prog="python -m icl_probes.label_flip",
        formatter_class=fmt,
        epilog=EPILOG,
        description="Label-flip in-context learning (Z. Shi 2024, Ch. 5): larger models follow "
        "flipped exemplar labels more, and the rank-r linear-attention theory says why.",
    )
    sub = p.add_subparsers(dest="cmd", required=True)

    _add_datasets(sub, fmt)
    _add_llm(sub, fmt)
    _add_ablation(sub, fmt)
    _add_theory(sub, fmt)
    return p


@command("probes", name="python -m icl_probes.label_flip")
def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        if getattr(args, "fig", None):  # before any work, not when the copy is made at the end
            check_png_path(args.fig, "--fig")
        return {"datasets": _datasets, "llm": _llm, "ablation": _ablation, "theory": _theory}[args.cmd](args)
    except (ValueError, FileNotFoundError, ConnectionError) as err:
        parser.error(str(err))


def _datasets(args) -> int:
    from .data import describe

    print(describe())
    return 0


def _copy(src: Path, dst) -> None:
    if dst:
        with replacing(dst) as tmp:  # the old figure stays whole until the new one is
            tmp.write_bytes(src.read_bytes())
        print(f"figure: {dst}")


def _llm(args) -> int:
    import torch

    from . import llm

    torch.set_num_threads(args.threads)
    check_out_dir(args.out)  # before the sweep, not after it
    preset = PRESETS[args.preset]
    cfg = llm.SweepConfig(
        models=_names(args.models or preset["models"]),
        datasets=_names(args.datasets or preset["datasets"]),
        shares=tuple(float(x) if "." in x else int(x) for x in _names(args.shares)),
        seeds=_ints(args.seeds or preset["seeds"], "--seeds"),
        m=args.m,
        n_eval=args.n_eval if args.n_eval is not None else preset["n_eval"],
        predict=args.predict,
        balanced=not args.unbalanced,
        per_prompt=args.per_prompt,
        data_dir=args.data_dir,
        device=args.device,
        attn=args.attn,
    )
    out = Path(args.out)
    rows = llm.run_sweep(cfg, out)
    summary = llm.summarize(rows)
    table = llm.markdown(summary)
    write_text(out / "summary.md", table)
    print(table)
    llm.plot(summary, out / "label_flip.png", title=f"M={cfg.m}, {len(cfg.seeds)} seeds, {cfg.predict}")
    print(f"rows: {out / 'label_flip.jsonl'}\nplot: {out / 'label_flip.png'}")
    _copy(out / "label_flip.png", args.fig)
    return 0


def _ablation(args) -> int:
    import torch

    from . import ablation

    torch.set_num_threads(args.threads)
    check_out_dir(args.out)
    irrelevant = ablation.IRRELEVANT
    if args.irrelevant_file:
        text = read_text(args.irrelevant_file, "--irrelevant-file")
        irrelevant = tuple(line.strip() for line in text.splitlines() if line.strip())
    if args.n_prompts < 1:
        raise ValueError(f"--n-prompts must be >= 1, got {args.n_prompts}")
    share = int(args.share) if float(args.share).is_integer() else args.share
    out = Path(args.out)
    rows = ablation.run_ablation(
        _names(args.models),
        args.dataset,
        out,
        n_prompts=args.n_prompts,
        m=args.m,
        share=share,
        seed=args.seed,
        irrelevant=irrelevant,
        data_dir=args.data_dir,
        device=args.device,
        attn=args.attn,
    )
    table = ablation.summary(rows)
    write_text(out / "ablation.md", table)
    print(table)
    ablation.plot(rows, out / "ablation.png")
    print(f"rows: {out / 'ablation.jsonl'}\nplot: {out / 'ablation.png'}")
    _copy(out / "ablation.png", args.fig)
    return 0


def _theory(args) -> int:
    from . import theory

    try:
        sigmas = tuple(float(x) for x in _names(args.sigmas))
    except ValueError:
        raise ValueError(f"--sigmas must be comma-separated numbers, got {args.sigmas!r}") from None
    cfg = theory.TheoryConfig(
        d=args.d,
        n_pretrain=args.n_pretrain,
        m=args.m,
        ranks=_ints(args.ranks, "--ranks"),
        sigmas=sigmas,
        spectrum=args.spectrum,
        samples=args.samples,
        seed=args.seed,
    )
    check_out_dir(args.out)
    result = theory.run(cfg)
    out = Path(args.out)
    write_json(out / "theory.json", result)
    table = theory.markdown(result)
    write_text(out / "theory.md", table)
    print(table)
    theory.plot(result, out / "theory.png")
    print(f"results: {out / 'theory.json'}\nplot: {out / 'theory.png'}")
    _copy(out / "theory.png", args.fig)
    return 0


if __name__ == "__main__":
    sys.exit(main())
