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

import functools
import json
import os
import subprocess
import sys
import time

from ...measure import FirstTokenClock, PeakMemory


@functools.lru_cache(maxsize=None)
def spec_of_label(text: str):
    """A worker's one parse of a method spec: the command checked its specs already, and a worker gets their text
    (a worker is a process of its own); every cell of that method in the worker uses this Spec."""
    from gemfilter.methods import parse_spec

    return parse_spec(text)


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
    return method.longest_budget()


def warmup_tokens(device, n: int, topk: int | None) -> int:
    """Prompt length of the untimed warm-up run. On CUDA it is long enough (k + 256) for the method's
    own path to run (SnapKV/H2O skip prompts shorter than k), so kernel selection, cuBLAS handles and
    allocator growth happen before timing; on CPU a 300-token run covers the first-call overheads.
    topk: the method's longest budget, :func:`warmup_budget` (None for full, which has no path to warm but the
    model's: 1024 + 256)."""
    return min(n, (1024 if topk is None else topk) + 256) if device.type == "cuda" else min(n, 300)


def _load_model(model_name, attn, layers, dtype, device, test_shrink, seed):
    """(model, tokenizer or None, extra report fields)."""
    import gemfilter
    from gemfilter.lab.bench import archs

    if archs.is_config_name(model_name):
        model = archs.build_model(
            model_name, layers=layers, dtype=dtype, device=device, test_shrink=test_shrink, attn=attn, seed=seed
        )
        return model, None, dict(weights="random", changes=list(model.config.gemfilter_changes))
    if layers is not None or test_shrink:
        raise ValueError("--layers and the test shrink apply to config:<arch> models only")
    kw = {}
    if dtype not in (None, "auto"):
        kw["dtype"] = archs.resolve_dtype(dtype, device or "cpu")
    if device is not None:
        kw["device_map"] = "auto" if device == "auto" else {"": device}
    model, tok = gemfilter.load_model(model_name, attn=attn, **kw)
    return model, tok, dict(weights="pretrained", changes=list(getattr(model.config, "gemfilter_changes", [])))


def _prompt(model, tok, length: int, seed: int) -> dict:
    """The prompt of ``length`` tokens: random ids for a config:<arch> model, else a needle case."""
    import torch

    if tok is None:
        from gemfilter.lab.bench import archs

        ids = archs.random_prompt(model.config.vocab_size, length, seed=seed + length, device=model.device)
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    from gemfilter.toolkit.haystack import build_case

    return tok(build_case(tok, length, 50).prompt, return_tensors="pt").to(model.device)


def decode_rows(method, n: int) -> int:
    """The KV rows per layer ``method`` leaves after an n-token prefill: n for full, its budget otherwise (a
    compiled cell's static cache holds these plus the new tokens)."""
    from gemfilter.methods.spec import FullMethod

    return n if isinstance(method, FullMethod) else min(n, method.topk)


class Bench:
    """One loaded model and what its cells share: the decoders that compiled cells reuse (one per capacity, so
    every prompt method at k rows compiles once; full's, one per length, are dropped after their cell)."""

    def __init__(
        self,
        model_name,
        attn=None,
        layers=None,
        dtype=None,
        device=None,
        test_shrink=False,
        seed=0,
        threads=0,
        compile=False,
    ):
        import torch

        if threads:
            torch.set_num_threads(threads)
        self.model_name, self.seed, self.compile = model_name, seed, compile
        self.model, self.tok, self.extra = _load_model(model_name, attn, layers, dtype, device, test_shrink, seed)
        self.kernel = self.model.config._attn_implementation
        self.device = next(self.model.parameters()).device
        cuda = self.device.type == "cuda"
        self.sync = (lambda: torch.cuda.synchronize(self.device)) if cuda else (lambda: None)
        # Masks are timed in eager runs only: the timer's clock and sync inside a compiled step would break its graph.
        self.masks = None if compile else _MaskTimer(self.kernel, self.sync)
        self.decoders = {}
        params = {id(p): p for p in self.model.parameters()}
        self.weights_bytes = sum(p.numel() * p.element_size() for p in params.values())

    def decoder(self, capacity: int, keep: bool):
        from gemfilter.compiled import StaticDecoder

        held = self.decoders.get(capacity)
        if held is None:
            held = StaticDecoder(self.model, capacity)
            if keep:
                self.decoders[capacity] = held
        return held

    def measure(self, method_name: str, length: int, gen_tokens: int, topk: int | None, layer) -> dict:
        """One cell. Returns times in seconds and peaks in MiB (see :func:`measure`)."""

        import gemfilter
        from gemfilter.apply import resolve
        from gemfilter.lab.bench.paper import h2o_exclusion
        from gemfilter.methods.spec import FullMethod

        model, tok, device, sync = self.model, self.tok, self.device, self.sync
        enc = _prompt(model, tok, length, self.seed)
        n = enc["input_ids"].shape[1]
        method = resolve(model, spec_of_label(method_name).method(n, topk=topk, layer=layer))
        reason = h2o_exclusion(method, model, n, device)
        if reason is not None:
            return {
                "method": method_name,
                "length": length,
                "n": n,
                "excluded": reason,
                "device": str(device),
                "device_name": device_name(device),
            }
        kw = forced_kwargs(gen_tokens)
        decoder = None
        if self.compile:  # full's capacity follows n: its decoder serves this cell only
            decoder = self.decoder(decode_rows(method, n) + gen_tokens - 1, keep=not isinstance(method, FullMethod))
        w = self._warm_up(method, enc, n, decoder, gen_tokens)
        memory = PeakMemory(device)
        memory.baseline = memory.now()
        clock = FirstTokenClock(memory, sync)
        begun = {}

        def on_begin(call):  # the method's own pass (a prompt method's filter pass; FastKV's first pass) is done
            sync()
            begun["filter_peak_abs_mib"] = memory.peak_abs()

        memory.reset_peak()
        if self.masks is not None:
            self.masks.seconds = 0.0
        sync()
        start = time.perf_counter()
        out = gemfilter.generate(
            model, enc, method=method, tokenizer=tok, streamer=clock, compile=decoder or False, on_begin=on_begin, **kw
        )
        sync()
        end = time.perf_counter()
        gen_peak_abs = memory.peak_abs()
        new_tokens = int(out.new_tokens.shape[1])
        if new_tokens != gen_tokens:  # never record a row whose generation phase has another length
            raise RuntimeError(f"{method_name} generated {new_tokens} tokens, not the forced {gen_tokens}")
        return self._row(method, method_name, length, n, out, clock, memory, begun, (start, end, gen_peak_abs), w)

    def _warm_up(self, method, enc, n: int, decoder, gen_tokens: int) -> int:
        """An untimed generation on the prompt's last w tokens; returns w. First-call overheads (CUDA context, kernel
        choice, allocator; compilation and CUDA graph capture for a compiled cell, which needs a few decode steps)
        are not what we measure."""
        import gemfilter

        w = warmup_tokens(self.device, n, warmup_budget(method))
        gemfilter.generate(
            self.model,
            {k: v[:, -w:] for k, v in enc.items()},
            method=method,
            tokenizer=self.tok,
            compile=decoder or False,
            **forced_kwargs(min(gen_tokens, 8) if decoder else 2),
        )
        self.sync()
        return w

    def _row(self, method, method_name, length, n, out, clock, memory, begun, timed, w) -> dict:
        """The cell's row: times in seconds, peaks in MiB, the budget and the theory's prompt-cost ratios.

        timed: (start, end, the absolute peak read at the end) of the timed generation."""
        import torch

        import gemfilter
        from gemfilter.apply import budget_fields

        model, device = self.model, self.device
        start, end, gen_peak_abs = timed
        new_tokens = int(out.new_tokens.shape[1])
        m = gemfilter.selection.num_layers(model)
        cost = method.prompt_cost(n, m)  # (published, this code's)
        theory = {} if cost is None else {"theory_prompt_ratio": cost[0], "theory_here_ratio": cost[1]}
        cache_bytes = out.decode_cache_bytes if out.decode_cache_bytes is not None else out.budget.kv_bytes
        gen_s = end - clock.first_token
        return {
            **theory,
            **budget_fields(out),
            "attn": self.kernel,
            "mask_s": None if self.masks is None else self.masks.seconds,
            "method": method_name,
            "length": length,
            "n": n,
            "kept": out.kept[0],
            "layer": method.layer,
            "m": m,
            "prompt_s": clock.first_token - start,
            "gen_s": gen_s,
            "total_s": end - start,
            "decode_ms": 1000 * gen_s / max(new_tokens - 1, 1),
            "prompt_peak_mib": clock.prompt_peak,
            "gen_peak_mib": gen_peak_abs - memory.baseline,
            "prompt_peak_abs_mib": clock.prompt_peak_abs,
            "gen_peak_abs_mib": gen_peak_abs,
            "filter_peak_abs_mib": begun.get("filter_peak_abs_mib"),
            "cache_mib": cache_bytes / 2**20,
            "loaded_mib": memory.baseline,
            "weights_mib": self.weights_bytes / 2**20,
            "dtype": str(model.dtype).replace("torch.", ""),
            "warmup_tokens": w,
            "new_tokens": new_tokens,
            "device": str(device),
            "device_name": device_name(device),
            "threads": torch.get_num_threads(),
            "compile": self.compile,
            **self.extra,
        }


def measure(
    model_name,
    method_name: str,
    length: int,
    gen_tokens: int,
    topk: int | None,
    layer,
    threads: int = 0,
    attn: str | None = None,
    layers: int | None = None,
    dtype: str | None = None,
    device: str | None = None,
    test_shrink: bool = False,
    seed: int = 0,
    compile: bool = False,
) -> dict:
    """One measurement, in this process. Returns times in seconds and peaks in MiB.

    attn: attention kernel (None: the model's default). ``mask_s`` is the time spent building masks
    during the measured prompt phase and generation. method_name: a method spec (``snapkv:k=512``); topk, layer:
    the command line's defaults for it (None: the method's own). layers, dtype, device, test_shrink, seed: see
    :func:`gemfilter.lab.bench.archs.build_model` (layers and test_shrink only for ``config:<arch>`` models).
    compile: decode on a static cache with a compiled step (:mod:`gemfilter.compiled`).

    Memory fields (MiB): ``weights_mib`` the parameters' bytes; ``loaded_mib`` what was allocated when the timed
    run began (the weights, and a compiled cell's static cache, which its warm-up allocated); ``filter_peak_abs_mib``
    the peak until the method's own pass ended (a prompt method's filter pass, FastKV's first pass);
    ``prompt_peak_abs_mib`` until the first new token; ``cache_mib`` the KV cache decoding reads (the static cache
    when compiled); ``gen_peak_abs_mib`` the generation phase's peak.
    """
    bench = Bench(
        model_name,
        attn=attn,
        layers=layers,
        dtype=dtype,
        device=device,
        test_shrink=test_shrink,
        seed=seed,
        threads=threads,
        compile=compile,
    )
    return bench.measure(method_name, length, gen_tokens, topk, layer)


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
            "--lengths) to measure the rest"
        ) from None
    finally:
        if main:
            signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)
    if proc.returncode != 0:
        raise RuntimeError(f"benchmark worker failed for {spec}:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def run_cells(common: dict, cells: list, timeout: float | None = None):
    """Run many cells in one worker process (the model loads once; compiled cells share a decoder): yields
    ``(index, row, error)`` per cell as each finishes, in order. common: :class:`Bench`'s settings plus topk,
    layer and gen_tokens; cells: [(method_name, length), ...].

    A cell that raises gives an error and the worker goes on (on CUDA, after freeing the cache); a cell past
    ``timeout`` seconds has the worker killed, gives an error, and a new worker takes the cells after it."""
    import select
    import signal
    import tempfile
    import threading

    env = dict(os.environ, TOKENIZERS_PARALLELISM="false", **{PARENT_ENV: str(os.getpid())})
    main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _on_sigterm) if main else None
    todo = list(enumerate(cells))
    try:
        while todo:
            spec = {"common": common, "cells": [[i, m, n] for i, (m, n) in todo]}
            with tempfile.TemporaryFile("w+") as err:
                proc = subprocess.Popen(
                    [sys.executable, "-m", "gemfilter.lab.bench.core", "--cells", json.dumps(spec)],
                    stdout=subprocess.PIPE,
                    stderr=err,
                    text=True,
                    env=env,
                )
                try:
                    while todo:
                        ready = select.select([proc.stdout], [], [], timeout)[0]
                        line = proc.stdout.readline() if ready else None
                        if not line:
                            break
                        msg = json.loads(line)
                        index = todo.pop(0)[0]
                        yield index, msg.get("row"), msg.get("error")
                    if todo:  # the worker stopped or a cell ran past the timeout
                        index, (method, length) = todo.pop(0)
                        stopped = proc.poll() is None
                        proc.kill()
                        proc.wait()
                        err.seek(0)
                        why = (
                            f"ran past --timeout {timeout} s and was stopped"
                            if stopped
                            else f"ended the worker (exit {proc.returncode}):\n{err.read()[-3000:]}"
                        )
                        yield index, None, f"the {method} measurement at length {length} {why}"
                finally:
                    if proc.poll() is None:
                        proc.kill()
                        proc.wait()
    finally:
        if main:
            signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)


def _cells_entry(spec_json: str) -> int:
    """``--cells``: one :class:`Bench` for every cell; one JSON line per cell, a row or an error."""
    import gc
    import traceback

    import torch

    if os.environ.get(PARENT_ENV):
        die_with_parent(int(os.environ[PARENT_ENV]))
    spec = json.loads(spec_json)
    common = dict(spec["common"])
    run = {k: common.pop(k) for k in ("topk", "layer", "gen_tokens")}
    bench = Bench(**common)
    for index, method, length in spec["cells"]:
        try:
            row, error = bench.measure(method, length, run["gen_tokens"], run["topk"], run["layer"]), None
        except Exception as exc:  # one cell's failure (out of memory, a refusal) is that cell's, not the run's
            row, error = None, f"{type(exc).__name__}: {exc}\n{traceback.format_exc()[-2000:]}"
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        print(json.dumps({"i": index, "row": row, "error": error}), flush=True)
    return 0


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
    if len(sys.argv) == 3 and sys.argv[1] == "--cells":
        sys.exit(_cells_entry(sys.argv[2]))
    sys.exit(
        "python -m gemfilter.lab.bench.core is the benchmark's internal worker (--worker SPEC_JSON, or "
        "--cells SPEC_JSON for many cells in one process); run 'gemfilter bench --help'"
    )
