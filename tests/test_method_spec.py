"""Method kinds and the method spec."""

import dataclasses

import pytest

from gemfilter.methods import (
    REGISTRY,
    CacheMethod,
    FastKV,
    FullMethod,
    GemFilter,
    GemFilterSpan,
    PromptMethod,
    SnapKV,
    parse_method,
    spec_of,
)
from gemfilter.methods.spec import split_defaults

KINDS = {"prompt": PromptMethod, "cache": CacheMethod, "full": FullMethod}


def test_every_method_has_one_kind_checked_by_isinstance():
    for name, cls in REGISTRY.items():
        assert isinstance(cls(), KINDS[cls.kind]), name
        assert sum(isinstance(cls(), k) for k in KINDS.values()) == 1, name
    assert {n for n, c in REGISTRY.items() if c.kind == "prompt"} == {
        "gemfilter",
        "gemfilter-span",
        "gemfilter-orig-pos",
        "middle-row",
        "largest-row",
        "gemfilter-qwin",
        "gemfilter-asl",
        "gemfilter-claa",
        "gemfilter-span-qwin",
        "gemfilter-span-claa",
        "gemfilter-span-qmax",
    }


@pytest.mark.parametrize(
    "spec,want",
    [
        ("gemfilter-span:k=256", GemFilterSpan(topk=256)),
        ("snapkv:topk=512,pooling=max", SnapKV(topk=512, pooling="max")),
        ("fastkv:k=512,tsp_len=2048,layer=11", FastKV(layer=11, topk=512, tsp_len=2048)),
        ("fastkv:score_dtype=fp32,layer=none", FastKV(score_dtype="fp32")),
        (" gemfilter ", GemFilter()),
    ],
)
def test_a_spec_builds_the_method_and_round_trips(spec, want):
    method = parse_method(spec)
    assert method == want
    assert parse_method(spec_of(method)) == method


def test_every_field_of_every_method_is_settable():
    for name, cls in REGISTRY.items():
        for f in dataclasses.fields(cls):
            value = f.default if f.default is not None else 3
            text = str(value)
            assert getattr(parse_method(f"{name}:{f.name}={text}"), f.name) == value, (name, f.name)


def test_command_line_defaults_apply_where_a_method_has_the_parameter():
    assert parse_method("snapkv", topk=300, layer=5) == SnapKV(topk=300)
    assert parse_method("gemfilter:k=64", topk=300, layer=5) == GemFilter(layer=5, topk=64)  # the spec wins
    assert split_defaults(["snapkv", "gemfilter", "full"], layer=5, topk=None) == {"layer": ["snapkv", "full"]}


@pytest.mark.parametrize(
    "spec,message",
    [
        ("gemfilter:k=0", "gemfilter: topk=0 must be >= 1"),
        ("snapkv:layer=99", "snapkv has no parameter 'layer'; its parameters: topk, window, kernel, pooling, gqa"),
        ("fastkv:pooling=foo", "fastkv: pooling must be 'avg' (v1) or 'max' (v3), got 'foo'"),
        ("gemfilter:k=ten", "gemfilter: topk='ten' is not an int"),
        ("gemfilter:layer=2.5", "gemfilter: layer='2.5' is not an int (or none)"),
        ("gemfilter:topk", "gemfilter: 'topk' is not key=value"),
        ("gemfiltr:k=3", "unknown method 'gemfiltr'; allowed: fastkv, full, gemfilter"),
    ],
)
def test_bad_specs_get_one_message_naming_what_is_allowed(spec, message):
    with pytest.raises(ValueError) as err:
        parse_method(spec)
    assert str(err.value).startswith(message), str(err.value)


def test_built_methods_are_checked_once_however_they_are_built():
    with pytest.raises(ValueError, match="h2o: topk=0 must be >= 1"):
        REGISTRY["h2o"](topk=0)
    with pytest.raises(ValueError, match="gemfilter-span: sink=-1 must be >= 0"):
        dataclasses.replace(GemFilterSpan(), sink=-1)
    with pytest.raises(TypeError, match=r"fastkv: layer must be an int \(or None: the model's default\), got 1.5"):
        FastKV(layer=1.5)
