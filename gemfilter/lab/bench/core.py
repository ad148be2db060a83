"""Speed and memory benchmark: prompt phase, generation phase and peak memory against context length.

Paper: Shi et al. 2024, Fig. 9.3 and Theorem 9.3. GemFilter's prompt phase costs about (r+1)/m of a
full prefill; SnapKV and H2O pay the full prefill and then save on the cache.

Every (method, length, repeat) runs in a fresh subprocess (``python -m gemfilter.lab.bench.core --worker``),
so one measurement's allocations cannot leak into the next. Time is split by a streamer: the prompt
phase ends when the first new token arrives (filter pass + k-token prefill for GemFilter, the full
prefill for the others), and the generation phase is the rest. Memory on CPU is the peak RSS of a
phase minus the RSS after the model loaded: the kernel's high-water mark (VmHWM) is reset at each
phase start through /proc/self/clear_refs. On CUDA it is torch.cuda.max_memory_allocated, also
relative to the loaded model, with synchronised timers; the absolute peaks (weights included, the
quantity Fig. 9.3 plots) are recorded too.

``config:<arch>`` models (see :mod:`gemfilter.lab.bench.archs`) are the paper's architectures with random
weights: the prompt is random token ids, and every method generates exactly ``gen_tokens`` tokens
(min = max), since random weights would stop at a random EOS.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from ...measure import FirstTokenClock, PeakMemory


class _MaskTimer:
    """Wraps the model's mask builder (this worker process only) to add up the seconds spent building masks."""

    def __init__(self, name: str, sync):
        from ...compat import mask_functions, register_mask

        self.seconds, self.sync = 0.0, sync
        inner = mask_functions()[name]

        def timed(*args, **kwargs):
            start = time.perf_counter()
            out = inner(*args, **kwargs)
            self.sync()
            self.seconds += time.perf_counter() - start
            return out

        register_mask(name, timed)


def forced_kwargs(gen_tokens: int) -> dict:
    """generate() keywords that make every method produce exactly ``gen_tokens`` tokens, greedily:
    min_new_tokens suppresses EOS until then, max_new_tokens stops there."""
    return dict(max_new_tokens=gen_tokens, min_new_tokens=gen_tokens, do_sample=False)


def device_name(device, cuda=None) -> str:
    """What the report names the device by: the GPU's name on CUDA, the CPU model otherwise.

    cuda: the ``torch.cuda`` module (a stand-in in tests)."""
    import torch

    device = torch.device(device)
    if device.type == "cuda":
        cuda = cuda or torch.cuda
        return str(cuda.get_device_name(device))
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or platform.machine() or "cpu"


def warmup_budget(method) -> int | None:
    """The longest budget on ``method``'s path: its topk, or FastKV's tsp_len where longer (TSP fires only on
    prompts longer than tsp_len, so a shorter warm-up never runs it). None for a method without one (full)."""
    budgets = [b for b in (getattr(method, "topk", None), getattr(method, "tsp_len", None)) if b is not None]
    return max(budgets) if budgets else None


def warmup_tokens(device, n: int, topk: int | None) -> int:
    """Prompt length of the untimed warm-up run. On CUDA it is long enough (k + 256) for the method's
    own path to run (SnapKV/H2O skip prompts shorter than k), so kernel selection, cuBLAS handles and
    allocator growth happen before timing; on CPU a 300-token run covers the first-call overheads.
    topk: the method's longest budget, :func:`warmup_budget` (None for full, which has no path to warm but the
    model's: 1024 + 256)."""
    return min(n, (1024 if topk is None else topk) + 256) if device.type == "cuda" else min(n, 300)


def _load(model_name, attn, layers, dtype, device, test_shrink, length, seed):
    """(model, tokenizer or None, encoded prompt, extra report fields)."""
    import torch

    import gemfilter
    from gemfilter.lab.bench import archs

    if archs.is_config_name(model_name):
        model = archs.build_model(model_name, layers=layers, dtype=dtype, device=device, test_shrink=test_shrink,
                                  attn=attn, seed=seed)
        ids = archs.random_prompt(model.config.vocab_size, length, seed=seed + length, device=model.device)
        extra = dict(weights="random", changes=list(model.config.gemfilter_changes))
        return model, None, {"input_ids": ids, "attention_mask": torch.ones_like(ids)}, extra
    from ..haystack import build_case

    if layers is not None or test_shrink:
        raise ValueError("--layers and the test shrink apply to config:<arch> models only")
    kw = {}
    if dtype not in (None, "auto"):
        kw["dtype"] = archs.resolve_dtype(dtype, device or "cpu")
    if device is not None:
        kw["device_map"] = "auto" if device == "auto" else {"": device}
    model, tok = gemfilter.load_model(model_name, attn=attn, **kw)
    enc = tok(build_case(tok, length, 50).prompt, return_tensors="pt").to(model.device)
    return model, tok, enc, dict(weights="pretrained", changes=list(getattr(model.config, "gemfilter_changes", [])))


def measure(model_name, method_name: str, length: int, gen_tokens: int, topk: int | None, layer, threads: int = 0,
            attn: str | None = None, layers: int | None = None, dtype: str | None = None, device: str | None = None,
            test_shrink: bool = False, seed: int = 0) -> dict:
    """One measurement, in this process. Returns times in seconds and peaks in MiB.

    attn: attention kernel (None: the model's default). ``mask_s`` is the time spent building masks
    during the measured prompt phase and generation. method_name: a method spec (``snapkv:k=512``); topk, layer:
    the command line's defaults for it (None: the method's own). layers, dtype, device, test_shrink, seed: see
    :func:`gemfilter.lab.bench.archs.build_model` (layers and test_shrink only for ``config:<arch>`` models).
    """
    import torch

    import gemfilter
    from gemfilter.apply import budget_fields, resolve
    from gemfilter.methods import parse_spec

    if threads:
        torch.set_num_threads(threads)
    model, tok, enc, extra = _load(model_name, attn, layers, dtype, device, test_shrink, length, seed)
    kernel = model.config._attn_implementation
    device = next(model.parameters()).device
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    masks = _MaskTimer(kernel, sync)
    n = enc["input_ids"].shape[1]
    method = resolve(model, parse_spec(method_name).method(n, topk=topk, layer=layer))
    from gemfilter.lab.bench.paper import h2o_exclusion

    reason = h2o_exclusion(method, model, n, device)
    if reason is not None:
        return {"method": method_name, "length": length, "n": n, "excluded": reason, "device": str(device),
                "device_name": device_name(device)}
    kw = forced_kwargs(gen_tokens)
    # Untimed warm-up: first-call overheads (CUDA context, kernel choice, allocator) are not what we measure.
    w = warmup_tokens(device, n, warmup_budget(method))
    gemfilter.generate(model, {k: v[:, -w:] for k, v in enc.items()}, method=method, tokenizer=tok, **forced_kwargs(2))
    sync()
    memory = PeakMemory(device)
    memory.baseline = memory.now()
    clock = FirstTokenClock(memory, sync)
    memory.reset_peak()
    masks.seconds = 0.0
    sync()
    start = time.perf_counter()
    out = gemfilter.generate(model, enc, method=method, tokenizer=tok, streamer=clock, **kw)
    sync()
    end = time.perf_counter()
    gen_peak_abs = memory.peak_abs()
    new_tokens = int(out.new_tokens.shape[1])
    if new_tokens != gen_tokens:  # never record a row whose generation phase has another length
        raise RuntimeError(f"{method_name} generated {new_tokens} tokens, not the forced {gen_tokens}")
    m = gemfilter.selection.num_layers(model)
    cost = method.prompt_cost(n, m) if hasattr(method, "prompt_cost") else None  # (published, this code's)
    theory = {} if cost is None else {"theory_prompt_ratio": cost[0], "theory_here_ratio": cost[1]}
    return {
        **theory, **budget_fields(out), "attn": kernel, "mask_s": masks.seconds, "method": method_name, "length": length,
        "n": n, "kept": out.kept[0],
        "layer": getattr(method, "layer", None), "m": m,
        "prompt_s": clock.first_token - start, "gen_s": end - clock.first_token, "total_s": end - start,
        "prompt_peak_mib": clock.prompt_peak, "gen_peak_mib": gen_peak_abs - memory.baseline,
        "prompt_peak_abs_mib": clock.prompt_peak_abs, "gen_peak_abs_mib": gen_peak_abs,
        "loaded_mib": memory.baseline, "dtype": str(model.dtype).replace("torch.", ""), "warmup_tokens": w,
        "new_tokens": new_tokens, "device": str(device), "device_name": device_name(device),
        "threads": torch.get_num_threads(), **extra,
    }


PARENT_ENV = "GEMFILTER_BENCH_PARENT"


def die_with_parent(parent: int) -> None:
    """Make this process die when ``parent`` does, so that a killed ``gemfilter bench`` leaves no worker computing
    beside a resumed run (skewing its timings).

    On Linux the kernel sends SIGKILL at the parent's death (``prctl(PR_SET_PDEATHSIG)``); a parent that died
    before that call is seen by ``getppid()``. Elsewhere a daemon thread polls ``getppid()`` each second.
    """
    import signal
    import threading

    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        armed = libc.prctl(1, signal.SIGKILL, 0, 0, 0) == 0  # 1 = PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # not Linux
        armed = False
    if os.getppid() != parent:
        os._exit(1)
    if not armed:
        def watch():
            while os.getppid() == parent:
                time.sleep(1.0)
            os._exit(1)

        threading.Thread(target=watch, daemon=True).start()


class Terminated(SystemExit):
    """SIGTERM while a worker runs: raised in the main thread, so that the worker is killed before bench exits."""

    def __init__(self):
        super().__init__(143)  # 128 + SIGTERM, the shell's convention


def _on_sigterm(signum, frame):
    raise Terminated()


def run_worker(spec: dict, timeout: float | None = None) -> dict:
    """Run :func:`measure` in a fresh Python subprocess and return its result.

    The worker dies with this process (:func:`die_with_parent`); a SIGTERM here kills it first (subprocess.run
    kills its child on any exception)."""
    import signal
    import threading

    cmd = [sys.executable, "-m", "gemfilter.lab.bench.core", "--worker", json.dumps(spec)]
    env = dict(os.environ, TOKENIZERS_PARALLELISM="false", **{PARENT_ENV: str(os.getpid())})
    main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _on_sigterm) if main else None
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        raise RuntimeError(
            f"the {spec['method_name']} measurement at length {spec['length']} ran past --timeout {timeout} s and "
            "was stopped. Finished cells are kept in bench.jsonl; rerun with a larger --timeout (or shorter "
            "--lengths) to measure the rest") from None
    finally:
        if main:
            signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)
    if proc.returncode != 0:
        raise RuntimeError(f"benchmark worker failed for {spec}:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _worker_entry(spec_json: str) -> int:
    if os.environ.get(PARENT_ENV):
        die_with_parent(int(os.environ[PARENT_ENV]))
    spec = json.loads(spec_json)
    print(json.dumps(measure(**spec)), flush=True)
    return 0


if __name__ == "__main__":
    # Worker entry only: the command is ``gemfilter bench`` (gemfilter.lab.bench.report), which imports
    # this module, so this one must not import it back.
    if len(sys.argv) == 3 and sys.argv[1] == "--worker":
        sys.exit(_worker_entry(sys.argv[2]))
    sys.exit("python -m gemfilter.lab.bench.core is the benchmark's internal worker (--worker SPEC_JSON); "
             "run 'gemfilter bench --help'")
