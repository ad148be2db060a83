"""feature_probes.mrp: Def. 3.1 data against its definition, the masks, the expected loss (Eq. 3) against an
exact enumeration of all masks of the sampled loss, which is itself checked against loops, and the CLI."""

import itertools

import pytest
import torch

from feature_probes.common import smoothed_relu
from feature_probes.mrp import cli
from feature_probes.mrp.data import PatchSpec, apply_mask, make_patch_data, sample_mask
from feature_probes.mrp.model import Encoder, capture, class_scores, mrp_loss_expected, mrp_loss_sampled, teacher_tau

CLEAN = PatchSpec(k=4, d=12, P=16, C_p=2, mu=0.5, s=2.0, gamma=0.0, noise_scale=0.0)


def test_patch_data_follows_definition_3_1_without_noise():
    data = make_patch_data(CLEAN, 300, torch.Generator().manual_seed(0))
    k, F = CLEAN.k, 2 * CLEAN.k
    others = 0
    for i in range(300):
        y, x = int(data.y[i]), data.x[i]
        assert float(x[:, F:].abs().sum()) == 0.0  # only feature coordinates without noise
        for f in range(F):
            patches = (data.owner[i] == f).nonzero().squeeze(1).tolist()
            total = float(x[:, f].sum())
            assert float(x[[p for p in range(CLEAN.P) if p not in patches], f].abs().sum()) == 0.0
            if f // 2 == y:
                assert len(patches) == CLEAN.C_p and all(float(x[p, f]) > 0 for p in patches)
                weak = bool(data.single[i]) and f % 2 + 1 != int(data.kept[i])
                lo, hi = (CLEAN.rho, 1.5 * CLEAN.rho) if weak else (CLEAN.own_lo, CLEAN.own_hi)
                assert lo - 1e-5 <= total <= hi + 1e-5
            elif patches:
                others += 1
                assert len(patches) == CLEAN.C_p
                assert CLEAN.other_lo - 1e-5 <= total <= CLEAN.other_hi + 1e-5
            for p in patches:  # a feature patch carries only its own feature
                assert float(x[p].abs().sum()) == pytest.approx(float(x[p, f]))
        assert int(data.kept[i]) in ((1, 2) if data.single[i] else (0,))
    # each of the 2(k-1) other-class features joins V'(X) with probability s/k
    assert others / (300 * 2 * (k - 1)) == pytest.approx(CLEAN.s / k, abs=0.05)
    assert float(data.single.float().mean()) == pytest.approx(CLEAN.mu, abs=0.1)


def test_noise_has_the_stated_scales():
    spec = PatchSpec(k=4, d=400, P=16, C_p=2, gamma=0.05)
    data = make_patch_data(spec, 200, torch.Generator().manual_seed(1))
    tail = data.x[:, :, 2 * spec.k :]  # coordinates orthogonal to every feature: pure Gaussian noise
    on = tail[data.owner >= 0]
    off = tail[data.owner < 0]
    assert float(on.std()) == pytest.approx(spec.sigma_p(), rel=0.05)
    assert float(off.std()) == pytest.approx(spec.gamma * spec.k / spec.d**0.5, rel=0.05)


def test_masked_patches_are_exactly_zero():
    x = torch.randn(50, 10, 6)
    eps = sample_mask(50, 10, 0.3, torch.Generator().manual_seed(2))
    masked = apply_mask(x, eps)
    assert float(masked[eps == 0].abs().sum()) == 0.0
    assert torch.equal(masked[eps == 1], x[eps == 1])
    assert float(eps.mean()) == pytest.approx(0.3, abs=0.05)
    with pytest.raises(ValueError, match="keep probability"):
        sample_mask(2, 2, 0.0, torch.Generator())


def _encoder(k=2, m=2, d=5, seed=0):
    return Encoder(k, m, d, 3.0, 0.5, 0.6, torch.Generator().manual_seed(seed))


def test_sampled_loss_matches_loops():
    enc = _encoder()
    x = torch.randn(3, 4, 5)
    eps = torch.tensor([[1.0, 0, 1, 1], [0, 0, 1, 0], [1, 1, 1, 1]])
    theta, tau = 0.6, 1.7
    f = lambda w, v: float(smoothed_relu(torch.dot(w, v), 3.0, 0.5))  # noqa: E731
    total = 0.0
    for n in range(3):
        for r in range(4):
            w = enc.w[r].detach()
            teacher = sum(f(tau * w, x[n, p]) for p in range(4))
            student = sum(f(w, eps[n, p] * x[n, p]) for p in range(4)) / theta
            total += 0.5 * (teacher - student) ** 2
    with torch.no_grad():
        assert float(mrp_loss_sampled(enc, x, eps, theta, tau)) == pytest.approx(total / 3, rel=1e-5)


def test_expected_loss_equals_the_average_over_every_mask():
    enc = _encoder(seed=1)
    x = torch.randn(2, 4, 5)
    theta, tau = 0.7, 1.3
    exact = 0.0
    for bits in itertools.product([0.0, 1.0], repeat=8):  # all masks of both points
        eps = torch.tensor(bits).view(2, 4)
        prob = theta ** eps.sum() * (1 - theta) ** (8 - eps.sum())
        with torch.no_grad():
            exact += float(prob * mrp_loss_sampled(enc, x, eps, theta, tau))
    with torch.no_grad():
        assert float(mrp_loss_expected(enc, x, theta, tau)) == pytest.approx(exact, rel=1e-5)


def test_teacher_gradient_is_blocked_and_tau_formula():
    enc = _encoder(seed=2)
    x = torch.randn(3, 4, 5)
    loss = mrp_loss_expected(enc, x, 0.5, 2.0)
    loss.backward()
    grad = enc.w.grad.clone()
    # the same loss with the teacher's output given as a constant has the same gradient
    with torch.no_grad():
        teacher = enc.patch_act(x, 2.0 * enc.w).sum(dim=1)
    enc.zero_grad()
    act = enc.patch_act(x)
    manual = (0.5 * (teacher - act.sum(dim=1)).pow(2).sum(dim=1) + 0.5 * act.pow(2).sum(dim=(1, 2))).mean()
    manual.backward()
    assert torch.allclose(grad, enc.w.grad)
    assert teacher_tau(0.5, 2, 0, 1.0) == pytest.approx(1 + 0.5 / 1.0 + 1.0)
    assert teacher_tau(0.25, 4, 9, 0.5) == pytest.approx(1 + 0.75 / 1.0 + 0.05)


def test_class_scores_and_capture():
    h = torch.arange(12.0).view(2, 6)  # k = 3 classes, m = 2 kernels each
    assert class_scores(h, 3, 2).tolist() == [[1.0, 5.0, 9.0], [13.0, 17.0, 21.0]]
    enc = _encoder(k=2, m=2, d=6)
    with torch.no_grad():
        enc.w.zero_()
        enc.w[0, 0], enc.w[1, 1], enc.w[2, 1], enc.w[3, 3] = 2.0, 0.5, 1.5, -3.0
    lam, arg, cap = capture(enc, 2, 1.0)
    assert lam.tolist() == [[2.0, 1.5], [0.0, 0.0]] and arg[0].tolist() == [0, 2]
    assert cap.tolist() == [[True, True], [False, False]]


def test_cli_help_bad_input_and_resume(tmp_path, capsys):
    for argv in ([], ["run"]):
        with pytest.raises(SystemExit) as exc:
            cli.main(argv + ["--help"])
        assert exc.value.code == 0
    with pytest.raises(SystemExit) as exc:
        cli.main(["run", "--preset", "tiny", "--mask-ratios", "0.5,1.0", "--out", str(tmp_path)])
    assert exc.value.code == 2 and "mask ratios in [0, 1)" in capsys.readouterr().err
    argv = ["run", "--preset", "tiny", "--out", str(tmp_path), "--quiet"]
    assert cli.main(argv) == 0
    rows = (tmp_path / "mrp_runs.jsonl").read_text().splitlines()
    assert len(rows) == 2 and (tmp_path / "mrp_capture.png").stat().st_size > 0
    assert cli.main(argv) == 0
    assert (tmp_path / "mrp_runs.jsonl").read_text().splitlines() == rows
