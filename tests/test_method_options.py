"""One method spec on every command line: the shared options, the same message for a bad spec everywhere.

Every command (gemfilter generate, bench, serve; gemfilter-niah, gemfilter-longbench, gemfilter-ruler,
gemfilter-scbench) and the lm-eval adapter parse methods with :func:`gemfilter.toolkit.options.method_specs_of`; a bad
spec is refused with
:func:`gemfilter.methods.parse_spec`'s message before any model loads or any engine is asked.
"""

import argparse
import dataclasses
import io
import re
from pathlib import Path

import pytest

from gemfilter.methods import REGISTRY, parse_method, parse_spec, parse_specs, split_specs
from gemfilter.toolkit.options import add_method_options, method_specs_of

ROOT = Path(__file__).resolve().parents[1]
BAD = {
    "gemfilter:k=0": "gemfilter: topk=0 must be >= 1",
    "snapkv:layer=99": "snapkv has no parameter 'layer'; its parameters: topk, window, kernel, pooling, gqa, ratio",
    "fastkv:pooling=foo": "fastkv: pooling must be 'avg' (v1) or 'max' (v3), got 'foo'",
}


def _commands(spec: str, model: str, out: Path) -> dict:
    """name -> (main, argv) of every command that takes methods, each given ``spec``."""
    from eval.longbench.cli import main as longbench
    from eval.niah.cli import main as niah
    from eval.ruler.cli import main as ruler
    from eval.scbench.cli import main as scbench
    from gemfilter.lab.cli import main as gemfilter

    prompt = out / "prompt.txt"
    prompt.write_text("w4 w5 w6")
    return {
        "gemfilter generate": (
            gemfilter,
            ["generate", "--model", model, "--prompt-file", str(prompt), "--method", spec],
        ),
        "gemfilter bench": (
            gemfilter,
            ["bench", "--model", model, "--methods", f"full,{spec}", "--lengths", "300", "--out", str(out / "bench")],
        ),
        "gemfilter serve": (
            gemfilter,
            ["serve", "--upstream", "http://127.0.0.1:9/v1", "--model", model, "--method", spec],
        ),
        "gemfilter-niah": (
            niah,
            ["--model", model, "--methods", f"full,{spec}", "--lengths", "300", "--out", str(out / "niah")],
        ),
        "gemfilter-longbench run": (
            longbench,
            ["run", "--model", model, "--methods", spec, "--tasks", "hotpotqa", "--out", str(out / "lb")],
        ),
        "gemfilter-ruler run": (ruler, ["run", "--model", model, "--methods", spec, "--out", str(out / "ruler")]),
        "gemfilter-scbench run": (
            scbench,
            ["run", "--model", model, "--methods", f"full,{spec}", "--out", str(out / "scbench")],
        ),
    }


@pytest.fixture
def nothing_loads(monkeypatch):
    """Fail if a model loads or the serving engine is asked: a bad spec must be refused before either."""

    def refuse(*args, **kwargs):
        raise AssertionError("a model loaded, or the engine was asked, before the spec was checked")

    for target in (
        "gemfilter.load_model",
        "gemfilter.models.load_model",
        "gemfilter.lab.serve.cli.connect",
        "gemfilter.lab.bench.core.run_worker",
    ):
        monkeypatch.setattr(target, refuse)


@pytest.mark.parametrize("spec", list(BAD))
def test_a_bad_spec_gets_the_same_one_line_message_from_every_command_and_the_adapter(
    spec, tiny_model_dir, tmp_path, capsys, nothing_loads
):
    with pytest.raises(ValueError) as parsed:
        parse_spec(spec)
    assert str(parsed.value) == BAD[spec]
    for name, (main, argv) in _commands(spec, str(tiny_model_dir), tmp_path).items():
        try:
            rc = main(argv)
        except SystemExit as stop:  # gemfilter bench ends with ErrorExit
            rc = stop.code
        assert (rc, capsys.readouterr().err.splitlines()) == (2, [f"error: {BAD[spec]}"]), name
    from eval.harness.adapter import GemFilterLM

    with pytest.raises(ValueError) as adapter:
        GemFilterLM(pretrained=str(tiny_model_dir), method=spec, dtype="float32")
    assert str(adapter.value) == BAD[spec]


def test_the_method_options_are_defined_in_one_place():
    """--topk, --layer, --methods and --method: one add_argument each, in gemfilter/toolkit/options.py."""
    where = {}
    for path in [*ROOT.glob("gemfilter/**/*.py"), *ROOT.glob("eval/**/*.py")]:
        for flag in re.findall(r"add_argument\(\s*\"(--topk|--layer|--methods|--method|--ratio)\"", path.read_text()):
            where.setdefault(flag, []).append(str(path.relative_to(ROOT)))
    assert where == {
        flag: ["gemfilter/toolkit/options.py"] for flag in ("--topk", "--layer", "--methods", "--method", "--ratio")
    }


def _parser(**kw):
    p = argparse.ArgumentParser()
    add_method_options(p, **kw)
    return p


def test_a_default_that_some_methods_lack_is_named_in_one_note():
    err = io.StringIO()
    specs = method_specs_of(_parser().parse_args(["--layer", "5", "--methods", "full,snapkv,gemfilter"]), note=err)
    assert [s.text for s in specs] == ["full", "snapkv", "gemfilter"]
    assert err.getvalue().splitlines() == [
        "note: --layer 5 does not apply to full, snapkv (no layer; see 'gemfilter methods NAME')"
    ]
    assert specs[2].method(layer=5).layer == 5 and specs[1].method(layer=5) == REGISTRY["snapkv"]()
    err = io.StringIO()
    method_specs_of(_parser().parse_args(["--methods", "full,gemfilter"]), note=err)  # nothing given: no note
    assert err.getvalue() == ""


def test_command_line_defaults_are_checked_by_the_method_and_the_spec_wins():
    with pytest.raises(ValueError, match="^gemfilter: topk=0 must be >= 1$"):
        method_specs_of(_parser().parse_args(["--topk", "0"]), note=io.StringIO())
    (spec,) = method_specs_of(_parser(methods="one", default="gemfilter").parse_args(["--topk", "64"]))
    assert spec.method(topk=64).topk == 64 and parse_spec("gemfilter:k=8").method(topk=64).topk == 8
    with pytest.raises(ValueError, match="--method takes one method, got 2: full, gemfilter"):
        method_specs_of(_parser(methods="one").parse_args(["--method", "full,gemfilter"]))
    ruler = _parser(topk="list")
    specs = method_specs_of(
        ruler.parse_args(["--methods", "full,fastkv:tsp_len=64", "--topk", "256,512"]), note=io.StringIO()
    )
    assert [s.text for s in specs] == ["full", "fastkv:tsp_len=64"]
    with pytest.raises(ValueError, match="^fastkv: topk=0 must be >= 1$"):  # each budget, with each method
        method_specs_of(ruler.parse_args(["--methods", "fastkv", "--topk", "256,0"]))


@pytest.mark.parametrize(
    "text, want",
    [
        ("full,gemfilter:k=256,layer=11,snapkv", ("full", "gemfilter:k=256,layer=11", "snapkv")),
        ("fastkv:k=512,tsp_len=2048,layer=11", ("fastkv:k=512,tsp_len=2048,layer=11",)),
        (" full , snapkv:ratio=0.1 ,", ("full", "snapkv:ratio=0.1")),
        ("gemfilter:k=64,gemfilter:k=128", ("gemfilter:k=64", "gemfilter:k=128")),
    ],
)
def test_split_specs(text, want):
    assert split_specs(text) == want
    assert tuple(s.text for s in parse_specs(text)) == want


def test_parse_specs_refuses_an_empty_list_and_a_spec_given_twice():
    with pytest.raises(ValueError, match="--methods is empty"):
        parse_specs(" , ")
    with pytest.raises(ValueError, match="--methods lists a method twice: gemfilter,full,gemfilter"):
        parse_specs("gemfilter,full,gemfilter")
    assert parse_specs("snapkv:ratio=0.1")[0].method(1000).topk == 100  # max(1, round(0.1 x prompt tokens))


def _text(value) -> str:
    return "none" if value is None else str(value)


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_every_field_round_trips_through_a_spec(name):
    """A spec that sets every field to its default builds the default method; one that sets each to another
    value builds that method: every dataclass field is settable by spec."""
    cls = REGISTRY[name]
    fields = dataclasses.fields(cls)
    spec = f"{name}:" + ",".join(f"{f.name}={_text(f.default)}" for f in fields) if fields else name
    assert parse_method(spec) == cls()
    changed = {
        f.name: (
            f.default + 1
            if isinstance(f.default, int) and not isinstance(f.default, bool)
            else 3
            if f.default is None
            else f.default
        )
        for f in fields
    }
    if fields:
        assert parse_method(f"{name}:" + ",".join(f"{k}={_text(v)}" for k, v in changed.items())) == cls(**changed)


def test_the_adapter_takes_a_spec_and_method_parameters_as_their_own_model_args(tiny_model_dir):
    from eval.harness.adapter import check_model_args

    spec, topk, layer, rest = check_model_args(
        str(tiny_model_dir), "fastkv:k=512", None, None, 2.0, None, {"tsp_len": 2048, "dtype": "float32"}
    )
    assert (spec.text, topk, layer, rest) == ("fastkv:k=512,tsp_len=2048", None, 2, {"dtype": "float32"})
    spec = check_model_args(str(tiny_model_dir), "gemfilter", 64, None, None, None, {})[0]
    assert spec.method(topk=64).topk == 64
    assert check_model_args(str(tiny_model_dir), "snapkv", None, 0.25, None, None, {})[0].text == "snapkv:ratio=0.25"


def test_gemfilter_methods_teaches_the_spec(capsys):
    from gemfilter.lab.cli import main

    assert main(["methods"]) == 0
    out = capsys.readouterr().out
    assert "NAME[:key=value,...]" in out and "snapkv:ratio=0.1" in out and "full,gemfilter:k=256,layer=11" in out
    assert main(["methods", "snapkv"]) == 0
    out = capsys.readouterr().out
    assert "topk = 1024" in out and "ratio" in out and "snapkv:ratio=0.1" in out
