"""The harness model ``gemfilter``: lm-evaluation-harness's ``hf`` model with a gemfilter method applied.

Paper: Shi et al. 2024 (GemFilter); every method of ``gemfilter methods`` runs the same way.

- ``generate_until``: the harness's own batched, left-padded ``generate``, inside :func:`gemfilter.apply`.
  Methods that refuse left-padded batches (``fastkv`` when it propagates; cache methods on sliding-window
  models) refuse them here too: use ``batch_size=1``.
- ``loglikelihood`` / ``loglikelihood_rolling``: the harness batches, truncates and slices as for ``hf``;
  each row's logits come from :func:`gemfilter.score.continuation_logits`, which selects from the
  context only (the split is the request's own) and scores the continuation.

``model_args`` (``--model_args`` or ``simple_evaluate(model="gemfilter", model_args=...)``):
``pretrained`` (``embedded`` for the embedded Gemma 3 270M, the default), ``method`` (a method spec, as on
every command line: ``gemfilter-span:k=256``, ``snapkv:ratio=0.1``; default ``gemfilter``), ``topk`` (tokens
kept or cache budget) or ``ratio`` (topk = ratio x the prompt's tokens) and ``layer`` (filter / TSP layer;
default the model's) for a spec that sets none, any other parameter of the method as its own key (the
harness splits model_args at commas: ``method=fastkv:k=512,tsp_len=2048`` gives ``tsp_len`` its own key,
which joins the spec), ``attn`` (``banded``, ``sdpa``, ``eager``), and every argument of the harness's
``hf`` model (``dtype``, ``revision``, ...). ``batch_size``,
``max_batch_size`` and ``device`` are the harness's own options (``--batch_size``, ``simple_evaluate(batch_size=)``).
Every bad model_arg is a ValueError naming it and what is allowed, before the model loads (from its config);
a bad spec gets the message every command line gives it (``gemfilter: topk=0 must be >= 1``).

Defaults are recorded: the results JSON's ``config`` holds ``gemfilter_method`` (the spec), ``gemfilter_topk``,
``gemfilter_ratio`` and ``gemfilter_layer`` (the resolved layer). ``ratio`` gives each row of a generation batch
its own budget (ratio x that row's tokens, padding excluded). Whole-document tasks (``loglikelihood_rolling``,
e.g. perplexity) are refused for every method but ``full``: their windows have no context to select from.

The harness finds this class only once this module is imported: ``gemfilter-lm-eval`` (or
``python -m eval.harness``) does it; from Python, ``import eval.harness.adapter`` before
``lm_eval.simple_evaluate(model="gemfilter", ...)``. lm-eval 0.4.13 loads no plugin entry points, so plain
``lm_eval --model gemfilter`` cannot find it.
"""

from __future__ import annotations

import torch
from lm_eval.api.registry import register_model
from lm_eval.models.huggingface import HFLM

import gemfilter
from gemfilter.apply import resolve
from gemfilter.methods import REGISTRY, FullMethod
from gemfilter.score import continuation_logits

OWN_ARGS = ("pretrained", "method", "topk", "ratio", "layer", "attn")
#: the harness passes these itself (--batch_size, --max_batch_size, --device): in model_args they would collide
HARNESS_ARGS = ("batch_size", "max_batch_size", "device")


def _shown(value) -> str:
    """A model_arg as the user typed it: the harness parses "-1" as the float -1.0."""
    return str(int(value)) if isinstance(value, float) and value.is_integer() else str(value)


def _whole(value):
    """An int given as text, int or integral float (the harness's parse), else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value if isinstance(value, int) else None


def method_spec(method, ratio, extra: dict) -> str:
    """The spec text of model_args ``method`` (a spec such as ``gemfilter-span:k=256``), with ``ratio`` and the
    method parameters given as their own model_args (the harness splits model_args at every comma, so
    ``method=fastkv:k=512,tsp_len=2048`` arrives as ``method=fastkv:k=512`` and ``tsp_len=2048``)."""
    items = [f"{k}={_shown(v)}" for k, v in extra.items()] + ([f"ratio={_shown(ratio)}"] if ratio is not None else [])
    text = str(method)
    return text + ("," if ":" in text else ":") + ",".join(items) if items else text


def check_model_args(pretrained, method, topk, ratio, layer, attn, kwargs: dict) -> tuple:
    """Every model_args check that needs no weights (the model's config is read); returns (spec, topk, layer, rest):
    the method's :class:`~gemfilter.methods.Spec`, topk and layer as ints (defaults for the spec), and the
    kwargs left for the harness's hf model.

    ValueError naming the bad model_arg and what is allowed: an unknown key, a layer or attn out of range; the
    method spec, with ``topk``/``layer`` as its defaults, is checked by :func:`~gemfilter.methods.parse_spec`
    with the same message as on every command line (e.g. ``gemfilter: topk=0 must be >= 1``), and a KV-cache
    method's budget against the model (e.g. SnapKV's topk must exceed its window)."""
    import inspect

    from gemfilter.methods import check_for_model, parse_spec
    from gemfilter.methods.spec import parameters
    from gemfilter.models import ATTN_CHOICES, load_config
    from gemfilter.toolkit.options import check_against_model

    known = set(OWN_ARGS) | {
        n
        for n, p in inspect.signature(HFLM.__init__).parameters.items()
        if p.kind is p.KEYWORD_ONLY or p.kind is p.POSITIONAL_OR_KEYWORD
    } - {"self"}
    cls = REGISTRY.get(str(method).partition(":")[0])
    own = [k for k in (parameters(cls) if cls else {}) if k not in known]
    unknown = sorted(set(kwargs) - known - set(own))
    if unknown:
        raise ValueError(
            f"model_args: unknown key(s) {', '.join(unknown)}; allowed: {', '.join(OWN_ARGS)} and the "
            f"harness's hf model's: {', '.join(sorted(known - set(OWN_ARGS) - set(HARNESS_ARGS)))}"
            + (f"; and {cls.name}'s parameters: {', '.join(own)}" if own else "")
        )
    if topk is not None and ratio is not None:
        raise ValueError("model_args: give topk or ratio, not both")
    if layer is not None and (_whole(layer) is None or _whole(layer) < 0):
        raise ValueError(
            f"model_args layer={_shown(layer)} must be a 0-based whole number >= 0 (or omitted for the model's default)"
        )
    if attn is not None and attn not in ATTN_CHOICES:
        raise ValueError(f"model_args attn={attn!r} is not a kernel; allowed: {', '.join(ATTN_CHOICES)}")
    # the harness reads "-1" as -1.0: a whole float is the int the user typed; any other value the method refuses
    topk = topk if _whole(topk) is None else _whole(topk)
    layer = _whole(layer)
    spec = parse_spec(method_spec(method, ratio, {k: v for k, v in kwargs.items() if k in own}), topk=topk, layer=layer)
    config = (
        load_config(None if pretrained == "embedded" else pretrained)
        if isinstance(pretrained, str)
        else pretrained.config
    )  # a model object (simple_evaluate(model=HFLM-style instance args))
    m = config.get_text_config().num_hidden_layers
    if layer is not None and not layer < m:
        raise ValueError(f"model_args layer={layer} is outside [0, {m}): this model has {m} decoder layers (0-based)")
    check_against_model(config, specs=(spec,))
    if spec.ratio is None:  # a budget the method cannot run with fails now, not when the first request runs
        check_for_model(spec.method(topk=topk, layer=layer), config, 0)
    return spec, topk, layer, {k: v for k, v in kwargs.items() if k not in own}


@register_model("gemfilter")
class GemFilterLM(HFLM):
    """``hf`` plus a method: ``method`` (a spec), ``topk`` or ``ratio``, ``layer``, ``attn`` (module docstring)."""

    def __init__(
        self, pretrained="embedded", method="gemfilter", topk=None, ratio=None, layer=None, attn=None, **kwargs
    ):
        spec, topk, layer, rest = check_model_args(
            pretrained, method, topk, ratio, layer, attn, {k: v for k, v in kwargs.items() if k not in HARNESS_ARGS}
        )
        kwargs = {**rest, **{k: v for k, v in kwargs.items() if k in HARNESS_ARGS}}
        if pretrained == "embedded":
            from gemfilter.models import embedded_model_dir

            pretrained = str(embedded_model_dir())
        kwargs.setdefault("device", "cuda" if torch.cuda.is_available() else "cpu")
        super().__init__(pretrained=pretrained, **kwargs)
        if attn is not None:
            gemfilter.set_attention(self.model, attn)
        self.spec, self.topk, self.layer = spec, topk, layer
        self._splits: dict = {}  # while a loglikelihood run lasts: row tokens -> context length
        self._lengths: list = []  # their distinct lengths, longest first
        self.budgets: list = []  # what each generate prefill kept (gemfilter.apply.Budget), as measured
        self.kept: list = []  # prompt tokens each loglikelihood row's continuation was scored from
        self.method_for(1)  # resolved against the loaded model: what the config alone could not check

    @classmethod
    def create_from_arg_obj(cls, arg_dict, additional_config=None):
        cls._no_collision(arg_dict, additional_config)
        return super().create_from_arg_obj(arg_dict, additional_config)

    @classmethod
    def create_from_arg_string(cls, arg_string, additional_config=None):
        from lm_eval.utils import simple_parse_args_string

        cls._no_collision(simple_parse_args_string(arg_string), additional_config)
        return super().create_from_arg_string(arg_string, additional_config)

    @staticmethod
    def _no_collision(args: dict, additional: dict | None) -> None:
        """The harness passes batch_size, max_batch_size and device itself; the same key in model_args would be
        a TypeError ("got multiple values") from Python. Say which option to use instead."""
        clash = [k for k, v in (additional or {}).items() if v is not None and k in args]
        if clash:
            raise ValueError(
                f"model_args: {', '.join(clash)} is the harness's own option; give it as "
                + ", ".join(f"--{k}" for k in clash)
                + " (or simple_evaluate's "
                + ", ".join(f"{k}=" for k in clash)
                + "), not in model_args"
            )

    def get_model_info(self) -> dict:
        """The harness's model info plus this adapter's settings, defaults included (the results JSON's config)."""
        info = super().get_model_info()
        method = self.method_for(1)
        info.update(
            gemfilter_method=self.spec.text,
            gemfilter_topk=None if self.spec.ratio is not None else method.topk,
            gemfilter_ratio=self.spec.ratio,
            gemfilter_layer=method.layer,
            gemfilter_kept=self.measured(),
        )
        return info

    def measured(self) -> dict:
        """What the method kept over the run, as measured: generate prefills (KV rows per layer, min and max;
        prompt positions through the last layer, min and max) and loglikelihood rows (tokens kept, min and max)."""
        span = lambda xs: [min(xs), max(xs)] if xs else None  # noqa: E731
        rows = [b.kv_rows for b in self.budgets]
        return {
            "generate_prefills": len(self.budgets),
            "kv_rows_per_layer": [span(layer) for layer in zip(*rows)] if rows else None,
            "propagated": span([b.propagated for b in self.budgets]),
            "loglikelihood_rows": len(self.kept),
            "kept": span(self.kept),
        }

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False):
        if not isinstance(self.method_for(1), FullMethod):
            names = sorted({str(getattr(r, "task_name", None) or "?") for r in requests})
            raise ValueError(
                f"task(s) {', '.join(names)} score whole documents (loglikelihood_rolling, e.g. "
                f"perplexity): their windows have no context to select from, so {self.spec.text} "
                "would compress nothing and report the uncompressed score under its name; run them "
                "with method=full"
            )
        return super().loglikelihood_rolling(requests, disable_tqdm=disable_tqdm)

    def method_for(self, prompt_tokens: int):
        """The resolved method for a prompt of ``prompt_tokens`` tokens (a ``ratio`` budget scales with it)."""
        return resolve(self.model, self.spec.method(prompt_tokens, topk=self.topk, layer=self.layer))

    def _model_generate(self, context, max_length, stop, **generation_kwargs):
        mask = generation_kwargs.get("attention_mask")
        lengths = [context.shape[1]] * context.shape[0] if mask is None else [int(n) for n in mask.sum(1)]
        if self.spec.ratio is None or len(set(lengths)) == 1:
            with gemfilter.apply(self.model, self.method_for(lengths[0]), tokenizer=self.tokenizer) as handle:
                out = super()._model_generate(context, max_length, stop, **generation_kwargs)
            self.budgets += handle.budgets
            return out
        # ratio on a left-padded batch of unequal rows: each row's budget is ratio x its own tokens, so the rows
        # run one at a time and come back as the harness expects (its padded context, then new tokens, padded)
        rows = []
        for i, n in enumerate(lengths):
            pad = context.shape[1] - n
            kwargs = {**generation_kwargs, "attention_mask": mask[i : i + 1, pad:]}
            with gemfilter.apply(self.model, self.method_for(n), tokenizer=self.tokenizer) as handle:
                out = super()._model_generate(context[i : i + 1, pad:], max_length - pad, stop, **kwargs)
            self.budgets += handle.budgets
            rows.append(torch.cat([context[i, :pad], out[0]]))
        width = max(len(r) for r in rows)
        return torch.stack([torch.cat([r, r.new_full((width - len(r),), self.tokenizer.pad_token_id)]) for r in rows])

    def _loglikelihood_tokens(self, requests, disable_tqdm=False, override_bs=None):
        # The harness hands _model_call only the padded token rows; remember where each row's context ends
        # (after the harness's own left truncation to max_length + 1 tokens).
        splits = {}
        for _, context, continuation in requests:
            whole = (context + continuation)[-(self.max_length + 1) :]
            key, ctx_len = tuple(whole[:-1]), len(whole) - len(continuation)
            if splits.setdefault(key, ctx_len) != ctx_len:
                raise ValueError(
                    "two loglikelihood requests have the same tokens but split them differently into "
                    "context and continuation; the gemfilter adapter cannot tell which row is which"
                )
        self._splits, self._lengths = splits, sorted({len(k) for k in splits}, reverse=True)
        try:
            return super()._loglikelihood_tokens(requests, disable_tqdm=disable_tqdm, override_bs=override_bs)
        finally:
            self._splits, self._lengths = {}, []

    def _row(self, row):
        """(tokens, context length) of one right-padded input row, from the requests' own splits."""
        ids = row.tolist()
        for n in (n for n in self._lengths if n <= len(ids)):
            if not any(ids[n:]) and tuple(ids[:n]) in self._splits:
                return ids[:n], self._splits[tuple(ids[:n])]
        raise RuntimeError("gemfilter adapter: an input row matches no loglikelihood request")

    def _model_call(self, inps, attn_mask=None, labels=None):
        if not self._splits:  # not a loglikelihood batch (e.g. the harness's batch-size probe): plain model
            return super()._model_call(inps, attn_mask=attn_mask, labels=labels)
        out = None
        for i, row in enumerate(inps):
            ids, ctx_len = self._row(row)
            tokens = torch.tensor(ids, dtype=torch.long)
            if ctx_len == 0:  # the context was truncated away: nothing to select from
                logits = super()._model_call(tokens[None].to(inps.device))[0]
            else:
                method = self.method_for(ctx_len)
                logits, kept, _ = continuation_logits(
                    self.model, tokens[:ctx_len], tokens[ctx_len:], method, self.tokenizer
                )
                self.kept.append(int(kept))
            if out is None:
                out = logits.new_zeros(inps.shape + (logits.shape[-1],))
            out[i, len(ids) - len(logits) : len(ids)] = logits  # the harness reads positions ctx_len - 1 .. n - 1
        return out
