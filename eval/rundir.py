"""Run-folder parts of the one run loop (:mod:`eval.runner`) and of the scorers (``--out`` of each benchmark).

What it holds:

- the setup identity: ``config.json`` (:data:`CONFIG`) records the settings that change answers
  (a runner config's ``identity()`` plus the model's ``gemfilter_changes``), written atomically just
  before the first row; a resume with other settings is refused (:func:`check_config`,
  :func:`read_config`), so one folder never mixes two setups;
- the folder lock (``gemfilter.toolkit.io.folder_lock``), taken by every append, read and merge below, so two
  runs sharing one ``--out`` lose no row;
- shards of several processes: process i appends its rows, fsynced, to its own shard
  (:func:`append_row`); the loop merges them (``gemfilter.toolkit.io.merge_jsonl``) when every process has finished;
- resume of finished rows: a rerun reads the result file and every shard first (:func:`read_finished`)
  and computes only what is missing;
- loading for a run: :func:`make_state` (accelerate's PartialState), :func:`model_config_for` (the
  config options are checked against before any weights load), :func:`load_for_run`;
- :func:`check_layers` (a resume must not mix filter layers) and :func:`print_report` (the CLIs' output).

Shard names differ between the two layouts: NIAH keeps one ``results.jsonl`` per folder with shards
``results.rank{i}.jsonl`` (defined in ``eval.niah.runner``); LongBench and RULER keep one
``<task>.jsonl`` per method folder with shards :data:`TASK_SHARD` (``<task>.jsonl.rank{i}``).
The benchmark-specific parts (row key, required fields, format defaults) come from each benchmark.
"""

from __future__ import annotations

import os
import warnings
from contextlib import nullcontext
from pathlib import Path

from gemfilter.toolkit.io import append_jsonl, folder_lock, read_json_object, read_jsonl, write_json_atomic

CONFIG = "config.json"
#: Process i's shard of ``<task>.jsonl`` (LongBench, RULER). It does not end in "jsonl", so the
#: official eval.py and our scorers skip shards.
TASK_SHARD = "{}.jsonl.rank{}"
#: The config.json format grew by keys: a key every benchmark added, missing from a stored config.json written
#: before it, means this value. A runner adds its own such keys (``format_defaults``).
FORMAT_DEFAULTS = {"dtype": None, "model_changes": [], "engine": None}


def read_config(out: Path) -> dict | None:
    """The stored config.json of ``out`` (None if there is none); CorruptFileError says how to recover."""
    path = Path(out) / CONFIG
    if not path.is_file():
        return None
    return read_json_object(
        path,
        "run config",
        fix=f"Delete {path} and rerun with the settings of the run that "
        "made this folder (a rerun with the same settings resumes it), or use another --out",
    )


def check_config(out: Path, config, write: bool, *, model_config, format_defaults: dict | None = None) -> None:
    """Refuse a folder holding results of another setup; record this setup if ``write`` (under the lock).

    out: the run folder; config: a runner config with ``identity()`` (the compared settings) and
    ``extra`` (recorded, not compared); write: write config.json if there is none (the first row is coming).
    model_config: the transformers config the run uses (:func:`model_config_for`), or None. Its
    ``gemfilter_changes`` (such as Phi 3.5's dropped window, which changes what SnapKV/H2O evict) are
    part of the setup; a stored config.json without ``model_changes`` is read as having none, so rows of a
    changed model are not mixed with them.
    format_defaults: the benchmark's own settings a stored config.json may lack, with the value a missing key means
    (on top of :data:`FORMAT_DEFAULTS`).
    """
    path = out / CONFIG
    new = {**config.identity(), "model_changes": list(getattr(model_config, "gemfilter_changes", None) or [])}
    with folder_lock(out) if write else nullcontext():
        stored = read_config(out)
        if stored is not None:
            saved = {**FORMAT_DEFAULTS, **(format_defaults or {}), **stored}
            old = {k: v for k, v in saved.items() if k in new}
            if "model" in old and same_model(old["model"], new.get("model")):
                old["model"] = new["model"]  # one folder named by a relative and an absolute path
            if old != new:
                diff = ", ".join(f"{k}: {old.get(k)!r} there, {new[k]!r} now" for k in new if old.get(k) != new[k])
                raise ValueError(
                    f"--out {out} holds results of another setup ({diff}). Use another --out, "
                    "or repeat the same settings to resume that run."
                )
        elif write:
            write_json_atomic(path, {**new, **config.extra})


def same_model(a, b) -> bool:
    """Whether two ``--model`` values name one model: the same text, or one local folder (by relative and absolute
    paths, or through a link). A relative path is read against the current folder, as the loader reads it."""
    if a == b:
        return True
    if not (isinstance(a, str) and isinstance(b, str)):
        return False
    pa, pb = Path(a).expanduser(), Path(b).expanduser()
    return pa.exists() and pb.exists() and pa.resolve() == pb.resolve()


def check_layers(rows, methods: dict) -> None:
    """Refuse to mix filter layers within a method. With --layer omitted the layer is the model's
    default, which a calibration (``gemfilter calibrate``) can change between a run and its resume.

    rows: finished rows, each with ``method`` (the name in ``methods``) and ``layer``;
    methods: {name: resolved method object}, whose ``layer`` (if any) this run uses.
    """
    for name, method in methods.items():
        new = method.layer
        old = sorted({r.get("layer") for r in rows if r["method"] == name} - {new}, key=str)
        if old:
            raise ValueError(
                f"finished {name} cells used filter layer {old[0]}, but this run resolves to layer {new} "
                f"(the model's default changed?). Pass --layer {old[0]} to resume, or use another --out."
            )


def append_row(path: Path, row: dict, *, ensure_ascii: bool = True) -> None:
    """Append one row to a shard (flushed, fsynced) under the folder lock that the merges also take.

    ensure_ascii: as ``json.dumps``'s (RULER writes its rows with False, as RULER does)."""
    append_jsonl(path, row, ensure_ascii=ensure_ascii)


def read_finished(target: Path, shard_pattern: str, key, *, required=(), skip_note: str) -> dict:
    """key(row) -> row over the result file ``target`` and its shards (first one wins), under the folder lock.

    shard_pattern: a glob of the shards in ``target``'s folder; key: a row's resume key; required: fields
    a row must hold, else it is skipped with a warning ending in ``skip_note``, so it is recomputed.
    A folder that does not exist yet holds no rows.
    """
    folder = Path(target).parent
    rows = {}
    if not folder.is_dir():
        return rows
    with folder_lock(folder):
        for path in [Path(target)] + sorted(folder.glob(shard_pattern)):
            for row in read_jsonl(path, required=required, skip_note=skip_note):
                rows.setdefault(key(row), row)
    return rows


def task_names(folder: Path) -> set:
    """The task names with rows in ``folder``: ``<task>.jsonl`` files and pending shards ``<task>.jsonl.rank<i>``."""
    return {
        p.name.split(".jsonl")[0]
        for p in Path(folder).glob("*.jsonl*")
        if p.name.endswith(".jsonl") or ".jsonl.rank" in p.name
    }


def rows_to_score(path, read, key, required=()) -> list:
    """The rows a scorer counts for one task: ``<task>.jsonl`` and its unmerged shards, each unit once.

    path: the merged ``<task>.jsonl`` (it may not exist); read: the scorer's strict reader of that file;
    key: row -> the unit's key (None: a row without one, kept as is); required: fields a shard row must hold.
    Shards are what an interrupted run left: their rows are scored too, with a warning (a torn last line is
    skipped), so a killed run is not reported as having no predictions. Rows repeating a key are dropped
    with a warning: a sample counted twice would move the score.
    """
    path = Path(path)
    rows = read(path) if path.is_file() else []
    shards = sorted(path.parent.glob(TASK_SHARD.format(path.name[: -len(".jsonl")], "*")))
    pending = [
        r for shard in shards for r in read_jsonl(shard, required=required, skip_note="that sample is not scored")
    ]
    if pending:
        warnings.warn(
            f"{path.parent}: {len(pending)} row(s) of {path.stem} are in unmerged shards "
            f"({', '.join(s.name for s in shards)}), left by an interrupted run; they are scored with the "
            "merged rows. Rerun the same `run` command to finish and merge them"
        )
    seen, out, repeats = set(), [], 0
    for row in rows + pending:
        k = key(row)
        if k is not None and k in seen:
            repeats += 1
            continue
        seen.add(k)
        out.append(row)
    if repeats:
        warnings.warn(
            f"{path}: {repeats} row(s) repeat a sample already there (same key); each sample is scored "
            "once, from its first row"
        )
    return out


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

    return (
        model_and_tokenizer[0].config if model_and_tokenizer is not None else gemfilter.models.load_config(config.model)
    )


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


def print_report(paths) -> int:
    """Print the markdown report(s) among ``paths`` and where each file went; exit status 0."""
    for path in paths:
        if path.suffix == ".md":
            print(path.read_text(encoding="utf-8"))
    print("wrote " + ", ".join(str(p) for p in paths))
    return 0
