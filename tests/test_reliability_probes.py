"""On icl_probes/: --force deletes only what it recomputes, other settings are not overwritten,
damaged or crafted files are refused with a message. Seconds-long CPU runs only."""

import json
import os

import pytest
import torch

from icl_probes.looped.cli import main as looped_main
from icl_probes.modular import cli

GROK = ["grok", "--kps", "2,5", "--steps", "20", "--eval-every", "10", "--quiet"]
MLP = ["mlp", "--k", "2", "--p", "5", "--steps", "20", "--eval-every", "10", "--quiet"]


def _rows(path):
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_grok_force_drops_only_the_rows_it_recomputes(tmp_path):
    out = tmp_path / "grok"
    assert cli.main(GROK + ["--out", str(out)]) == 0
    (mine,) = _rows(out / "grok_runs.jsonl")
    other_pair = {**mine, "k": 3, "p": 3, "seconds": -1.0}  # a finished (k, p) of this sweep's settings
    other_setting = {**mine, "settings": {**mine["settings"], "seed": 7}, "seconds": -2.0}  # another sweep's row
    with open(out / "grok_runs.jsonl", "a") as f:
        f.write(json.dumps(other_pair) + "\n" + json.dumps(other_setting) + "\n")
    assert cli.main(GROK + ["--out", str(out), "--force"]) == 0
    rows = _rows(out / "grok_runs.jsonl")
    assert [r["seconds"] for r in rows[:2]] == [-1.0, -2.0]  # both kept
    assert len(rows) == 3 and (rows[2]["k"], rows[2]["p"]) == (2, 5) and rows[2]["seconds"] >= 0  # recomputed once


def test_grok_skips_a_line_that_is_not_an_object(tmp_path):
    out = tmp_path / "grok"
    out.mkdir()
    (out / "grok_runs.jsonl").write_text('[1, 2]\n"text"\n')
    with pytest.warns(UserWarning, match=r"grok_runs.jsonl:1: skipping an incomplete row: a row must be a JSON object"):
        assert cli.main(GROK + ["--out", str(out)]) == 0
    assert [(r["k"], r["p"]) for r in _rows(out / "grok_runs.jsonl") if isinstance(r, dict)] == [(2, 5)]


@pytest.mark.slow  # trains the MLP probe twice (~7 s)
def test_mlp_with_other_settings_does_not_overwrite_a_result(tmp_path, capsys):
    out = tmp_path / "mlp"
    assert cli.main(MLP + ["--out", str(out)]) == 0
    before = (out / "mlp_result.json").read_text()
    with pytest.raises(SystemExit) as exc:
        cli.main(MLP + ["--out", str(out), "--seed", "1"])
    assert exc.value.code == 2
    assert "already holds mlp_result.json of other settings (seed: 0 there, 1 now)" in capsys.readouterr().err
    assert (out / "mlp_result.json").read_text() == before
    assert cli.main(MLP + ["--out", str(out), "--seed", "1", "--force"]) == 0  # asked for: replaced
    assert json.loads((out / "mlp_result.json").read_text())["config"]["seed"] == 1


def test_mlp_out_naming_a_file_and_a_corrupt_result_are_clear_errors(tmp_path, capsys):
    (tmp_path / "file").write_text("x")
    with pytest.raises(SystemExit) as exc:
        cli.main(MLP + ["--out", str(tmp_path / "file")])
    assert exc.value.code == 2 and "is a file, not a folder" in capsys.readouterr().err
    out = tmp_path / "mlp"
    out.mkdir()
    (out / "mlp_result.json").write_text('{"config": {"k": 2')
    with pytest.raises(SystemExit) as exc:
        cli.main(MLP + ["--out", str(out)])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and "mlp_result.json: this results file is not valid JSON" in err and "Delete" in err


class _Payload:
    """Unpickling this runs a shell command: what a crafted checkpoint in --out could do."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def test_a_crafted_checkpoint_is_refused_not_unpickled(tmp_path, capsys):
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
    marker = tmp_path / "pwned"
    out.mkdir()
    torch.save({"model": _Payload(marker), "opt": {}, "data_rng": None, "step": 0}, out / "ckpt_last_shared.pt")
    with pytest.raises(SystemExit) as exc:
        looped_main(args)
    assert not marker.exists()  # the command never ran
    err = capsys.readouterr().err
    assert exc.value.code == 2 and "ckpt_last_shared.pt: not a checkpoint this command wrote" in err
    assert "Delete it to restart" in err


@pytest.mark.parametrize(
    "argv",
    [["looped", "fig81", "--n", "6", "--T", "5", "--trials", "1", "--kappa-trials", "1"], ["label_flip", "theory"]],
)
def test_every_probe_command_checks_out_before_computing(tmp_path, monkeypatch, capsys, argv):
    from icl_probes.label_flip import cli as lf_cli
    from icl_probes.label_flip import theory
    from icl_probes.looped import fig81

    def never(*a, **k):
        raise AssertionError("computed before --out was checked")

    monkeypatch.setattr(theory, "run", never)
    monkeypatch.setattr(fig81, "run_fig81", never)
    (tmp_path / "file").write_text("x")
    main = looped_main if argv[0] == "looped" else lf_cli.main
    with pytest.raises(SystemExit) as exc:
        main(argv[1:] + ["--out", str(tmp_path / "file")])
    assert exc.value.code == 2 and "is a file, not a folder" in capsys.readouterr().err


def test_feature_probe_force_recomputes_only_its_own_rows(tmp_path):
    """--force on a feature probe drops the rows it recomputes (same settings, its units), no others."""
    from dataclasses import dataclass

    from feature_probes.common import run_resumable
    from icl_probes.io import read_jsonl

    @dataclass(frozen=True)
    class Cfg:
        lr: float
        seeds: tuple = (0, 1)

    path = tmp_path / "runs.jsonl"
    calls = []

    def compute(seed, tag):
        calls.append(seed)
        return {"seed": seed, "tag": tag}

    def sweep(cfg, seeds, tag, force=False):
        return run_resumable(
            cfg, path, ("seeds",), [(s,) for s in seeds], lambda r: (r["seed"],), lambda s: compute(s, tag), force=force
        )

    sweep(Cfg(0.1), (0, 1), "old")
    sweep(Cfg(0.2), (0,), "other settings")
    assert sweep(Cfg(0.1), (0, 1), "new") == read_jsonl(path)[:2] and calls == [0, 1, 0]  # resumed: nothing new
    rows = sweep(Cfg(0.1), (1,), "new", force=True)
    assert calls == [0, 1, 0, 1] and [r["tag"] for r in rows] == ["new"]
    stored = [(r["settings"]["lr"], r["seed"], r["tag"]) for r in read_jsonl(path)]
    assert sorted(stored) == [(0.1, 0, "old"), (0.1, 1, "new"), (0.2, 0, "other settings")]


@pytest.mark.parametrize(
    "probe, argv",
    [("mrp", ["run", "--preset", "tiny"]), ("parity", ["table", "--preset", "tiny"]), ("midpoint_mixup", ["sweep"])],
)
def test_a_feature_probe_out_or_fig_dir_naming_a_file_is_a_clear_error(tmp_path, capsys, probe, argv):
    import importlib

    main = importlib.import_module(f"feature_probes.{probe}.cli").main
    (tmp_path / "file").write_text("x")
    for extra in (
        ["--out", str(tmp_path / "file")],
        ["--out", str(tmp_path / "o"), "--fig-dir", str(tmp_path / "file")],
    ):
        with pytest.raises(SystemExit) as exc:
            main(argv + extra)
        err = capsys.readouterr().err
        assert exc.value.code == 2 and f"{extra[-2]} {tmp_path / 'file'} is a file, not a folder" in err
