"""Method kinds and the one method spec every command line parses.

Kinds: a method is a frozen dataclass on one of three bases (``base.py``, which also declares what a method
can do):

- :class:`PromptMethod`: picks prompt tokens at a filter layer, then generates from them (gemfilter,
  gemfilter-span, ...). Only these can run in front of an engine (``gemfilter serve``, ``--engine``).
- :class:`CacheMethod`: runs the prefill (all of it, or up to a propagation layer as FastKV) and keeps
  ``topk`` rows of the KV cache per layer.
- :class:`FullMethod`: changes nothing (the baseline).

Spec: ``NAME[:key=value,...]``, e.g. ``gemfilter-span:k=256``, ``snapkv:topk=512,pooling=max``,
``fastkv:k=512,tsp_len=2048,layer=11``, ``snapkv:ratio=0.1``. ``k`` is short for ``topk``. Every dataclass
field of the method is settable; each value is read by the field's type and checked once, where the method is
built (its ``__post_init__``). A key the method does not have is an error that lists the ones it has.
``ratio`` sets the budget per prompt: ``topk = max(1, round(ratio x prompt tokens))`` (:class:`Spec`).
A list of specs is one comma-separated text (:func:`split_specs`): ``full,gemfilter:k=256,layer=11,snapkv``.
Each parameter's default is its dataclass field's, in the method's own module; a command line's ``--topk`` and
``--layer`` are defaults for the specs that do not set them (None: the method's own).
"""

from __future__ import annotations

import dataclasses
import typing

from .base import COUNTS, OPTIONAL, CacheMethod, FullMethod, Method, PromptMethod  # noqa: F401 (re-exported)
from .registry import REGISTRY

ALIASES = {"k": "topk"}


def parameters(cls) -> dict:
    """{field: (type annotation as text, default)} of a method class, in declaration order."""
    hints = typing.get_type_hints(cls)
    return {f.name: (_type_name(hints.get(f.name)), f.default) for f in dataclasses.fields(cls)}


def _type_name(tp) -> str:
    args = [a for a in typing.get_args(tp) if a is not type(None)]
    base = args[0] if args else tp
    name = getattr(base, "__name__", str(base))
    return name + (" or none" if type(None) in typing.get_args(tp) else "")


def _parse_value(method: str, key: str, text: str, type_name: str):
    """``text`` as the field's type: int, float, bool or str; 'none' for an optional field."""
    base = type_name.split(" ")[0]
    if text.lower() == "none" and type_name.endswith("or none"):
        return None
    try:
        if base == "int":
            return int(text)
        if base == "float":
            return float(text)
        if base == "bool":
            if text.lower() not in ("true", "false", "1", "0"):
                raise ValueError(text)
            return text.lower() in ("true", "1")
    except ValueError:
        raise ValueError(
            f"{method}: {key}={text!r} is not a{'n' if base == 'int' else ''} {base}"
            + (" (or none)" if type_name.endswith("or none") else "")
        ) from None
    return text


def parse_method(spec: str, prompt_tokens: int | None = None, **defaults):
    """Build a registered method from ``NAME[:key=value,...]`` (:func:`parse_spec`, then :meth:`Spec.method`).

    prompt_tokens: the prompt's length, for a ``ratio`` budget; defaults: settings a command line applies to
    every method it runs (``topk``, ``layer``); the spec's own keys win.
    """
    return parse_spec(spec, **defaults).method(prompt_tokens, **defaults)


def split_specs(text) -> tuple:
    """'full,gemfilter:k=256,layer=11,snapkv' -> ('full', 'gemfilter:k=256,layer=11', 'snapkv').

    A comma starts a new spec unless the next item is a ``key=value`` without a ``:`` (method names hold no
    ``=``), so a list needs no other separator. Items are stripped; empty items are dropped.
    """
    specs = []
    for item in (p.strip() for p in str(text).split(",")):
        if not item:
            continue
        if "=" in item and ":" not in item.partition("=")[0] and specs:
            specs[-1] += "," + item
        else:
            specs.append(item)
    return tuple(specs)


@dataclasses.dataclass(frozen=True)
class Spec:
    """One method as a command line names it: ``NAME[:key=value,...]``, parsed and checked once.

    text: the spec as given (whitespace stripped); name: the registry name; params: ((field, value), ...) set by
    the spec or by a command's budget; ratio: the budget as a fraction of each prompt's tokens (None: ``topk`` as
    set, or its default); budget: what a command's budget list adds to the label (``_k256``, ``_r0.1``; empty for
    a spec run as given). Build it with :func:`parse_spec`; a command's budgets with :meth:`budgeted` (no second
    parse); :meth:`method` gives the method object for one prompt.
    """

    text: str
    name: str
    params: tuple = ()
    ratio: float | None = None
    budget: str = ""

    @property
    def label(self) -> str:
        """The name of its rows and folders: the spec's text, and the budget a command's list gave it."""
        return self.text + self.budget

    @property
    def cls(self) -> type:
        """The method's class: what it can do is declared there (:class:`Method`)."""
        return REGISTRY[self.name]

    @property
    def sets_budget(self) -> bool:
        """Whether the spec itself sets its budget (``k=``/``topk=`` or ``ratio=``)."""
        return self.ratio is not None or "topk" in dict(self.params)

    def budgeted(self, topk: int | None = None, ratio: float | None = None) -> Spec:
        """This spec run at one budget of a command's list: ``topk`` tokens (label ``TEXT_kK``) or ``ratio`` of each
        prompt's tokens (``TEXT_rR``). A method without a ``topk`` parameter keeps its own (only the label says
        the budget). Not a parse: the spec's parameters are kept as they are."""
        if ratio is not None:
            return dataclasses.replace(self, ratio=ratio, budget=f"_r{ratio:g}")
        params = dict(self.params)
        if "topk" in parameters(self.cls):
            params["topk"] = topk
        return dataclasses.replace(self, params=tuple(params.items()), budget=f"_k{topk}")

    def method(self, prompt_tokens: int | None = None, **defaults):
        """The method object (not yet resolved against a model) for a prompt of ``prompt_tokens`` tokens.

        defaults: a command line's ``topk`` / ``layer`` for the fields the spec does not set (None: the
        method's own default); ones the method does not have are skipped (see :func:`split_defaults`).
        """
        cls = REGISTRY[self.name]
        params = parameters(cls)
        values = {k: v for k, v in defaults.items() if k in params and v is not None}
        values.update(self.params)
        if self.ratio is not None:
            if prompt_tokens is None:
                raise ValueError(f"{self.text}: a ratio budget needs the prompt's length")
            values["topk"] = max(1, round(self.ratio * prompt_tokens))
        return cls(**values)

    def check(self, **defaults) -> None:
        """Build the method once with ``defaults`` so that a bad value is a one-line ValueError now."""
        try:
            self.method(1 if self.ratio is not None else None, **defaults)
        except TypeError as err:  # a count that is not whole: the same one-line error as a bad value
            raise ValueError(str(err)) from None


def parse_spec(text: str, **defaults) -> Spec:
    """A :class:`Spec` from ``NAME[:key=value,...]``; the method is built once here, so every error shows now.

    defaults: as :meth:`Spec.method`'s (checked with the spec). Raises ValueError (TypeError for a count
    that is not whole) naming what was wrong and what is allowed.
    """
    text = ",".join(p.strip() for p in str(text).strip().split(","))
    name, _, rest = text.partition(":")
    if name not in REGISTRY:
        raise ValueError(f"unknown method {name!r}; allowed: {', '.join(sorted(REGISTRY))}")
    params = parameters(REGISTRY[name])
    values, ratio = {}, None
    for item in filter(None, rest.split(",")):
        key, sep, value = item.partition("=")
        key = ALIASES.get(key.strip(), key.strip())
        if not sep or not value.strip():
            raise ValueError(f"{name}: {item!r} is not key=value (e.g. {name}:topk=256)")
        if key == "ratio" and "topk" in params:
            ratio = _parse_value(name, key, value.strip(), "float")
            if not 0 < ratio <= 1:
                raise ValueError(f"{name}: ratio={value.strip()} must be in (0, 1] (topk = ratio x prompt tokens)")
            continue
        if key not in params:
            have = ", ".join(list(params) + (["ratio"] if "topk" in params else [])) or "none"
            raise ValueError(f"{name} has no parameter {key!r}; its parameters: {have}")
        values[key] = _parse_value(name, key, value.strip(), params[key][0])
    if ratio is not None and "topk" in values:
        raise ValueError(f"{name}: give topk or ratio, not both")
    spec = Spec(text, name, tuple(values.items()), ratio)
    spec.check(**defaults)
    return spec


def parse_specs(text, **defaults) -> tuple:
    """Every spec of a comma-separated list (:func:`split_specs`), each parsed; a label given twice is refused."""
    texts = split_specs(text)
    if not texts:
        raise ValueError("--methods is empty; give a comma-separated list, e.g. full,gemfilter")
    specs = tuple(parse_spec(t, **defaults) for t in texts)
    labels = [s.label for s in specs]
    if len(set(labels)) != len(labels):
        raise ValueError(f"--methods lists a method twice: {','.join(labels)}")
    return specs


def check_ratio(ratio) -> None:
    """Refuse a command's ``--ratio`` that is not a fraction in (0, 1]."""
    if isinstance(ratio, bool) or not isinstance(ratio, float) or not 0 < ratio <= 1:
        raise ValueError(f"--ratio must be a fraction in (0, 1] of the prompt's tokens, got {ratio!r}")


def expand_budgets(specs, topks=(), ratio: float | None = None, layer: int | None = None) -> tuple:
    """A command's run plan: each spec at each budget of its ``--topk`` list (or at its ``--ratio``), the one place
    budgets are expanded. Specs of :class:`FullMethod` and specs that set their own budget (``gemfilter:k=256``,
    ``snapkv:ratio=0.1``) run once, as given; so do all of them when neither is given.

    specs: parsed :class:`Spec` objects (or spec texts, parsed here); topks: budgets; ratio: a share of each
    prompt's tokens; layer: the command's ``--layer``, checked with each budget. Each budget is checked where the
    method is built, as any other parameter (``gemfilter: topk=0 must be >= 1``). Nothing is parsed again.
    """
    specs = plan(specs, layer=layer)  # texts are parsed here (for the API); Specs pass as they are
    topks = tuple(topks or ())
    if ratio is not None:
        check_ratio(ratio)
    out = []
    for spec in specs:
        if issubclass(spec.cls, FullMethod) or spec.sets_budget or (ratio is None and not topks):
            out.append(spec)
            continue
        for k in topks:
            spec.check(topk=k, layer=layer)
        out += [spec.budgeted(ratio=ratio)] if ratio is not None else [spec.budgeted(topk=k) for k in topks]
    return tuple(out)


def plan(methods, **defaults) -> tuple:
    """A run config's ``methods`` as :class:`Spec` objects: texts (``"full,gemfilter:k=256"`` or a tuple of them) are
    parsed here, each spec once, checked with ``defaults`` (``topk``, ``layer``); Specs (a command line's, parsed
    already) are checked with them and kept. A label given twice is refused; an empty plan is the runner's to refuse
    (a config that only merges or reads rows needs none)."""
    items = [
        one
        for m in ((methods,) if isinstance(methods, str) else methods)
        for one in ((m,) if isinstance(m, Spec) else split_specs(m))
    ]
    specs = tuple(m if isinstance(m, Spec) else parse_spec(m, **defaults) for m in items)
    for spec in (m for m in items if isinstance(m, Spec)):
        spec.check(**defaults)  # built with these defaults, not parsed again
    labels = [s.label for s in specs]
    if len(set(labels)) != len(labels):
        raise ValueError(f"--methods lists a method twice: {','.join(labels)}")
    return specs


def split_defaults(names, **defaults) -> dict:
    """{setting: [methods that do not have it]} for command-line defaults given explicitly, so a command can
    say that ``--layer`` does not apply to ``snapkv`` instead of dropping it silently."""
    out = {}
    for key, value in defaults.items():
        if value is None:
            continue
        missing = [n.partition(":")[0] for n in names if key not in parameters(REGISTRY[n.partition(":")[0]])]
        if missing:
            out[key] = missing
    return out


def spec_of(method) -> str:
    """The canonical spec of a method object: its name and every field that differs from the default."""
    cls = type(method)
    values = vars(method)
    changed = [f"{f.name}={values[f.name]}" for f in dataclasses.fields(cls) if values[f.name] != f.default]
    return cls.name + (":" + ",".join(changed) if changed else "")
