"""Each command parses each method spec once: the command line makes the run plan, and everything after it (the
run config, the checks before loading, the engine check, the runner's set-up, every prompt) uses that plan.

Every parse goes through ``gemfilter.methods.spec.parse_spec``; the tests count its calls per spec text over a whole
run of each benchmark's command on the tiny random Llama, and check the labels that name the result folders.
"""

import collections

import pytest
from longbench_fixtures import TASKS as LB_TASKS
from longbench_fixtures import write_words
from niah_fixtures import write_haystack
from test_ruler_runner import TASKS as RULER_TASKS
from test_ruler_runner import write_samples

import gemfilter.methods
import gemfilter.methods.spec as spec_module


@pytest.fixture
def parses(monkeypatch):
    """{spec text: times parsed} while the test runs."""
    counts = collections.Counter()
    real = spec_module.parse_spec

    def counting(text, **defaults):
        counts[text] += 1
        return real(text, **defaults)

    monkeypatch.setattr(spec_module, "parse_spec", counting)
    monkeypatch.setattr(gemfilter.methods, "parse_spec", counting)
    return counts


METHODS = "full,gemfilter,snapkv:window=4,gemfilter:k=12"
ONCE = {"full": 1, "gemfilter": 1, "snapkv:window=4": 1, "gemfilter:k=12": 1}


def test_ruler_run_parses_each_spec_once_over_two_budgets(parses, tiny_model_dir, tmp_path, capsys):
    from eval.ruler.cli import main

    out = write_samples(tmp_path / "out", n=1)
    argv = ["run", "--model", str(tiny_model_dir), "--tasks", ",".join(RULER_TASKS[:1]), "--num-samples", "1"]
    argv += ["--methods", METHODS, "--topk", "8,16", "--layer", "2", "--lengths", "512", "--threads", "1"]
    assert main([*argv, "--no-progress", "--out", str(out)]) == 0, capsys.readouterr().err
    assert dict(parses) == ONCE
    made = sorted(p.name for p in (out / "512" / "pred").iterdir())
    # the labels of a budget list are as they were: the spec, then _k<budget> where the spec sets none
    assert made == sorted(
        ["full", "gemfilter_k8", "gemfilter_k16", "snapkv:window=4_k8", "snapkv:window=4_k16", "gemfilter:k=12"]
    )


def test_ruler_ratio_labels_are_as_they_were(parses, tiny_model_dir, tmp_path, capsys):
    from eval.ruler.cli import main

    out = write_samples(tmp_path / "out", n=1)
    argv = ["run", "--model", str(tiny_model_dir), "--tasks", ",".join(RULER_TASKS[:1]), "--num-samples", "1"]
    argv += ["--methods", "full,snapkv:window=2", "--ratio", "0.5", "--lengths", "512", "--threads", "1"]
    assert main([*argv, "--no-progress", "--out", str(out)]) == 0, capsys.readouterr().err
    assert dict(parses) == {"full": 1, "snapkv:window=2": 1}
    assert sorted(p.name for p in (out / "512" / "pred").iterdir()) == ["full", "snapkv:window=2_r0.5"]


def test_longbench_run_parses_each_spec_once(parses, tiny_model_dir, tmp_path, capsys):
    from eval.longbench.cli import main

    words = write_words(tmp_path / "data", e=True, words=80)
    argv = ["run", "--model", str(tiny_model_dir), "--data-dir", str(words), "--tasks", LB_TASKS[0], "--limit", "1"]
    argv += ["--methods", METHODS, "--topk", "8", "--layer", "2", "--max-length", "64", "--threads", "1"]
    assert main([*argv, "--no-progress", "--out", str(tmp_path / "out")]) == 0, capsys.readouterr().err
    assert dict(parses) == ONCE
    assert sorted(p.name for p in (tmp_path / "out" / "pred").iterdir()) == sorted(ONCE)


def test_niah_run_parses_each_spec_once(parses, tmp_path, capsys):
    from niah_fixtures import save_tiny_model

    from eval.niah.cli import main

    model_dir = save_tiny_model(tmp_path / "model")
    argv = ["--model", str(model_dir), "--haystack-dir", str(write_haystack(tmp_path / "hay")), "--lengths", "240"]
    argv += ["--depths", "50", "--methods", METHODS, "--topk", "40", "--layer", "2", "--max-new-tokens", "2"]
    assert main([*argv, "--no-progress", "--out", str(tmp_path / "out")]) == 0, capsys.readouterr().err
    assert dict(parses) == ONCE


def test_scbench_run_parses_each_spec_once(parses, tmp_path, monkeypatch, capsys):
    from test_scbench_runner import CharTokenizer, _build
    from transformers import LlamaConfig, LlamaForCausalLM

    from eval.scbench import runner
    from eval.scbench.cli import main

    tiny = _build(LlamaForCausalLM, LlamaConfig, max_position_embeddings=4096), CharTokenizer()
    real = runner.run
    monkeypatch.setattr(runner, "run", lambda config, out, **kw: real(config, out, **kw, model_and_tokenizer=tiny))
    argv = ["run", "--tasks", "scbench_vt", "--lengths", "2048", "--num-samples", "1", "--turns", "2"]
    argv += ["--methods", "full,gemfilter,snapkv:window=4", "--topk", "48", "--layer", "2"]
    argv += ["--protocols", "reselect,reuse", "--no-warmup", "--no-progress", "--out", str(tmp_path / "out")]
    assert main(argv) == 0, capsys.readouterr().err
    assert dict(parses) == {"full": 1, "gemfilter": 1, "snapkv:window=4": 1}
    made = sorted(p.name for p in (tmp_path / "out" / "multi-turn" / "2048").iterdir())
    assert made == ["full", "gemfilter@reselect", "gemfilter@reuse", "snapkv:window=4"]


def test_bad_specs_keep_their_one_line_errors():
    from eval.ruler.runner import RunConfig, run
    from gemfilter.methods.spec import expand_budgets

    with pytest.raises(ValueError, match="unknown method 'nope'; allowed:"):
        expand_budgets(("full", "nope"), (8,))
    with pytest.raises(ValueError, match="gemfilter: topk=0 must be >= 1"):
        expand_budgets(("gemfilter",), (8, 0))
    with pytest.raises(ValueError, match="--ratio must be a fraction in \\(0, 1\\]"):
        expand_budgets(("snapkv",), ratio=1.5)
    with pytest.raises(ValueError, match="--methods is empty"):
        run(RunConfig(methods=()), "unused", model_and_tokenizer=(None, None))
    with pytest.raises(ValueError, match="lists a method twice"):
        RunConfig(methods=("full", "full"))
