"""The gemfilter command on a tiny model saved on disk."""

import re

from gemfilter.lab.cli import main
from gemfilter.methods import REGISTRY


def test_methods_lists_the_registry(capsys):
    assert main(["methods"]) == 0
    out = capsys.readouterr().out
    for name in REGISTRY:
        assert re.search(rf"^{re.escape(name)}\s+\S", out, re.M), name


def test_generate_reports_kept_tokens_and_selection(tiny_model_dir, tmp_path, capsys):
    prompt = tmp_path / "p.txt"
    prompt.write_text(" ".join(f"w{3 + i % 90}" for i in range(30)))
    rc = main(
        [
            "generate",
            "--prompt-file",
            str(prompt),
            "--model",
            str(tiny_model_dir),
            "--layer",
            "2",
            "--topk",
            "7",
            "--max-new-tokens",
            "3",
            "--show-selection",
        ]
    )
    assert rc == 0
    err = capsys.readouterr().err
    assert "[gemfilter] kept 7/30 prompt tokens (filter layer 2)" in err
    kept_text = err.split("--- kept text ---")[1].split()
    assert len(kept_text) == 7


def test_generate_errors_are_clear(tiny_model_dir, tmp_path, capsys):
    empty = tmp_path / "empty.txt"
    empty.write_text("  \n")
    assert main(["generate", "--prompt-file", str(empty), "--model", str(tiny_model_dir)]) == 2
    assert "is empty" in capsys.readouterr().err
    prompt = tmp_path / "p.txt"
    prompt.write_text("w5 w6 w7")
    assert main(["generate", "--prompt-file", str(prompt), "--model", str(tiny_model_dir), "--layer", "9"]) == 2
    assert "outside [0, 4)" in capsys.readouterr().err
