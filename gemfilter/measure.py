"""Peak memory and time to first token, for the benchmark and the conversation API.

Memory on CPU is the process's resident set: its high-water mark (VmHWM) is reset through
/proc/self/clear_refs at a phase start (Linux >= 4.0). On CUDA it is torch.cuda.max_memory_allocated,
with synchronised timers. Both are reported relative to a baseline, the loaded model.
"""

from __future__ import annotations

import time

_STATUS = "/proc/self/status"


def _rss_kib(field: str) -> int:
    with open(_STATUS) as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{field} not found in {_STATUS}")


class PeakMemory:
    """Peak memory of a phase in MiB, relative to a baseline (the loaded model)."""

    def __init__(self, device):
        self.cuda = device.type == "cuda"
        self.device = device  # every CUDA call names it: the current device may be another GPU
        self.baseline = 0.0
        if self.cuda:
            import torch

            self.torch = torch

    def now(self) -> float:
        if self.cuda:
            return self.torch.cuda.memory_allocated(self.device) / 2**20
        return _rss_kib("VmRSS") / 1024

    def reset_peak(self):
        if self.cuda:
            self.torch.cuda.synchronize(self.device)
            self.torch.cuda.reset_peak_memory_stats(self.device)
        else:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")  # resets VmHWM to the current RSS (Linux >= 4.0)

    def peak(self) -> float:
        return self.peak_abs() - self.baseline

    def peak_abs(self) -> float:
        """Peak since the last reset, weights included (CUDA: max_memory_allocated; CPU: VmHWM)."""
        if self.cuda:
            self.torch.cuda.synchronize(self.device)
            return self.torch.cuda.max_memory_allocated(self.device) / 2**20
        return _rss_kib("VmHWM") / 1024


class FirstTokenClock:
    """A generate streamer: marks the first new token, which ends the prompt phase, and the memory peak until
    then. memory: a :class:`PeakMemory`, or None where memory cannot be read (time only); sync: what waits for
    the device (a no-op on the CPU)."""

    def __init__(self, memory: PeakMemory | None, sync=lambda: None):
        self.memory, self.sync = memory, sync
        self.calls = 0
        self.first_token = None
        self.prompt_peak = self.prompt_peak_abs = None

    def put(self, value):
        self.calls += 1
        if self.calls == 2:  # call 1 is the prompt itself, call 2 the first generated token
            self.sync()
            self.first_token = time.perf_counter()
            if self.memory is None:
                return
            self.prompt_peak_abs = self.memory.peak_abs()
            self.prompt_peak = self.prompt_peak_abs - self.memory.baseline
            self.memory.reset_peak()

    def end(self):
        pass
