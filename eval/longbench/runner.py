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
  the folder's lock (``gemfilter.io``), so two runs sharing one ``--out`` lose no row.

A rerun computes only the samples whose ``_id`` has no row yet. Under ``accelerate launch`` /
``torchrun`` the missing samples are dealt round-robin over the processes (accelerate's PartialState).
Greedy decoding makes each row a pure function of its inputs, so the merge equals a single-process run.
Sharding, resume, config and layer checks are :mod:`eval.rundir`'s, shared with NIAH and RULER.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from pathlib import Path

from gemfilter.io import check_out_dir
from gemfilter.options import check_against_model

from eval.rundir import (CONFIG, TASK_SHARD, append_row, check_config, check_layers, finished_task, load_for_run,
                         make_state, merge_task, model_config_for)

from .data import HUB_REPO, load_records
from .pipeline import check_max_length, default_max_length, predict
from .tasks import BY_NAME, get_task

#: LongBench settings added after folders were written without them: a missing key means this value
#: (settings every benchmark added are ``eval.rundir.LEGACY_IDENTITY``).
LEGACY_IDENTITY = {"method_max_length": {}}
#: Fields every stored row has; a row without them (or a null row) is skipped and its sample recomputed.
ROW_FIELDS = ("pred", "answers", "_id")


@dataclass(frozen=True)
class RunConfig:
    """One LongBench experiment.

    model: HF id / local path / None (embedded Gemma 3 270M); methods: registry names; tasks: configs
    (``hotpotqa``, ...); e: LongBench-E (``<task>_e`` data, ``pred_e`` folder); limit: first n samples
    per task (None: all); topk, layer: method parameters (methods without them ignore them; layer None
    = the model's default); max_length: prompt tokens after middle truncation (None: the model's window
    minus 500); chat_template: apply the tokenizer's chat template (not to trec, triviaqa, samsum, lcc,
    repobench-p); data_dir: local folder of ``<config>.jsonl`` (None: the hub); method_max_length:
    method -> its own max_length (the official runs cut H2O to 8192); dtype: None (the loader's) or a
    torch dtype name, used on an accelerator only (CPU keeps float32 and says so); engine: None (generate
    here) or an OpenAI-compatible engine's URL (select here, generate there).
    """

    model: str | None = None
    methods: tuple = ("full", "gemfilter")
    tasks: tuple = tuple(BY_NAME)
    e: bool = False
    limit: int | None = None
    topk: int = 1024
    layer: int | None = None
    max_length: int | None = None
    chat_template: bool = False
    data_dir: str | None = None
    attn: str | None = None  # attention kernel (None: the model's default); exact kernels, so not compared
    method_max_length: dict = field(default_factory=dict)
    dtype: str | None = None
    engine: str | None = None
    extra: dict = field(default_factory=dict)  # recorded in config.json, not compared

    def identity(self) -> dict:
        """Settings every finished row depends on besides its (method, task, _id)."""
        return {"model": self.model, "topk": self.topk, "layer": self.layer, "max_length": self.max_length,
                "chat_template": self.chat_template,
                "data": HUB_REPO if self.data_dir is None else str(self.data_dir),
                "method_max_length": {m: v for m, v in sorted(self.method_max_length.items()) if m in self.methods},
                "dtype": self.dtype, "engine": self.engine}

    def max_length_of(self, method: str, default: int) -> int:
        """Prompt tokens kept for ``method``: its own max length, else --max-length, else ``default``."""
        return self.method_max_length.get(method) or self.max_length or default

    def pred_dir(self, out, method: str) -> Path:
        """``out/pred/<method>`` (``out/pred_e/<method>`` for LongBench-E), the official layout."""
        return Path(out) / ("pred_e" if self.e else "pred") / method


def validate(config: RunConfig) -> None:
    """Raise ValueError naming the bad setting and what is allowed."""
    from gemfilter.methods import check_names

    check_names(config.methods)
    if not config.tasks:
        raise ValueError(f"no tasks given; allowed: {', '.join(BY_NAME)}")
    for name in config.tasks:
        task = get_task(name)
        if config.e:
            task.e_config()  # ValueError for a task without a LongBench-E variant
    if isinstance(config.topk, bool) or not isinstance(config.topk, int) or config.topk < 1:
        raise ValueError(f"--topk must be an int >= 1, got {config.topk!r}")
    if config.layer is not None and (isinstance(config.layer, bool) or not isinstance(config.layer, int)
                                     or config.layer < 0):
        raise ValueError(f"--layer must be a 0-based int >= 0 (or omitted for the model's default), got {config.layer!r}")
    if config.max_length is not None:
        check_max_length(config.max_length)
    for name, value in config.method_max_length.items():
        check_names([name])
        check_max_length(value)
    if config.limit is not None and (isinstance(config.limit, bool) or not isinstance(config.limit, int)
                                     or config.limit < 1):
        raise ValueError(f"--limit must be an int >= 1 (or omitted for every sample), got {config.limit!r}")


def run(config: RunConfig, out, *, state=None, model_and_tokenizer=None, progress: bool = True) -> dict | None:
    """Compute the missing samples of ``config`` into ``out``; return {(method, task): rows} (None off main).

    state: an accelerate PartialState (default: :func:`eval.rundir.make_state`, gloo on CPU).
    model_and_tokenizer: a loaded (model, tokenizer) pair (default: ``gemfilter.load_model(config.model)``).
    progress: a tqdm bar on the main process.
    """
    import gemfilter
    from gemfilter.apply import resolve
    from gemfilter.methods import check_for_model
    from gemfilter.serve.engine import check_engine_methods, engine_field

    from gemfilter.serve.engine import generator
    from tqdm.auto import tqdm

    validate(config)
    state = state or make_state()
    out = check_out_dir(out, files=(CONFIG,))
    model_config = model_config_for(config, model_and_tokenizer)
    check_config(out, config, write=False, model_config=model_config, legacy=LEGACY_IDENTITY)
    check_against_model(model_config, layer=config.layer, lengths=(config.max_length or 1,), length_flag="--max-length")
    # The model's window is needed only by methods with neither their own length nor --max-length.
    needs_window = config.max_length is None and any(m not in config.method_max_length for m in config.methods)
    max_length = default_max_length(model_config) if needs_window else config.max_length
    check_engine_methods(config.engine, config.methods)
    unresolved = {m: gemfilter.get_method(m, layer=config.layer, topk=config.topk) for m in config.methods}
    for m, method in unresolved.items():  # e.g. SnapKV on a model whose every layer is windowed; prompts are cut to this
        check_for_model(method, model_config, config.max_length_of(m, max_length))
    tasks = [get_task(name) for name in config.tasks]
    with state.main_process_first():  # the main process fills the datasets cache; the others then read it
        records = {t.config: load_records(t.e_config() if config.e else t.config, config.data_dir, config.limit)
                   for t in tasks}
    if state.is_main_process and not config.e and config.limit is None:
        short = [f"{t.config} ({len(records[t.config])} of {t.samples})" for t in tasks
                 if len(records[t.config]) != t.samples]
        if short:
            warnings.warn("LongBench v1 sizes differ, so scores are not comparable with published ones: "
                          + ", ".join(short))
    done = {(m, t.config): finished_task(config.pred_dir(out, m), t.config, ROW_FIELDS)
            for m in config.methods for t in tasks}
    todo = [(m, t, r) for m in config.methods for t in tasks for r in records[t.config]
            if r["_id"] not in done[m, t.config]]
    # Everyone has read the finished rows before anyone appends, so all agree on the same todo list.
    state.wait_for_everyone()
    mine = todo[state.process_index::state.num_processes]
    if state.is_main_process and progress:
        total = sum(len(records[t.config]) for t in tasks) * len(config.methods)
        tqdm.write(f"LongBench{'-E' if config.e else ''}: {total} samples ({len(config.methods)} methods x "
                   f"{len(tasks)} tasks), {total - len(todo)} already done, {len(todo)} to compute over "
                   f"{state.num_processes} process(es) -> {out}")
    if mine:
        model, tok = load_for_run(config, state, model_and_tokenizer, tqdm.write if state.is_main_process else None)
        methods = {m: resolve(model, method) for m, method in unresolved.items()}
        generate = generator(config.engine, tok)
        check_layers([{"method": m, "layer": row.get("layer")} for (m, _), rows in done.items()
                      for row in rows.values()], methods)
        desc = "LongBench" + (f" (process 0 of {state.num_processes})" if state.num_processes > 1 else "")
        # the first row is coming: pin the setup
        check_config(out, config, write=True, model_config=model_config, legacy=LEGACY_IDENTITY)
        bar = tqdm(mine, desc=desc, unit="sample", disable=not (progress and state.is_main_process))
        for name, task, record in bar:
            folder = config.pred_dir(out, name)
            folder.mkdir(parents=True, exist_ok=True)
            res = predict(model, tok, methods[name], task, record, config.max_length_of(name, max_length),
                          config.chat_template, generate)
            row = {"pred": res["pred"], "answers": record["answers"], "all_classes": record["all_classes"],
                   "length": record["length"], "_id": record["_id"], "kept": res["kept"],
                   "prompt_tokens": res["prompt_tokens"], "layer": getattr(methods[name], "layer", None),
                   **{k: res[k] for k in ("kv_rows", "propagated") if k in res}, **engine_field(config.engine)}
            append_row(folder / TASK_SHARD.format(task.config, state.process_index), row)
            bar.set_postfix(method=name, task=task.config, kept=res["kept"])
    state.wait_for_everyone()
    if not state.is_main_process:
        return None
    merged = {}
    for m in config.methods:
        for t in tasks:
            folder = config.pred_dir(out, m)
            if folder.is_dir():
                merged[m, t.config] = merge_task(folder, t.config, [r["_id"] for r in records[t.config]], ROW_FIELDS)
    return merged
