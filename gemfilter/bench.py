"""Speed and memory benchmark: prompt phase, generation phase and peak memory against context length.

Paper: Shi et al. 2024, Fig. 9.3 and Theorem 9.3. GemFilter's prompt phase costs about (r+1)/m of a
full prefill; SnapKV and H2O pay the full prefill and then save on the cache.

Every (method, length, repeat) runs in a fresh subprocess (``python -m gemfilter.bench --worker``),
so one measurement's allocations cannot leak into the next. Time is split by a streamer: the prompt
phase ends when the first new token arrives (filter pass + k-token prefill for GemFilter, the full
prefill for the others), and the generation phase is the rest. Memory on CPU is the peak RSS of a
phase minus the RSS after the model loaded: the kernel's high-water mark (VmHWM) is reset at each
phase start through /proc/self/clear_refs. On CUDA it is torch.cuda.max_memory_allocated, also
relative to the loaded model, with synchronised timers.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

_STATUS = "/proc/self/status"


def _rss_kib(field: str) -> int:
    with open(_STATUS) as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{field} not found in {_STATUS}")


class _Memory:
    """Peak memory of a phase in MiB, relative to a baseline (the loaded model)."""

    def __init__(self, device):
        self.cuda = device.type == "cuda"
        self.baseline = 0.0
        if self.cuda:
            import torch

            self.torch = torch

    def now(self) -> float:
        if self.cuda:
            return self.torch.cuda.memory_allocated() / 2**20
        return _rss_kib("VmRSS") / 1024

    def reset_peak(self):
        if self.cuda:
            self.torch.cuda.synchronize()
            self.torch.cuda.reset_peak_memory_stats()
        else:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")  # resets VmHWM to the current RSS (Linux >= 4.0)

    def peak(self) -> float:
        if self.cuda:
            self.torch.cuda.synchronize()
            return self.torch.cuda.max_memory_allocated() / 2**20 - self.baseline
        return _rss_kib("VmHWM") / 1024 - self.baseline


class _PhaseClock:
    """A generate streamer: marks the first new token, which ends the prompt phase."""

    def __init__(self, memory: _Memory, sync):
        self.memory, self.sync = memory, sync
        self.calls = 0
        self.first_token = None
        self.prompt_peak = None

    def put(self, value):
        self.calls += 1
        if self.calls == 2:  # call 1 is the prompt itself, call 2 the first generated token
            self.sync()
            self.first_token = time.perf_counter()
            self.prompt_peak = self.memory.peak()
            self.memory.reset_peak()

    def end(self):
        pass


class _MaskTimer:
    """Wraps the model's mask builder (this worker process only) to add up the seconds spent building masks."""

    def __init__(self, name: str, sync):
        from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface

        self.seconds, self.sync = 0.0, sync
        inner = ALL_MASK_ATTENTION_FUNCTIONS[name]

        def timed(*args, **kwargs):
            start = time.perf_counter()
            out = inner(*args, **kwargs)
            self.sync()
            self.seconds += time.perf_counter() - start
            return out

        AttentionMaskInterface.register(name, timed)


def measure(model_name, method_name: str, length: int, gen_tokens: int, topk: int, layer, threads: int = 0,
            attn: str | None = None) -> dict:
    """One measurement, in this process. Returns times in seconds and peaks in MiB.

    attn: attention kernel (None: the model's default). ``mask_s`` is the time spent building masks
    during the measured prompt phase and generation.
    """
    import torch

    import gemfilter
    from gemfilter.apply import resolve
    from eval.niah.haystack import build_case

    if threads:
        torch.set_num_threads(threads)
    model, tok = gemfilter.load_model(model_name, attn=attn)
    kernel = model.config._attn_implementation
    device = next(model.parameters()).device
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    masks = _MaskTimer(kernel, sync)
    method = resolve(model, gemfilter.get_method(method_name, layer=layer, topk=topk))
    prompt = build_case(tok, length, 50).prompt
    enc = tok(prompt, return_tensors="pt").to(device)
    n = enc["input_ids"].shape[1]
    kw = dict(max_new_tokens=gen_tokens, min_new_tokens=gen_tokens, do_sample=False)
    # Warm-up on a short prompt: first-call overheads are not what we measure.
    gemfilter.generate(model, {k: v[:, -300:] for k, v in enc.items()}, method=method, tokenizer=tok, max_new_tokens=2)
    memory = _Memory(device)
    memory.baseline = memory.now()
    clock = _PhaseClock(memory, sync)
    memory.reset_peak()
    masks.seconds = 0.0
    sync()
    start = time.perf_counter()
    out = gemfilter.generate(model, enc, method=method, tokenizer=tok, streamer=clock, **kw)
    sync()
    end = time.perf_counter()
    return {
        "attn": kernel, "mask_s": masks.seconds, "method": method_name, "length": length, "n": n, "kept": out.kept[0],
        "layer": getattr(method, "layer", None), "m": gemfilter.selection.num_layers(model),
        "prompt_s": clock.first_token - start, "gen_s": end - clock.first_token, "total_s": end - start,
        "prompt_peak_mib": clock.prompt_peak, "gen_peak_mib": memory.peak(),
        "new_tokens": int(out.new_tokens.shape[1]), "device": str(device), "threads": torch.get_num_threads(),
    }


def run_worker(spec: dict, timeout: float | None = None) -> dict:
    """Run :func:`measure` in a fresh Python subprocess and return its result."""
    cmd = [sys.executable, "-m", "gemfilter.bench", "--worker", json.dumps(spec)]
    env = dict(os.environ, TOKENIZERS_PARALLELISM="false")
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"benchmark worker failed for {spec}:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _worker_entry(spec_json: str) -> int:
    spec = json.loads(spec_json)
    print(json.dumps(measure(**spec)), flush=True)
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--worker":
        sys.exit(_worker_entry(sys.argv[2]))
    from gemfilter.bench_report import main

    sys.exit(main())
