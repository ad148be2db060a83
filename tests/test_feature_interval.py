"""feature_probes.interval (Table A.2): the interval law's labels against a hand count, its exact numbers (P(y=+1),
gamma, sigma~, the threshold ceiling) against sums written out and against sampling, the balanced sampler's class
laws, the CLI (help, one-line errors, resume), and the committed tables rebuilt from their results."""

import json
import math
import re
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from docs_blocks import docs_block

from feature_probes.interval import cli
from feature_probes.interval.data import IntervalSpec, interval_labels, make_split, sample_phi
from feature_probes.interval.experiments import PRESETS, run_interval
from feature_probes.parity.data import make_problem
from feature_probes.parity.experiments import hyper

SPEC = IntervalSpec()  # Table A.2's d = 500, D = 100, k = 30, [t1, t2] = [20, 30], Pr = 2/3 on A
MEASURED = Path(__file__).resolve().parents[1] / "measured" / "feature_probes"
DOCS = MEASURED.parents[1] / "docs" / "feature-probes.md"


def test_labels_by_hand():
    A = torch.tensor([0, 2, 3, 5])
    phi = torch.tensor(
        [
            [1, 1, 1, 0, 0, 1, 0],  # sum over A: 1+1+0+1 = 3
            [0, 1, 0, 0, 1, 0, 1],  # 0
            [1, 0, 1, 1, 0, 1, 1],  # 4
            [1, 0, 0, 1, 0, 0, 0],
        ],
        dtype=torch.float,
    )  # 2
    assert interval_labels(phi, A, 2, 3).tolist() == [1.0, -1.0, -1.0, 1.0]
    assert interval_labels(phi, A, 3, 4).tolist() == [1.0, -1.0, 1.0, -1.0]
    gen = torch.Generator().manual_seed(0)
    problem = make_problem(SPEC, gen)
    for spec in (SPEC, replace(SPEC, balanced=False), replace(SPEC, structured=False)):
        phi, y = sample_phi(spec, problem.A, 400, gen)
        for i in range(400):
            ones = sum(int(phi[i, j]) for j in problem.A.tolist())
            assert y[i] == (1 if 20 <= ones <= 30 else -1)


def test_exact_law_numbers_written_out():
    """P(y=+1) = sum_{s>=20} C(30,s)(2/3)^s(1/3)^(30-s); gamma = Cov(y, s)/k; sigma~^2 = k mu(1-mu) + (D-k)/4."""
    natural = replace(SPEC, balanced=False)
    pos = sum(math.comb(30, s) * (2 / 3) ** s * (1 / 3) ** (30 - s) for s in range(20, 31))
    assert natural.positive_share() == pytest.approx(pos) and pos == pytest.approx(0.5848, abs=1e-4)
    es_pos = sum(s * math.comb(30, s) * (2 / 3) ** s * (1 / 3) ** (30 - s) for s in range(20, 31))
    # natural: Cov(y, s) = E[y s] - E[y] E[s], E[s] = 20, E[y s] = 2 E[s 1{s>=20}] - E[s]
    assert natural.gamma() == pytest.approx((2 * es_pos - 20 - (2 * pos - 1) * 20) / 30)
    assert natural.centre_and_scale()[1] ** 2 == pytest.approx(30 * (2 / 3) * (1 / 3) + 70 / 4)
    # balanced: E[y] = 0, E[y s] = (E[s | +] - E[s | -]) / 2
    es_neg = 20 - es_pos
    gamma_bal = (es_pos / pos - es_neg / (1 - pos)) / 2 / 30
    assert SPEC.gamma() == pytest.approx(gamma_bal)
    mu = (es_pos / pos + es_neg / (1 - pos)) / 2 / 30
    assert SPEC.centre_and_scale()[1] ** 2 == pytest.approx(30 * mu * (1 - mu) + 70 / 4)
    assert replace(SPEC, structured=False, balanced=False).positive_share() == pytest.approx(
        sum(math.comb(30, s) for s in range(20, 31)) / 2**30
    )
    # t2 = k: the label is a threshold on s; an interval inside [0, k] is not (k = 2, [1, 1]: XOR of two bits)
    assert SPEC.linear_ceiling() == pytest.approx(1.0) and natural.majority_share() == pytest.approx(pos)
    xor = IntervalSpec(d=4, D=2, k=2, t1=1, t2=1, p_a=0.5, balanced=False)  # P(s) = 1/4, 1/2, 1/4
    assert xor.linear_ceiling() == pytest.approx(3 / 4)


@pytest.mark.parametrize("balanced", [True, False])
def test_sampled_law_matches_the_exact_numbers(balanced):
    spec = replace(SPEC, balanced=balanced)
    gen = torch.Generator().manual_seed(1)
    problem = make_problem(spec, gen)
    x, y, phi = make_split(spec, problem, 60000, gen)
    assert torch.equal(y, interval_labels(phi, problem.A, 20, 30))
    if balanced:
        assert int((y > 0).sum()) == 30000
        s = phi[:, problem.A].sum(dim=1).long()
        for label in (1, -1):  # the class-conditional law of s
            freq = torch.bincount(s[y == label], minlength=31).double() / 30000
            assert freq.tolist() == pytest.approx(spec.class_s_pmf(label), abs=0.01)
    else:
        assert float((y > 0).double().mean()) == pytest.approx(spec.positive_share(), abs=0.01)
    cov = (y[:, None] * phi).mean(dim=0) - y.mean() * phi.mean(dim=0)
    on_a = torch.zeros(spec.D, dtype=torch.bool)
    on_a[problem.A] = True
    assert float(cov[on_a].mean()) == pytest.approx(spec.gamma(), abs=0.005)
    assert float(cov[~on_a].abs().max()) < 0.02
    assert float(x.mean(dim=0).abs().max()) < 0.01 and float(x.pow(2).sum(dim=1).mean()) == pytest.approx(1.0, rel=0.02)


def test_hyper_parameters_come_from_the_structured_law():
    h = hyper(replace(PRESETS["cpu"], laws=(False,)))
    gamma, sigma = SPEC.gamma(), SPEC.centre_and_scale()[1]
    assert h["sigma_a"] == pytest.approx(sigma**2 / (gamma * 900)) and h["sigma_w"] == pytest.approx(1 / 30)
    assert h["eta1"] == pytest.approx(gamma**2 * sigma**2 / (30 * 100**3))
    assert h["eta3"] == pytest.approx(900 / (200 * 100 ** (1 / 3)))
    with pytest.raises(ValueError, match="t1=31"):
        IntervalSpec(t1=31, t2=31).check()


def test_run_records_prediction_shares_and_the_law():
    row = run_interval(PRESETS["tiny"], True, 0)
    assert row["test_pos_share"] == 0.5 and row["law"]["majority"] == 0.5
    for method in row["methods"].values():
        assert 0.0 <= method["test_pos_share"] <= 1.0


def test_cli_help_bad_input_and_resume(tmp_path, capsys):
    for argv in ([], ["table"]):
        with pytest.raises(SystemExit) as exc:
            cli.main(argv + ["--help"])
        assert exc.value.code == 0
    assert "t1=20" in capsys.readouterr().out
    for bad, why in ((["--steps", "2"], "at least 3 steps"), (["--stage3", "sgd"], "stage3=")):
        with pytest.raises(SystemExit) as exc:
            cli.main(["table", "--preset", "tiny", "--out", str(tmp_path / "bad"), *bad])
        err = capsys.readouterr().err
        assert exc.value.code == 2 and why in err and "Traceback" not in err
        assert len([line for line in err.splitlines() if "error:" in line]) == 1
    with pytest.raises(SystemExit) as exc:
        cli.main(["report", str(tmp_path / "nothing")])
    assert exc.value.code == 2 and "interval_result.json does not exist" in capsys.readouterr().err
    argv = ["table", "--preset", "tiny", "--out", str(tmp_path / "run"), "--quiet", "--threads", "1"]
    assert cli.main(argv) == 0
    rows = (tmp_path / "run" / "interval_runs.jsonl").read_text().splitlines()
    assert len(rows) == 2 and (tmp_path / "run" / "interval_figA4_weights.png").stat().st_size > 0
    assert cli.main(argv) == 0  # resumes: nothing recomputed, nothing appended
    assert (tmp_path / "run" / "interval_runs.jsonl").read_text().splitlines() == rows
    summary = (tmp_path / "run" / "interval_summary.md").read_text()
    assert cli.main(["report", str(tmp_path / "run")]) == 0
    assert (tmp_path / "run" / "interval_summary.md").read_text() == summary


FOLDERS = sorted(p.parent.name for p in MEASURED.glob("interval*/interval_result.json"))


def test_the_committed_runs_are_there():
    assert {"interval", "interval-paper", "interval-natural", "interval-gd-lr0.1"} <= set(FOLDERS)


@pytest.mark.parametrize("folder", FOLDERS)
def test_committed_interval_summaries_are_their_results_tables(folder):
    """Each committed table is what its committed result gives, and the result's rows are the JSONL's."""
    result = json.loads((MEASURED / folder / "interval_result.json").read_text())
    assert (
        cli.markdown(result["runs"], result["config"], result["command"])
        == (MEASURED / folder / "interval_summary.md").read_text()
    )
    rows = [json.loads(line) for line in (MEASURED / folder / "interval_runs.jsonl").read_text().splitlines()]
    slim = [{k: v for k, v in r.items() if k != "mds"} for r in rows]
    assert all(r in slim for r in result["runs"])


@pytest.mark.parametrize("marker", ["interval-paper", "interval-natural", "interval-gd-lr0.1"])
def test_docs_tables_are_the_committed_summaries(marker):
    """docs/feature-probes.md's Table A.2 blocks are the committed runs' tables, with their commands."""
    text = DOCS.read_text(encoding="utf-8")
    block = docs_block("feature-probes.md", marker).strip()
    summary = (MEASURED / marker / "interval_summary.md").read_text()
    assert block and block in summary
    command = re.search(r"`(python -m feature_probes.interval [^`]*)`", summary).group(1)
    assert command.replace(" --quiet", "") in text
