"""A ``gemfilter bench`` worker dies with its parent. SIGKILL or SIGTERM to the process that
runs :func:`gemfilter.lab.bench.core.run_worker` leaves no worker computing (it would skew a resumed run's timings)."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

PARENT = """
import json, sys
from gemfilter.lab.bench.core import run_worker
run_worker(json.loads(sys.argv[1]))
"""


def workers_of(pid: int) -> list:
    """The pids whose parent is ``pid`` (field 4 of /proc/PID/stat) and whose command line is the bench worker's.

    The command line is checked because the parent's imports may start short-lived helpers of their own: on
    Python 3.10, ``ctypes.util.find_library`` runs ``/sbin/ldconfig -p``, and CI once took that for the worker."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            if int(stat.read_text().rsplit(")", 1)[1].split()[1]) != pid:
                continue
            cmdline = (stat.parent / "cmdline").read_bytes().split(b"\0")  # only the parent's children
        except OSError:
            continue
        if b"--worker" in cmdline:
            found.append(int(stat.parent.name))
    return found


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def wait_for(test, seconds: float):
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        value = test()
        if value:
            return value
        time.sleep(0.1)
    return test()


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc (Linux)")
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_the_worker_dies_with_its_parent(tiny_model_dir, sig):
    # a worker that would generate for minutes: 100000 forced tokens on the tiny model
    spec = dict(
        model_name=str(tiny_model_dir), method_name="full", length=300, gen_tokens=100000, topk=16, layer=2, threads=1
    )
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    parent = subprocess.Popen([sys.executable, "-c", PARENT, json.dumps(spec)], env=env, stderr=subprocess.DEVNULL)
    worker = None
    try:
        workers = wait_for(lambda: workers_of(parent.pid), 60)
        assert len(workers) == 1
        worker = workers[0]
        time.sleep(3)  # let it import and arm itself, then start generating
        assert alive(worker)
        parent.send_signal(sig)
        status = parent.wait(timeout=30)
        assert status == -sig if sig == signal.SIGKILL else status == 143  # 128 + SIGTERM
        assert wait_for(lambda: not alive(worker), 10), "the worker outlived its parent"
    finally:
        parent.kill()
        parent.wait()
        if worker is not None and alive(worker):  # the old behaviour: an orphan; do not leave it running
            os.kill(worker, signal.SIGKILL)
