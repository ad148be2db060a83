"""``gemfilter bench --preset paper`` and config:<arch> models: the preset's settings, input checks
before any computation, the Fig. 9.3 table against hand-computed ratios, H2O's exclusion, and one
end-to-end run on a scaled (2-layer, test-shrunk) Phi 3.5 Mini."""

import json

import pytest

from gemfilter.lab.bench import paper as bench_paper
from gemfilter.lab.bench import report as bench_report

# Synthetic measurements: seconds and MiB per method, prompt time scaling with n.
PROMPT = {"full": 10.0, "snapkv": 10.5, "gemfilter": 4.5}
GEN = {"full": 2.0, "snapkv": 1.0, "gemfilter": 1.0}
PEAK = {"full": 30000.0, "snapkv": 20000.0, "gemfilter": 14000.0}


def _fake_worker(specs):
    def run(spec, timeout=None):
        specs.append(spec)
        m, n = spec["method_name"], spec["length"]
        layer = spec["layer"] if m == "gemfilter" else None
        prompt = PROMPT[m] * n / 4096
        return dict(
            attn="sdpa",
            mask_s=0.0,
            method=m,
            length=n,
            n=n,
            kept=n if m == "full" else 1024,
            layer=layer,
            m=spec["layers"] or 32,
            prompt_s=prompt,
            gen_s=GEN[m],
            total_s=prompt + GEN[m],
            prompt_peak_mib=1.0,
            gen_peak_mib=1.0,
            prompt_peak_abs_mib=PEAK[m],
            gen_peak_abs_mib=PEAK[m] - 5,
            new_tokens=spec["gen_tokens"],
            device="cuda:0",
            device_name="NVIDIA H100 80GB HBM3",
            threads=1,
            dtype="bfloat16",
            warmup_tokens=1280,
            weights="random",
            changes=[],
        )

    return run


def test_preset_paper_settings_and_table(monkeypatch, tmp_path, capsys):
    specs = []
    monkeypatch.setattr("gemfilter.lab.bench.core.run_worker", _fake_worker(specs))
    assert bench_report.main(["--model", "config:llama-3.1-8b", "--preset", "paper", "--out", str(tmp_path)]) == 0
    assert sorted({s["length"] for s in specs}) == [4096, 8192, 16384, 32768, 65536, 122880]
    assert {s["method_name"] for s in specs} == {"full", "snapkv", "gemfilter"}  # no H2O, as in the paper
    assert {(s["topk"], s["gen_tokens"], s["layer"]) for s in specs} == {(1024, 50, 13)}
    table = (tmp_path / "bench.md").read_text()
    assert "### Fig. 9.3 comparison" in table and "NVIDIA H100 80GB HBM3" in table
    assert "torch.cuda.max_memory_allocated" in table and bench_paper.H2O_LEFT_OUT in table
    row = next(line for line in table.splitlines() if line.startswith("| 4096 | 0."))
    cells = [c.strip() for c in row.strip("|").split("|")]
    # prompt ÷full, (r+1)/m, prompt ÷snapkv, total ÷snapkv, paper, total ÷full, paper, peak ÷snapkv, paper, peak ÷full,
    # paper
    assert cells[1:] == [
        f"{4.5 / 10:.2f}",
        f"{14 / 32:.2f}",
        f"{4.5 / 10.5:.2f}",
        f"{5.5 / 11.5:.2f}",
        "0.42",
        f"{5.5 / 12:.2f}",
        "0.42",
        f"{14000 / 20000:.2f}",
        "0.70",
        f"{14000 / 30000:.2f}",
        "0.30",
    ]


def test_preset_layer_follows_the_architecture_and_explicit_options_win(monkeypatch, tmp_path):
    specs = []
    monkeypatch.setattr("gemfilter.lab.bench.core.run_worker", _fake_worker(specs))
    args = [
        "--model",
        "config:phi-3.5-mini",
        "--preset",
        "paper",
        "--lengths",
        "2048",
        "--gen-tokens",
        "7",
        "--out",
        str(tmp_path),
    ]
    assert bench_report.main(args) == 0
    assert {(s["length"], s["gen_tokens"], s["layer"], s["topk"]) for s in specs} == {(2048, 7, 19, 1024)}


def test_scaled_model_needs_a_layer_inside_it_before_anything_runs(monkeypatch, tmp_path):
    def boom(*a, **k):
        raise AssertionError("a cell ran before the arguments were checked")

    monkeypatch.setattr("gemfilter.lab.bench.core.run_worker", boom)
    base = ["--model", "config:llama-3.1-8b", "--out", str(tmp_path)]
    with pytest.raises(SystemExit, match="layer 13 is outside.*--layers 8 --layer 3"):
        bench_report.main(base + ["--preset", "paper", "--layers", "8"])
    with pytest.raises(SystemExit, match="1..32"):
        bench_report.main(base + ["--layers", "40"])
    with pytest.raises(SystemExit, match="unknown architecture.*config:phi-3.5-mini"):
        bench_report.main(["--model", "config:gpt-5", "--out", str(tmp_path)])
    with pytest.raises(SystemExit, match="config:<arch> only"):
        bench_report.main(["--layers", "2", "--out", str(tmp_path)])
    with pytest.raises(SystemExit, match="unknown dtype"):
        bench_report.main(base + ["--dtype", "int4"])


def test_h2o_is_excluded_with_its_reason_where_it_cannot_fit(monkeypatch):
    from gemfilter import get_method
    from gemfilter.lab.bench import archs

    model = archs.build_model("config:llama-3.1-8b", device="meta")
    h2o, snap = get_method("h2o"), get_method("snapkv")
    monkeypatch.setattr(bench_paper, "_mem_available", lambda: 8 * 2**30)
    # 4 fp32 tensors of 32 heads x 256 x n: at n = 122880 that is 15 GiB > 8 GiB free; at 4096 it fits.
    reason = bench_paper.h2o_exclusion(h2o, model, 122880, "cpu")
    assert reason is not None and "15.0 GiB" in reason and "8.0 GiB is free" in reason
    assert bench_paper.h2o_exclusion(h2o, model, 4096, "cpu") is None
    assert bench_paper.h2o_exclusion(snap, model, 122880, "cpu") is None


def test_excluded_cells_are_reported_not_measured(monkeypatch, tmp_path):
    specs = []
    fake = _fake_worker(specs)

    def run(spec, timeout=None):
        if spec["method_name"] == "h2o":
            return dict(
                method="h2o",
                length=spec["length"],
                n=spec["length"],
                excluded="does not fit",
                device="cpu",
                device_name="x",
            )
        return fake(spec, timeout)

    monkeypatch.setattr("gemfilter.lab.bench.core.run_worker", run)
    args = [
        "--model",
        "config:llama-3.1-8b",
        "--methods",
        "full,snapkv,gemfilter,h2o",
        "--lengths",
        "4096",
        "--layer",
        "13",
        "--out",
        str(tmp_path),
    ]
    assert bench_report.main(args) == 0
    table = (tmp_path / "bench.md").read_text()
    assert "- h2o at 4096 tokens not run: does not fit" in table
    assert "| h2o |" not in table
    assert json.loads((tmp_path / "bench.json").read_text())["excluded"][0]["method"] == "h2o"


@pytest.mark.slow  # a whole benchmark run (~30 s)
def test_end_to_end_scaled_phi_generates_the_forced_tokens(tmp_path):
    args = [
        "--model",
        "config:phi-3.5-mini",
        "--layers",
        "2",
        "--test-shrink",
        "--dtype",
        "fp32",
        "--device",
        "cpu",
        "--methods",
        "full,gemfilter,snapkv",
        "--lengths",
        "300",
        "--topk",
        "64",
        "--layer",
        "1",
        "--gen-tokens",
        "3",
        "--out",
        str(tmp_path),
    ]
    assert bench_report.main(args) == 0
    rows = [json.loads(x) for x in (tmp_path / "bench.jsonl").read_text().splitlines()]
    assert sorted(r["method"] for r in rows) == ["full", "gemfilter", "snapkv"]
    for r in rows:
        assert r["new_tokens"] == 3 and r["n"] == 300 and r["weights"] == "random" and r["m"] == 2
        assert r["kept"] == (300 if r["method"] == "full" else 64)
        assert "TEST SHRINK: widths and heads / 8, vocabulary 1024" in r["changes"]
    table = (tmp_path / "bench.md").read_text()
    assert "first 2 of 32 decoder layers" in table and "TEST SHRINK" in table
    assert "| n | prompt ÷full | (r+1)/m |" in table and "| 300 | gemfilter | 64 |" in table


def test_pretrained_models_take_dtype_and_device_but_not_layers(tiny_model_dir):
    from gemfilter.lab.bench import core as bench

    row = bench.measure(str(tiny_model_dir), "gemfilter", 350, 2, 64, 2, dtype="fp32", device="cpu")
    assert row["weights"] == "pretrained" and row["changes"] == [] and row["new_tokens"] == 2
    assert row["dtype"] == "float32" and row["device"] == "cpu" and row["kept"] == 64
    with pytest.raises(ValueError, match="config:<arch> models only"):
        bench.measure(str(tiny_model_dir), "full", 350, 2, 64, None, layers=2)
