"""feature_probes.parity: labels recomputed from phi by hand, the structured law's statistics (gamma = 1/4,
sigma~^2 = 25), the smoothed activation against Monte Carlo, steps 1 and 2 of Thm A.20 against their
closed forms, the NTK predictor against autograd, and the CLI."""

import math

import pytest
import torch

from feature_probes.parity import cli
from feature_probes.parity.data import ParitySpec, make_problem, make_split, normalise, parity_labels, sample_phi
from feature_probes.parity.experiments import cos_to_star, hyper, PRESETS
from feature_probes.parity.model import (FixedFeatureHead, LinearisedNet, TwoLayerNet, clip_relu, gd_step, hinge,
                                        smoothed_clip_relu)

SPEC = ParitySpec()  # the simulation's d = 500, D = 100, k = 5, p_o = 1/2


def test_labels_by_hand():
    A = torch.tensor([1, 3, 4])
    phi = torch.tensor([[0, 1, 0, 1, 1, 0], [0, 0, 0, 0, 0, 1], [1, 1, 1, 0, 0, 1], [0, 1, 0, 0, 0, 0]], dtype=torch.float)
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
    assert float(constant) == pytest.approx(0.5 + 0.5 * 2 / 2 ** SPEC.k, abs=0.01)
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
    assert torch.equal(net.w[:m], net.w[m:]) and torch.equal(net.b[:m], net.b[m:]) and torch.equal(net.a[:m], -net.a[m:])
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
        net(x[i:i + 1]).sum().backward()  # plain sigma: its derivative is 1 on (0, 1), as in LinearisedNet
        expect = (net.w.grad * lin.dw).sum() + (net.b.grad * lin.db).sum() + (net.a.grad * lin.da).sum()
        assert float(lin(x[i:i + 1]).detach()) == pytest.approx(float(expect.detach()), rel=1e-4, abs=1e-5)


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
    assert h["sigma_a"] == pytest.approx(4.0) and h["sigma_w"] == pytest.approx(0.2) and h["sigma_b"] == pytest.approx(0.04)
    assert h["eta1"] == pytest.approx((1 / 16) * 25 / (5 * 300 ** 3))
    assert h["eta3"] == pytest.approx(25 / (600 * 300 ** (1 / 3)))
    star = torch.tensor([1.0, 1.0, 0.0])
    assert cos_to_star(torch.tensor([[1.0, 0.0, 0.0], [-1.0, -1.0, 0.0], [2.0, 2.0, 0.1]]), star) == pytest.approx(
        4 / (math.sqrt(8.01) * math.sqrt(2)))


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
