"""feature_probes.midpoint_mixup: Def. 4.1 data checked point by point against the definition, the network
and the ERM / Mixup / Midpoint losses against loops written from Eqs. 2.1, 2.2, 3.1 and 4.1, Table 1's
image protocol, and the CLI (help, outputs, resume, bad input)."""

import json

import pytest
import torch
import torch.nn.functional as F

from feature_probes.midpoint_mixup import cli
from feature_probes.midpoint_mixup.data import (
    MultiViewSpec,
    concat_views,
    fixed_extras,
    make_multiview,
    pair_classes,
    single_view,
)
from feature_probes.midpoint_mixup.model import MultiViewNet, SmallCNN, batch_mixup_loss, mixup_loss, relu_tilde

SPEC = MultiViewSpec(k=5, P=12, C_P=2, Q=2, delta1=0.1, delta2=1.0, delta3=0.02, delta4=0.05)


def test_multiview_points_follow_definition_4_1():
    data = make_multiview(SPEC, 200, torch.Generator().manual_seed(0))
    for i in range(200):
        y, x = int(data.y[i]), data.x[i]
        p1, p2 = data.patches1[i].tolist(), data.patches2[i].tolist()
        assert len(set(p1)) == SPEC.C_P and len(set(p2)) == SPEC.C_P and not set(p1) & set(p2)
        noise = [int(c) for c in data.noise_classes[i]]
        assert len(set(noise)) == SPEC.Q and y not in noise
        for j, (a, b) in enumerate(zip(p1, p2)):
            beta = float(data.beta[i, j])
            assert SPEC.delta1 - 1e-6 <= beta <= SPEC.delta2 - SPEC.delta1 + 1e-6
            expect_a, expect_b = torch.zeros(2 * SPEC.k), torch.zeros(2 * SPEC.k)
            expect_a[2 * y], expect_b[2 * y + 1] = beta, SPEC.delta2 - beta
            assert torch.equal(x[a], expect_a) and torch.allclose(x[b], expect_b)
            assert float(x[a].sum() + x[b].sum()) == pytest.approx(SPEC.delta2)  # each pair sums to delta2
        noise_cols = {2 * s + ell for s in noise for ell in (0, 1)}
        for p in set(range(SPEC.P)) - set(p1) - set(p2):
            for col in range(2 * SPEC.k):
                v = float(x[p, col])
                if col in noise_cols:
                    assert SPEC.delta3 - 1e-7 <= v <= SPEC.delta4 + 1e-7
                else:
                    assert v == 0.0


def test_single_view_zeroes_exactly_the_other_features_patches():
    data = make_multiview(SPEC, 30, torch.Generator().manual_seed(1))
    for keep in (1, 2):
        xs = single_view(data, keep)
        for i in range(30):
            drop = data.patches2[i] if keep == 1 else data.patches1[i]
            y = int(data.y[i])
            assert float(xs[i, drop].abs().sum()) == 0.0
            other = 2 * y + (1 if keep == 1 else 0)
            assert float(xs[i, :, other].abs().sum()) == 0.0  # v_{y,3-keep} is gone everywhere
            rest = [p for p in range(SPEC.P) if p not in drop.tolist()]
            assert torch.equal(xs[i, rest], data.x[i, rest])
    with pytest.raises(ValueError, match="1 or 2"):
        single_view(data, 3)


def test_relu_tilde_by_hand():
    alpha, rho = 8.0, 0.1
    z = torch.tensor([-1.0, 0.0, 0.05, 0.1, 0.3])
    expect = [0.0, 0.0, 0.05**8 / (8 * 0.1**7), 0.1 - 0.875 * 0.1, 0.3 - 0.875 * 0.1]
    assert relu_tilde(z, alpha, rho).tolist() == pytest.approx(expect, rel=1e-5, abs=1e-12)
    assert 0.1**8 / (8 * 0.1**7) == pytest.approx(0.1 - 0.875 * 0.1)  # continuous at rho


def _g_loops(model, x):
    """Eq. 4.1 with explicit sums: g_y(x) = sum_r sum_p ReLU~(<w_{y,r}, x^(p)>)."""
    out = torch.zeros(len(x), model.k)
    for b in range(len(x)):
        for y in range(model.k):
            for r in range(model.m):
                for p in range(x.shape[1]):
                    out[b, y] += relu_tilde(torch.dot(model.w[y, r], x[b, p]), model.alpha, model.rho)
    return out


def _net(seed=0):
    return MultiViewNet(SPEC.k, 3, 4, 8.0, 0.1, torch.Generator().manual_seed(seed))  # d = 4: large correlations


def test_network_matches_equation_4_1():
    data = make_multiview(SPEC, 4, torch.Generator().manual_seed(2))
    model = _net()
    with torch.no_grad():
        assert torch.allclose(model(data.x), _g_loops(model, data.x), atol=1e-6)
        own, off = model.feature_strength()
        for y in range(SPEC.k):
            for ell in (0, 1):
                assert float(own[y, ell]) == pytest.approx(float(model.w[y, :, 2 * y + ell].max()))
                others = [float(model.w[s, r, 2 * y + ell]) for s in range(SPEC.k) if s != y for r in range(3)]
                assert float(off[y, ell]) == pytest.approx(max(others))


def test_midpoint_loss_is_cross_entropy_against_the_half_half_label_mix():
    data = make_multiview(SPEC, 6, torch.Generator().manual_seed(3))
    model = _net(1)
    n, k = 6, SPEC.k
    with torch.no_grad():
        terms, diff = [], []
        for i in range(n):
            for j in range(n):
                z = (data.x[i] + data.x[j]) / 2
                target = 0.5 * F.one_hot(data.y[i], k).float() + 0.5 * F.one_hot(data.y[j], k).float()
                ce = float(F.cross_entropy(_g_loops(model, z[None]), target[None]))
                terms.append(ce)
                if data.y[i] != data.y[j]:
                    diff.append(ce)
        assert float(mixup_loss(model, data.x, data.y, "midpoint")) == pytest.approx(sum(terms) / n**2, rel=1e-5)
        assert float(mixup_loss(model, data.x, data.y, "midpoint", pairs="different", chunk=4)) == pytest.approx(
            sum(diff) / len(diff), rel=1e-5
        )
        erm = sum(float(F.cross_entropy(_g_loops(model, data.x[i : i + 1]), data.y[i : i + 1])) for i in range(n)) / n
        assert float(mixup_loss(model, data.x, data.y, "erm")) == pytest.approx(erm, rel=1e-5)


def test_uniform_mixup_loss_by_hand_with_the_same_lambdas():
    data = make_multiview(SPEC, 5, torch.Generator().manual_seed(4))
    model = _net(2)
    lam = torch.rand(5, 5, generator=torch.Generator().manual_seed(9))
    total = 0.0
    with torch.no_grad():
        for i in range(5):
            for j in range(5):
                out = _g_loops(model, (lam[i, j] * data.x[i] + (1 - lam[i, j]) * data.x[j])[None])
                total += float(
                    lam[i, j] * F.cross_entropy(out, data.y[i : i + 1])
                    + (1 - lam[i, j]) * F.cross_entropy(out, data.y[j : j + 1])
                )
        got = mixup_loss(model, data.x, data.y, "uniform", torch.Generator().manual_seed(9))
    assert float(got) == pytest.approx(total / 25, rel=1e-5)
    with pytest.raises(ValueError, match="allowed"):
        mixup_loss(model, data.x, data.y, "cutmix")


def test_digits_protocol_pairs_classes_both_ways_and_zeroes_the_test_view():
    partner = pair_classes(10, torch.Generator().manual_seed(0))
    assert all(int(partner[int(partner[c])]) == c and int(partner[c]) != c for c in range(10))
    y = torch.arange(40) % 10
    extra = fixed_extras(y, partner, torch.Generator().manual_seed(1))
    assert all(int(y[extra[i]]) == int(partner[y[i]]) for i in range(40))
    x, xe = torch.rand(3, 1, 8, 8), torch.rand(3, 1, 8, 8)
    g = torch.tensor([0.0, 0.25, 1.0])
    both = concat_views(x, xe, g)
    assert torch.allclose(both[1, 0], 0.25 * x[1, 0]) and torch.allclose(both[1, 1], 0.75 * xe[1, 0])
    test = concat_views(x, None, None)
    assert torch.equal(test[:, 0], x[:, 0]) and float(test[:, 1].abs().sum()) == 0.0
    with pytest.raises(ValueError, match="even"):
        pair_classes(5, torch.Generator())


def test_batch_midpoint_loss_is_half_half_cross_entropy():
    torch.manual_seed(0)
    model = SmallCNN(width=2)
    x, y = torch.rand(6, 2, 8, 8), torch.tensor([0, 1, 2, 3, 4, 5])
    perm = torch.randperm(6, generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        out = model((x + x[perm]) / 2)
        target = 0.5 * F.one_hot(y, 10).float() + 0.5 * F.one_hot(y[perm], 10).float()
        expect = float(F.cross_entropy(out, target))
        got = float(batch_mixup_loss(model, x, y, "midpoint", torch.Generator().manual_seed(5)))
    assert got == pytest.approx(expect, rel=1e-5)


def test_cli_help_bad_input_and_resume(tmp_path, capsys):
    for argv in ([], ["synthetic"], ["images"]):
        with pytest.raises(SystemExit) as exc:
            cli.main(argv + ["--help"])
        assert exc.value.code == 0
    with pytest.raises(SystemExit) as exc:
        cli.main(["synthetic", "--preset", "tiny", "--methods", "erm,cutmix", "--out", str(tmp_path)])
    assert exc.value.code == 2 and "subset of erm,midpoint,uniform" in capsys.readouterr().err
    argv = ["synthetic", "--preset", "tiny", "--out", str(tmp_path), "--quiet"]
    assert cli.main(argv) == 0
    rows = (tmp_path / "synthetic_runs.jsonl").read_text().splitlines()
    assert len(rows) == 3 and (tmp_path / "midpoint_synthetic.png").stat().st_size > 0
    assert cli.main(argv) == 0  # resumes: nothing rerun, nothing appended
    assert (tmp_path / "synthetic_runs.jsonl").read_text().splitlines() == rows
    result = json.loads((tmp_path / "synthetic_result.json").read_text())
    assert {r["method"] for r in result["runs"]} == {"erm", "midpoint", "uniform"}


def test_lr_sweep_presets_grow_the_budget_as_one_over_lr():
    from dataclasses import replace

    from feature_probes.midpoint_mixup.experiments import IMAGES_PRESETS, SWEEPS, SYNTHETIC_PRESETS

    runs = [SYNTHETIC_PRESETS[name] for name in SWEEPS["lr"]]
    assert [r.lr for r in runs] == [10.0, 1.0, 0.1]
    assert [r.steps for r in runs] == [600, 6000, 60000]  # lr x steps = 6000, the cpu preset's budget
    assert all(r.eval_every * 12 == r.steps and r.seeds == (0,) for r in runs)
    cpu = SYNTHETIC_PRESETS["cpu"]
    for r in runs:  # the same problem, network and methods as the cpu preset
        r.check()
        assert replace(r, lr=cpu.lr, steps=cpu.steps, eval_every=cpu.eval_every, seeds=cpu.seeds, note=cpu.note) == cpu
    steps = IMAGES_PRESETS["cpu-steps"]
    assert -(-1300 // steps.batch) * steps.epochs == 8200  # about the paper's 60000 / 750 x 100 = 8000 Adam steps
    assert -(-1300 // IMAGES_PRESETS["cpu"].batch) * IMAGES_PRESETS["cpu"].epochs == 200


def test_sweep_command_writes_a_row_per_setting_and_method(tmp_path, monkeypatch, capsys):
    from feature_probes.midpoint_mixup.experiments import SYNTHETIC_PRESETS

    monkeypatch.setitem(cli.SWEEPS, "lr", ("tiny",))
    assert cli.main(["sweep", "--out", str(tmp_path), "--quiet"]) == 0
    table = (tmp_path / "sweep_summary.md").read_text()
    assert table.count("| tiny |") == len(SYNTHETIC_PRESETS["tiny"].methods)
    assert (tmp_path / "midpoint_sweep_lr.png").stat().st_size > 0
    rows = (tmp_path / "sweep_runs.jsonl").read_text().splitlines()
    assert cli.main(["sweep", "--out", str(tmp_path), "--quiet"]) == 0  # resumes: nothing recomputed
    assert (tmp_path / "sweep_runs.jsonl").read_text().splitlines() == rows
