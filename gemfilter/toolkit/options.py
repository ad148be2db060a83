"""Command-line options, parsed and checked one way for every command (gemfilter, eval, icl_probes).

- context lengths have one parser (:func:`parse_lengths`): ``1000``, ``2k``, ``1.5K``; never ``300.9``,
  ``inf`` or more than :data:`MAX_TOKENS`; depths, positive integer lists and names likewise;
- :func:`check_against_model` checks ``--layer`` and lengths against a model's config before any weights
  load; :func:`cli_exit` turns a user error into ``error: ...`` and exit status 2.

Nothing here imports torch or transformers at import time.
"""

from __future__ import annotations

import math
import sys

from gemfilter.compat import text_config

#: No model we know of reads more tokens than this; a larger --lengths value is a typo (1e9 would spin).
MAX_TOKENS = 10_000_000


def parse_length(item, flag: str = "--lengths") -> int:
    """One context length in tokens: a whole number, ``k``/``K`` = thousands (``2k``, ``1.5k``)."""
    text = str(item).strip()
    scale = 1000 if text[-1:] in ("k", "K") else 1
    num = text[:-1] if scale == 1000 else text
    try:
        value = float(num) * scale
    except ValueError:
        raise ValueError(f"{flag}: {text!r} is not a number; give token counts like 1000,2k,1.5k") from None
    if not math.isfinite(value):
        raise ValueError(f"{flag}: {text!r} is not a finite number; give token counts like 1000,2k,1.5k")
    if value != int(value) or value < 1:
        raise ValueError(f"{flag}: {text!r} must be a positive whole number of tokens (1000, 2k, 1.5k)")
    if value > MAX_TOKENS:
        raise ValueError(
            f"{flag}: {text!r} is {int(value):,} tokens, more than any model's context window "
            f"(at most {MAX_TOKENS:,} allowed)"
        )
    return int(value)


def split_names(text) -> tuple:
    """'full, gemfilter,' -> ('full', 'gemfilter'): a comma-separated option's items (may be empty)."""
    return tuple(s.strip() for s in str(text).split(",") if s.strip())


def cli_exit(call) -> int:
    """``call()``'s exit status; a ValueError or OSError (bad input, missing file) is printed as one
    ``error: ...`` line on stderr and gives 2, so commands fail with a message instead of a traceback."""
    try:
        return call()
    except (ValueError, OSError) as err:  # FileNotFoundError is an OSError
        print(f"error: {err}", file=sys.stderr)
        return 2


def _items(text, flag: str) -> list:
    items = list(split_names(text))
    if not items:
        raise ValueError(f"{flag} is empty; give a comma-separated list")
    return items


def parse_lengths(text, flag: str = "--lengths") -> tuple:
    """'1000,2k,4K' -> (1000, 2000, 4000): :func:`parse_length` for each, sorted, unique."""
    return tuple(sorted({parse_length(item, flag) for item in _items(text, flag)}))


def normalize_depth(value):
    """Whole floats become ints, so 50 and 50.0 name the same cell in files and keys."""
    return int(value) if float(value) == int(value) else float(value)


def parse_depths(text, flag: str = "--depths") -> tuple:
    """'0,50,100' -> (0, 50, 100): percents in [0, 100] (ints where whole), sorted, unique."""
    out = []
    for item in _items(text, flag):
        try:
            value = float(item)
        except ValueError:
            raise ValueError(f"{flag}: {item!r} is not a number; give percents like 0,25,50,75,100") from None
        if not 0 <= value <= 100:
            raise ValueError(f"{flag}: {item!r} is outside [0, 100] (depth is a percent of the context)")
        out.append(normalize_depth(value))
    return tuple(sorted(set(out)))


def parse_positive_ints(text, flag: str) -> tuple:
    """'256,512' -> (256, 512): whole numbers >= 1, sorted, unique."""
    out = []
    for item in _items(text, flag):
        try:
            value = float(item)
        except ValueError:
            raise ValueError(f"{flag}: {item!r} is not a number; give whole numbers >= 1 like 256,512") from None
        if not math.isfinite(value) or value != int(value) or value < 1:
            raise ValueError(f"{flag}: {item!r} must be a whole number >= 1")
        out.append(int(value))
    return tuple(sorted(set(out)))


def check_int(value, flag: str, low: int) -> None:
    """ValueError unless ``value`` is an int >= ``low``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{flag} must be a whole number >= {low}, got {value!r}")


def check_against_model(config, *, layer=None, lengths=(), length_flag: str = "--lengths", specs=()) -> None:
    """Check options against a model's config (no weights needed): 0 <= layer < layers, lengths <= window.

    config: a transformers config (``gemfilter.models.load_config``) or a model's ``.config``; specs: parsed
    method specs (:func:`method_specs_of`), whose own ``layer`` is checked the same way.
    """
    text = text_config(config)
    m = getattr(text, "num_hidden_layers", None)
    if layer is not None and isinstance(m, int) and not 0 <= layer < m:
        raise ValueError(f"--layer {layer} is outside [0, {m}): this model has {m} decoder layers (0-based)")
    for spec in specs:
        own = dict(spec.params).get("layer")
        if own is not None and isinstance(m, int) and not 0 <= own < m:
            raise ValueError(
                f"{spec.text}: layer={own} is outside [0, {m}): this model has {m} decoder layers (0-based)"
            )
    window = getattr(text, "max_position_embeddings", None)
    too_long = [n for n in lengths if isinstance(window, int) and n > window]
    if too_long:
        raise ValueError(
            f"{length_flag}: {', '.join(map(str, too_long))} tokens exceed this model's context window "
            f"of {window} tokens (max_position_embeddings); allowed: up to {window}"
        )


#: How a method is named on every command line; shown in the help of --methods / --method.
SPEC_HELP = (
    "NAME[:key=value,...], e.g. gemfilter-span:k=256, snapkv:ratio=0.1 (keep 10%% of each prompt), "
    "fastkv:k=512,tsp_len=2048,layer=11; k is topk, and every parameter listed by "
    "'gemfilter methods NAME' can be set"
)


def add_method_options(
    parser,
    *,
    methods: str | None = "list",
    default: str | None = "full,gemfilter",
    default_help: str | None = None,
    topk: str = "int",
    topk_default: int | None = None,
    topk_help: str | None = None,
    layer: bool = True,
) -> None:
    """Add the method options every command shares: the one definition of ``--methods``/``--method``, ``--topk``
    (and RULER's ``--ratio``) and ``--layer``.

    methods: "list" adds ``--methods`` (comma-separated specs), "one" adds ``--method`` (one spec), None neither;
    default: its default spec text (None: the command supplies one later); default_help: how the help states it;
    topk: "int" (one default budget), "list" (budgets, one run each, plus ``--ratio``); topk_default: None (each
    method's own) or a fixed k; topk_help: the help of a ``--topk`` that is not a method default (inspect's k);
    layer: whether to add ``--layer``.
    """
    if methods == "list":
        parser.add_argument(
            "--methods",
            default=default,
            metavar="SPECS",
            help="comma-separated methods, each " + SPEC_HELP + "; a key=value after a comma "
            "continues the method before it (full,gemfilter:k=256,layer=11,snapkv is three). "
            f"Default: {default_help or default}",
        )
    elif methods == "one":
        parser.add_argument(
            "--method",
            default=default,
            metavar="SPEC",
            help="the method, " + SPEC_HELP + f". Default: {default_help or default}",
        )
    budget = (
        "tokens kept (prompt methods) or KV entries per layer (cache methods) (default: each method's own, "
        "see 'gemfilter methods NAME')"
    )
    if topk == "list":  # text, read by parse_topks: several budgets
        kw = dict(
            default=None,
            metavar="K,...",
            help="comma-separated default budgets, one run per budget, for the methods whose spec sets none: " + budget,
        )
    else:
        kw = dict(
            type=int,
            default=topk_default,
            metavar="K",
            help=topk_help or "default budget for the methods whose spec sets none: " + budget,
        )
    parser.add_argument("--topk", **kw)
    if topk == "list":
        parser.add_argument(
            "--ratio",
            type=float,
            default=None,
            help="instead of --topk: keep this fraction (0-1] of each prompt's tokens",
        )
    if layer:
        parser.add_argument(
            "--layer",
            type=int,
            default=None,
            help="default 0-based layer for the methods that have one and whose spec sets none: "
            "the filter layer (FastKV: its TSP layer) (default: the model's, e.g. 13 for "
            "Llama 3.1 8B, 11 for the embedded model)",
        )


def parse_topks(text, flag: str = "--topk") -> tuple:
    """'256,512' -> (256, 512): whole numbers, in order given, unique; their range is each method's own check."""
    out = []
    for item in _items(text, flag):
        try:
            out.append(int(item))
        except ValueError:
            raise ValueError(f"{flag}: {item!r} is not a whole number; give budgets like 256,512") from None
    return tuple(dict.fromkeys(out))


def method_specs_of(args, default: str | None = None, *, note=None) -> tuple:
    """The methods a command line names, as parsed :class:`~gemfilter.methods.spec.Spec` objects.

    args: parsed options from :func:`add_method_options` (``methods`` or ``method``, ``topk``, ``layer``,
    ``ratio``); default: the spec text when the option was left at None (a preset's methods); note: where the
    notes go (stderr). ``--topk``/``--layer`` are checked by each method (a ValueError such as ``gemfilter:
    topk=0 must be >= 1``); when given and some methods have no such parameter, one line names them instead
    of dropping the value silently.
    """
    from gemfilter.methods.spec import parse_specs, split_defaults

    one = hasattr(args, "method")
    flag = "--method" if one else "--methods"
    text = getattr(args, "method" if one else "methods", None)
    text = default if text is None else text
    layer, given, ratio = getattr(args, "layer", None), getattr(args, "topk", None), getattr(args, "ratio", None)
    topks = parse_topks(given) if isinstance(given, str) else (given,)
    specs = parse_specs(text, topk=topks[0], layer=layer)  # the command's one parse of each spec
    for k in topks[1:]:  # each budget with each method: a budget no method takes fails now, not in a worker
        for spec in specs:
            spec.check(topk=k, layer=layer)
    if one and len(specs) != 1:
        raise ValueError(f"{flag} takes one method, got {len(specs)}: {', '.join(s.text for s in specs)}")
    names = [s.name for s in specs]
    unused = split_defaults(names, topk=given, layer=layer)
    lacking = split_defaults(names, topk=ratio).get("topk")  # a ratio is a topk per prompt
    if lacking:
        unused["ratio"] = lacking
    shown = {"topk": given, "layer": layer, "ratio": ratio}
    for key, lack in unused.items():
        print(
            f"note: --{key} {shown[key]} does not apply to {', '.join(dict.fromkeys(lack))} (no "
            f"{'layer' if key == 'layer' else 'budget'}; see 'gemfilter methods NAME')",
            file=note or sys.stderr,
        )
    return specs
