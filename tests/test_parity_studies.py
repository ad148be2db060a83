"""feature_probes.parity.studies: the step-1 variants against a step written out from autograd's gradient,
the NTK spread against the closed-form ridge on every parameter, the CLI, and the committed study tables."""

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from docs_blocks import docs_block

from feature_probes.parity import cli
from feature_probes.parity.data import make_problem, make_split
from feature_probes.parity.experiments import PRESETS, cos_to_star, hyper
from feature_probes.parity.model import NTKFeatures, TwoLayerNet, hinge
from feature_probes.parity.studies import (
    Step1Variant,
    ntk_markdown,
    ntk_spread,
    step1_cosines,
    step1_markdown,
)
from icl_probes.common import seed_everything

TINY = PRESETS["tiny"]
MEASURED = Path(__file__).resolve().parents[1] / "measured" / "feature_probes"
DOCS = MEASURED.parents[1] / "docs" / "feature-probes.md"


def _start(cfg, seed):
    """run_parity's draw for seed: problem, train split, test split, then the initial network."""
    spec = replace(cfg.spec, structured=True)
    h = hyper(cfg)
    gen = seed_everything(seed)
    problem = make_problem(spec, gen)
    x, y, _ = make_split(spec, problem, cfg.n_train, gen)
    make_split(spec, problem, cfg.n_test, gen)
    return x, y, problem.star(), TwoLayerNet(spec.d, cfg.m, h["sigma_w"], h["sigma_b"], h["sigma_a"], gen), h


@pytest.mark.parametrize(
    "variant",
    [
        Step1Variant("all"),
        Step1Variant("first 100", n=100),
        Step1Variant("keeps half", keep=0.5),
        Step1Variant("lemma", rule="lemma_a17"),
        Step1Variant("float32 sum", float32_sum=True),
    ],
)
def test_step1_cosine_is_that_of_the_step_written_out(variant):
    """w^(1) = keep w^(0) - eta1 grad_w L(first n points), with autograd's gradient of the smoothed hinge loss."""
    (row,) = step1_cosines(TINY, 3, [variant])
    x, y, star, net, _ = _start(TINY, 3)
    h = hyper(replace(TINY, step1=variant.rule))
    n = variant.n or TINY.n_train
    hinge(net(x[:n], h["smooth12"]), y[:n]).backward()
    w0 = net.w.detach()
    w1 = variant.keep * w0 - h["eta1"] * net.w.grad
    if (
        variant.float32_sum
    ):  # the two w terms cancel only up to float32 rounding (at the paper's size it swamps eta1 grad)
        w1 = w0 - h["eta1"] * (net.w.grad + 2 * h["lam_w1"] * w0)
    assert row["n"] == n and row["init"]["cos"] == pytest.approx(cos_to_star(net.w.detach(), star), abs=1e-6)
    assert row["step1"]["cos"] == pytest.approx(cos_to_star(w1, star), abs=1e-4)
    if variant.keep:  # eta1 grad is ~1e-9 of w^(0): keeping any of the init keeps its direction
        assert row["step1"]["cos"] == pytest.approx(row["init"]["cos"], abs=1e-4)


def test_step1_leaves_out_variants_larger_than_the_training_set_and_checks_keep():
    rows = step1_cosines(TINY, 0, [Step1Variant("too many", n=TINY.n_train + 1), Step1Variant("all")])
    assert [r["variant"] for r in rows] == ["all"]
    with pytest.raises(ValueError, match="keep=1.0"):
        step1_cosines(TINY, 0, [Step1Variant("bad", keep=1.0)])


def test_ntk_spread_predicts_as_the_closed_form_ridge_and_counts_its_subsets():
    """Test accuracy and subset accuracies from (Phi^T Phi + lam I)^-1 Phi^T y on every parameter, at the chosen lam."""
    row = ntk_spread(TINY, 1, 400, 600, 100, paper_test=0.6)
    spec = replace(TINY.spec, structured=True)
    run = replace(TINY, n_train=400, n_test=600)
    gen = seed_everything(1)
    problem = make_problem(spec, gen)
    x, y, _ = make_split(spec, problem, 400, gen)
    xt, yt, _ = make_split(spec, problem, 600, gen)
    h = hyper(run)
    net = TwoLayerNet(spec.d, run.m, h["sigma_w"], h["sigma_b"], h["sigma_a"], gen)
    feats = NTKFeatures(net, x)
    phi = feats.dense(x).double()
    theta = torch.linalg.solve(phi.T @ phi + row["lam"] * torch.eye(phi.shape[1], dtype=phi.dtype), phi.T @ y.double())
    out = feats.dense(xt).double() @ theta
    right = ((out > 0).double() * 2 - 1 == yt.double()).double()
    parts = right.view(6, 100).mean(dim=1)
    assert row["subsets"] == 6 and row["test_acc"] == pytest.approx(float(right.mean()), abs=0.01)
    assert row["subset_min"] == pytest.approx(float(parts.min()), abs=0.02)
    assert row["subset_max"] == pytest.approx(float(parts.max()), abs=0.02)
    assert row["share_at_paper"] == pytest.approx(float((parts >= 0.6).double().mean()), abs=1 / 6 + 1e-9)


def test_study_cli_help_bad_input_and_resume(tmp_path, capsys):
    for sub in ("step1", "ntk"):
        with pytest.raises(SystemExit) as exc:
            cli.main([sub, "--help"])
        assert exc.value.code == 0
    assert "0.848" in capsys.readouterr().out
    for bad, why in (
        (["--n-train", "5,x"], "expected integers"),
        (["--subset", "0"], "subset=0"),
        (["--n-train", "5"], "training sizes >= 10"),
    ):
        with pytest.raises(SystemExit) as exc:
            cli.main(["ntk", "--preset", "tiny", "--out", str(tmp_path / "bad"), *bad])
        assert exc.value.code == 2 and why in capsys.readouterr().err
    argv = [
        "ntk",
        "--preset",
        "tiny",
        "--seeds",
        "0",
        "--n-train",
        "100,200",
        "--n-test",
        "200",
        "--subset",
        "50",
        "--out",
        str(tmp_path / "ntk"),
        "--quiet",
    ]
    assert cli.main(argv) == 0
    rows = (tmp_path / "ntk" / "ntk_rows.jsonl").read_text().splitlines()
    assert len(rows) == 2
    assert cli.main(argv) == 0  # resumes: nothing recomputed, nothing appended
    assert (tmp_path / "ntk" / "ntk_rows.jsonl").read_text().splitlines() == rows
    assert cli.main(["step1", "--preset", "tiny", "--seeds", "0,1", "--out", str(tmp_path / "s1"), "--quiet"]) == 0
    assert "| steps 1-2 on 100 points |" in (tmp_path / "s1" / "step1_summary.md").read_text()


@pytest.mark.parametrize("study, build", [("step1", step1_markdown), ("ntk", ntk_markdown)])
def test_committed_study_tables_are_their_rows_and_in_the_docs(study, build):
    folder = MEASURED / f"parity-{study}"
    rows = [json.loads(line) for line in (folder / f"{study}_rows.jsonl").read_text().splitlines()]
    summary = (folder / f"{study}_summary.md").read_text()
    command, table = summary.split("\n\n", 1)
    assert table == build(rows)
    assert docs_block("feature-probes.md", f"parity-{study}").strip() == table.strip()
    assert command.strip("`").replace(" --quiet", "") in DOCS.read_text(encoding="utf-8")  # the run's own command


def test_docs_no_structure_training_size_rows_are_the_committed_results():
    """docs/feature-probes.md's no-structure table: each row's n_train and both third stages' train / test / cos
    are its run's result."""
    block = docs_block("feature-probes.md", "parity-nostruct-n")
    rows = [line.split(" | ") for line in block.strip().splitlines()[2:]]
    assert len(rows) >= 4
    for cells in rows:
        result = json.loads((MEASURED / cells[0].strip("|` ") / "parity_result.json").read_text())
        unit = next(u for u in result["runs"] if not u["structured"])["methods"]
        want = [str(result["config"]["n_train"])] + [
            f"{100 * unit[m]['train_acc']:.1f} / {100 * unit[m]['test_acc']:.1f} / {unit[m]['cos']:.3f}"
            for m in ("network", "network_adam")
        ]
        assert [c.strip("| ") for c in cells[1:]] == want, cells[0]
