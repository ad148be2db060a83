"""Benchmark arithmetic against hand computations, and an end-to-end run with resume on a tiny model."""

import json

import pytest

from gemfilter.lab.bench import report as bench_report
from gemfilter.lab.bench.report import growth_exponent, summarize


def test_growth_exponent_recovers_power_laws():
    ns = [1000, 2000, 4000, 8000]
    assert growth_exponent(ns, [3 * n**1.5 for n in ns]) == pytest.approx(1.5)
    assert growth_exponent(ns, [0.01 * n for n in ns]) == pytest.approx(1.0)
    assert growth_exponent([1000], [1.0]) is None


def _row(method, length, rep, prompt, gen, peak, layer=None):
    return dict(
        method=method,
        length=length,
        repeat=rep,
        n=length,
        kept=min(length, 100),
        prompt_s=prompt,
        gen_s=gen,
        total_s=prompt + gen,
        prompt_peak_mib=peak,
        gen_peak_mib=peak / 2,
        layer=layer,
        m=18,
    )


def test_summary_medians_and_ratios_by_hand():
    rows = [
        _row("full", 1000, 0, 10.0, 5.0, 400),
        _row("full", 1000, 1, 12.0, 5.0, 420),
        _row("full", 1000, 2, 30.0, 5.0, 410),
        _row("gemfilter", 1000, 0, 7.0, 1.0, 300, layer=11),
        _row("snapkv", 1000, 0, 12.0, 2.0, 500),
    ]
    s = summarize(rows)
    cells = {c["method"]: c for c in s["cells"]}
    assert cells["full"]["prompt_s"] == 12.0  # median of 10, 12, 30
    assert cells["full"]["prompt_peak_mib"] == 410
    g = cells["gemfilter"]
    assert g["prompt_s_vs_full"] == pytest.approx(7 / 12)
    assert g["total_s_vs_full"] == pytest.approx(8 / 17)
    assert g["total_s_vs_snapkv"] == pytest.approx(8 / 14)
    assert g["theory_prompt_ratio"] == pytest.approx(12 / 18)
    assert "theory_prompt_ratio" not in cells["snapkv"]


@pytest.mark.slow  # a whole benchmark run, then its resume (~1 min)
def test_bench_end_to_end_and_resume(tiny_model_dir, tmp_path, monkeypatch, capsys):
    args = [
        "--model",
        str(tiny_model_dir),
        "--methods",
        "full,gemfilter,snapkv",
        "--lengths",
        "350,500",
        "--gen-tokens",
        "3",
        "--topk",
        "64",
        "--layer",
        "2",
        "--out",
        str(tmp_path),
    ]
    assert bench_report.main(args) == 0
    rows = [json.loads(x) for x in (tmp_path / "bench.jsonl").read_text().splitlines()]
    assert sorted((r["method"], r["length"]) for r in rows) == sorted(
        (m, n) for m in ("full", "gemfilter", "snapkv") for n in (350, 500)
    )
    for r in rows:
        assert r["new_tokens"] == 3 and r["prompt_s"] > 0 and r["gen_s"] > 0
        assert r["kept"] == (r["n"] if r["method"] == "full" else 64)
        assert r["layer"] == (2 if r["method"] == "gemfilter" else None)  # the resolved filter layer
    cells = json.loads((tmp_path / "bench.json").read_text())["cells"]
    assert all(c["theory_prompt_ratio"] == 3 / 4 for c in cells if c["method"] == "gemfilter")
    assert (tmp_path / "bench.png").stat().st_size > 10_000
    table = (tmp_path / "bench.md").read_text()
    assert "| gemfilter |" in table and "Growth exponent" in table
    # --threads 0 means torch's choice: the header and rows give the count the workers really used
    assert all(r["threads"] >= 1 and r["threads_arg"] == 0 for r in rows)
    assert f"threads: {rows[0]['threads']};" in table and "threads: 0;" not in table

    def boom(*a, **k):
        raise AssertionError("a finished cell was measured again")

    monkeypatch.setattr("gemfilter.lab.bench.core.run_worker", boom)
    assert bench_report.main(args) == 0  # everything is in bench.jsonl: nothing reruns


def test_bench_rejects_unknown_methods(tmp_path):
    with pytest.raises(SystemExit, match="unknown method.*allowed"):
        bench_report.main(["--methods", "full,warp", "--out", str(tmp_path)])
    with pytest.raises(SystemExit, match="must be a positive whole number of tokens"):
        bench_report.main(["--lengths", "2.5", "--out", str(tmp_path)])


@pytest.mark.slow  # two benchmark runs (~20 s)
def test_keep_going_reports_the_cells_that_ran_and_a_rerun_measures_only_the_failed_one(tmp_path, monkeypatch, capsys):
    """--keep-going (the GPU script's mode): a failed cell is one error line, the report covers the others, exit 2;
    without it the first failure ends the run."""
    from gemfilter.lab.bench import core

    args = [
        "--model",
        "config:llama-3.1-8b",
        "--layers",
        "2",
        "--test-shrink",
        "--dtype",
        "fp32",
        "--device",
        "cpu",
        "--methods",
        "full,gemfilter",
        "--lengths",
        "300",
        "--gen-tokens",
        "2",
        "--topk",
        "64",
        "--layer",
        "1",
        "--out",
        str(tmp_path),
    ]
    real, ran = core.run_worker, []

    def fails_for_full(spec, timeout=None):
        ran.append(spec["method_name"])
        if spec["method_name"] == "full":
            raise RuntimeError("benchmark worker failed: CUDA out of memory (injected)")
        return real(spec, timeout)

    monkeypatch.setattr(core, "run_worker", fails_for_full)
    with pytest.raises(SystemExit, match="CUDA out of memory"):
        bench_report.main(args)  # default: stop at the first failure
    assert ran == ["full"] and not (tmp_path / "bench.jsonl").exists()
    assert bench_report.main(args + ["--keep-going"]) == 2
    err = capsys.readouterr().err
    assert "error: full at 300 tokens: benchmark worker failed: CUDA out of memory" in err
    assert "1 cell(s) failed and are not in the report: full at 300 tokens" in err
    rows = [json.loads(x) for x in (tmp_path / "bench.jsonl").read_text().splitlines()]
    assert [r["method"] for r in rows] == ["gemfilter"] and "| gemfilter |" in (tmp_path / "bench.md").read_text()
    assert rows[0]["dtype"] == "float32" and rows[0]["dtype_arg"] == "fp32"  # the resolved dtype and the option
    ran.clear()
    monkeypatch.setattr(
        core, "run_worker", lambda spec, timeout=None: ran.append(spec["method_name"]) or real(spec, timeout)
    )
    assert bench_report.main(args + ["--keep-going"]) == 0
    assert ran == ["full"]  # only the failed cell


def test_rows_that_kept_only_the_dtype_option_are_read_with_the_dtype_they_ran_in(tmp_path):
    """Rows written before dtype_arg held --dtype in "dtype" (None for auto): auto on CUDA is bf16."""
    base = dict(
        method="full",
        length=4096,
        repeat=0,
        n=4096,
        kept=4096,
        prompt_s=1.0,
        gen_s=1.0,
        total_s=2.0,
        prompt_peak_mib=1.0,
        gen_peak_mib=1.0,
        threads_arg=0,
    )
    rows = [
        dict(base, dtype=None, device="cuda:0"),
        dict(base, length=8192, dtype="fp16", device="cpu"),
        dict(base, length=16384, dtype=None, device="cpu"),
    ]
    (tmp_path / "bench.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    got = {r["length"]: (r["dtype"], r["dtype_arg"]) for r in bench_report.load_rows(tmp_path / "bench.jsonl")}
    assert got == {4096: ("bfloat16", None), 8192: ("float16", "fp16"), 16384: (None, None)}
