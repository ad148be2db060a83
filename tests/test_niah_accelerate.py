"""Two CPU processes under ``accelerate launch`` shard the NIAH cells; the merge equals a single run.

``accelerate launch --cpu --num_processes 2`` starts one process unless MPI is configured, so the
test uses ``--multi_gpu`` (torchrun underneath), for which the runner picks gloo on CPU.
"""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

from niah_fixtures import save_tiny_model, write_haystack

from gemfilter.toolkit.io import read_jsonl

REPO = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def strip(rows):
    return [{k: v for k, v in r.items() if k not in ("seconds", "process")} for r in rows]


def test_two_processes_resume_and_merge_to_the_single_process_result(tmp_path):
    model_dir = save_tiny_model(tmp_path / "model")
    args = [
        "--model",
        str(model_dir),
        "--haystack-dir",
        str(write_haystack(tmp_path / "hay")),
        "--lengths",
        "240,260",
        "--depths",
        "0,50,100",
        "--methods",
        "full,gemfilter,snapkv",
        "--topk",
        "40",
        "--layer",
        "2",
        "--max-new-tokens",
        "3",
        "--threads",
        "1",
        "--no-progress",
    ]
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1"}  # both runs on CPU, same kernels

    single = tmp_path / "single"
    r = subprocess.run(
        [sys.executable, "-m", "eval.niah", *args, "--out", str(single)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    rows1 = read_jsonl(single / "results.jsonl")
    assert len(rows1) == 18

    # A run interrupted after 4 cells, then resumed by two processes: 14 cells dealt round-robin.
    sharded = tmp_path / "sharded"
    sharded.mkdir()
    (sharded / "config.json").write_text((single / "config.json").read_text())
    (sharded / "results.rank0.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows1[:4]))
    launch = [
        sys.executable,
        "-m",
        "accelerate.commands.launch",
        "--multi_gpu",
        "--num_processes",
        "2",
        "--num_machines",
        "1",
        "--mixed_precision",
        "no",
        "--dynamo_backend",
        "no",
        "--main_process_port",
        str(free_port()),
        "-m",
        "eval.niah",
        *args,
        "--out",
        str(sharded),
    ]
    r = subprocess.run(launch, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    rows2 = read_jsonl(sharded / "results.jsonl")
    assert strip(rows2) == strip(rows1)
    assert rows2[:4] == rows1[:4]  # kept, not recomputed
    assert [row["process"] for row in rows2[4:]] == [0, 1] * 7
    assert list(sharded.glob("results.rank*.jsonl")) == []
    assert (sharded / "heatmaps.png").is_file() and (sharded / "summary.md").is_file()
