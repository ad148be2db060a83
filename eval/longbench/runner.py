"""LongBench v1 runner: one JSONL row per (method, task, sample), in the official layout, resumable and shardable.

Source: THUDM/LongBench (v1) ``pred.py`` writes ``pred/<model>/<task>.jsonl`` (``pred_e/`` for
LongBench-E) with one ``{"pred", "answers", "all_classes", "length"}`` line per sample; here the
"model" folder is the method, so ``eval.py``-style scoring compares methods. Each row also holds
``_id`` (the resume key), ``kept`` (prompt tokens the answer was generated from), ``prompt_tokens``
and ``layer`` (the resolved filter layer, None for methods without one).

Files in ``--out``:

- ``config.json``: settings that change answers (model, topk, layer, max_length, chat template,
  data source), written just before the first row (a run that fails its checks leaves the folder
  free); a rerun with other settings is refused, so a folder never mixes two setups;
- ``pred[_e]/<method>/<task>.jsonl.rank{i}``: rows appended (flushed, fsynced) by process i;
- ``pred[_e]/<method>/<task>.jsonl``: the merged rows in dataset order, written atomically by the
  main process after every process finished; the shards are then removed. Appends and merges take
  the folder's lock (``gemfilter.toolkit.io``), so two runs sharing one ``--out`` lose no row.

A rerun computes only the samples whose ``_id`` has no row yet. Under ``accelerate launch`` /
``torchrun`` the missing samples are dealt round-robin over the processes (accelerate's PartialState).
Greedy decoding makes each row a pure function of its inputs, so the merge equals a single-process run.
The loop (sharding, resume, config identity, merge) is :mod:`eval.runner`'s, shared with NIAH and RULER.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from pathlib import Path

from eval.runner import Benchmark, Unit, finished_by_folder
from eval.runner import RunConfig as BaseRunConfig
from eval.runner import run as run_units
from gemfilter.toolkit.options import check_against_model

from .data import HUB_REPO, load_records
from .pipeline import check_max_length, default_max_length
from .pipeline import predict as predict_one
from .tasks import BY_NAME, get_task

#: LongBench settings added after folders were written without them: a missing key means this value
#: (settings every benchmark added are ``eval.rundir.FORMAT_DEFAULTS``).
FORMAT_DEFAULTS = {"method_max_length": {}}
#: Fields every stored row has; a row without them (or a null row) is skipped and its sample recomputed.
ROW_FIELDS = ("pred", "answers", "_id")


@dataclass(frozen=True)
class RunConfig(BaseRunConfig):
    """One LongBench experiment: :class:`eval.runner.RunConfig`'s fields (each method's label names its
    ``pred/<method>`` folder), and:

    tasks: configs (``hotpotqa``, ...); e: LongBench-E (``<task>_e`` data, ``pred_e`` folder); limit: first n
    samples per task (None: all); max_length: prompt tokens after middle truncation (None: the model's window
    minus 500); chat_template: apply the tokenizer's chat template (not to trec, triviaqa, samsum, lcc,
    repobench-p); data_dir: local folder of ``<config>.jsonl`` (None: the hub); method_max_length: method label
    -> its own max_length (the official runs cut H2O to 8192).
    """

    tasks: tuple = tuple(BY_NAME)
    e: bool = False
    limit: int | None = None
    max_length: int | None = None
    chat_template: bool = False
    data_dir: str | None = None
    method_max_length: dict = field(default_factory=dict)

    def identity(self) -> dict:
        """Settings every finished row depends on besides its (method, task, _id)."""
        return {
            "model": self.model,
            "topk": self.topk,
            "layer": self.layer,
            "max_length": self.max_length,
            "chat_template": self.chat_template,
            "data": HUB_REPO if self.data_dir is None else str(self.data_dir),
            "method_max_length": {m: v for m, v in sorted(self.method_max_length.items()) if m in self.labels},
            "dtype": self.dtype,
            "engine": self.engine,
        }

    def max_length_of(self, method: str, default: int) -> int:
        """Prompt tokens kept for ``method``: its own max length, else --max-length, else ``default``."""
        return self.method_max_length.get(method) or self.max_length or default

    def pred_dir(self, out, method: str) -> Path:
        """``out/pred/<method>`` (``out/pred_e/<method>`` for LongBench-E), the official layout."""
        return Path(out) / ("pred_e" if self.e else "pred") / method


def validate(config: RunConfig) -> None:
    """Raise ValueError naming the bad setting and what is allowed."""
    from gemfilter.methods import REGISTRY

    if not config.tasks:
        raise ValueError(f"no tasks given; allowed: {', '.join(BY_NAME)}")
    for name in config.tasks:
        task = get_task(name)
        if config.e:
            task.e_config()  # ValueError for a task without a LongBench-E variant
    if config.max_length is not None:
        check_max_length(config.max_length)
    for name, value in config.method_max_length.items():  # a preset names methods that may not run
        if name.partition(":")[0] not in REGISTRY:
            raise ValueError(f"method_max_length: unknown method {name!r}; allowed: {', '.join(sorted(REGISTRY))}")
        check_max_length(value)
    if config.limit is not None and (
        isinstance(config.limit, bool) or not isinstance(config.limit, int) or config.limit < 1
    ):
        raise ValueError(f"--limit must be an int >= 1 (or omitted for every sample), got {config.limit!r}")


class LongBench(Benchmark):
    """LongBench on :func:`eval.runner.run`: one unit per (method, task, sample), in
    ``pred[_e]/<method>/<task>.jsonl``."""

    noun, required, format_defaults = "sample", ROW_FIELDS, FORMAT_DEFAULTS

    @property
    def name(self) -> str:
        return "LongBench-E" if self.config.e else "LongBench"

    def validate(self) -> None:
        validate(self.config)

    def max_length(self, model_config) -> int | None:
        """--max-length, else the model's window minus 500; the window is read only if some method has neither
        its own length nor --max-length."""
        config = self.config
        needs_window = config.max_length is None and any(m not in config.method_max_length for m in config.labels)
        return default_max_length(model_config) if needs_window else config.max_length

    def check(self, model_config) -> None:
        config = self.config
        check_against_model(
            model_config, layer=config.layer, lengths=(config.max_length or 1,), length_flag="--max-length"
        )
        window = self.max_length(model_config)  # prompts are cut to each method's length
        self.check_methods(model_config, lambda spec: (config.max_length_of(spec.label, window),))

    def units(self, out, state, say) -> list:
        config = self.config
        tasks = [get_task(name) for name in config.tasks]
        records = {
            t.config: load_records(t.e_config() if config.e else t.config, config.data_dir, config.limit) for t in tasks
        }
        if state.is_main_process and not config.e and config.limit is None:
            short = [
                f"{t.config} ({len(records[t.config])} of {t.samples})"
                for t in tasks
                if len(records[t.config]) != t.samples
            ]
            if short:
                warnings.warn(
                    "LongBench v1 sizes differ, so scores are not comparable with published ones: " + ", ".join(short)
                )
        return [
            Unit(str(config.pred_dir(".", m) / f"{t.config}.jsonl"), r["_id"], (m, t, r))
            for m in config.labels
            for t in tasks
            for r in records[t.config]
        ]

    def row_key(self, row: dict):
        return row["_id"]

    def describe(self, units: list) -> str:
        config = self.config
        return f"{self.name}: {len(units)} samples ({len(config.labels)} methods x {len(config.tasks)} tasks)"

    def start(self, model, tok, done: dict):
        from gemfilter.apply import BUDGET_FIELDS
        from gemfilter.toolkit.serving.engine import engine_field

        config = self.config
        window = self.max_length(model.config)
        methods = self.build_methods(model, finished_by_folder(done), lambda label: config.max_length_of(label, window))
        generate = self.generator(tok)

        def predict(unit: Unit) -> dict:
            name, task, record = unit.data
            res = predict_one(
                model,
                tok,
                methods[name],
                task,
                record,
                config.max_length_of(name, window),
                config.chat_template,
                generate,
            )
            return {
                "pred": res["pred"],
                "answers": record["answers"],
                "all_classes": record["all_classes"],
                "length": record["length"],
                "_id": record["_id"],
                "kept": res["kept"],
                "prompt_tokens": res["prompt_tokens"],
                "layer": methods[name].layer,
                **{k: res[k] for k in BUDGET_FIELDS if k in res},
                **engine_field(config.engine),
            }

        return predict

    def postfix(self, unit: Unit, row: dict) -> dict:
        return {"method": unit.data[0], "task": unit.data[1].config, "kept": row["kept"]}


def run(config: RunConfig, out, *, state=None, model_and_tokenizer=None, progress: bool = True) -> dict | None:
    """Compute the missing samples of ``config`` into ``out`` (:func:`eval.runner.run`); return
    {(method, task): rows} (None off the main process).

    state: an accelerate PartialState (default: :func:`eval.rundir.make_state`, gloo on CPU).
    model_and_tokenizer: a loaded (model, tokenizer) pair (default: ``gemfilter.load_model(config.model)``).
    progress: a tqdm bar on the main process.
    """
    merged = run_units(LongBench(config), out, state=state, model_and_tokenizer=model_and_tokenizer, progress=progress)
    if merged is None:
        return None
    return {(Path(file).parent.name, Path(file).stem): rows for file, rows in merged.items()}
