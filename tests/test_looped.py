"""icl_probes.looped (Ch. 8): the construction against independent GD, the mask, the fast loop, the CLI.

Every expected value comes from a computation written here (a plain GD loop, a per-row attention sum,
numpy eigenvalues), never from the package's own output.
"""

import contextlib
import io
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from icl_probes.looped.cli import main
from icl_probes.looped.model import (
    attention_mask,
    build_input,
    construction,
    linear_attention,
    looped_forward,
    looped_forward_fast,
    sample_tasks,
)

ROOT = Path(__file__).resolve().parents[1]


def plain_gd(X, y, etas):
    """theta^(T) of gradient descent on 1/2 ||y - X theta||^2 from theta = 0, in numpy, one task."""
    theta = np.zeros(X.shape[1])
    for eta in etas:
        theta = theta - eta * X.T @ (X @ theta - y)
    return theta


@pytest.mark.parametrize("T", [1, 3, 17, 60])
@pytest.mark.parametrize("n,d", [(16, 4), (7, 3), (40, 9)])
def test_construction_equals_gd_float64(T, n, d):
    """TF(Z^(0)) with Q, P of Lemma 8.13 equals alpha theta^(T) of plain GD to 1e-10, with varying eta^(t)."""
    rng = np.random.default_rng(1000 * T + n)
    Q, P = construction(d, dtype=torch.float64)
    for _ in range(3):
        X = rng.standard_normal((n, d))
        y = rng.standard_normal(n)  # any y: the identity does not need y = X theta*
        alpha = rng.uniform(-2, 2)
        L = np.linalg.eigvalsh(X.T @ X)[-1]
        etas = rng.uniform(0.1, 1.5, T) / L
        Z0 = np.zeros((n + 1, d + 1))
        Z0[:n, :d], Z0[:n, d], Z0[n, d] = X, y, alpha
        tf = looped_forward(torch.tensor(Z0)[None], Q, P, torch.tensor(etas), T)[0].numpy()
        np.testing.assert_allclose(tf, alpha * plain_gd(X, y, etas), rtol=0, atol=1e-10)


def test_construction_per_task_schedule_and_every_loop():
    """Batched (B, T) step sizes and all_loops: loop t's readout is alpha theta^(t) of that task's own GD."""
    tasks = sample_tasks(5, 12, 3, torch.Generator().manual_seed(0), dtype=torch.float64)
    etas = torch.rand(5, 8, generator=torch.Generator().manual_seed(1), dtype=torch.float64) * 0.05
    outs = looped_forward(tasks.input(), *construction(3), etas, 8, all_loops=True)
    for b in range(5):
        for t in range(9):
            want = tasks.alpha[b].item() * plain_gd(tasks.X[b].numpy(), tasks.y[b].numpy(), etas[b, :t].numpy())
            np.testing.assert_allclose(outs[b, t].numpy(), want, rtol=0, atol=1e-12)


def test_mask_shape():
    M = attention_mask(4).numpy()
    want = np.zeros((5, 5))
    want[4, :4] = 1
    np.testing.assert_array_equal(M, want)


def test_mask_leaves_all_rows_but_last_unchanged():
    """With random (not constructed) Q, P, a loop changes only the last row; that row matches a direct sum."""
    g = torch.Generator().manual_seed(3)
    n, d = 9, 4
    Z = torch.randn(2, n + 1, d + 1, generator=g, dtype=torch.float64)
    Q, P = (torch.randn(d + 1, d + 1, generator=g, dtype=torch.float64) for _ in range(2))
    Z1 = looped_forward(Z, Q, P, 0.3, 1, all_loops=False)  # just to exercise the loop API too
    A = linear_attention(Z, Q, P)
    assert torch.equal(A[:, :n], torch.zeros_like(A[:, :n]))
    new = Z - 0.3 * A
    assert torch.equal(new[:, :n], Z[:, :n])
    for b in range(2):  # last row = sum_{j<n} (z_last^T Q z_j) z_j^T P, written out
        z = Z[b].numpy()
        want = sum((z[n] @ Q.numpy() @ z[j]) * (z[j] @ P.numpy()) for j in range(n))
        np.testing.assert_allclose(A[b, n].numpy(), want, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(Z1.numpy(), -new[:, n, :d].numpy(), rtol=0, atol=1e-14)


def test_fast_loop_equals_definition():
    """The O(d^2) loop used in training equals the full masked-attention loop for random Q, P."""
    g = torch.Generator().manual_seed(4)
    tasks = sample_tasks(6, 10, 3, g, dtype=torch.float64)
    Q, P = (0.3 * torch.randn(4, 4, generator=g, dtype=torch.float64) for _ in range(2))
    etas = torch.rand(7, generator=g, dtype=torch.float64) * 0.05
    slow = looped_forward(tasks.input(), Q, P, etas, 7, all_loops=True)
    np.testing.assert_allclose(looped_forward_fast(tasks.input(), Q, P, etas, 7).numpy(), slow.numpy(), atol=1e-12)


def test_sampler_task_definition():
    tasks = sample_tasks(500, 6, 4, torch.Generator().manual_seed(5), dtype=torch.float64)
    np.testing.assert_allclose(tasks.theta.norm(dim=1).numpy(), 1, atol=1e-12)
    np.testing.assert_allclose(
        tasks.y.numpy(), np.einsum("bnd,bd->bn", tasks.X.numpy(), tasks.theta.numpy()), atol=1e-12
    )
    assert (tasks.alpha.abs() >= 0.5).all() and (tasks.alpha > 0).any() and (tasks.alpha < 0).any()
    Z = build_input(tasks.X, tasks.y, tasks.alpha)
    assert torch.equal(Z[:, -1, :-1], torch.zeros(500, 4, dtype=torch.float64))
    assert torch.equal(Z[:, -1, -1], tasks.alpha) and torch.equal(Z[:, :-1, -1], tasks.y)
    with pytest.raises(ValueError, match="alpha_range"):
        sample_tasks(2, 3, 2, torch.Generator(), alpha_range=(0.0, 1.0))


def test_eta_shape_error():
    with pytest.raises(ValueError, match="schedule"):
        looped_forward(torch.zeros(2, 4, 3), *construction(2), torch.ones(5), 3)


def run_cli(*args):
    return subprocess.run(
        [sys.executable, "-m", "icl_probes.looped", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
        timeout=120,
    )


def test_cli_help_teaches():
    top = run_cli("--help")
    assert top.returncode == 0 and "fig81" in top.stdout and "examples:" in top.stdout
    for sub in ("fig81", "train", "check"):
        out = main_help(sub)
        assert "examples:" in out and "--out" in out and "--float64" in out


def main_help(sub):
    buf = io.StringIO()
    with pytest.raises(SystemExit) as exc, contextlib.redirect_stdout(buf):
        main([sub, "--help"])
    assert exc.value.code == 0
    return buf.getvalue()


def test_cli_fig81_tiny_run_and_resume(tmp_path):
    out, png = tmp_path / "a", tmp_path / "fig.png"
    args = [
        "fig81",
        "--n",
        "6,12",
        "--T",
        "30",
        "--trials",
        "2",
        "--kappa-trials",
        "5",
        "--out",
        str(out),
        "--png",
        str(png),
        "--no-progress",
    ]
    assert main(args) == 0
    assert png.stat().st_size > 1000 and png.read_bytes()[:4] == b"\x89PNG"
    res = json.loads((out / "results.json").read_text())
    table = (out / "table.md").read_text()
    assert "| 6 |" in table and "| 12 |" in table
    rows = [json.loads(x) for x in (out / "rows.jsonl").read_text().splitlines()]
    for r in rows:  # kappa checked against numpy on the same X
        if r.get("kind") == "kappa":
            continue
        X = sample_tasks(1, r["n"], 4, torch.Generator().manual_seed(r["seed"]), dtype=torch.float64).X[0].numpy()
        ev = np.linalg.eigvalsh(X.T @ X)
        assert r["kappa"] == pytest.approx(ev[-1] / ev[0], rel=1e-10)
        assert r["max_dev_from_gd"] < 1e-12
    assert res["per_n"]["6"]["trials_below_theta_bound"] == 2
    # Resume: delete one trial row; the rerun recomputes exactly that one.
    kept = [r for r in rows if not (r["n"] == 12 and r.get("trial") == 1)]
    (out / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in kept))
    assert main(args) == 0
    again = [json.loads(x) for x in (out / "rows.jsonl").read_text().splitlines()]
    assert len(again) == len(rows)
    assert again[-1]["n"] == 12 and again[-1]["trial"] == 1
    assert again[-1]["log_ratio"] == next(r for r in rows if r["n"] == 12 and r.get("trial") == 1)["log_ratio"]


def test_cli_train_smoke_and_resume(tmp_path):
    out = tmp_path / "b"
    args = [
        "train",
        "--preset",
        "smoke",
        "--losses",
        "last",
        "--eta-modes",
        "shared",
        "--out",
        str(out),
        "--no-progress",
    ]
    assert main(args) == 0
    assert (out / "train.png").read_bytes()[:4] == b"\x89PNG"
    assert "learned last/shared" in (out / "table.md").read_text()
    res = json.loads((out / "results.json").read_text())
    assert len(res["models"]["last/shared"]["rel_sq_error_mean"]) == 7  # eval loops 0..6
    # Interrupt: drop the final row, so the rerun resumes from the checkpoint and evaluates again.
    rows = (out / "rows.jsonl").read_text().splitlines()
    final = [r for r in rows if '"final"' in r]
    (out / "rows.jsonl").write_text("\n".join(r for r in rows if '"final"' not in r) + "\n")
    assert main(args) == 0
    rows2 = (out / "rows.jsonl").read_text().splitlines()
    assert [r for r in rows2 if '"final"' in r] == final  # same checkpoint, same held-out tasks


def test_cli_bad_input(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["fig81", "--n", "2,16", "--out", str(tmp_path / "c")])
    assert exc.value.code == 2 and "every n must be >= d=4" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["train", "--eta-modes", "cyclic", "--out", str(tmp_path / "d")])
    assert "subset of per-loop,shared" in capsys.readouterr().err
    # A changed config into the same folder is refused instead of mixing two runs.
    base = [
        "fig81",
        "--n",
        "6",
        "--T",
        "5",
        "--trials",
        "1",
        "--kappa-trials",
        "1",
        "--no-progress",
        "--out",
        str(tmp_path / "e"),
    ]
    assert main(base) == 0
    with pytest.raises(SystemExit):
        main(base + ["--seed", "7"])
    assert "another config" in capsys.readouterr().err


def test_cli_check_float64(tmp_path):
    res = run_cli("check", "--float64", "--T", "1,25", "--tasks", "8", "--out", str(tmp_path))
    assert res.returncode == 0, res.stderr
    diffs = json.loads((tmp_path / "check.json").read_text())["max_abs_diff"]
    assert set(diffs) == {"1", "25"} and max(diffs.values()) < 1e-10
