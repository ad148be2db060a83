"""What a method can do is declared on its type (gemfilter/methods/spec.py), never guessed: no ``hasattr`` or
``getattr`` on a method object and no string test of a method's kind anywhere in the library or the benchmarks,
and every registered method answers every declared ability."""

import dataclasses
import re
from pathlib import Path

import pytest

import gemfilter
from gemfilter.methods import REGISTRY, CacheMethod, FullMethod, Method, PromptMethod, register

ROOT = Path(__file__).resolve().parents[1]
SOURCES = [p for d in ("gemfilter", "eval") for p in (ROOT / d).rglob("*.py")]
# a method object goes by these names in the code: method, m, spec, methods[...], self.method, cls
GUESS = re.compile(r"\b(hasattr|getattr)\((self\.)?(method|m|spec|methods\[[^]]*\]|cls)\s*,")
KIND_TEST = re.compile(r"\b(spec|method|m|cls|\))\.kind\s*(==|!=|not in|in)\s*[\"'(]")


def lines_matching(pattern) -> list:
    """'file:line: text' for every line of the library and the benchmarks that ``pattern`` finds."""
    return [
        f"{p.relative_to(ROOT)}:{i}: {line.strip()}"
        for p in SOURCES
        for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
        if pattern.search(line)
    ]


@pytest.mark.parametrize("pattern", [GUESS, KIND_TEST], ids=["hasattr-or-getattr", "kind-string-test"])
def test_no_ability_is_guessed_and_no_kind_string_is_tested(pattern):
    found = lines_matching(pattern)
    assert not found, "\n".join(found)


def test_the_check_itself_sees_a_guess():
    """The patterns above catch the forms they are meant to (so the two tests can fail)."""
    assert GUESS.search('rule = getattr(method, "default_layer", None)')
    assert GUESS.search('elif hasattr(method, "score_pass"):')
    assert GUESS.search('"layer": getattr(methods[name], "layer", None)')
    assert KIND_TEST.search('if spec.kind == "full":')
    assert KIND_TEST.search('parse_spec(n).kind not in ("prompt", "full")')
    assert not KIND_TEST.search('return self.kind != "qa"')  # a RULER task's kind, not a method's


ABILITIES = ("serves_engine", "one_pass_scoring", "scores_last_row", "protocols", "layer", "topk", "kernel")


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_every_registered_method_answers_every_declared_ability(name):
    method = REGISTRY[name]()
    if "layer" in {f.name for f in dataclasses.fields(method)}:
        method = dataclasses.replace(method, layer=5)  # as resolved against a model
    base = next(b for b in (PromptMethod, CacheMethod, FullMethod) if isinstance(method, b))
    for ability in ABILITIES:
        getattr(method, ability)  # declared on Method: no AttributeError for any method
    longest = max(method.topk, method.tsp_len) if name == "fastkv" else method.topk  # FastKV: TSP past tsp_len
    assert method.longest_budget() == longest
    cost = method.prompt_cost(4096, 18)
    assert cost is None or len(cost) == 2
    assert method.serves_engine == (base is not CacheMethod)
    assert (
        method.protocols
        == {
            PromptMethod: (
                "reselect",
                "reuse",
                "stable",
                "stable-cf",
                "stable-gap",
                "stable-front",
                "stable-late",
                "stable-late-runs",
            ),
            CacheMethod: ("reuse",),
            FullMethod: ("full",),
        }[base]
    )
    if base is PromptMethod:
        assert method.separable and method.selects_from_cache in (True, False)


def test_only_typed_methods_register():
    class NotAMethod:
        name = "not-a-method"

    with pytest.raises(TypeError, match="subclass gemfilter.methods.PromptMethod"):
        register(NotAMethod)
    assert "not-a-method" not in REGISTRY


def test_apply_refuses_an_object_that_is_not_a_method():
    from dataclasses import dataclass

    @dataclass(frozen=True)
    class Lookalike:  # has begin, as a method has, but declares nothing
        layer: int = 1

        def begin(self, model, input_ids, valid, tokenizer=None):
            raise AssertionError("never called")

    from tiny_models import BUILDERS

    with pytest.raises(TypeError, match="method must be a method object"):
        gemfilter.apply(BUILDERS["llama"](), Lookalike()).__enter__()
    assert issubclass(REGISTRY["gemfilter"], Method)
