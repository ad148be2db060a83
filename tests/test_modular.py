"""Tests for icl_probes.modular (Ch. 4): Fourier metrics against hand-built cosines and a naive DFT,
the data set against itertools, the models against their equations written out, short training smoke
runs and the CLI (help, outputs, resume, bad input)."""

import cmath
import itertools
import json
import math

import numpy as np
import pytest
import torch

from icl_probes.modular import cli, experiments
from icl_probes.modular.data import all_inputs, check_kp, labels, make_split
from icl_probes.modular.experiments import grokking_delay
from icl_probes.modular.fourier import (
    dft2_interaction_share,
    dft2_sparsity,
    frequency_histogram,
    max_normalised_power,
    neuron_power,
    one_sided_power,
)
from icl_probes.modular.mlp import PowerMLP, paper_width
from icl_probes.modular.train import TrainConfig, train
from icl_probes.modular.transformer import ModularTransformer


def cosine(p, j, phase=0.3, amp=2.0, offset=0.7):
    return torch.tensor([amp * math.cos(2 * math.pi * j * a / p + phase) + offset for a in range(p)])


@pytest.mark.parametrize("p", [5, 23, 47])
def test_pure_cosine_has_power_one_at_its_frequency(p):
    for j in range(1, (p - 1) // 2 + 1):
        power, freq = max_normalised_power(cosine(p, j, phase=0.1 * j))
        assert power.item() == pytest.approx(1.0, abs=1e-6)
        assert freq.item() == j


def test_random_vectors_have_low_power():
    p = 47
    power, _ = max_normalised_power(torch.randn(2000, p, generator=torch.Generator().manual_seed(0)))
    # max of 23 i.i.d. exponentials over their sum: mean about H_23 / 23 = 0.16
    assert 0.1 < power.mean().item() < 0.25
    assert (power >= 0.9).sum().item() == 0


def test_one_sided_power_matches_a_naive_dft():
    p = 11
    u = [0.3, -1.0, 2.0, 0.0, 0.5, 1.5, -0.7, 0.2, 0.9, -2.0, 1.1]
    naive = []
    for j in range(1, (p - 1) // 2 + 1):
        pos = sum(u[a] * cmath.exp(-2j * math.pi * j * a / p) for a in range(p))
        neg = sum(u[a] * cmath.exp(-2j * math.pi * (p - j) * a / p) for a in range(p))
        naive.append(abs(pos) ** 2 + abs(neg) ** 2)
    assert one_sided_power(torch.tensor(u, dtype=torch.float64)).tolist() == pytest.approx(naive, rel=1e-9)


def test_neuron_power_pools_the_k_embeddings():
    p = 13
    same = torch.stack([cosine(p, 4, phase=ph) for ph in (0.0, 1.0, 2.0)])[:, None, :]  # (k=3, m=1, p)
    power, freq = neuron_power(same)
    assert power.item() == pytest.approx(1.0, abs=1e-6) and freq.item() == 4
    mixed = torch.stack([cosine(p, 2), cosine(p, 5)])[:, None, :]  # equal amplitudes, two frequencies
    assert neuron_power(mixed)[0].item() == pytest.approx(0.5, abs=1e-6)
    assert frequency_histogram(torch.tensor([1, 1, 3, 6]), p) == [2, 0, 1, 0, 0, 1]


def test_dft2_sparsity_of_a_2d_cosine_and_of_noise():
    p = 17
    a, b = np.meshgrid(np.arange(p), np.arange(p), indexing="ij")
    w = torch.tensor(np.cos(2 * np.pi * (3 * a + 5 * b) / p + 0.4))
    share, dominant = dft2_sparsity(w)
    assert share == pytest.approx(1.0, abs=1e-9) and dominant == (3, 5)
    product = torch.tensor(np.cos(2 * np.pi * 2 * a / p) * np.cos(2 * np.pi * 7 * b / p))
    assert dft2_sparsity(product)[0] == pytest.approx(1.0, abs=1e-9)
    assert dft2_sparsity(torch.randn(p, p, generator=torch.Generator().manual_seed(1)))[0] < 0.2
    # a cosine in a alone plus a cosine in a - b: the interaction part is exactly the a - b cosine
    mixed = torch.tensor(3 * np.cos(2 * np.pi * 2 * a / p) + np.cos(2 * np.pi * 4 * (a - b) / p))
    assert dft2_sparsity(mixed)[1] == (2, 0)
    assert dft2_interaction_share(mixed) == pytest.approx(1.0, abs=1e-9)


@pytest.mark.parametrize("k,p", [(2, 3), (2, 7), (3, 5), (4, 3)])
def test_dataset_enumerates_all_inputs_with_correct_labels(k, p):
    x = all_inputs(k, p)
    expected = list(itertools.product(range(p), repeat=k))
    assert x.tolist() == [list(t) for t in expected]
    assert labels(x, p).tolist() == [sum(t) % p for t in expected]
    split = make_split(k, p, 0.5, seed=3)
    assert len(split.x_train) == round(p**k / 2) and len(split.x_train) + len(split.x_test) == p**k
    rows = [tuple(r) for r in split.x_train.tolist()] + [tuple(r) for r in split.x_test.tolist()]
    assert sorted(rows) == expected  # disjoint and complete
    for xs, ys in ((split.x_train, split.y_train), (split.x_test, split.y_test)):
        assert ys.tolist() == [sum(r) % p for r in xs.tolist()]


def test_bad_k_p_and_split_are_rejected():
    for k, p in ((1, 5), (2, 9), (2, 2), (3, 1)):
        with pytest.raises(ValueError):
            check_kp(k, p)
    with pytest.raises(ValueError, match="train_frac"):
        make_split(2, 5, 1.0)


def test_power_mlp_is_equation_4_2():
    torch.manual_seed(0)
    k, p, m = 3, 5, 4
    net = PowerMLP(k, p, m, init_std=0.5)
    a = torch.tensor([[0, 1, 2], [4, 4, 3]])
    out = net(a)
    for n, row in enumerate(a.tolist()):
        expected = sum((sum(net.U[j, row[j], i] for j in range(k)) ** k) * net.W[i] for i in range(m))
        assert torch.allclose(out[n], expected, atol=1e-5)
    assert net.embeddings()[1, 2].tolist() == net.U[1, :, 2].tolist()  # u_{i=2, j=1} over a
    assert paper_width(4, 47) == 2944 and paper_width(3, 97) == 1536 and paper_width(5, 23) == 5632


def test_power_summary_counts_active_neurons():
    from icl_probes.modular.experiments import _power_summary

    p = 7
    net = PowerMLP(2, p, 3, init_std=1.0)
    with torch.no_grad():
        net.U[:, :, 0] = torch.stack([cosine(p, 2, phase=0.0, offset=0.0), cosine(p, 2, phase=1.0, offset=0.0)])
        net.U[:, :, 1] = (cosine(p, 1, offset=0.0) + cosine(p, 3, offset=0.0))[None]  # power 0.5
        net.U[:, :, 2] *= 1e-3  # a switched-off neuron: far below 0.1 x the largest norm
        net.W[2] *= 1e-3
    s = _power_summary(net)
    assert s["n_active"] == 2 and s["freq"][0] == 2 and s["power"][0] == pytest.approx(1.0, abs=1e-6)
    assert s["power"][1] == pytest.approx(0.5, abs=1e-6)
    assert s["frac_power_ge_active"] == 0.5 and s["covered_active"] == 2


def test_w_kq_equals_key_query_products_of_the_token_embeddings():
    torch.manual_seed(0)
    model = ModularTransformer(2, 7, n_layers=1, d_model=8, n_heads=3, d_head=4, d_mlp=16)
    qkv = model.blocks[0].qkv(model.tok.weight).detach()  # (p, 3 * H * d_head): q heads, k heads, v heads
    q, k = qkv[:, :12].view(7, 3, 4), qkv[:, 12:24].view(7, 3, 4)
    w = model.w_kq(0)
    for h in range(3):
        assert torch.allclose(w[h], k[:, h] @ q[:, h].T, atol=1e-6)


def test_mlp_training_smoke_fits_the_train_set():
    torch.manual_seed(0)
    split = make_split(2, 23, 0.5, seed=0)
    net = PowerMLP(2, 23, paper_width(2, 23))
    cfg = TrainConfig(steps=300, lr=5e-3, weight_decay=1.0, batch_size=0, eval_every=100)
    hist = train(net, split, cfg, progress=False)
    assert hist[-1]["train_loss"] < 0.2 * hist[0]["train_loss"]
    assert hist[-1]["train_acc"] > 0.9  # chance is 1/23


def test_training_stops_at_the_deadline_and_marks_the_row():
    import time

    split = make_split(2, 5, 0.5, seed=0)
    hist = train(
        PowerMLP(2, 5, 8), split, TrainConfig(steps=1000, eval_every=500), progress=False, deadline=time.time() - 1
    )
    assert [r["step"] for r in hist] == [0, 1] and hist[-1]["time_limit"] is True


def test_grokking_delay_from_a_hand_made_history():
    hist = [
        dict(step=s, train_acc=tr, test_acc=te)
        for s, tr, te in [(0, 0.0, 0.0), (100, 0.5, 0.0), (200, 0.995, 0.1), (300, 1.0, 0.5), (400, 1.0, 0.992)]
    ]
    # gap area by hand, left sums over 100-step intervals: 0 + 0.5*100 + 0.895*100 + 0.5*100 = 189.5
    assert grokking_delay(hist, 0.99) == dict(train_step=200, test_step=400, delay=200, gap_area=189.5)
    assert grokking_delay(hist[:4], 0.99)["delay"] is None


def test_cli_help_teaches(capsys):
    for sub in ("mlp", "transformer", "grok"):
        with pytest.raises(SystemExit) as exc:
            cli.main([sub, "--help"])
        assert exc.value.code == 0
        text = capsys.readouterr().out
        assert "examples:" in text and "outputs" in text and "--preset" in text


@pytest.mark.slow  # trains through the command twice (~5 s)
def test_cli_mlp_writes_outputs_and_resumes(tmp_path, monkeypatch, capsys):
    args = ["mlp", "--k", "2", "--p", "11", "--steps", "50", "--eval-every", "25", "--out", str(tmp_path), "--quiet"]
    assert cli.main(args) == 0
    result = json.loads((tmp_path / "mlp_result.json").read_text())
    assert result["config"]["p"] == 11 and len(result["final_power"]["power"]) == paper_width(2, 11)
    assert [r["step"] for r in map(json.loads, (tmp_path / "mlp_log.jsonl").read_text().splitlines())] == [0, 25, 50]
    assert "test accuracy" in (tmp_path / "mlp_summary.md").read_text()
    for name in ("modular_fig41_neurons.png", "modular_fig42_frequencies.png"):
        assert (tmp_path / name).read_bytes()[:4] == b"\x89PNG"

    def boom(*a, **kw):
        raise AssertionError("a finished run was retrained")

    monkeypatch.setattr(cli, "run_mlp", boom)
    assert cli.main(args) == 0  # resumed from mlp_result.json
    with pytest.raises(AssertionError):
        cli.main(args + ["--steps", "60", "--force"])  # other settings with --force: retrained


def test_cli_grok_and_transformer_resume(tmp_path, monkeypatch):
    args = ["grok", "--kps", "2,5;3,3", "--steps", "20", "--eval-every", "10", "--out", str(tmp_path), "--quiet"]
    assert cli.main(args) == 0
    rows = [json.loads(line) for line in (tmp_path / "grok_runs.jsonl").read_text().splitlines()]
    assert [(r["k"], r["p"]) for r in rows] == [(2, 5), (3, 3)]
    assert "| 3 | 3 |" in (tmp_path / "grok_summary.md").read_text()
    assert (tmp_path / "modular_fig44_grokking.png").exists()
    monkeypatch.setattr(experiments, "train", lambda *a, **kw: (_ for _ in ()).throw(AssertionError("rerun")))
    assert cli.main(args) == 0  # both (k, p) finished: nothing retrained
    with pytest.raises(AssertionError, match="rerun"):
        cli.main(args[:2] + ["2,5;2,7"] + args[3:])  # (2, 7) is new
    monkeypatch.undo()
    tf = [
        "transformer",
        "--k",
        "2",
        "--p",
        "5",
        "--heads",
        "2",
        "--d-model",
        "8",
        "--steps",
        "10",
        "--out",
        str(tmp_path),
    ]
    assert cli.main(tf + ["--quiet"]) == 0
    assert len(json.loads((tmp_path / "transformer_result.json").read_text())["init_kq"]["share"]) == 2
    assert (tmp_path / "modular_fig43_wkq.png").exists()


@pytest.mark.parametrize(
    "bad,message",
    [
        (["--p", "9"], "odd prime"),
        (["--k", "1"], "k=1"),
        (["--steps", "0"], "steps=0"),
        (["--device", "tpu"], "unknown device"),
    ],
)
def test_cli_rejects_bad_input(tmp_path, capsys, bad, message):
    with pytest.raises(SystemExit) as exc:
        cli.main(["mlp", "--out", str(tmp_path), "--quiet", *bad])
    assert exc.value.code == 2
    assert message in capsys.readouterr().err
