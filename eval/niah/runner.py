"""NIAH grid runner: one JSONL row per (method, length, depth) cell, resumable and shardable.

Files in the output folder:

- ``config.json``: the settings that change answers (model, topk, layer, prompt, max_new_tokens,
  haystack), written (atomically) just before the first row, so a run that fails its checks leaves
  the folder free. A rerun with other such settings is refused, so one folder never mixes two setups.
- ``results.rank{i}.jsonl``: rows appended by process i as each cell finishes (flushed and fsynced),
  so an interrupted run loses at most the cell in flight.
- ``results.jsonl``: the merged rows, sorted by (method, length, depth); written atomically by the
  main process after all processes finish, after which the shards are removed.

Appends and merges take the folder's lock (``gemfilter.io``), so two runs sharing one ``--out`` lose
no row: a merge either reads a concurrent append or leaves it in a fresh shard.

A (re)run reads every finished row first (merged file and shards), so only missing cells are
computed. Under ``accelerate launch`` / ``torchrun`` the missing cells are dealt round-robin over
processes (``PartialState.process_index`` / ``num_processes``). Greedy decoding makes every cell a
pure function of its inputs, so the merged file equals a single-process run's (except ``seconds``).

The folder machinery (config.json identity, lock, shards, resume, model loading) is
:mod:`eval.rundir`'s, shared with LongBench and RULER; this module adds NIAH's file names, row key
and legacy settings.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

from gemfilter.io import check_out_dir, merge_jsonl
from gemfilter.options import check_against_model

from eval.rundir import (CONFIG, append_row, check_config, check_layers, load_for_run, make_state, model_config_for,
                         read_finished)

from .grid import PRESETS, normalize_depth
from .haystack import PROTOCOLS, TEMPLATES, build_case, make_haystack, read_haystack
from .scoring import score_all

#: NIAH settings added after folders were written without them: a missing key means this value
#: (settings every benchmark added are ``eval.rundir.LEGACY_IDENTITY``).
LEGACY_IDENTITY = {"protocol": "kamradt"}
RESULTS = "results.jsonl"
#: Process i's shard of results.jsonl (LongBench and RULER name theirs ``eval.rundir.TASK_SHARD``).
SHARD = "results.rank{}.jsonl"
#: Fields every stored row has; a row without them (or a null row) is skipped and its cell recomputed.
ROW_FIELDS = ("method", "length", "depth", "response", "recall", "rouge1", "hit", "kept", "prompt_tokens", "seconds")


@dataclass(frozen=True)
class RunConfig:
    """One NIAH experiment. model: HF id / local path / None (embedded Gemma 3 270M);
    methods: registry names; lengths: context tokens; depths: percents; topk, layer: method
    parameters (methods without them ignore them; layer None = the model's default);
    prompt: ``gemfilter`` or ``kamradt-chat``; haystack_dir: None = the Paul Graham essays;
    protocol: ``kamradt`` (clean context) or ``gemfilter-repo`` (the GemFilter repo's special tokens, as
    in the paper's figures); dtype: None (the loader's default) or a torch dtype name, used on an
    accelerator only (fp16 on CPU is slow and poorly supported, so CPU keeps float32 and says so);
    engine: None (generate here) or an OpenAI-compatible engine's URL (select here, generate there)."""

    model: str | None = None
    methods: tuple = ("full", "gemfilter")
    lengths: tuple = PRESETS["cpu-demo"][0]
    depths: tuple = PRESETS["cpu-demo"][1]
    topk: int = 1024
    layer: int | None = None
    prompt: str = "gemfilter"
    max_new_tokens: int = 50
    haystack_dir: str | None = None
    attn: str | None = None  # attention kernel (None: the model's default); exact kernels, so not compared
    protocol: str = "kamradt"
    dtype: str | None = None
    engine: str | None = None
    extra: dict = field(default_factory=dict)  # recorded in config.json, not compared (e.g. preset name)

    def identity(self) -> dict:
        """Settings a finished cell depends on besides its (method, length, depth)."""
        return {"model": self.model, "topk": self.topk, "layer": self.layer, "prompt": self.prompt,
                "max_new_tokens": self.max_new_tokens,
                "haystack_dir": None if self.haystack_dir is None else str(self.haystack_dir),
                "protocol": self.protocol, "dtype": self.dtype, "engine": self.engine}

    def cells(self) -> list:
        return [(m, L, normalize_depth(d)) for m in self.methods for L in self.lengths for d in self.depths]


def validate(config: RunConfig) -> None:
    """Raise ValueError naming the bad setting and what is allowed."""
    from gemfilter.methods import check_names

    check_names(config.methods)
    if config.prompt not in TEMPLATES:
        raise ValueError(f"unknown --prompt {config.prompt!r}; allowed: {', '.join(TEMPLATES)}")
    if config.protocol not in PROTOCOLS:
        raise ValueError(f"unknown --protocol {config.protocol!r}; allowed: {', '.join(PROTOCOLS)}")
    if not config.lengths or not config.depths:
        raise ValueError("the grid is empty: give at least one length and one depth")
    for name, value, low in (("--topk", config.topk, 1), ("--max-new-tokens", config.max_new_tokens, 1)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ValueError(f"{name} must be an int >= {low}, got {value!r}")
    if config.layer is not None and (isinstance(config.layer, bool) or not isinstance(config.layer, int)
                                     or config.layer < 0):
        raise ValueError(f"--layer must be a 0-based int >= 0 (or omitted for the model's default), got {config.layer!r}")


def cell_key(row: dict) -> tuple:
    return row["method"], int(row["length"]), normalize_depth(row["depth"])


def finished_rows(out: Path) -> dict:
    """cell key -> row over the merged file and every shard (first one wins); read under the folder lock."""
    return read_finished(Path(out) / RESULTS, SHARD.format("*"), cell_key, required=ROW_FIELDS,
                         skip_note="that cell will be rerun")


def merge(out: Path, method_order=()) -> list:
    """Write the sorted, de-duplicated rows to results.jsonl (atomically), then drop the shards (under the lock)."""
    rank = {m: i for i, m in enumerate(method_order)}
    return merge_jsonl(Path(out) / RESULTS, SHARD.format("*"), cell_key, required=ROW_FIELDS,
                       sort_key=lambda r: (rank.get(r["method"], len(rank)), r["method"], r["length"], float(r["depth"])))


def run_cell(model, tokenizer, method, case, max_new_tokens: int, generate=None) -> dict:
    """Generate for one prompt with one method: response text, kept tokens, prompt tokens, seconds.

    generate: ``gemfilter.generate`` (the default) or an engine's (``gemfilter.serve.engine.generator``)."""
    import gemfilter

    generate = generate or gemfilter.generate
    start = time.perf_counter()
    enc = tokenizer(case.prompt, return_tensors="pt", add_special_tokens=case.add_special_tokens).to(model.device)
    out = generate(model, enc, method=method, tokenizer=tokenizer, max_new_tokens=max_new_tokens)
    from gemfilter.apply import budget_fields

    text = tokenizer.decode(out.new_tokens[0], skip_special_tokens=True)
    return {"response": text, "kept": int(out.kept[0]), "prompt_tokens": int(enc["input_ids"].shape[1]),
            "seconds": time.perf_counter() - start, **budget_fields(out)}


def check_before_compute(config: RunConfig, model_config) -> dict:
    """Everything that can be checked without the weights: --layer, --lengths and the methods against the
    model, the haystack. Returns {method name: its registry object, not yet resolved against the model}.

    model_config: the model's transformers config. Reading the haystack here (not after the model
    loaded) means a bad --haystack-dir fails in a second, before config.json is written.
    """
    from gemfilter import get_method
    from gemfilter.methods import check_for_model
    from gemfilter.serve.engine import check_engine_methods

    check_against_model(model_config, layer=config.layer, lengths=config.lengths)
    check_engine_methods(config.engine, config.methods)
    methods = {name: get_method(name, layer=config.layer, topk=config.topk) for name in config.methods}
    for method in methods.values():  # e.g. SnapKV on a model whose every layer is windowed
        check_for_model(method, model_config, max(config.lengths))
    read_haystack(config.haystack_dir)
    return methods


def run(config: RunConfig, out, *, state=None, model_and_tokenizer=None, progress: bool = True,
        max_cells: int | None = None):
    """Compute the missing cells of ``config`` into ``out``; return the merged rows (None off the main process).

    state: an accelerate PartialState (default: :func:`make_state`).
    model_and_tokenizer: a loaded (model, tokenizer) pair (default: ``gemfilter.load_model(config.model)``).
    max_cells: compute at most this many missing cells this time (the rest on a later run).
    """
    from gemfilter.apply import resolve
    from gemfilter.models import EMBEDDED_NAME
    from gemfilter.serve.engine import engine_field

    from gemfilter.serve.engine import generator
    from tqdm.auto import tqdm

    validate(config)
    state = state or make_state()
    out = check_out_dir(out, files=(RESULTS, CONFIG))
    model_config = model_config_for(config, model_and_tokenizer)
    check_config(out, config, write=False, model_config=model_config, legacy=LEGACY_IDENTITY)
    unresolved = check_before_compute(config, model_config)
    done = finished_rows(out)
    todo = [c for c in config.cells() if c not in done]
    if max_cells is not None:
        todo = todo[:max_cells]
    if todo:  # the tokenizer alone (seconds): a length too short for the needle fails before the model loads
        from gemfilter.haystack import check_lengths
        from gemfilter.models import load_tokenizer

        tok = model_and_tokenizer[1] if model_and_tokenizer is not None else load_tokenizer(config.model)
        check_lengths(tok, sorted({c[1] for c in todo}), protocol=config.protocol)
    # Everyone has read the finished rows before anyone appends, so all agree on the same todo list.
    state.wait_for_everyone()
    mine = todo[state.process_index::state.num_processes]
    if state.is_main_process and progress:
        cells = config.cells()
        already = sum(c in done for c in cells)
        later = len(cells) - already - len(todo)
        tqdm.write(f"NIAH: {len(cells)} cells, {already} already done, {len(todo)} to compute over "
                   f"{state.num_processes} process(es)" + (f", {later} left for a later run" if later else "")
                   + f" -> {out}")
    if mine:
        model, tok = load_for_run(config, state, model_and_tokenizer, tqdm.write if state.is_main_process else None)
        hay = make_haystack(tok, max(config.lengths), haystack_dir=config.haystack_dir)
        generate = generator(config.engine, tok)
        methods = {m: resolve(model, unresolved[m]) for m in dict.fromkeys(c[0] for c in mine)}
        check_layers(done.values(), methods)
        shard = out / SHARD.format(state.process_index)
        # the first row is coming: pin the setup
        check_config(out, config, write=True, model_config=model_config, legacy=LEGACY_IDENTITY)
        label = config.model or EMBEDDED_NAME
        desc = "NIAH cells" + (f" (process 0 of {state.num_processes})" if state.num_processes > 1 else "")
        bar = tqdm(mine, desc=desc, unit="cell", disable=not (progress and state.is_main_process))
        for name, length, depth in bar:
            case = build_case(tok, length, depth, haystack=hay, template=config.prompt, protocol=config.protocol)
            res = run_cell(model, tok, methods[name], case, config.max_new_tokens, generate)
            row = {"method": name, "length": length, "depth": depth, **res, **score_all(res["response"]),
                   "model": label, "topk": config.topk, "layer": getattr(methods[name], "layer", None),
                   "prompt": config.prompt, "protocol": config.protocol, "dtype": str(model.dtype).replace("torch.", ""),
                   "max_new_tokens": config.max_new_tokens,
                   "attn": model.config._attn_implementation, **engine_field(config.engine),
                   "process": state.process_index}  # which shard computed it (not part of the result)
            append_row(shard, row)
            bar.set_postfix(method=name, L=length, depth=depth, recall=f"{row['recall']:.2f}")
    state.wait_for_everyone()
    if not state.is_main_process:
        return None
    return merge(out, config.methods)
