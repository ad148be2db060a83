"""Bad options are one ``error:`` line and exit 2 before any model loads or any
work starts, and nothing is written."""

import pytest

from eval.longbench.cli import main as lb_main


def test_max_length_per_method_must_name_a_method_of_the_run(tmp_path, capsys):
    argv = [
        "run",
        "--model",
        str(tmp_path / "no-such-model"),
        "--tasks",
        "hotpotqa",
        "--methods",
        "full,gemfilter",
        "--max-length-per-method",
        "nosuch=5",
        "--out",
        str(tmp_path / "out"),
    ]
    assert lb_main(argv) == 2
    err = capsys.readouterr().err
    assert err.strip() == (
        "error: --max-length-per-method names nosuch, which --methods does not run; allowed: full, gemfilter"
    )
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("argv", [["train", "--preset", "smoke"], ["fig81"]])
def test_looped_png_that_is_a_folder_is_refused_before_work(tmp_path, capsys, argv):
    from icl_probes.looped.cli import main as looped_main

    folder = tmp_path / "figs"
    folder.mkdir()
    with pytest.raises(SystemExit) as exit_:
        looped_main(argv + ["--out", str(tmp_path / "out"), "--png", str(folder)])
    assert exit_.value.code == 2
    assert f"--png {folder} is a folder; give the PNG file to write" in capsys.readouterr().err
    assert list((tmp_path / "out").iterdir()) == [] and not (tmp_path / "figs.png").exists()


def test_label_flip_theory_fig_that_is_a_folder_is_refused_before_work(tmp_path, capsys):
    from icl_probes.label_flip.cli import main as label_flip_main

    with pytest.raises(SystemExit) as exit_:
        label_flip_main(["theory", "--out", str(tmp_path / "out"), "--fig", str(tmp_path)])
    assert exit_.value.code == 2 and f"--fig {tmp_path} is a folder" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("module", ["gemfilter.toolkit.io", "icl_probes.io"])
def test_a_figure_cut_short_by_a_full_disk_leaves_the_old_one(tmp_path, monkeypatch, module):
    """save_png (the plugin's and the probes'), which every figure of the tree is written through: a failing
    write keeps the old PNG and leaves no temp file."""
    import importlib

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.figure import Figure

    save_png = importlib.import_module(module).save_png
    path = tmp_path / "fig.png"
    fig, _ = plt.subplots()
    save_png(fig, path)
    good = path.read_bytes()
    assert good.startswith(b"\x89PNG")

    def full_disk(self, fname, **kwargs):
        with open(fname, "wb") as f:
            f.write(good[:100])
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(Figure, "savefig", full_disk)
    fig, _ = plt.subplots()
    with pytest.raises(OSError, match="No space left"):
        save_png(fig, path)
    assert path.read_bytes() == good and [p.name for p in tmp_path.iterdir()] == ["fig.png"]
    assert not plt.fignum_exists(fig.number)  # closed all the same


def test_every_figure_in_the_tree_is_written_through_save_png():
    """A plain savefig anywhere but the two save_png modules would write in place (a truncated PNG on a full disk)."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    writers = {Path("gemfilter/toolkit/io.py"), Path("icl_probes/io.py")}
    calls = [
        f"{p.relative_to(root)}:{i}"
        for folder in ("gemfilter", "eval", "icl_probes", "feature_probes")
        for p in (root / folder).rglob("*.py")
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if re.search(r"\.savefig\(", line) and p.relative_to(root) not in writers
    ]
    assert calls == []


def test_niah_length_too_short_fails_before_the_model_loads_and_before_config_json(tmp_path, capsys, monkeypatch):
    from niah_fixtures import save_tiny_model, word_tokenizer, write_haystack

    import gemfilter
    from eval.niah.cli import main as niah_main
    from gemfilter.toolkit.haystack import NEEDLE

    def no_load(*args, **kwargs):
        raise AssertionError("the model was loaded")

    model_dir = save_tiny_model(tmp_path / "m")
    monkeypatch.setattr(gemfilter, "load_model", no_load)
    monkeypatch.setattr("gemfilter.models.load_model", no_load)
    needle = len(word_tokenizer().encode(NEEDLE, add_special_tokens=False))
    argv = [
        "--model",
        str(model_dir),
        "--methods",
        "full",
        "--lengths",
        f"{200 + needle - 1},400",
        "--depths",
        "50",
        "--haystack-dir",
        str(write_haystack(tmp_path / "hay")),
        "--out",
        str(tmp_path / "out"),
        "--no-progress",
    ]
    assert niah_main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == (
        f"error: --lengths: {200 + needle - 1} tokens is too short for the needle test: a context "
        f"needs the 200-token buffer (template, question, answer) plus the {needle}-token needle; "
        f"allowed: {200 + needle} tokens or more with this tokenizer"
    )
    assert not (tmp_path / "out" / "config.json").exists()


def test_bench_length_too_short_fails_before_any_worker(tmp_path, capsys, monkeypatch, tiny_model_dir):
    from gemfilter.lab.bench import core
    from gemfilter.lab.bench.report import main as bench_main

    def no_worker(*args, **kwargs):
        raise AssertionError("a worker started")

    monkeypatch.setattr(core, "run_worker", no_worker)
    with pytest.raises(SystemExit) as exit_:
        bench_main(
            [
                "--model",
                str(tiny_model_dir),
                "--methods",
                "full",
                "--lengths",
                "150,400",
                "--out",
                str(tmp_path / "out"),
            ]
        )
    assert exit_.value.code == 2
    assert capsys.readouterr().err.strip().startswith("error: --lengths: 150 tokens is too short for the needle test")
