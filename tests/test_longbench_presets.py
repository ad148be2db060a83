"""LongBench per-method max length and the gemfilter-paper preset, on the tiny Llama."""

import pytest
from longbench_fixtures import TASKS, write_words

from eval.longbench import cli, runner
from eval.longbench.pipeline import truncate_middle
from eval.longbench.presets import paper_max_length, parse_method_lengths
from eval.longbench.runner import RunConfig, run
from eval.longbench.tasks import PAPER_TASKS, get_task


@pytest.fixture(scope="module")
def tiny(tiny_model_dir):
    import gemfilter

    return gemfilter.load_model(str(tiny_model_dir))


def test_each_method_is_truncated_to_its_own_max_length(tiny, tiny_model_dir, tmp_path):
    data = write_words(tmp_path / "data", e=False, words=80)
    model, tok = tiny
    config = RunConfig(
        model=str(tiny_model_dir),
        methods=("full", "h2o"),
        tasks=TASKS[:1],
        limit=2,
        topk=40,
        max_length=64,
        data_dir=str(data),
        method_max_length={"h2o": 41},
    )
    rows = run(config, tmp_path / "out", model_and_tokenizer=tiny, progress=False)
    from eval.longbench.data import load_records

    records = load_records(TASKS[0], str(data), 2)
    task = get_task(TASKS[0])
    for name, length in (("full", 64), ("h2o", 41)):
        for row, record in zip(rows[name, TASKS[0]], records):
            expected = tok(truncate_middle(task.prompt(record), tok, length))["input_ids"]  # pred.py's cut
            assert row["prompt_tokens"] == len(expected) <= length, (name, row["_id"])
    assert {r["prompt_tokens"] for r in rows["full", TASKS[0]]} != {r["prompt_tokens"] for r in rows["h2o", TASKS[0]]}
    other = RunConfig(**{**config.__dict__, "method_max_length": {"h2o": 50}})
    with pytest.raises(ValueError, match="method_max_length"):
        run(other, tmp_path / "out", model_and_tokenizer=tiny, progress=False)


def test_bad_per_method_lengths_are_refused():
    # the values take --max-length's forms (gemfilter.toolkit.options.parse_length): 8k is 8000 there too
    assert parse_method_lengths("h2o=8192, snapkv=4k") == {"h2o": 8192, "snapkv": 4000}
    for bad in ("h2o", "h2o=", "=8"):
        with pytest.raises(ValueError, match="must look like METHOD=TOKENS"):
            parse_method_lengths(bad)
    for bad, msg in (("h2o=x", "not a number"), ("h2o=1.5", "whole number"), ("h2o=inf", "not a finite")):
        with pytest.raises(ValueError, match=f"--max-length-per-method h2o.*{msg}"):
            parse_method_lengths(bad)
    with pytest.raises(ValueError, match="unknown method"):
        runner.validate(RunConfig(method_max_length={"h2x": 10}))
    with pytest.raises(ValueError, match="--max-length must be an int >= 2"):
        runner.validate(RunConfig(method_max_length={"h2o": 1}))


def test_paper_preset_settings_and_explicit_options_win(tmp_path, monkeypatch):
    seen = []
    monkeypatch.setattr(runner, "run", lambda config, out, **kw: seen.append(config))  # returns None: no report
    assert cli.main(["run", "--preset", "gemfilter-paper", "--out", str(tmp_path)]) == 0
    c = seen[-1]
    assert c.tasks == PAPER_TASKS and c.labels == ("full", "gemfilter", "snapkv-per-head", "h2o-per-head")
    assert c.method_max_length == {"h2o-per-head": 8192} and c.max_length is None and c.dtype == "float16"
    assert not c.chat_template
    assert (
        cli.main(
            [
                "run",
                "--preset",
                "gemfilter-paper",
                "--model",
                "meta-llama/Llama-3.1-8B-Instruct",
                "--methods",
                "full,h2o",
                "--max-length-per-method",
                "full=9000",
                "--out",
                str(tmp_path),
            ]
        )
        == 0
    )
    c = seen[-1]
    assert c.max_length == 128000 and c.method_max_length == {"h2o": 8192, "full": 9000}
    assert cli.main(["run", "--tasks", "hotpotqa", "--out", str(tmp_path)]) == 0  # no preset: today's defaults
    c = seen[-1]
    assert (c.labels, c.method_max_length, c.max_length, c.dtype) == (("full", "gemfilter"), {}, None, None)
    assert paper_max_length("mistralai/Mistral-Nemo-Instruct-2407") == 128000 and paper_max_length(None) is None
