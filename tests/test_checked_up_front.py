"""Issue 43, items 5, 7, 9 and 11: bad options are one ``error:`` line and exit 2 before any model loads or any
work starts, and nothing is written."""

import pytest

from eval.longbench.cli import main as lb_main


def test_max_length_per_method_must_name_a_method_of_the_run(tmp_path, capsys):
    argv = ["run", "--model", str(tmp_path / "no-such-model"), "--tasks", "hotpotqa", "--methods", "full,gemfilter",
            "--max-length-per-method", "nosuch=5", "--out", str(tmp_path / "out")]
    assert lb_main(argv) == 2
    err = capsys.readouterr().err
    assert err.strip() == ("error: --max-length-per-method names nosuch, which --methods does not run; allowed: "
                           "full, gemfilter")
    assert not (tmp_path / "out").exists()
