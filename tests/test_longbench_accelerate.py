"""Two CPU processes under ``accelerate launch`` shard LongBench samples; the merge equals a single-process run.

``accelerate launch --cpu --num_processes 2`` starts one process unless MPI is configured, so (as the
NIAH test) this uses ``--multi_gpu`` (torchrun underneath) with no GPU visible; the runner's
PartialState then uses gloo on CPU.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

from longbench_fixtures import TASKS, write_words
from test_niah_accelerate import free_port

from gemfilter.toolkit.io import read_jsonl

REPO = Path(__file__).resolve().parents[1]


def test_two_processes_resume_and_merge_to_the_single_process_result(tiny_model_dir, tmp_path):
    import torch

    from eval.longbench.cli import main

    words = write_words(tmp_path / "data", words=80)
    args = [
        "--model",
        str(tiny_model_dir),
        "--data-dir",
        str(words),
        "--tasks",
        ",".join(TASKS),
        "--limit",
        "3",
        "--methods",
        "full,gemfilter",
        "--topk",
        "8",
        "--layer",
        "2",
        "--max-length",
        "64",
        "--threads",
        "1",
    ]
    single = tmp_path / "single"
    threads = torch.get_num_threads()
    try:  # in-process single run with 1 thread, like each launched process
        assert main(["run", *args, "--no-progress", "--out", str(single)]) == 0
    finally:
        torch.set_num_threads(threads)
    files = sorted(p.relative_to(single) for p in single.rglob("*.jsonl"))
    assert len(files) == 6  # 2 methods x 3 tasks

    # A run interrupted after one sample, resumed by two processes dealing the other 17 round-robin.
    sharded = tmp_path / "sharded"
    (sharded / "pred" / "full").mkdir(parents=True)
    (sharded / "config.json").write_text((single / "config.json").read_text())
    first = read_jsonl(single / "pred" / "full" / "hotpotqa.jsonl")[0]
    (sharded / "pred" / "full" / "hotpotqa.jsonl.rank0").write_text(json.dumps(first) + "\n")
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1"}
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
        "eval.longbench",
        "run",
        *args,
        "--out",
        str(sharded),
    ]
    # With progress on, the main process prints how the work was dealt (the bar itself goes to stderr).
    r = subprocess.run(launch, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "1 already done, 17 to compute over 2 process(es)" in r.stdout
    assert sorted(p.relative_to(sharded) for p in sharded.rglob("*.jsonl")) == files
    for path in files:
        assert (sharded / path).read_text() == (single / path).read_text(), path
    assert not list(sharded.rglob("*.rank*"))
    assert (sharded / "report.md").read_text() == (single / "report.md").read_text()
