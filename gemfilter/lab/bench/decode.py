"""Decoding against the memory-bandwidth bound: ms per new token of each decode path, beside the time to read the
weights and the kept cache once at the device's measured copy bandwidth.

Paper: Shi et al. 2024, Fig. 9.3 (50 new tokens after the prompt phase). A decode step at batch 1 must read every
weight the step uses (all but the input embedding table, of which it reads one row) and the KV cache once; at
the bandwidth a large device-to-device copy reaches (bytes read plus bytes written, measured here), that is the
step's floor. Paths timed on a k-token prompt (GemFilter's cache holds k rows whatever the prompt's length):

- ``generate``: plain ``model.generate`` (eager, dynamic cache);
- ``apply-full``: ``gemfilter.generate`` with ``full`` (the same, through ``apply()``'s hooks: their overhead);
- ``static-eager``: :class:`gemfilter.compiled.StaticDecoder` without compiling (a static cache alone);
- ``compiled``: ``gemfilter.generate(..., compile=True)``'s decoder (torch.compile; CUDA graphs on CUDA);
- ``hf-static``: transformers' own ``generate(cache_implementation="static")``, which compiles its decode step on
  CUDA (``--hf-static``; on a CPU it runs eagerly).

``python -m gemfilter.lab.bench.decode --model config:llama-3.1-8b --out OUT.jsonl`` appends one row per path.
"""

from __future__ import annotations

import argparse
import sys
import time

PATHS = ("generate", "apply-full", "static-eager", "compiled", "hf-static")


def copy_bandwidth(device, gib: float = 2.0, repeats: int = 10) -> float:
    """Bytes per second of a device-to-device copy of ``gib`` GiB, counting bytes read plus bytes written
    (the best of ``repeats``; on a CPU, a memory-to-memory copy)."""
    import torch

    n = int(gib * 2**30) // 4
    src = torch.empty(n, dtype=torch.float32, device=device).fill_(1.0)
    dst = torch.empty_like(src)
    sync = (lambda: torch.cuda.synchronize(device)) if torch.device(device).type == "cuda" else (lambda: None)
    dst.copy_(src)
    sync()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        dst.copy_(src)
        sync()
        best = min(best, time.perf_counter() - start)
    return 2 * n * 4 / best


def step_bytes(model, rows: int) -> dict:
    """Bytes a batch-1 decode step reads at least: the weights it uses (the input embedding table only when it is
    tied to the output layer) and the keys and values of ``rows`` cached tokens."""
    params = {id(p): p for p in model.parameters()}
    weights = sum(p.numel() * p.element_size() for p in params.values())
    embed = model.get_input_embeddings().weight
    tied = model.get_output_embeddings() is not None and model.get_output_embeddings().weight is embed
    used = weights - (0 if tied else embed.numel() * embed.element_size())
    cfg = model.config.get_text_config()
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    kv = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * head_dim * rows * embed.element_size()
    return {"weights_bytes": weights, "step_weight_bytes": used, "kv_bytes": kv}


def _timed(run, sync, gen: int) -> float:
    """ms per decode step of ``run(streamer)``: (end - first token) / (gen - 1)."""
    from ...measure import FirstTokenClock

    clock = FirstTokenClock(None, sync)
    sync()
    run(clock)
    sync()
    end = time.perf_counter()
    return 1000 * (end - clock.first_token) / (gen - 1)


def probe(model, k: int = 1024, gen: int = 50, paths=PATHS, seed: int = 0, log=print):
    """Yield one row per decode path as it is timed: ``decode_ms`` beside ``bound_ms`` (the step's bytes at the
    measured bandwidth). A path that fails yields a row with its ``error`` and the next path runs."""
    import torch

    import gemfilter
    from gemfilter.compiled import StaticDecoder
    from gemfilter.methods import get_method

    from .archs import random_prompt
    from .core import device_name, forced_kwargs

    device = next(model.parameters()).device
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    bandwidth = copy_bandwidth(device)
    size = step_bytes(model, k)
    bound_ms = 1000 * (size["step_weight_bytes"] + size["kv_bytes"]) / bandwidth
    ids = random_prompt(model.config.vocab_size, k, seed=seed, device=device)
    forced = forced_kwargs(gen)
    full = get_method("full")
    eager_decoder = StaticDecoder(model, k + gen - 1, compile=False) if "static-eager" in paths else None
    compiled_decoder = StaticDecoder(model, k + gen - 1) if "compiled" in paths else None
    runs = {
        "generate": lambda s: model.generate(ids, streamer=s, **forced),
        "apply-full": lambda s: gemfilter.generate(model, ids, method=full, streamer=s, **forced),
        "static-eager": lambda s, d=eager_decoder: gemfilter.generate(
            model, ids, method=full, streamer=s, compile=d, **forced
        ),
        "compiled": lambda s, d=compiled_decoder: gemfilter.generate(
            model, ids, method=full, streamer=s, compile=d, **forced
        ),
        "hf-static": lambda s: model.generate(ids, streamer=s, cache_implementation="static", **forced),
    }
    common = {
        "k": k,
        "gen_tokens": gen,
        "bound_ms": bound_ms,
        "bandwidth_gbs": bandwidth / 1e9,
        **size,
        "dtype": str(model.dtype).replace("torch.", ""),
        "device": str(device),
        "device_name": device_name(device),
    }
    for path in paths:
        start = time.perf_counter()
        try:
            for _ in range(3 if path in ("compiled", "hf-static") else 1):  # compile, record CUDA graphs, replay
                with torch.no_grad():
                    runs[path](None)
            warm = time.perf_counter() - start
            with torch.no_grad():
                ms = _timed(runs[path], sync, gen)
        except Exception as exc:  # one path's failure is that path's: the others still run
            log(f"{path}: failed: {type(exc).__name__}: {exc}")
            yield {"path": path, "error": f"{type(exc).__name__}: {exc}"[:2000], **common}
            continue
        log(f"{path}: {ms:.2f} ms/token, bound {bound_ms:.2f} ms ({ms / bound_ms:.2f}x); warm-up {warm:.1f} s")
        yield {"path": path, "decode_ms": ms, "ratio_to_bound": ms / bound_ms, "warmup_s": warm, **common}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m gemfilter.lab.bench.decode",
        description=__doc__.split("\n\n")[0],
        epilog="Paths: " + ", ".join(PATHS) + ". Each row records decode_ms, bound_ms, "
        "the measured bandwidth and the bytes counted.",
    )
    p.add_argument("--model", required=True, help="config:<arch> (random weights), e.g. config:llama-3.1-8b")
    p.add_argument("--layers", type=int, default=None, help="keep the first N decoder layers")
    p.add_argument("--test-shrink", action="store_true", help="TESTS ONLY: the shrunk architecture")
    p.add_argument("--dtype", default=None, help="auto (default), bf16, fp16 or fp32")
    p.add_argument("--device", default=None, help="cpu, cuda, cuda:N (default: cuda if available)")
    p.add_argument("--k", type=int, default=1024, help="prompt tokens: the kept cache's rows (default 1024)")
    p.add_argument("--gen-tokens", type=int, default=50, help="new tokens per run, forced (default 50)")
    p.add_argument(
        "--paths",
        default=",".join(PATHS[:4]),
        help=f"comma-separated, from {', '.join(PATHS)} (default: all but hf-static)",
    )
    p.add_argument("--out", required=True, help="JSONL file the rows are appended to")
    args = p.parse_args(argv)
    from gemfilter.toolkit.io import append_jsonl
    from gemfilter.toolkit.loop import Unit, compute

    from .archs import build_model, is_config_name

    paths = [x.strip() for x in args.paths.split(",") if x.strip()]
    bad = [x for x in paths if x not in PATHS]
    if bad or not paths:
        p.error(f"--paths {args.paths!r}: choose from {', '.join(PATHS)}")
    if not is_config_name(args.model):
        p.error(f"--model {args.model!r}: give config:<arch> (random weights: timing only)")
    if args.k < 2 or args.gen_tokens < 2:
        p.error("--k and --gen-tokens must be >= 2")
    model = build_model(
        args.model, layers=args.layers, dtype=args.dtype, device=args.device, test_shrink=args.test_shrink
    )
    rows = probe(model, k=args.k, gen=args.gen_tokens, paths=paths, log=lambda m: print(m, file=sys.stderr))
    compute(  # every path, each run appending its rows (probe yields them in the paths' order)
        [Unit(args.out, path) for path in paths],
        lambda unit: {"model": args.model, "layers": args.layers, **next(rows)},
        lambda unit, row: append_jsonl(args.out, row),
        desc="decode paths",
        noun="path",
        progress=False,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
