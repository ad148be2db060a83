"""feature_probes.parity: labels recomputed from phi by hand, the structured law's statistics (gamma = 1/4,
sigma~^2 = 25), the smoothed activation against Monte Carlo, steps 1 and 2 of Thm A.20 against their
closed forms, the NTK predictor and NTK features against autograd, the NTK ridge solver against the closed form
on every parameter, the Adam third stage's first step by hand, and the CLI."""

import json
import math
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from docs_blocks import docs_block

from feature_probes.parity import cli
from feature_probes.parity.data import ParitySpec, make_problem, make_split, normalise, parity_labels, sample_phi
from feature_probes.parity.experiments import PRESETS, _stage3, cos_to_star, hyper
from feature_probes.parity.model import (
    FixedFeatureHead,
    LinearisedNet,
    NTKFeatures,
    TwoLayerNet,
    clip_relu,
    gd_step,
    hinge,
    ntk_predict,
    ntk_ridge,
    regulariser,
    smoothed_clip_relu,
)

SPEC = ParitySpec()  # the simulation's d = 500, D = 100, k = 5, p_o = 1/2

MEASURED = Path(__file__).resolve().parents[1] / "measured" / "feature_probes"


def test_labels_by_hand():
    A = torch.tensor([1, 3, 4])
    phi = torch.tensor(
        [[0, 1, 0, 1, 1, 0], [0, 0, 0, 0, 0, 1], [1, 1, 1, 0, 0, 1], [0, 1, 0, 0, 0, 0]], dtype=torch.float
    )
    # sums over A: 3 (odd), 0 (even), 1 (odd), 1 (odd)
    assert parity_labels(phi, A).tolist() == [1.0, -1.0, 1.0, 1.0]
    gen = torch.Generator().manual_seed(0)
    problem = make_problem(SPEC, gen)
    phi = sample_phi(SPEC, problem.A, 500, gen)
    y = parity_labels(phi, problem.A)
    for i in range(500):
        ones = sum(int(phi[i, j]) for j in problem.A.tolist())
        assert y[i] == (1 if ones % 2 == 1 else -1)
        assert y[i] == math.prod(2 * int(phi[i, j]) - 1 for j in problem.A.tolist())  # odd k


def test_structured_law_statistics():
    gen = torch.Generator().manual_seed(1)
    problem = make_problem(SPEC, gen)
    assert torch.allclose(problem.M.T @ problem.M, torch.eye(SPEC.D), atol=1e-5)
    n = 40000
    phi = sample_phi(SPEC, problem.A, n, gen)
    y = parity_labels(phi, problem.A)
    block = phi[:, problem.A]
    constant = ((block.sum(dim=1) == 0) | (block.sum(dim=1) == SPEC.k)).float().mean()
    # D^(1) always has a constant block; D^(0) has one with probability 2/2^k
    assert float(constant) == pytest.approx(0.5 + 0.5 * 2 / 2**SPEC.k, abs=0.01)
    cov = (y[:, None] * phi).mean(dim=0) - y.mean() * phi.mean(dim=0)
    on_a = torch.zeros(SPEC.D, dtype=torch.bool)
    on_a[problem.A] = True
    assert cov[on_a].tolist() == pytest.approx([0.25] * SPEC.k, abs=0.015)
    assert float(cov[~on_a].abs().max()) < 0.02
    assert float(y.mean()) == pytest.approx(0.0, abs=0.02)
    xt = phi @ problem.M.T
    sigma2 = float((xt - xt.mean(dim=0)).pow(2).sum(dim=1).mean())
    assert sigma2 == pytest.approx(25.0, rel=0.02)
    assert SPEC.centre_and_scale()[1] ** 2 == pytest.approx(25.0) and SPEC.gamma() == pytest.approx(0.25)
    x = normalise(SPEC, problem, phi)
    assert float(x.mean(dim=0).abs().max()) < 0.01 and float(x.pow(2).sum(dim=1).mean()) == pytest.approx(1.0, rel=0.02)


def test_unstructured_law_and_balanced_split():
    spec = ParitySpec(structured=False)
    gen = torch.Generator().manual_seed(2)
    problem = make_problem(spec, gen)
    x, y, phi = make_split(spec, problem, 4000, gen)
    assert int((y > 0).sum()) == 2000 and int((y < 0).sum()) == 2000
    assert torch.equal(y, parity_labels(phi, problem.A))
    cov = (y[:, None] * phi).mean(dim=0) - y.mean() * phi.mean(dim=0)
    assert float(cov.abs().max()) < 0.06  # no first-order signal without structure
    assert float(phi.mean()) == pytest.approx(0.5, abs=0.01)
    with pytest.raises(ValueError, match="odd"):
        make_problem(ParitySpec(k=4), gen)


def test_smoothed_activation_against_monte_carlo():
    z = torch.tensor([-0.3, 0.0, 0.02, 0.5, 0.97, 1.4])
    s = 0.1
    xi = torch.randn(400000, generator=torch.Generator().manual_seed(3)) * s
    mc = torch.stack([clip_relu(v + xi).mean() for v in z])
    assert torch.allclose(smoothed_clip_relu(z, s), mc, atol=2e-3)
    assert torch.equal(smoothed_clip_relu(z, 0.0), z.clamp(0, 1))
    assert hinge(torch.tensor([2.0, 0.5, -1.0]), torch.tensor([1.0, 1.0, 1.0])) == pytest.approx((0 + 0.5 + 2.0) / 3)


def _small():
    spec = ParitySpec(d=30, D=10, k=3)
    gen = torch.Generator().manual_seed(4)
    problem = make_problem(spec, gen)
    x, y, _ = make_split(spec, problem, 400, gen)
    net = TwoLayerNet(spec.d, 8, 1 / 3, 1 / 9, 2.0, gen)
    return x, y, net


def test_symmetric_init_and_the_first_two_steps():
    x, y, net = _small()
    m = 8
    assert (
        torch.equal(net.w[:m], net.w[m:]) and torch.equal(net.b[:m], net.b[m:]) and torch.equal(net.a[:m], -net.a[m:])
    )
    assert float(net(x).detach().abs().max()) < 1e-6  # g = 0 at init
    eta, s = 1e-3, 1 / 9

    def grads(model):
        model.zero_grad()
        hinge(model(x, s), y).backward()
        return model.w.grad.clone(), model.a.grad.clone(), model.b.grad.clone()

    gw, _, gb = grads(net)
    b0 = net.b.detach().clone()
    gd_step(net, x, y, eta, 0.0, 1 / (2 * eta), s)  # step 1: lambda_w = 1/(2 eta) wipes the init
    assert torch.allclose(net.w, -eta * gw, rtol=1e-6, atol=1e-12)
    assert torch.allclose(net.b, b0 - eta * gb)
    gw, ga, _ = grads(net)
    gd_step(net, x, y, 1.0, 0.5, 0.5, s)  # step 2: eta = 1, lambda = 1/2
    assert torch.allclose(net.w, -gw, atol=1e-7) and torch.allclose(net.a, -ga, atol=1e-7)


def test_linearised_net_is_the_first_order_taylor_expansion():
    x, y, net = _small()
    lin = LinearisedNet(net)
    gen = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for p in (lin.dw, lin.db, lin.da):
            p.copy_(torch.randn(p.shape, generator=gen))
    for i in range(5):
        net.zero_grad()
        net(x[i : i + 1]).sum().backward()  # plain sigma: its derivative is 1 on (0, 1), as in LinearisedNet
        expect = (net.w.grad * lin.dw).sum() + (net.b.grad * lin.db).sum() + (net.a.grad * lin.da).sum()
        assert float(lin(x[i : i + 1]).detach()) == pytest.approx(float(expect.detach()), rel=1e-4, abs=1e-5)


def test_fixed_feature_head_standardises_with_training_statistics():
    x, _, net = _small()
    head = FixedFeatureHead(net.w, net.b, x)
    feats = clip_relu(x @ net.w.detach().T + net.b.detach())
    keep = feats.std(dim=0) > 1e-6  # neurons that vary on the training set
    with torch.no_grad():
        head.a.copy_(torch.eye(len(head.a))[0])
        z = (feats - feats.mean(dim=0)) / feats.std(dim=0).clamp_min(1e-12)
        assert torch.allclose(head(x), z[:, 0], atol=1e-5)
    assert torch.allclose(z[:, keep].mean(dim=0), torch.zeros(int(keep.sum())), atol=1e-5)


def test_hyper_parameters_of_the_simulation():
    h = hyper(PRESETS["cpu"])
    assert (
        h["sigma_a"] == pytest.approx(4.0)
        and h["sigma_w"] == pytest.approx(0.2)
        and h["sigma_b"] == pytest.approx(0.04)
    )
    assert h["eta1"] == pytest.approx((1 / 16) * 25 / (5 * 300**3))
    assert h["eta3"] == pytest.approx(25 / (600 * 300 ** (1 / 3)))
    star = torch.tensor([1.0, 1.0, 0.0])
    assert cos_to_star(torch.tensor([[1.0, 0.0, 0.0], [-1.0, -1.0, 0.0], [2.0, 2.0, 0.1]]), star) == pytest.approx(
        4 / (math.sqrt(8.01) * math.sqrt(2))
    )


def test_cli_help_bad_input_and_resume(tmp_path, capsys):
    for argv in ([], ["table"]):
        with pytest.raises(SystemExit) as exc:
            cli.main(argv + ["--help"])
        assert exc.value.code == 0
    with pytest.raises(SystemExit) as exc:
        cli.main(["table", "--preset", "tiny", "--steps", "2", "--out", str(tmp_path)])
    assert exc.value.code == 2 and "at least 3 steps" in capsys.readouterr().err
    argv = ["table", "--preset", "tiny", "--out", str(tmp_path), "--quiet"]
    assert cli.main(argv) == 0
    rows = (tmp_path / "parity_runs.jsonl").read_text().splitlines()
    assert len(rows) == 2 and (tmp_path / "parity_figA2_mds.png").stat().st_size > 0
    assert cli.main(argv) == 0
    assert (tmp_path / "parity_runs.jsonl").read_text().splitlines() == rows


def test_ntk_features_are_the_networks_gradient_at_initialisation():
    x, _, net = _small()
    feats = NTKFeatures(net, x)
    dense = feats.dense(x[:6])
    for i in range(6):
        net.zero_grad()
        net(x[i : i + 1]).sum().backward()  # plain sigma, derivative 1 on (0, 1)
        grad = torch.cat([net.a.grad, net.w.grad.reshape(-1), net.b.grad])
        assert torch.allclose(dense[i], grad, atol=1e-6)


def test_ntk_ridge_equals_the_closed_form_on_all_parameters():
    """The reduced, preconditioned CG solve predicts what (Phi^T Phi + lam I)^-1 Phi^T y on every parameter does."""
    x, y, net = _small()
    feats = NTKFeatures(net, x)
    xt = torch.randn(20, x.shape[1], generator=torch.Generator().manual_seed(9)) * x.std()
    phi, phit = feats.dense(x).double(), feats.dense(xt).double()
    for lam in (10.0, 0.1):
        theta = torch.linalg.solve(phi.T @ phi + lam * torch.eye(phi.shape[1], dtype=phi.dtype), phi.T @ y.double())
        mine, iters = ntk_ridge(feats, x, y, lam, tol=1e-7, iters=2000)
        assert iters < 2000
        assert torch.allclose(ntk_predict(feats, mine, x).double(), phi @ theta, atol=1e-3)
        assert torch.allclose(ntk_predict(feats, mine, xt).double(), phit @ theta, atol=1e-3)  # off the span too


def test_adam_stage3_first_step_is_the_sign_of_the_gradient():
    """Adam's first step is lr * g / (|g| + eps) on every parameter of both layers (bias-corrected moments)."""
    x, y, net = _small()
    cfg = replace(PRESETS["tiny"], adam_lr3=0.01)
    h = hyper(cfg)
    gd_step(net, x, y, 1.0, 0.5, 0.5, 0.0)  # leave the symmetric init, so every gradient is non-zero
    before = [p.detach().clone() for p in net.parameters()]
    net.zero_grad()
    (hinge(net(x), y) + regulariser(net, h["lam3"], h["lam3"])).backward()
    grads = [p.grad.clone() for p in net.parameters()]
    _stage3("adam", net, cfg, h)(x, y)
    for p, p0, g in zip(net.parameters(), before, grads):
        assert torch.allclose(p.detach(), p0 - 0.01 * g / (g.abs() + 1e-8), atol=1e-7)
    net2 = TwoLayerNet(x.shape[1], 8, 0.2, 0.04, 4.0, torch.Generator().manual_seed(0))
    w0 = net2.w.detach().clone()
    _stage3("thm_a20", net2, cfg, h)(x, y)  # plain GD at eta3: w - eta3 (grad + 2 lam3 w)
    assert not torch.equal(net2.w.detach(), w0)


def test_stage3_and_ntk_settings_are_checked():
    with pytest.raises(ValueError, match="stage3=.*allowed"):
        replace(PRESETS["tiny"], stage3=("sgd",)).check()
    with pytest.raises(ValueError, match="ntk_lams"):
        replace(PRESETS["tiny"], ntk_lams=(0.0,)).check()
    with pytest.raises(ValueError, match="symmetric initialisation"):
        x, _, net = _small()
        with torch.no_grad():
            net.a.add_(1.0)
        NTKFeatures(net, x)


def test_linear_ceiling_is_54_of_64_by_hand_and_by_sampling():
    """s = sum_A phi: P(s) = (17, 5, 10, 10, 5, 17)/64 for s = 0..5; the threshold s >= 3 is right on
    s = 0, 2 (label -1) and 3, 5 (label +1): (17 + 10 + 10 + 17)/64."""
    assert SPEC.linear_ceiling() == pytest.approx(54 / 64)
    assert ParitySpec(structured=False).linear_ceiling() == pytest.approx((1 + 10 + 10 + 1) / 32)  # Binomial(5, 1/2)
    gen = torch.Generator().manual_seed(2)
    problem = make_problem(SPEC, gen)
    phi = sample_phi(SPEC, problem.A, 200000, gen)
    s, y = phi[:, problem.A].sum(dim=1), parity_labels(phi, problem.A)
    best = max(float(((s >= t).float() * 2 - 1 == y).float().mean()) for t in range(7))
    assert best == pytest.approx(54 / 64, abs=0.005)


def test_report_writes_the_summary_again_and_refuses_a_folder_without_a_result(tmp_path, capsys):
    argv = ["table", "--preset", "tiny", "--out", str(tmp_path), "--quiet"]
    assert cli.main(argv) == 0
    summary = (tmp_path / "parity_summary.md").read_text()
    (tmp_path / "parity_summary.md").unlink()
    assert cli.main(["report", str(tmp_path)]) == 0
    assert (tmp_path / "parity_summary.md").read_text() == summary
    with pytest.raises(SystemExit) as exc:
        cli.main(["report", str(tmp_path / "nothing")])
    assert exc.value.code == 2 and "parity_result.json does not exist" in capsys.readouterr().err


@pytest.mark.parametrize("folder", sorted(p.parent.name for p in MEASURED.glob("parity*/parity_result.json")))
def test_committed_parity_summaries_are_their_results_tables(folder):
    """Each committed table under measured/feature_probes/parity* is what its committed result gives."""
    result = json.loads((MEASURED / folder / "parity_result.json").read_text())
    assert (
        cli.markdown(result["runs"], result["config"], result["command"])
        == (MEASURED / folder / "parity_summary.md").read_text()
    )


def test_docs_gd_sweep_rows_are_the_committed_results():
    """docs/feature-probes.md's tables of stage-3 step sizes (with and without structure): each row's T and
    accuracies are its run's result."""
    for marker, structured, least in (("parity-gd-sweep", True, 5), ("parity-nostruct-gd", False, 3)):
        block = docs_block("feature-probes.md", marker)
        rows = [line.split(" | ") for line in block.strip().splitlines()[2:]]
        assert len(rows) >= least, marker
        for cells in rows:
            folder = cells[0].strip("|` ")
            result = json.loads((MEASURED / folder / "parity_result.json").read_text())
            net = next(u for u in result["runs"] if u["structured"] == structured)["methods"]["network"]
            want = [
                str(result["config"]["steps"]),
                f"{100 * net['train_acc']:.1f}",
                f"{100 * net['test_acc']:.1f}",
                f"{net['cos']:.3f}",
            ]
            assert [c.strip("| ") for c in cells[2:]] == want, (marker, folder)
    paper = docs_block("feature-probes.md", "parity-paper").strip()
    assert paper in (MEASURED / "parity-paper" / "parity_summary.md").read_text()
