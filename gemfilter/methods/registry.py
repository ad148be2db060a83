"""The method registry: name -> frozen dataclass. Kept apart from the package ``__init__`` so method
modules import it without importing the package that imports them (no import cycle)."""

from __future__ import annotations

import dataclasses

from .base import Method

REGISTRY: dict = {}


def register(cls):
    """Class decorator: add a method class to :data:`REGISTRY` under ``cls.name``. It subclasses one of the
    typed bases (``PromptMethod``, ``CacheMethod``, ``FullMethod``), which declare what a method can do."""
    if not (isinstance(cls, type) and issubclass(cls, Method)):
        raise TypeError(
            f"{cls!r} is not a method class: subclass gemfilter.methods.PromptMethod, CacheMethod or "
            "FullMethod (a frozen dataclass), which declare what a method can do"
        )
    if cls.name in REGISTRY:
        raise ValueError(f"method name {cls.name!r} is registered twice")
    REGISTRY[cls.name] = cls
    return cls


def get_method(name: str, **params):
    """Build a registered method by name.

    Parameters a method does not have (say ``layer`` for ``snapkv``) are ignored and ``None`` values keep the
    method's default, so one set of settings can build every method. Commands build methods from specs
    (:func:`gemfilter.methods.parse_spec`), which refuse a parameter the method lacks.
    """
    if name not in REGISTRY:
        raise ValueError(f"unknown method {name!r}; allowed: {', '.join(sorted(REGISTRY))}")
    cls = REGISTRY[name]
    fields = {f.name for f in dataclasses.fields(cls)}
    return cls(**{k: v for k, v in params.items() if k in fields and v is not None})


def describe() -> list:
    """(name, description) for every registered method, sorted by name."""
    return [(name, cls.description) for name, cls in sorted(REGISTRY.items())]


def check_for_model(method, config, prompt_tokens: int) -> None:
    """Refuse, from a model's config alone (no weights), a method that could not run on prompts of up to
    ``prompt_tokens`` tokens: the method's declared ``check_model`` (the KV-cache methods override it; the default
    accepts any model that takes the method's layer)."""
    method.check_model(config, prompt_tokens)
