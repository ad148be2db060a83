"""Make a plain ``model.generate`` run a method (GemFilter, SnapKV, ...), and a ``generate`` helper.

``apply(model, method)`` switches the model's attention to the wrapper and adds a forward pre-hook
and post-hook. On each generate call's prefill (empty KV cache) the method's ``begin`` makes a
per-call state object, which may rewrite the inputs (GemFilter feeds only the kept tokens at new
positions 0..k-1, Algorithm 2 step 5), watch the prefill attention through the wrapper (SnapKV, H2O)
and evict the cache after the prefill. On decode steps it translates generate's mask and positions.

``generate`` therefore returns exactly what it normally returns (the original prompt plus the new
tokens), and streamers, stopping criteria and every generation kwarg pass through untouched. The
hooks and the attention switch are undone in ``finally``.

A cache filled inside the block continues exactly in a later ``generate`` call (a second turn): a method
that shrank the prompt leaves the cache shorter than the sequence it consumed, so ``generate`` hands the
forward old tokens again along with the new ones; the hooks drop those (after checking they are the
tokens this cache consumed) and feed only the new ones, at the method's positions. What cannot be made
exact is refused by name.
"""

from __future__ import annotations

import copy
import dataclasses
import weakref
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

from .attention import wrapped_attention
from .compat import cache_in, first_position, generation_modes_limited
from .draft import check_selector, drafted_begin
from .dropped import check_switch, give_back
from .methods.spec import Method
from .selection import Selection, as_batch, check_causal_decoder, check_params, check_prompt


@dataclass
class Applied:
    """Handle yielded by :func:`apply`: the method (its layer resolved) and every call's state."""

    method: object
    calls: list = field(default_factory=list)
    _by_cache: weakref.WeakKeyDictionary = field(default_factory=weakref.WeakKeyDictionary)
    _prefilling: weakref.WeakKeyDictionary = field(default_factory=weakref.WeakKeyDictionary)
    _consumed: weakref.WeakKeyDictionary = field(default_factory=weakref.WeakKeyDictionary)
    budgets: list = field(default_factory=list)  # one Budget per prefill, as measured from the cache
    on_begin: object = None  # called with each call's state once the method's begin (its selection) returned

    @property
    def selection(self) -> Selection | None:
        """The last call's selection (None for methods that keep no single index set)."""
        return self.calls[-1].selection if self.calls else None

    def fork(self, cache):
        """A copy of ``cache`` (filled inside this block) that ``generate`` continues on its own; ``cache`` stays
        as it was. SCBench drops each answer from the cache: a turn answers on a fork, the next one goes on
        from the original. The call's per-cache state (decoded positions, masks) is copied with it.
        """
        call = self._by_cache.get(cache)
        if call is None:
            raise ValueError("fork(): this cache was not filled inside this apply() block")
        twin = copy.copy(call)
        for key, value in vars(twin).items():  # decode rebinds tensors but mutates dicts and lists in place
            if isinstance(value, (dict, list)):
                setattr(twin, key, copy.copy(value))
        forked = copy.deepcopy(cache)
        consumed = self._consumed[cache]
        self._by_cache[forked] = twin
        self._consumed[forked] = Consumed(consumed.ids.clone(), consumed.real.clone(), consumed.top)
        return forked


@dataclass(frozen=True)
class Budget:
    """What a prefill kept, read from the cache it left (not from the method's parameters).

    kv_rows: KV rows per layer (padding included; a sliding-window layer holds at most window - 1);
    propagated: prompt positions the prefill ran through the last layer (k for a prompt method, n for a
    cache method, tsp_len for FastKV once its propagation fires); kv_bytes: the bytes of those keys and values
    (the generation cache, as Fig. 9.3's memory counts it; not a row field).
    """

    kv_rows: tuple
    propagated: int
    kv_bytes: int = 0

    @classmethod
    def measure(cls, call, cache) -> "Budget":
        held = [layer for layer in cache.layers if getattr(layer, "keys", None) is not None]
        rows = tuple(
            int(layer.keys.shape[-2]) if getattr(layer, "keys", None) is not None else 0 for layer in cache.layers
        )
        size = sum(t.numel() * t.element_size() for layer in held for t in (layer.keys, layer.values))
        return cls(kv_rows=rows, propagated=int(getattr(call, "fed", 0)), kv_bytes=size)

    def summary(self) -> dict:
        """The fields a result row records: ``kv_rows`` per layer and ``propagated``."""
        return {"kv_rows": list(self.kv_rows), "propagated": self.propagated}


#: every key :func:`budget_fields` may give; the benchmark runners copy these into their rows
BUDGET_FIELDS = ("kv_rows", "propagated", "selected_layers")


def budget_fields(out) -> dict:
    """The row fields of a generate output's measured :class:`Budget` (none for an engine's answer), and
    ``selected_layers`` (one per batch row) where the method chose its filter layer per prompt
    (``gemfilter-asl``): a row's ``layer`` is then the method's L_min, the first layer that may select."""
    budget = getattr(out, "budget", None)
    fields = {} if budget is None else budget.summary()
    chosen = getattr(getattr(out, "selection", None), "layers", None)
    return fields if chosen is None else {**fields, "selected_layers": [int(x) for x in chosen]}


class Consumed:
    """The original tokens a cache has consumed inside apply(): ids (b, c), padding included; real (b,) counts."""

    def __init__(self, ids, real, top=None):
        self.ids, self.real = ids, real
        self.top = top  # the largest position fed to the model so far (gemfilter.dropped.check_switch)

    def only_new(self, kwargs, name: str) -> dict:
        """Drop from a decode forward's input the tokens this cache consumed already, and record the rest.

        ``generate`` restarting on a cache slices its input at the cache's length; after a method shrank the
        cache, that slice starts with tokens the cache already holds (compressed). Their count is the number
        of real tokens consumed minus the position ``generate`` gives the first incoming token.
        """
        ids = kwargs["input_ids"]
        first = first_position(kwargs)
        overlap = torch.zeros_like(self.real) if first is None else self.real - first.to(self.real.device)
        o = int(overlap[0])
        if not bool((overlap == o).all()) or o < 0 or o >= ids.shape[1]:
            raise ValueError(
                f"apply(): this generate call continues a {name} cache that consumed {self.real.tolist()} tokens "
                f"per row, but its input starts at positions {first.tolist() if first is not None else '?'} "
                f"with {ids.shape[1]} tokens: give generate the previous output sequence (prompt and answer) "
                "followed by at least one new token, one conversation per row, with no tokens left out"
            )
        if o:
            if not torch.equal(ids[:, :o], self.ids[:, -o:].to(ids.device)):
                raise ValueError(
                    f"apply(): the history given to this generate call differs from what the {name} cache "
                    "consumed in the earlier call(s): pass that call's output sequence, then the new tokens"
                )
            kwargs["input_ids"] = ids = ids[:, o:]
            for key in ("position_ids", "cache_position"):  # the latter in releases that still pass it
                if kwargs.get(key) is not None:
                    kwargs[key] = kwargs[key][..., o:]
        self.ids = torch.cat([self.ids, ids.to(self.ids.device)], dim=1)
        self.real = self.real + ids.shape[1]
        return kwargs


def _make_hooks(model, handle: Applied, tokenizer, begin):
    method = handle.method

    def pre_hook(module, args, kwargs):
        if args:
            raise TypeError("apply(): call the model with keyword arguments (as model.generate does)")
        if kwargs.get("inputs_embeds") is not None:
            raise ValueError(f"apply(): {method.name} needs input_ids, not inputs_embeds")
        _, cache = cache_in(kwargs)
        if cache is None:  # Phi-3's LongRoPE step passes none on long sequences: see gemfilter.dropped
            cache, kwargs = give_back(model, handle._consumed, kwargs)
        if cache is None:
            raise ValueError(
                f"apply(): {method.name} needs generate's KV cache (use_cache=True). For one forward pass, "
                "use gemfilter.select_tokens and run the model on the kept tokens."
            )
        if getattr(cache, "is_compileable", False):
            raise ValueError(
                f"apply(): {method.name} needs a dynamic KV cache, got {type(cache).__name__}: a static (compileable) "
                "cache, e.g. from generate(cache_implementation='static'), has a fixed length and comes with prebuilt "
                "4-D masks that the method can neither shrink nor rewrite. Use generate's default cache"
            )
        mask = kwargs.get("attention_mask")
        if mask is not None and not (torch.is_tensor(mask) and mask.dim() == 2):
            got = f"a {mask.dim()}-D tensor" if torch.is_tensor(mask) else f"a {type(mask).__name__}"
            raise ValueError(f"apply(): only 2-D (batch, seq) attention masks are supported, got {got}")
        past = cache.get_seq_length()
        if past == 0:  # prefill of a new generate call (or the first forward on an empty cache inside the block)
            input_ids = kwargs["input_ids"]
            valid = torch.ones_like(input_ids, dtype=torch.bool) if mask is None else mask.bool()
            call = begin(model, input_ids, valid, tokenizer)
            if handle.on_begin is not None:
                handle.on_begin(call)
            handle.calls.append(call)
            handle._by_cache[cache] = call
            handle._prefilling[cache] = call
            handle._consumed[cache] = Consumed(input_ids, valid.sum(1))
            kwargs = call.prefill(kwargs, cache)
            call.fed = kwargs["input_ids"].shape[1]  # what the prefill forward runs through the last layer
            check_switch(model, handle._consumed[cache], kwargs, 0, method.name)  # records the prefill's top
            return args, kwargs
        call = handle._by_cache.get(cache)
        if call is None:
            raise ValueError(
                f"apply(): the KV cache passed in already holds {past} tokens and was not filled inside this "
                f"apply() block, so {method.name} never saw those tokens and would run as plain full generation. "
                "Inside apply(), pass no cache or an empty one (a prefix cache built outside the block cannot be "
                "filtered)"
            )
        kwargs = call.decode(handle._consumed[cache].only_new(kwargs, method.name), cache, past)
        check_switch(model, handle._consumed[cache], kwargs, past, method.name)
        return args, kwargs

    def post_hook(module, args, kwargs, output):
        _, cache = cache_in(kwargs)
        call = handle._prefilling.pop(cache, None) if cache is not None else None
        if call is not None:
            call.after_prefill(cache)
            handle.budgets.append(Budget.measure(call, cache))

    pre_hook._gemfilter_apply = True  # marks the model as inside apply(): see _check_not_nested
    return pre_hook, post_hook


def _check_not_nested(model) -> None:
    """Refuse a second apply() on a model already inside one: the outer hooks would rewrite the inner
    call's inputs, so the inner method would be silently ignored (or crash) and its selection be wrong."""
    if any(getattr(h, "_gemfilter_apply", False) for h in model._forward_pre_hooks.values()):
        raise RuntimeError(
            "apply(): this model is already inside `with apply(model, ...)`; nesting is not supported (the inner "
            "method would be silently ignored). Inside the block call model.generate(...) directly, or leave the "
            "block before gemfilter.generate / another apply()"
        )


def resolve(model, method):
    """Fill in the model's default filter layer and validate the method's parameters."""
    if not isinstance(method, Method) or not dataclasses.is_dataclass(method):
        got = repr(method) if isinstance(method, str) else type(method).__name__
        raise TypeError(
            f"method must be a method object such as GemFilter(layer=13, topk=1024), got {got}; "
            "build one by name with gemfilter.get_method(name, layer=..., topk=...)"
        )
    if getattr(model, "config", None) is None:
        raise TypeError(
            f"{type(model).__name__} has no .config: pass a transformers causal LM "
            "(e.g. AutoModelForCausalLM.from_pretrained(...)), not a bare torch module"
        )
    names = {f.name for f in dataclasses.fields(method)}
    if "layer" in names:
        if method.layer is None:
            # A method with its own rule (FastKV's TSP layer) overrides it; the others use GemFilter's filter layer.
            method = dataclasses.replace(method, layer=method.default_layer(model))
        check_params(model, method.layer, method.topk, method.kernel)
    return method  # every other parameter was checked when the method was built (Method.__post_init__)


@contextmanager
def apply(model, method, tokenizer=None, selector=None, on_begin=None):
    """Inside the block, a plain ``model.generate(...)`` runs ``method`` (GemFilter, SnapKV, ...).

    Parameters
    ----------
    model: a transformers causal LM whose attention dispatches through AttentionInterface.
    method: a registered method object, e.g. ``GemFilter(layer=13, topk=1024)``.
    tokenizer: needed by methods that read token text (``gemfilter-span``).
    selector: optional draft model with ``model``'s tokenizer (e.g. a smaller one of its family): a prompt
        filter then selects on the selector's layers 0..r (its layer resolved against the selector) and
        ``model`` generates from the kept tokens (see :mod:`gemfilter.draft`).
    on_begin: optional ``f(call)``, called on each prefill once the method's begin (the filter pass of a prompt
        method, FastKV's first pass) has returned and before the prefill forward runs: the benchmark reads the
        filter pass's memory peak there.

    Yields an :class:`Applied` handle (``handle.selection``, ``handle.calls``). The model's attention
    implementation and hooks are restored on exit, exceptions included.
    """
    if selector is not None:
        check_selector(selector, model)
    handle = Applied(method=resolve(model if selector is None else selector, method), on_begin=on_begin)
    begin = handle.method.begin if selector is None else drafted_begin(handle.method, selector)
    check_causal_decoder(model, need_generate=True)
    _check_not_nested(model)
    with wrapped_attention(model), generation_modes_limited(model):
        pre, post = _make_hooks(model, handle, tokenizer, begin)
        hooks = [
            model.register_forward_pre_hook(pre, with_kwargs=True),
            model.register_forward_hook(post, with_kwargs=True),
        ]
        try:
            yield handle
        finally:
            for h in hooks:
                h.remove()


@dataclass
class GemFilterOutput:
    """What :func:`generate` returns: ``output`` is exactly what ``model.generate`` returned."""

    output: object
    selection: Selection | None
    kept_text: list | None
    prompt_len: int
    kept: list  # per row: prompt tokens the answer was generated from (n for full)
    budget: Budget | None = None  # what the prefill kept, measured: KV rows per layer, tokens propagated
    decode_cache_bytes: int | None = None  # the static cache decoding ran on (compile); eager: budget.kv_bytes

    @property
    def sequences(self) -> torch.Tensor:
        return self.output if torch.is_tensor(self.output) else self.output.sequences

    @property
    def new_tokens(self) -> torch.Tensor:
        """(b, t) generated tokens only."""
        return self.sequences[:, self.prompt_len :]


def generate(
    model,
    inputs,
    *,
    layer: int | None = None,
    topk: int = 1024,
    kernel: int = 5,
    tokenizer=None,
    method=None,
    selector=None,
    compile=False,
    on_begin=None,
    **generate_kwargs,
) -> GemFilterOutput:
    """GemFilter generation (Algorithm 2): filter with the first ``layer`` layers, then generate from top-k.

    Parameters
    ----------
    inputs: a (b, n) LongTensor or a tokenizer output (mapping with input_ids and optional attention_mask).
    layer: 0-based filter layer; None -> :func:`gemfilter.layers.default_layer`.
    topk: tokens kept per row.
    tokenizer: if given, ``kept_text`` holds the decoded kept tokens.
    method: a method object instead of (layer, topk, kernel).
    selector: optional draft model with ``model``'s tokenizer that makes the selection (see :func:`apply`).
    compile: False (default): ``model.generate`` decodes. True: greedy decoding from the method's cache on a
        static cache and a compiled step (:mod:`gemfilter.compiled`), reused by later calls with as many rows;
        or a :class:`gemfilter.compiled.StaticDecoder` to decode on. Equal tokens to ``compile=False``.
    on_begin: passed to :func:`apply`.
    generate_kwargs: passed to ``model.generate``. Decoding is greedy unless you say otherwise.
    """
    from .methods import GemFilter

    if hasattr(inputs, "keys") and "input_ids" in inputs:
        input_ids, attention_mask = as_batch(inputs["input_ids"], inputs.get("attention_mask"))
    elif torch.is_tensor(inputs) or isinstance(inputs, (list, tuple)):
        input_ids, attention_mask = as_batch(inputs)
    else:
        raise TypeError(
            "inputs must be a LongTensor (b, n), a list of token lists, or a tokenizer output with 'input_ids'"
        )
    check_prompt(input_ids, attention_mask)
    method = method or GemFilter(layer=layer, topk=topk, kernel=kernel)
    generate_kwargs.setdefault("do_sample", False)
    generate_kwargs.setdefault("num_beams", 1)
    if compile is not False:
        return _generate_compiled(
            model, input_ids, attention_mask, method, tokenizer, selector, compile, on_begin, generate_kwargs
        )
    with apply(model, method, tokenizer=tokenizer, selector=selector, on_begin=on_begin) as handle:
        out = model.generate(input_ids=input_ids, attention_mask=attention_mask, **generate_kwargs)
    if not handle.calls:
        raise RuntimeError(
            "gemfilter.generate: model.generate made no prefill forward on an empty KV cache, so "
            f"{method.name} never ran"
        )
    sel = handle.selection
    text = sel.kept_text(tokenizer) if tokenizer is not None and sel is not None else None
    return GemFilterOutput(
        output=out,
        selection=sel,
        kept_text=text,
        prompt_len=input_ids.shape[1],
        kept=handle.calls[-1].kept,
        budget=handle.budgets[-1] if handle.budgets else None,
    )


def _generate_compiled(model, input_ids, attention_mask, method, tokenizer, selector, decoder, on_begin, kwargs):
    """:func:`generate` with ``compile``: the method's prefill inside :func:`apply`, then greedy decoding on a
    static cache and a compiled step (see :mod:`gemfilter.compiled`)."""
    from . import compiled

    settings = compiled.check_keywords(model, kwargs)
    if decoder is not True and not isinstance(decoder, compiled.StaticDecoder):
        raise TypeError(f"compile must be False, True or a gemfilter.compiled.StaticDecoder, got {decoder!r}")
    device = next(model.parameters()).device
    input_ids = input_ids.to(device)
    attention_mask = None if attention_mask is None else attention_mask.to(device)
    if settings["streamer"] is not None:  # generate hands the streamer the prompt first
        settings["streamer"].put(input_ids.cpu())
    with apply(model, method, tokenizer=tokenizer, selector=selector, on_begin=on_begin) as handle:
        first, cache = compiled.prefill(model, handle, input_ids, attention_mask)
    if not handle.calls:
        raise RuntimeError(f"gemfilter.generate: the prefill made no call of {method.name}")
    call = handle.calls[-1]
    cont = call.continuation()
    rows = handle.budgets[-1].kv_rows
    if decoder is True:
        decoder = compiled.decoder_for(model, max(rows) + max(settings["max_new_tokens"] - 1, 0), input_ids.shape[0])
    needed = max(rows) + max(settings["max_new_tokens"] - 1, 0)
    if needed > decoder.capacity:
        raise ValueError(
            f"this StaticDecoder holds {decoder.capacity} rows per layer; the prefill left {max(rows)} "
            f"and {settings['max_new_tokens']} new tokens need {needed}: build one with capacity >= "
            f"{needed}"
        )
    mask = decoder.load(cache, cont.valid)
    del cache
    with torch.no_grad():
        new = decoder.decode(first, cont, mask, **settings)
    sel = handle.selection
    text = sel.kept_text(tokenizer) if tokenizer is not None and sel is not None else None
    return GemFilterOutput(
        output=torch.cat([input_ids, new], dim=1),
        selection=sel,
        kept_text=text,
        prompt_len=input_ids.shape[1],
        kept=call.kept,
        budget=handle.budgets[-1],
        decode_cache_bytes=decoder.cache_bytes(),
    )
