"""NIAH grid runner: one JSONL row per (method, length, depth) cell, resumable and shardable.

Files in the output folder:

- ``config.json``: the settings that change answers (model, topk, layer, prompt, max_new_tokens,
  haystack), written (atomically) just before the first row, so a run that fails its checks leaves
  the folder free. A rerun with other such settings is refused, so one folder never mixes two setups.
- ``results.rank{i}.jsonl``: rows appended by process i as each cell finishes (flushed and fsynced),
  so an interrupted run loses at most the cell in flight.
- ``results.jsonl``: the merged rows, sorted by (method, length, depth); written atomically by the
  main process after all processes finish, after which the shards are removed.

Appends and merges take the folder's lock (``gemfilter.toolkit.io``), so two runs sharing one ``--out`` lose
no row: a merge either reads a concurrent append or leaves it in a fresh shard.

A (re)run reads every finished row first (merged file and shards), so only missing cells are
computed. Under ``accelerate launch`` / ``torchrun`` the missing cells are dealt round-robin over
processes (``PartialState.process_index`` / ``num_processes``). Greedy decoding makes every cell a
pure function of its inputs, so the merged file equals a single-process run's (except ``seconds``).

The loop (config.json identity, lock, shards, resume, merge, model loading) is :mod:`eval.runner`'s,
shared with LongBench and RULER; this module supplies NIAH's cells, file names, row key and format defaults
(:class:`Niah`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from eval.runner import Benchmark, Unit, finished
from eval.runner import RunConfig as BaseRunConfig
from eval.runner import merge as merge_units
from eval.runner import run as run_units
from gemfilter.toolkit.options import check_against_model

from .grid import PRESETS, normalize_depth
from .haystack import PROTOCOLS, TEMPLATES, build_case, make_haystack, read_haystack
from .scoring import score_all

#: NIAH settings added after folders were written without them: a missing key means this value
#: (settings every benchmark added are ``eval.rundir.FORMAT_DEFAULTS``).
FORMAT_DEFAULTS = {"protocol": "kamradt"}
RESULTS = "results.jsonl"
#: Process i's shard of results.jsonl (LongBench and RULER name theirs ``eval.rundir.TASK_SHARD``).
SHARD = "results.rank{}.jsonl"
#: Fields every stored row has; a row without them (or a null row) is skipped and its cell recomputed.
ROW_FIELDS = ("method", "length", "depth", "response", "recall", "rouge1", "hit", "kept", "prompt_tokens", "seconds")


@dataclass(frozen=True)
class RunConfig(BaseRunConfig):
    """One NIAH experiment: :class:`eval.runner.RunConfig`'s fields (each method's label is its rows' ``method``;
    ``topk`` / ``layer`` are ignored by methods without them), and:

    lengths: context tokens; depths: percents; prompt: ``gemfilter`` or ``kamradt-chat``; max_new_tokens: the
    answer's length; haystack_dir: None = the Paul Graham essays; protocol: ``kamradt`` (clean context) or
    ``gemfilter-repo`` (the GemFilter repo's special tokens, as in the paper's figures). The dtype is used on an
    accelerator only (fp16 on CPU is slow and poorly supported, so CPU keeps float32 and says so)."""

    lengths: tuple = PRESETS["cpu-demo"][0]
    depths: tuple = PRESETS["cpu-demo"][1]
    prompt: str = "gemfilter"
    max_new_tokens: int = 50
    haystack_dir: str | None = None
    protocol: str = "kamradt"

    def identity(self) -> dict:
        """Settings a finished cell depends on besides its (method, length, depth)."""
        return {
            "model": self.model,
            "topk": self.topk,
            "layer": self.layer,
            "prompt": self.prompt,
            "max_new_tokens": self.max_new_tokens,
            "haystack_dir": None if self.haystack_dir is None else str(self.haystack_dir),
            "protocol": self.protocol,
            "dtype": self.dtype,
            "engine": self.engine,
        }

    def cells(self) -> list:
        return [(m, L, normalize_depth(d)) for m in self.labels for L in self.lengths for d in self.depths]


def validate(config: RunConfig) -> None:
    """Raise ValueError naming the bad setting and what is allowed."""
    if config.prompt not in TEMPLATES:
        raise ValueError(f"unknown --prompt {config.prompt!r}; allowed: {', '.join(TEMPLATES)}")
    if config.protocol not in PROTOCOLS:
        raise ValueError(f"unknown --protocol {config.protocol!r}; allowed: {', '.join(PROTOCOLS)}")
    if not config.lengths or not config.depths:
        raise ValueError("the grid is empty: give at least one length and one depth")
    value = config.max_new_tokens
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"--max-new-tokens must be an int >= 1, got {value!r}")


def cell_key(row: dict) -> tuple:
    return row["method"], int(row["length"]), normalize_depth(row["depth"])


def run_cell(model, tokenizer, method, case, max_new_tokens: int, generate=None) -> dict:
    """Generate for one prompt with one method: response text, kept tokens, prompt tokens, seconds.

    generate: ``gemfilter.generate`` (the default) or an engine's (``gemfilter.toolkit.serving.engine.generator``)."""
    import gemfilter

    generate = generate or gemfilter.generate
    start = time.perf_counter()
    enc = tokenizer(case.prompt, return_tensors="pt", add_special_tokens=case.add_special_tokens).to(model.device)
    out = generate(model, enc, method=method, tokenizer=tokenizer, max_new_tokens=max_new_tokens)
    from gemfilter.apply import budget_fields

    text = tokenizer.decode(out.new_tokens[0], skip_special_tokens=True)
    return {
        "response": text,
        "kept": int(out.kept[0]),
        "prompt_tokens": int(enc["input_ids"].shape[1]),
        "seconds": time.perf_counter() - start,
        **budget_fields(out),
    }


class Niah(Benchmark):
    """The NIAH grid on :func:`eval.runner.run`: one unit per (method, length, depth) cell, in results.jsonl."""

    name, noun, required, format_defaults, ensure_ascii, record_process = (
        "NIAH",
        "cell",
        ROW_FIELDS,
        FORMAT_DEFAULTS,
        True,
        True,
    )

    def validate(self) -> None:
        validate(self.config)

    def check(self, model_config) -> None:
        """--layer, --lengths and the methods against the model; the haystack (a bad --haystack-dir fails in a
        second, before config.json is written)."""
        config = self.config
        check_against_model(model_config, layer=config.layer, lengths=config.lengths)
        self.check_methods(model_config, lambda spec: (max(config.lengths),))
        read_haystack(config.haystack_dir)

    def units(self, out, state, say) -> list:
        return [Unit(RESULTS, cell) for cell in self.config.cells()]

    def row_key(self, row: dict) -> tuple:
        return cell_key(row)

    def shard_name(self, file: str, rank) -> str:
        return SHARD.format(rank)

    def sort_key(self, file: str, units: list):
        rank = {m: i for i, m in enumerate(self.config.labels)}
        return lambda r: (rank.get(r["method"], len(rank)), r["method"], r["length"], float(r["depth"]))

    def before_load(self, todo: list, tokenizer) -> None:
        """A length too short for the needle fails on the tokenizer alone, before the model loads."""
        from gemfilter.toolkit.haystack import check_lengths

        check_lengths(tokenizer, sorted({u.key[1] for u in todo}), protocol=self.config.protocol)

    def start(self, model, tok, done: dict):
        from gemfilter.models import EMBEDDED_NAME
        from gemfilter.toolkit.serving.engine import engine_field

        config = self.config
        hay = make_haystack(tok, max(config.lengths), haystack_dir=config.haystack_dir)
        generate = self.generator(tok)
        methods = self.build_methods(model, done[RESULTS].values())
        fixed = {
            "model": config.model or EMBEDDED_NAME,
            "prompt": config.prompt,
            "protocol": config.protocol,
            "dtype": str(model.dtype).replace("torch.", ""),
            "max_new_tokens": config.max_new_tokens,
            "attn": model.config._attn_implementation,
            **engine_field(config.engine),
        }

        def predict(unit: Unit) -> dict:
            name, length, depth = unit.key
            case = build_case(tok, length, depth, haystack=hay, template=config.prompt, protocol=config.protocol)
            res = run_cell(model, tok, methods[name], case, config.max_new_tokens, generate)
            return {
                "method": name,
                "length": length,
                "depth": depth,
                **res,
                **score_all(res["response"]),
                "topk": config.topk if methods[name].topk is None else methods[name].topk,
                "layer": methods[name].layer,
                **fixed,
            }

        return predict

    def postfix(self, unit: Unit, row: dict) -> dict:
        return {"method": row["method"], "L": row["length"], "depth": row["depth"], "recall": f"{row['recall']:.2f}"}


def finished_rows(out: Path) -> dict:
    """cell key -> row over the merged file and every shard (first one wins); read under the folder lock."""
    return finished(Niah(RunConfig()), Path(out), [RESULTS])[RESULTS]


def merge(out: Path, method_order=()) -> list:
    """Write the sorted, de-duplicated rows to results.jsonl (atomically), then drop the shards (under the lock)."""
    config = RunConfig(methods=tuple(method_order))
    return merge_units(Niah(config), Path(out), [Unit(RESULTS, None)]).get(RESULTS, [])


def run(
    config: RunConfig, out, *, state=None, model_and_tokenizer=None, progress: bool = True, max_cells: int | None = None
):
    """Compute the missing cells of ``config`` into ``out`` (:func:`eval.runner.run`); return the merged rows
    (None off the main process).

    state: an accelerate PartialState (default: :func:`eval.rundir.make_state`).
    model_and_tokenizer: a loaded (model, tokenizer) pair (default: ``gemfilter.load_model(config.model)``).
    max_cells: compute at most this many missing cells this time (the rest on a later run).
    """
    from gemfilter.models import load_tokenizer

    merged = run_units(
        Niah(config, lambda: load_tokenizer(config.model)),
        out,
        state=state,
        model_and_tokenizer=model_and_tokenizer,
        progress=progress,
        max_units=max_cells,
    )
    return None if merged is None else merged.get(RESULTS, [])
