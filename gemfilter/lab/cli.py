"""The ``gemfilter`` command: generate with a method, list the methods.

Examples::

    gemfilter methods
    gemfilter generate --prompt-file prompt.txt --show-selection
    gemfilter bench --lengths 2000,4000,8000 --methods full,gemfilter,snapkv
    gemfilter generate --prompt-file prompt.txt --method snapkv --topk 512 --model meta-llama/Llama-3.1-8B-Instruct
    gemfilter generate --prompt-file prompt.txt --method fastkv:k=512,tsp_len=2048
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from gemfilter.toolkit.entry import command

EPILOG = """The default model is the embedded Gemma 3 270M (offline; the first load dequantizes it and
caches safetensors under ~/.cache/gemfilter, about 75 s once, then about 3 s).
Paper: Shi et al. 2024, "Discovering the Gems in Early Layers" (GemFilter)."""

SPEC_EPILOG = """Every command names a method by a spec, NAME[:key=value,...]:
  gemfilter                           the method with its own defaults ('gemfilter methods NAME' lists them)
  gemfilter-span:k=256                k is topk: prompt tokens kept (cache methods: KV entries per layer)
  snapkv:ratio=0.1                    a budget per prompt: topk = max(1, round(0.1 x its tokens))
  fastkv:k=512,tsp_len=2048,layer=11  any parameter; layer: the filter layer (FastKV: its TSP layer)
A list (--methods) is comma-separated; a key=value after a comma continues the method before it:
  --methods full,gemfilter:k=256,layer=11,snapkv   (three methods)
--topk and --layer are defaults for the methods whose spec sets none (the spec wins); a method without
that parameter is named in a note. In Python: gemfilter.methods.parse_method('fastkv:k=512,tsp_len=2048')."""


def _cmd_methods(args) -> int:
    import inspect

    from ..methods import REGISTRY, describe
    from ..methods.spec import parameters

    if args.name is not None:  # one method in full: its kind, docstring and every parameter's default
        if args.name not in REGISTRY:
            raise ValueError(f"unknown method {args.name!r}; allowed: {', '.join(sorted(REGISTRY))}")
        cls = REGISTRY[args.name]
        print(
            f"{args.name} ({cls.kind} method): {cls.description}\n\n{inspect.getdoc(cls)}\n\n"
            f"parameters (defaults), settable as {args.name}:key=value,...:"
        )
        for key, (type_name, default) in parameters(cls).items():
            print(
                f"  {key} = {default!r}  [{type_name}]"
                + ("  (None: the model's default layer)" if key == "layer" else "")
                + ("  (alias k)" if key == "topk" else "")
            )
        if "topk" in parameters(cls):
            print(
                f"  ratio  [float in (0, 1]]  instead of topk: topk = max(1, round(ratio x prompt tokens)), e.g. "
                f"{args.name}:ratio=0.1"
            )
        return 0
    width = max(len(n) for n, _ in describe())
    for name, desc in describe():
        print(f"{name:<{width}}  {REGISTRY[name].kind:<6}  {desc}")
    print(
        "\nkinds: prompt (picks prompt tokens; runs in front of an engine), cache (keeps topk KV rows per layer), "
        "full (the baseline).\n\n" + SPEC_EPILOG
    )
    return 0


def check_generate_args(args):
    """Every option check that needs no weights (the config is enough), so a typo costs no model load; returns
    the method's :class:`~gemfilter.methods.spec.Spec`."""
    from gemfilter.toolkit.options import check_against_model, check_int, method_specs_of

    from ..models import load_config

    check_int(args.threads, "--threads", 0)
    check_int(args.max_new_tokens, "--max-new-tokens", 1)
    (spec,) = method_specs_of(args)
    check_against_model(load_config(args.model), layer=args.layer, specs=(spec,))
    return spec


def _cmd_generate(args) -> int:
    import torch

    from gemfilter.toolkit.io import read_text

    from .. import generate, load_model
    from ..apply import resolve

    path = Path(args.prompt_file)
    if not path.is_file():
        print(f"error: --prompt-file {path} does not exist or is not a file", file=sys.stderr)
        return 2
    prompt = read_text(path, "prompt file")
    spec = check_generate_args(args)
    if not prompt.strip():
        print(f"error: --prompt-file {path} is empty; write the prompt (context and question) into it", file=sys.stderr)
        return 2
    if args.threads:
        torch.set_num_threads(args.threads)
    model, tok = load_model(args.model, attn=args.attn)
    enc = tok(prompt, return_tensors="pt").to(model.device)
    n = enc["input_ids"].shape[1]
    method = resolve(model, spec.method(n, topk=args.topk, layer=args.layer))
    start = time.perf_counter()
    out = generate(model, enc, method=method, tokenizer=tok, max_new_tokens=args.max_new_tokens)
    seconds = time.perf_counter() - start
    answer = tok.decode(out.new_tokens[0], skip_special_tokens=True)
    layer = method.layer
    print(answer.strip())
    rows = out.budget.kv_rows if out.budget is not None else ()
    print(
        f"\n[{spec.label}] kept {out.kept[0]}/{n} prompt tokens"
        + (f" (filter layer {layer})" if layer is not None else "")
        + (
            f"; KV rows per layer {min(rows)}..{max(rows)}, {out.budget.propagated} tokens through the last layer"
            if rows
            else ""
        )
        + f", {seconds:.1f} s",
        file=sys.stderr,
    )
    if args.show_selection:
        if out.kept_text is None:
            print(f"[{spec.label}] keeps per-head cache entries, not one token set: nothing to show", file=sys.stderr)
        else:
            print("\n--- kept text ---\n" + out.kept_text[0], file=sys.stderr)
    return 0


def build_parser() -> argparse.ArgumentParser:
    from gemfilter.toolkit.options import add_method_options

    from ..models import add_attn_argument

    parser = argparse.ArgumentParser(
        prog="gemfilter",
        description="GemFilter and KV-cache baselines for Hugging Face causal LMs.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    sub.add_parser(
        "bench",
        help="speed and memory of each method against context length (see 'gemfilter bench -h')",
        add_help=False,
    )

    p = sub.add_parser(
        "methods",
        help="list the registered methods with a one-line description",
        description="List the registered methods; with a NAME, print that method's documentation and "
        "every parameter with its default (e.g. 'gemfilter methods fastkv').",
        epilog=SPEC_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("name", nargs="?", default=None, help="a method name: show its docstring and parameter defaults")
    p.set_defaults(func=_cmd_methods)

    p = sub.add_parser(
        "generate",
        help="answer a prompt file with a method and report how many prompt tokens it kept",
        description="Read a prompt (context + question) from a file, run the method, print the answer on "
        "stdout and 'kept K/N prompt tokens' on stderr.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--prompt-file", required=True, help="UTF-8 text file holding the whole prompt")
    p.add_argument(
        "--model", default=None, help="Hugging Face id or local path (default: the embedded Gemma 3 270M, offline)"
    )
    add_method_options(p, methods="one", default="gemfilter", default_help="gemfilter (paper-faithful)")
    p.add_argument("--max-new-tokens", type=int, default=50, help="tokens to generate, greedy (default 50)")
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (default: torch's choice)")
    add_attn_argument(p)
    p.add_argument("--show-selection", action="store_true", help="also print the kept text (to stderr)")
    p.set_defaults(func=_cmd_generate)

    from .hub import add_parser as add_export_hub
    from .inspection.report import add_subcommands
    from .serve.cli import add_parser as add_serve
    from .serve.cli import add_plugin_parser

    add_subcommands(sub)
    add_serve(sub)
    add_plugin_parser(sub)
    add_export_hub(sub)
    return parser


@command(name="gemfilter")
def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["bench"]:  # its own parser: python -m gemfilter.lab.bench.report --help
        from .bench.report import main as bench_main

        return bench_main(argv[1:])
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (ValueError, TypeError, OSError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
