"""One run loop for every benchmark (NIAH, LongBench, RULER, SCBench): ``run(benchmark, out)``.

What the loop owns, the same for every benchmark:

- validation (:meth:`Benchmark.validate`) and the checks that need only the model's config
  (:meth:`Benchmark.check`), both before any weights load;
- the folder's identity: ``config.json`` (``eval.rundir.check_config``), compared before anything is
  computed and written just before the first row, so a run that fails its checks leaves the folder free;
- resume: every result file's finished rows (merged file and shards) are read first, and only the
  missing units are computed;
- shards: process i appends its rows, flushed and fsynced under the folder lock, to its own shard of
  each result file; accelerate's ``PartialState`` says which process this is;
- the merge: once every process has finished, the main process writes each result file atomically
  in the benchmark's order and removes its shards;
- the progress bar and the one summary line.

What a benchmark supplies (:class:`Benchmark`): its config (``identity()``, ``extra``, ``model``,
``attn``, ``dtype``), its units (:class:`Unit`: a result file, a resume key, the data to answer it),
the key of a stored row, and ``start(model, tokenizer, done)``, which returns ``predict(unit) -> row``.
A unit may be anything that makes one row: a NIAH cell, a LongBench sample, or a whole multi-turn
conversation (SCBench), whose row holds every turn.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Hashable, Iterable

from eval.rundir import (
    CONFIG,
    TASK_SHARD,
    append_row,
    check_config,
    check_layers,
    load_for_run,
    make_state,
    model_config_for,
    read_finished,
)
from gemfilter.toolkit.io import check_out_dir, merge_jsonl
from gemfilter.toolkit.loop import Unit, compute, missing  # noqa: F401 (Unit: what a benchmark's units are)


class Benchmark:
    """What one benchmark tells :func:`run`. Subclasses set the class attributes and the methods marked so.

    name: shown in the summary line; noun: one unit in the progress bar (``cell``, ``sample``);
    required: fields a stored row must hold (else it is skipped with a warning and recomputed);
    format_defaults: settings added to a folder's identity after folders were written without them (an earlier
    config.json format), with the value a missing key means;
    ensure_ascii: as ``json.dumps``'s for the rows written; record_process: add ``process`` (the shard that
    computed the row, not part of the result) to each row; config: the benchmark's run config; tokenizer: a
    callable giving the tokenizer alone (seconds, no weights), for data preparation and :meth:`before_load`.
    """

    name: str = "benchmark"
    noun: str = "sample"
    required: tuple = ()
    format_defaults: dict = {}
    ensure_ascii: bool = False
    record_process: bool = False

    def __init__(self, config, tokenizer=None):
        self.config, self.tokenizer = config, tokenizer

    # -- supplied by every benchmark -------------------------------------------------------------------
    def validate(self) -> None:
        """Raise ValueError naming the bad setting and what is allowed (no model, no data needed)."""

    def check(self, model_config) -> None:
        """Checks that need only the model's config (layer range, lengths, methods against the model)."""

    def units(self, out: Path, state, say) -> list:
        """Every :class:`Unit` of this config, in the order they are computed. Runs on the main process
        first (it may download or prepare data), then on the others. say: where notes go (or None)."""
        raise NotImplementedError

    def row_key(self, row: dict) -> Hashable:
        """The resume key of a stored row (the key of the unit that made it)."""
        raise NotImplementedError

    def start(self, model, tokenizer, done: dict) -> Callable[[Unit], dict]:
        """``predict(unit) -> row`` for this process, once the model is loaded.

        done: {file: {key: row}} of finished rows, for checks that a resume does not mix setups."""
        raise NotImplementedError

    # -- defaults a benchmark may replace --------------------------------------------------------------
    def shard_name(self, file: str, rank) -> str:
        """The file name of process ``rank``'s shard of ``file`` (rank ``*``: the glob of all of them)."""
        return TASK_SHARD.format(Path(file).name[: -len(".jsonl")], rank)

    def describe(self, units: list) -> str:
        """The start of the summary line: what the whole config holds."""
        return f"{self.name}: {len(units)} {self.noun}s"

    def before_load(self, todo: list, tokenizer) -> None:
        """Checks on the units to compute that need the tokenizer alone (seconds, before the weights)."""

    def share(self, todo: list, process: int, processes: int) -> list:
        """This process's part of the units to compute (default: dealt round-robin)."""
        return todo[process::processes]

    def sort_key(self, file: str, units: list) -> Callable[[dict], Any]:
        """The merged file's row order: this run's unit order; rows of other units after them, as they were."""
        rank = {u.key: i for i, u in enumerate(units) if u.file == file}
        return lambda row: rank.get(self.row_key(row), len(rank))

    def postfix(self, unit: Unit, row: dict) -> dict:
        """What the progress bar shows after a unit."""
        return {}

    # -- the method set-up every benchmark shares: its plan is ``config.methods`` --------------------------
    def check_methods(self, model_config, lengths_of: Callable[[Any], Iterable[int]]) -> None:
        """Before any weights load: an ``--engine`` takes every method of the plan (prompt methods only), and each
        method fits the model at each prompt length it will see (``lengths_of(spec)``; SnapKV on a model whose every
        layer is windowed is refused here)."""
        from gemfilter.methods import check_for_model
        from gemfilter.toolkit.serving.engine import check_engine_methods

        config = self.config
        check_engine_methods(config.engine, {s.label: s.cls for s in config.methods})
        for spec in config.methods:
            for length in lengths_of(spec):
                check_for_model(self.method_of(spec, length), model_config, length)

    def method_of(self, spec, prompt_tokens: int | None = None):
        """The method object of ``spec`` for a prompt of ``prompt_tokens`` tokens, with the config's ``topk`` /
        ``layer`` as the defaults of a spec that sets none; not yet resolved against a model."""
        return spec.method(prompt_tokens, topk=self.config.topk, layer=self.config.layer)

    def build_methods(self, model, finished: Iterable[dict], prompt_tokens_of=None, per_prompt: bool = False) -> dict:
        """{label: resolved method} of the plan; refuses a resume whose finished rows (``{"method", "layer"}``) used
        another filter layer than this run resolves to (``eval.rundir.check_layers``).

        prompt_tokens_of: label -> the prompt length a method is built for (None: none; a ``ratio`` budget then
        needs one, and says so); per_prompt: leave out the methods with a ``ratio`` budget, which the benchmark
        builds for each prompt (:meth:`method_of`).
        """
        from gemfilter.apply import resolve

        methods = {
            s.label: resolve(model, self.method_of(s, prompt_tokens_of(s.label) if prompt_tokens_of else None))
            for s in self.config.methods
            if not (per_prompt and s.ratio is not None)
        }
        check_layers(finished, methods)
        return methods

    def generator(self, tokenizer):
        """``gemfilter.generate``, or the engine's generate with the same signature when ``--engine`` is given."""
        from gemfilter.toolkit.serving.engine import generator

        return generator(self.config.engine, tokenizer)


def finished_by_folder(done: dict) -> list:
    """``{"method", "layer"}`` of every finished row, its method read from its file's folder (``pred/<label>/``)."""
    return [
        {"method": Path(file).parent.name, "layer": row.get("layer")}
        for file, rows in done.items()
        for row in rows.values()
    ]


@dataclass(frozen=True)
class RunConfig:
    """The fields every benchmark's run config shares; each benchmark's ``RunConfig`` adds its own.

    model: HF id / local path / None (the embedded Gemma 3 270M); methods: the run plan, method specs as texts
    (``"full"``, ``"gemfilter:k=256"``) or as :class:`gemfilter.methods.Spec` objects a command line parsed
    already (budgets applied, :func:`gemfilter.methods.spec.expand_budgets`). It is held as Specs: each text is
    parsed once, when the config is made, with ``topk`` / ``layer`` as the defaults of the specs that set none
    (None: each method's own). attn: the attention kernel (None: the model's; exact kernels, so not compared);
    dtype: None (the loader's) or a torch dtype name, used on an accelerator only; engine: None (generate here)
    or an OpenAI-compatible engine's URL (select here, generate there); extra: recorded in config.json, not
    compared.
    """

    model: str | None = None
    methods: tuple = ("full", "gemfilter")
    topk: int | None = None
    layer: int | None = None
    attn: str | None = None
    dtype: str | None = None
    engine: str | None = None
    extra: dict = field(default_factory=dict)

    def __post_init__(self):
        from gemfilter.methods.spec import plan

        object.__setattr__(self, "methods", plan(self.methods, topk=self.topk, layer=self.layer))

    @property
    def labels(self) -> tuple:
        """Each method's label, the name of its rows and folders, in the order given."""
        return tuple(s.label for s in self.methods)


def finished(benchmark: Benchmark, out: Path, files) -> dict:
    """{file: {key: row}} over each result file and its shards (first one wins), under the folder lock."""
    note = f"that {benchmark.noun} will be rerun"
    return {
        f: read_finished(
            out / f, benchmark.shard_name(f, "*"), benchmark.row_key, required=benchmark.required, skip_note=note
        )
        for f in files
    }


def merge(benchmark: Benchmark, out: Path, units: list) -> dict:
    """{file: merged rows} for every result file of ``units`` that exists or has shards; shards are removed."""
    merged = {}
    for file in dict.fromkeys(u.file for u in units):
        target = out / file
        if target.is_file() or (target.parent.is_dir() and any(target.parent.glob(benchmark.shard_name(file, "*")))):
            merged[file] = merge_jsonl(
                target,
                benchmark.shard_name(file, "*"),
                benchmark.row_key,
                sort_key=benchmark.sort_key(file, units),
                required=benchmark.required,
                ensure_ascii=benchmark.ensure_ascii,
            )
    return merged


def run(
    benchmark: Benchmark,
    out,
    *,
    state=None,
    model_and_tokenizer=None,
    progress: bool = True,
    max_units: int | None = None,
) -> dict | None:
    """Compute the missing units of ``benchmark`` into ``out``; return {file: merged rows} (None off the main process).

    state: an accelerate PartialState (default: ``eval.rundir.make_state``, gloo on CPU);
    model_and_tokenizer: a loaded (model, tokenizer) pair (default: loaded from the config, only if
    there is something to compute); progress: the bar and the summary line on the main process;
    max_units: compute at most this many missing units this time (the rest on a later run).
    """
    from tqdm.auto import tqdm

    config = benchmark.config
    if isinstance(config, RunConfig) and not config.methods:  # a benchmark's plan (a toy config may have none)
        raise ValueError("--methods is empty; give a comma-separated list, e.g. full,gemfilter")
    benchmark.validate()
    state = state or make_state()
    out = check_out_dir(out, files=(CONFIG,))
    model_config = model_config_for(config, model_and_tokenizer)
    check_config(out, config, write=False, model_config=model_config, format_defaults=benchmark.format_defaults)
    benchmark.check(model_config)
    say = tqdm.write if (progress and state.is_main_process) else None
    with state.main_process_first():  # the main process fills data caches; the others then read them
        units = benchmark.units(out, state, say)
    done = finished(benchmark, out, dict.fromkeys(u.file for u in units))
    todo = missing(units, done)
    later = 0
    if max_units is not None:
        later, todo = max(0, len(todo) - max_units), todo[:max_units]
    if todo and benchmark.tokenizer is not None:
        benchmark.before_load(
            todo, model_and_tokenizer[1] if model_and_tokenizer is not None else benchmark.tokenizer()
        )
    # Everyone has read the finished rows before anyone appends, so all agree on the same list.
    state.wait_for_everyone()
    mine = benchmark.share(todo, state.process_index, state.num_processes)
    if say:
        say(
            f"{benchmark.describe(units)}, {len(units) - len(todo) - later} already done, {len(todo)} to compute over "
            f"{state.num_processes} process(es)" + (f", {later} left for a later run" if later else "") + f" -> {out}"
        )
    if mine:
        model, tok = load_for_run(config, state, model_and_tokenizer, say)
        predict = benchmark.start(model, tok, done)
        check_config(
            out, config, write=True, model_config=model_config, format_defaults=benchmark.format_defaults
        )  # a row is coming

        def write(unit: Unit, row: dict) -> None:  # this process's shard of the unit's file
            if benchmark.record_process:
                row["process"] = state.process_index
            shard = out / Path(unit.file).parent / benchmark.shard_name(unit.file, state.process_index)
            shard.parent.mkdir(parents=True, exist_ok=True)
            append_row(shard, row, ensure_ascii=benchmark.ensure_ascii)

        compute(
            mine,
            predict,
            write,
            desc=benchmark.name + (f" (process 0 of {state.num_processes})" if state.num_processes > 1 else ""),
            noun=benchmark.noun,
            progress=progress and state.is_main_process,
            postfix=benchmark.postfix,
        )
    state.wait_for_everyone()
    if not state.is_main_process:
        return None
    return merge(benchmark, out, units)
