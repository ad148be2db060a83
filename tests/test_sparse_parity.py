"""icl_probes.sparse_parity (Sec. 5.5): the closed-form heads against the dissertation's worked example written out,
Thm 5.5.2's signal term against values computed by hand, the projection ratio against rank(D)/M for random D,
the data law's frequencies, the model against its hidden-basis form, the exact N -> infinity loss against sampling,
nested flips, the CLI (help, one-line errors, resume) and the committed tables rebuilt from their rows."""

import json
import math
from pathlib import Path

import pytest
import torch
from docs_blocks import docs_block

from icl_probes.sparse_parity import cli
from icl_probes.sparse_parity.data import (
    TaskLaw,
    flip_labels,
    flip_ranks,
    random_orthonormal,
    sample_pairs,
    sample_phi,
    sample_prompts,
    task_sets,
    xor_labels,
)
from icl_probes.sparse_parity.experiments import PRESETS, run_closed
from icl_probes.sparse_parity.model import (
    Heads,
    closed_form,
    exact_limit_loss,
    forward,
    hinge,
    limit_forward,
    signal_term,
)
from icl_probes.sparse_parity.report import markdown
from icl_probes.sparse_parity.theory import d_matrix, projection_energy, projector, sample_xi, subset_check

REPO = Path(__file__).resolve().parents[1]
MEASURED = REPO / "measured" / "sparse-parity"
DOCS = REPO / "docs" / "icl-probes.md"
GAMMA = 0.125


def test_closed_form_is_the_worked_example():
    """v2 = 3, d = 8 (the dissertation's example): a = (-1, -1, -1, +1, -1, -1, -1, +1), 4 gamma V as listed."""
    h = closed_form(3, 3, GAMMA)
    written = [[-1, 1, -1, 1, -1, 1, -1, 1], [-1, -1, 1, 1, -1, -1, 1, 1], [-1, -1, -1, -1, 1, 1, 1, 1], [-3] * 8]
    written += [[-v for v in row] for row in written]
    assert h.a.tolist() == [-1, -1, -1, 1, -1, -1, -1, 1] and h.index == tuple(range(1, 9))
    assert (h.diag() * 4 * GAMMA).tolist() == written
    assert torch.equal(h.V, torch.diag_embed(h.diag()))  # diagonal
    g1 = closed_form(1, 3, GAMMA)  # neurons {1, 4, 5, 8}, with v1 = 1 in neuron 4 and its negation
    assert g1.index == (1, 4, 5, 8) and g1.a.tolist() == [-1, 1, -1, 1]
    assert (g1.diag() * 4 * GAMMA).tolist() == [written[0], [-1] * 8, written[4], [1] * 8]


def test_signal_term_by_hand():
    """v1 = 1, v2 = 2 (d = 4), task (1, 2) in S1 (0-based (0, 1)). With f1 = (-p1 + p2)/2, f2 = (-p1 - p2)/2,
    f3 = -(p1 + p2): g2* = -|f1| - |f2| + |f3| and g1* = -|f1| + |f3|/2. By hand, for (p1, p2) = (1, 1), (1, -1),
    (-1, 1), (-1, -1): g2* = 1, -1, -1, 1 and g1* = 1, -1, -1, 1, so y g = 1 and the hinge loss is 0. On the S2 task
    (1, 3), (p1, p3) = (1, 1): g1* = -1 + 1 = 0 (hinge loss 1), g2* = -1 - 0 + 2 = 1."""
    signs = torch.tensor([[1.0, 1.0], [1.0, -1.0], [-1.0, 1.0], [-1.0, -1.0]])
    phi_q = torch.ones(4, 4, dtype=torch.float64)
    phi_q[:, :2] = signs
    pairs = torch.tensor([[0, 1]] * 4)
    for v in (1, 2):
        g = signal_term(closed_form(v, 2, GAMMA), pairs, phi_q, GAMMA)
        assert g.tolist() == pytest.approx([1.0, -1.0, -1.0, 1.0])
        assert hinge(signs.prod(dim=1).double() * g).tolist() == [0.0] * 4
    s2 = torch.tensor([[0, 2]])
    ones = torch.ones(1, 4, dtype=torch.float64)
    assert float(signal_term(closed_form(1, 2, GAMMA), s2, ones, GAMMA)) == pytest.approx(0.0)
    assert float(signal_term(closed_form(2, 2, GAMMA), s2, ones, GAMMA)) == pytest.approx(1.0)


def test_closed_forms_on_every_task_exactly():
    """N -> infinity: both solve S1 with margin 1; g2* solves S2; g1* gets g = 0 exactly on the S2 pairs whose
    first v1 binary digits agree (d = 8, v1 = 1: 24 of the 54 ordered S2 pairs), so its S2 loss is 24/54."""
    s1, s2 = task_sets(8, 2)
    assert len(s1) == 2 and len(s2) == 54
    g1, g2 = closed_form(1, 3, GAMMA), closed_form(3, 3, GAMMA)
    assert exact_limit_loss(g1.a, g1.V, s1, GAMMA) == dict(loss=0.0, acc=1.0, margin=1.0)
    assert exact_limit_loss(g2.a, g2.V, s1, GAMMA)["margin"] == 1.0
    assert exact_limit_loss(g2.a, g2.V, s2, GAMMA) == dict(loss=0.0, acc=1.0, margin=1.0)
    agree = sum(1 for i, j in s2.tolist() if i % 2 == j % 2)
    assert agree == 24 and exact_limit_loss(g1.a, g1.V, s2, GAMMA)["loss"] == pytest.approx(24 / 54)


def test_subset_check_finds_the_rescaled_neuron():
    rows = subset_check(closed_form(1, 3, GAMMA), closed_form(3, 3, GAMMA))
    assert [r["index"] for r in rows] == [1, 4, 5, 8]
    assert [r["exact"] for r in rows] == [[1], [], [5], []]
    assert [r["rescaled"] for r in rows] == [[1], [4], [5], [8]]
    assert rows[1]["scale"] == pytest.approx([1 / 3])  # -v1/(4 gamma) against -v2/(4 gamma)
    row = run_closed(PRESETS["tiny"], 1, 2)
    assert row["g1"]["signal_s1"] == dict(max_hinge=0.0, min_margin=1.0)


def test_projection_energy_is_rank_over_m_for_a_random_d():
    """E||P_D Xi||^2 = tr(P_D) Cov(Xi) = rank(D)/M, for any D; a random (d, c) D of rank r < c included."""
    gen = torch.Generator().manual_seed(0)
    d, M = 12, 64
    xi = sample_xi(M, d, 40000, gen)
    assert float(xi.var(dim=0).mean()) == pytest.approx(1 / M, rel=0.03)
    assert set(torch.unique(xi * M).tolist()) <= set(range(-M, M + 1, 2))
    energies = {}
    for r, c in ((2, 5), (7, 9)):
        D = torch.randn(d, r, generator=gen, dtype=torch.float64) @ torch.randn(
            r, c, generator=gen, dtype=torch.float64
        )
        P = projector(D)
        assert torch.allclose(P @ P, P, atol=1e-10) and torch.allclose(P @ D, D, atol=1e-10)
        mean, se = projection_energy(P, xi)
        assert abs(mean - r / M) < 4 * se
        energies[r] = mean
    assert energies[2] / energies[7] == pytest.approx(2 / 7, rel=0.05)
    for v1, v2 in ((1, 3), (2, 4)):  # D_j has 2(v_j + 1) columns and rank v_j + 1
        assert int(torch.linalg.matrix_rank(d_matrix(closed_form(v1, v2, GAMMA)))) == v1 + 1
        assert int(torch.linalg.matrix_rank(d_matrix(closed_form(v2, v2, GAMMA)))) == v2 + 1


def test_task_law_and_generator():
    law = TaskLaw(8, 2, GAMMA, 0.3)
    gen = torch.Generator().manual_seed(1)
    pairs = sample_pairs(law, 20000, gen)
    in_s1 = (pairs < 2).all(dim=1)
    assert float(in_s1.double().mean()) == pytest.approx(0.7, abs=0.015) and bool((pairs[:, 0] != pairs[:, 1]).all())
    phi = sample_phi(torch.tensor([[2, 5]] * 40000), 1, 8, GAMMA, gen)[:, 0]
    for (a, b), p in zip(((1, 1), (1, -1), (-1, 1), (-1, -1)), (0.25 + GAMMA, 0.25, 0.25, 0.25 - GAMMA)):
        assert float(((phi[:, 2] == a) & (phi[:, 5] == b)).double().mean()) == pytest.approx(p, abs=0.01)
    assert float(phi[:, [0, 1, 3, 4, 6, 7]].mean()) == pytest.approx(0.0, abs=0.01)
    G = random_orthonormal(8, gen)
    assert torch.allclose(G.T @ G, torch.eye(8, dtype=torch.float64), atol=1e-12)
    pr = sample_prompts(TaskLaw(8, 2, GAMMA), G, 300, 50, gen, "s1")
    assert torch.allclose(pr.X, pr.phi @ G.T) and torch.equal(pr.y, xor_labels(pr.phi, pr.pairs))
    assert torch.equal(pr.y_q, pr.phi_q[torch.arange(50), pr.pairs[:, 0]] * pr.phi_q[torch.arange(50), pr.pairs[:, 1]])
    # E[y phi] = 2 gamma (e_i + e_j): the limit the model sees
    big = sample_prompts(TaskLaw(8, 2, GAMMA), G, 200000, 1, gen, "s1")
    h = (big.y[0] @ big.phi[0]) / 200000
    want = torch.zeros(8, dtype=torch.float64)
    want[big.pairs[0]] = 2 * GAMMA
    assert torch.allclose(h, want, atol=0.01)


def test_model_is_its_hidden_basis_form_and_the_exact_loss_is_the_sampled_one():
    gen = torch.Generator().manual_seed(2)
    G = random_orthonormal(8, gen)
    heads = Heads(
        torch.tensor([0.7, -0.4, 1.0], dtype=torch.float64), torch.randn(3, 8, 8, generator=gen, dtype=torch.float64)
    )
    pr = sample_prompts(TaskLaw(8, 2, GAMMA, 0.2), G, 40, 30, gen)
    h = torch.einsum("bn,bnd->bd", pr.y, pr.phi) / 40
    want = torch.relu(torch.einsum("bd,mde,be->bm", h, heads.V, pr.phi_q)) @ heads.a
    assert torch.allclose(forward(heads.a, heads.weights(G), pr.X, pr.y, pr.x_q), want, atol=1e-12)
    s1, s2 = task_sets(8, 2)
    exact = exact_limit_loss(heads.a, heads.V, s2, GAMMA)
    pairs = s2[torch.randint(len(s2), (200000,), generator=gen)]
    phi_q = sample_phi(pairs, 1, 8, GAMMA, gen)[:, 0]
    z = phi_q.gather(1, pairs).prod(dim=1) * limit_forward(heads.a, heads.weights(G), G, pairs, phi_q @ G.T, GAMMA)
    loss = hinge(z)
    assert abs(float(loss.mean()) - exact["loss"]) < 4 * float(loss.std()) / 200000**0.5
    assert float(z.min()) >= exact["margin"] - 1e-9


def test_flips_are_exact_and_nested():
    gen = torch.Generator().manual_seed(3)
    y = torch.ones(5, 20, dtype=torch.float64)
    ranks = flip_ranks(y, gen)
    before = None
    for rate in (0.0, 0.1, 0.25, 0.5):
        flipped = flip_labels(y, rate, ranks)
        assert ((flipped < 0).sum(dim=1) == math.floor(rate * 20 + 0.5)).all()
        if before is not None:
            assert bool(((before < 0) <= (flipped < 0)).all())  # nested
        before = flipped
    with pytest.raises(ValueError, match="flip rate"):
        flip_labels(y, 1.5, ranks)


@pytest.mark.slow  # trains through the command twice (~6 s)
def test_cli_help_bad_input_and_resume(tmp_path, capsys):
    for argv in ([], ["run"], ["report"]):
        with pytest.raises(SystemExit) as exc:
            cli.main(argv + ["--help"])
        assert exc.value.code == 0
    assert "(v1+1)/(v2+1)" in capsys.readouterr().out
    for bad, why in (
        (["--parts", "foo"], "subset of closed"),
        (["--prompts", "0"], "prompts=0"),
        (["--train-seeds", "x"], "non-negative integers"),
        (["--threads", "0"], "--threads 0"),
    ):
        with pytest.raises(SystemExit) as exc:
            cli.main(["run", "--preset", "tiny", "--out", str(tmp_path / "bad"), *bad])
        err = capsys.readouterr().err
        assert exc.value.code == 2 and why in err and "Traceback" not in err
        assert len([line for line in err.splitlines() if "error:" in line]) == 1
    with pytest.raises(SystemExit) as exc:
        cli.main(["report", str(tmp_path / "nothing")])
    assert exc.value.code == 2 and "rows.jsonl does not exist" in capsys.readouterr().err
    argv = ["run", "--preset", "tiny", "--out", str(tmp_path / "run"), "--quiet"]
    assert cli.main(argv) == 0
    rows = (tmp_path / "run" / "rows.jsonl").read_text().splitlines()
    assert len(rows) == 1 + 2 + 2 + 1 + 2 and (tmp_path / "run" / "sparse_parity_train.png").stat().st_size > 0
    assert cli.main(argv) == 0  # resumes: nothing recomputed, nothing appended
    assert (tmp_path / "run" / "rows.jsonl").read_text().splitlines() == rows
    summary = (tmp_path / "run" / "summary.md").read_text()
    assert cli.main(["report", str(tmp_path / "run")]) == 0
    assert (tmp_path / "run" / "summary.md").read_text() == summary


def _committed_rows(folder=MEASURED):
    return [json.loads(line) for line in (folder / "rows.jsonl").read_text().splitlines() if line.strip()]


FOLDERS = ["sparse-parity", "sparse-parity-train-seeds", "sparse-parity-train-long"]


@pytest.mark.parametrize("folder", FOLDERS)
def test_committed_summary_is_its_rows(folder):
    """measured/sparse-parity*/summary.md is the command line and markdown() of the committed rows."""
    path = MEASURED.parent / folder
    command, tables = (path / "summary.md").read_text().split("\n\n", 1)
    assert tables == markdown(_committed_rows(path))
    assert command.startswith("`python -m icl_probes.sparse_parity run --preset ")


def test_committed_rows_agree_with_the_closed_forms():
    """The committed run's exact numbers are the ones the tests above derive by hand."""
    rows = _committed_rows()
    closed = {(r["v1"], r["v2"]): r for r in rows if r["part"] == "closed"}
    assert closed[(1, 3)]["g1"]["s2"]["loss"] == pytest.approx(24 / 54)
    for r in (r for r in rows if r["part"] == "ratio"):
        assert (r["rank1"], r["rank2"]) == (r["v1"] + 1, r["v2"] + 1)
        assert abs(r["xi_ratio"] - (r["v1"] + 1) / (r["v2"] + 1)) < 4 * r["xi_ratio_se"]


@pytest.mark.parametrize("section", ["closed", "loss", "ratio", "flips", "noise", "train"])
def test_docs_tables_are_the_committed_summary(section):
    """docs/icl-probes.md's Sec. 5.5 tables are the committed summary's, block by block."""
    text = DOCS.read_text(encoding="utf-8")
    block = docs_block("icl-probes.md", f"sparse-parity-{section}").strip()
    assert block and block in (MEASURED / "summary.md").read_text()
    command = (MEASURED / "summary.md").read_text().split("\n", 1)[0].strip("`").replace(" --quiet", "")
    assert command in text


@pytest.mark.parametrize("folder", FOLDERS[1:])
def test_docs_extra_training_tables_are_their_summaries(folder):
    text = DOCS.read_text(encoding="utf-8")
    block = docs_block("icl-probes.md", folder).strip()
    summary = (MEASURED.parent / folder / "summary.md").read_text()
    assert block and block in summary
    assert summary.split("\n", 1)[0].strip("`").replace(" --quiet", "") in text


def test_committed_diagonal_heads_have_zero_loss_below_the_closed_form_norm():
    """The docs' claim, from the committed rows alone: a diagonal run's heads (a, diag V) classify every task of
    S1 and S2 and every sign of (phi_q,i, phi_q,j) with margin mu > 0, written out here as
    g = sum_l a_l ReLU(2 gamma (V_l,ii phi_i + V_l,jj phi_j)) (a diagonal V reads only the task's two
    coordinates), and sum ||V||^2 / mu^2 is below the closed form g2*'s 2d v2 (v2 + 1) / (16 gamma^2)."""
    found = 0
    for folder in FOLDERS:
        for r in _committed_rows(MEASURED.parent / folder):
            if r["part"] != "train" or r["kind"] != "diagonal" or r["margin"] <= 0:
                continue
            d, gamma = 2 ** r["v2"], r["settings"]["gamma"]
            margin = min(
                p * q * sum(a * max(0.0, 2 * gamma * (v[i] * p + v[j] * q)) for a, v in zip(r["a"], r["diag"]))
                for i in range(d)
                for j in range(d)
                if i != j
                for p, q in ((1, 1), (1, -1), (-1, 1), (-1, -1))
            )
            norm = sum(x * x for v in r["diag"] for x in v)
            closed = 2 * d * r["v2"] * (r["v2"] + 1) / (16 * gamma**2)
            assert margin == pytest.approx(r["margin"], abs=1e-9) and margin > 0
            assert norm / margin**2 < closed and closed == r["closed"]["g2"]["norm"]
            found += 1
    assert found >= 2
