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
"""

from __future__ import annotations

import os
import time
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path

from gemfilter.io import (append_jsonl, check_against_model, check_out_dir, folder_lock, merge_jsonl,
                          read_json_object, read_jsonl, write_json_atomic)

from .grid import PRESETS, normalize_depth
from .haystack import PROTOCOLS, TEMPLATES, build_case, make_haystack, read_haystack
from .scoring import score_all

#: Settings added after folders were written without them: a missing key means this value
#: (LongBench's runner shares :func:`check_config`, hence its method_max_length).
LEGACY_IDENTITY = {"protocol": "kamradt", "dtype": None, "method_max_length": {}, "model_changes": [], "engine": None}
RESULTS = "results.jsonl"
CONFIG = "config.json"
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
    """key -> row over the merged file and every shard (first one wins); read under the folder lock."""
    rows = {}
    with folder_lock(out):
        for path in [out / RESULTS] + sorted(out.glob(SHARD.format("*"))):
            for row in read_jsonl(path, required=ROW_FIELDS, skip_note="that cell will be rerun"):
                rows.setdefault(cell_key(row), row)
    return rows


def read_config(out: Path) -> dict | None:
    """The stored config.json of ``out`` (None if there is none); CorruptFileError says how to recover."""
    path = Path(out) / CONFIG
    if not path.is_file():
        return None
    return read_json_object(path, "run config", fix=f"Delete {path} and rerun with the settings of the run that "
                            "made this folder (a rerun with the same settings resumes it), or use another --out")


def check_config(out: Path, config: RunConfig, write: bool, *, model_config) -> None:
    """Refuse a folder holding results of another setup; record this setup if ``write`` (under the lock).

    model_config: the transformers config the run uses (:func:`model_config_for`), or None. Its
    ``gemfilter_changes`` (such as Phi 3.5's dropped window, which changes what SnapKV/H2O evict) are
    part of the setup; a folder from before a change reads as having none, so its rows are not mixed in.
    """
    path = out / CONFIG
    new = {**config.identity(), "model_changes": list(getattr(model_config, "gemfilter_changes", None) or [])}
    with folder_lock(out) if write else nullcontext():
        stored = read_config(out)
        if stored is not None:
            saved = {**LEGACY_IDENTITY, **stored}
            old = {k: v for k, v in saved.items() if k in new}
            if old != new:
                diff = ", ".join(f"{k}: {old.get(k)!r} there, {new[k]!r} now" for k in new if old.get(k) != new[k])
                raise ValueError(f"--out {out} holds results of another setup ({diff}). Use another --out, "
                                 "or repeat the same settings to resume that run.")
        elif write:
            write_json_atomic(path, {**new, **config.extra})


def merge(out: Path, method_order=()) -> list:
    """Write the sorted, de-duplicated rows to results.jsonl (atomically), then drop the shards (under the lock)."""
    rank = {m: i for i, m in enumerate(method_order)}
    return merge_jsonl(Path(out) / RESULTS, SHARD.format("*"), cell_key, required=ROW_FIELDS,
                       sort_key=lambda r: (rank.get(r["method"], len(rank)), r["method"], r["length"], float(r["depth"])))


def check_layers(rows, methods: dict) -> None:
    """Refuse to mix filter layers within a method. With --layer omitted the layer is the model's
    default, which a calibration (``gemfilter calibrate``) can change between a run and its resume."""
    for name, method in methods.items():
        new = getattr(method, "layer", None)
        old = sorted({r.get("layer") for r in rows if r["method"] == name} - {new}, key=str)
        if old:
            raise ValueError(f"finished {name} cells used filter layer {old[0]}, but this run resolves to layer {new} "
                             f"(the model's default changed?). Pass --layer {old[0]} to resume, or use another --out.")


def make_state():
    """accelerate's PartialState. Without an accelerator it must be told cpu=True, or processes
    started by torchrun / ``accelerate launch --multi_gpu`` would each think they run alone."""
    import torch
    from accelerate import PartialState

    has_acc = torch.accelerator.is_available() if hasattr(torch, "accelerator") else torch.cuda.is_available()
    cpu = not has_acc or os.environ.get("ACCELERATE_USE_CPU", "").lower() in ("1", "true", "yes")
    return PartialState(cpu=cpu)


def model_config_for(config, model_and_tokenizer=None):
    """The transformers config that options are checked against before any weights load: the loaded
    model's, else ``gemfilter.models.load_config(config.model)`` (the config file only)."""
    import gemfilter

    return model_and_tokenizer[0].config if model_and_tokenizer is not None \
        else gemfilter.models.load_config(config.model)


def load_for_run(config, state, model_and_tokenizer=None, say=None) -> tuple:
    """(model, tokenizer) for an eval run (NIAH, LongBench, RULER), on this process's device.

    config: a runner config with ``model``, ``attn`` and ``dtype``; state: accelerate's
    PartialState; model_and_tokenizer: a loaded pair, used as given; say: where the dtype note goes.
    A model placed by ``device_map`` (``hf_device_map`` set) is not moved.
    """
    import gemfilter
    from gemfilter.models import resolve_dtype

    if model_and_tokenizer is not None:
        return model_and_tokenizer
    dtype, note = resolve_dtype(config.dtype, state.device)
    if note and say:
        say(note)
    model, tok = gemfilter.load_model(config.model, attn=config.attn, dtype=dtype)
    if getattr(model, "hf_device_map", None) is None:
        model.to(state.device)
    return model, tok


def run_cell(model, tokenizer, method, case, max_new_tokens: int, generate=None) -> dict:
    """Generate for one prompt with one method: response text, kept tokens, prompt tokens, seconds.

    generate: ``gemfilter.generate`` (the default) or an engine's (``gemfilter.serve.engine.generator``)."""
    import gemfilter

    generate = generate or gemfilter.generate
    start = time.perf_counter()
    enc = tokenizer(case.prompt, return_tensors="pt", add_special_tokens=case.add_special_tokens).to(model.device)
    out = generate(model, enc, method=method, tokenizer=tokenizer, max_new_tokens=max_new_tokens)
    text = tokenizer.decode(out.new_tokens[0], skip_special_tokens=True)
    return {"response": text, "kept": int(out.kept[0]), "prompt_tokens": int(enc["input_ids"].shape[1]),
            "seconds": time.perf_counter() - start}


def append_row(path: Path, row: dict) -> None:
    """Append one row (fsynced) under the folder lock that :func:`merge` also takes."""
    append_jsonl(path, row)


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
    from gemfilter.serve.engine import engine_field, generator
    from tqdm.auto import tqdm

    validate(config)
    state = state or make_state()
    out = check_out_dir(out, files=(RESULTS, CONFIG))
    model_config = model_config_for(config, model_and_tokenizer)
    check_config(out, config, write=False, model_config=model_config)
    unresolved = check_before_compute(config, model_config)
    done = finished_rows(out)
    todo = [c for c in config.cells() if c not in done]
    if max_cells is not None:
        todo = todo[:max_cells]
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
        check_config(out, config, write=True, model_config=model_config)  # the first row is coming: pin the setup
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
