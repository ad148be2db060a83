"""Two CPU processes under ``accelerate launch`` shard RULER predictions; the merge equals a single-process run.

As the NIAH and LongBench tests: ``--multi_gpu`` (torchrun underneath) with no GPU visible, so the
runner's PartialState uses gloo on CPU.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

from test_niah_accelerate import free_port
from test_ruler_runner import TASKS, write_samples

from gemfilter.toolkit.io import read_jsonl

REPO = Path(__file__).resolve().parents[1]


def _strip(path):
    return [{k: v for k, v in r.items() if k != "seconds"} for r in read_jsonl(path)]


def test_two_processes_resume_and_merge_to_the_single_process_result(tiny_model_dir, tmp_path):
    import torch

    from eval.ruler.cli import main

    args = [
        "--model",
        str(tiny_model_dir),
        "--tasks",
        ",".join(TASKS),
        "--num-samples",
        "3",
        "--lengths",
        "512",
        "--methods",
        "full,gemfilter",
        "--topk",
        "8",
        "--layer",
        "2",
        "--threads",
        "1",
    ]
    single = write_samples(tmp_path / "single")
    threads = torch.get_num_threads()
    try:
        assert main(["run", *args, "--no-progress", "--out", str(single)]) == 0
    finally:
        torch.set_num_threads(threads)
    files = sorted(p.relative_to(single / "512" / "pred") for p in (single / "512" / "pred").rglob("*.jsonl"))
    assert len(files) == 6  # 2 methods x 3 tasks

    # A run interrupted after one prediction, resumed by two processes dealing the other 17 round-robin.
    sharded = write_samples(tmp_path / "sharded")
    (sharded / "config.json").write_text((single / "config.json").read_text())
    folder = sharded / "512" / "pred" / "full"
    folder.mkdir(parents=True)
    first = read_jsonl(single / "512" / "pred" / "full" / "vt.jsonl")[0]
    (folder / "vt.jsonl.rank0").write_text(json.dumps(first) + "\n")
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
        "eval.ruler",
        "run",
        *args,
        "--out",
        str(sharded),
    ]
    r = subprocess.run(launch, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "1 already done, 17 to compute over 2 process(es)" in r.stdout
    got = sorted(p.relative_to(sharded / "512" / "pred") for p in (sharded / "512" / "pred").rglob("*.jsonl"))
    assert got == files
    for f in files:
        assert _strip(sharded / "512" / "pred" / f) == _strip(single / "512" / "pred" / f), f
    assert not list(sharded.rglob("*.rank*"))
    assert (sharded / "report.csv").read_text() == (single / "report.csv").read_text()
