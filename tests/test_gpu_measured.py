"""The H200 figures in docs/bench.md are the committed rows of measured/gpu-h200 (scripts/gpu_check.sh's run).

The Fig. 9.3 tables are built again from each folder's bench.jsonl (``paper_table``: medians, ratios against
full and SnapKV, the paper's figures) and every table line under the docs' gpu-h200 markers must be one of
them; the sentences' ratios are recomputed from the rows; the CUDA test count is the log's.
"""

import json
import re
from pathlib import Path

import pytest

from gemfilter.lab.bench.paper import paper_table, ratios
from gemfilter.lab.bench.report import load_rows

REPO = Path(__file__).resolve().parents[1]
RUN = REPO / "measured" / "gpu-h200"
DOC = (REPO / "docs" / "bench.md").read_text(encoding="utf-8")


def table(arch):
    rows = load_rows(RUN / arch / "bench.jsonl")
    return rows, paper_table(rows, {"model": f"config:{arch}", "topk": 1024, "gen_tokens": 50})


@pytest.mark.parametrize("arch", ["llama-3.1-8b", "mistral-nemo-12b"])
def test_every_documented_line_is_a_line_of_the_rows_table(arch):
    rows, built = table(arch)
    assert {r["device_name"] for r in rows} == {"NVIDIA H200"} and {r["dtype"] for r in rows} == {"bfloat16"}
    key = arch.split("-")[0] if arch.startswith("llama") else "nemo"
    doc_lines = []
    for part in ("rows", "ratios"):
        start = DOC.index(f"<!-- gpu-h200-{key}: {part}")
        block = DOC[start:].split("\n", 1)[1].split("\n\n", 1)[0]  # the table under the marker line
        doc_lines += [x for x in block.splitlines() if x.startswith("| ") and not x.startswith("| n ")]
    assert len(doc_lines) >= (36 if key == "llama" else 5)
    missing = [x for x in doc_lines if x not in built.splitlines()]
    assert not missing, f"docs/bench.md has {len(missing)} line(s) the rows do not give, e.g. {missing[0]}"


def test_the_sentences_ratios_are_the_rows():
    rows, _ = table("llama-3.1-8b")
    by = {(r["method"], r["length"]): r for r in rows}
    r120 = next(r for r in ratios(rows) if r["length"] == 122880)
    full, gem, snap, fast = (by[(m, 122880)] for m in ("full", "gemfilter", "snapkv", "fastkv:layer=15"))
    for text, value in [
        ("is 2.41× faster than full in the prompt phase", full["prompt_s"] / gem["prompt_s"]),
        ("1.72× faster than full", full["total_s"] / gem["total_s"]),
        ("1.76× faster than SnapKV", snap["total_s"] / gem["total_s"]),
        ("here 1.95× prefill", full["prompt_s"] / fast["prompt_s"]),
    ]:
        assert text in DOC.replace("\n  ", " ")
        assert f"{value:.2f}" in text, (text, value)
    assert f"{r120['peak_abs_mib/full']:.2f}× full's" in DOC and f"{r120['prompt_s/full']:.2f}× full" in DOC
    peak = max(gem["prompt_peak_abs_mib"], gem["gen_peak_abs_mib"]) / 1024
    assert f"({peak:.1f} against" in DOC


def test_the_cuda_test_count_is_the_logs():
    log = (RUN / "cuda-tests.log").read_text()
    passed = int(re.search(r"(\d+) passed", log).group(1))
    assert "failed" not in log and f"all\n{passed} passed" in DOC
    assert json.loads((RUN / "llama-3.1-8b" / "bench.json").read_text())["meta"]["device"].endswith("(NVIDIA H200)")


def test_the_variants_cuda_test_count_is_their_logs():
    log = (REPO / "measured" / "gpu-h200-variants" / "cuda-tests.log").read_text()
    passed = int(re.search(r"(\d+) passed", log).group(1))
    assert "failed" not in log and "NVIDIA H200" in log and f"all\n{passed} passed" in DOC
