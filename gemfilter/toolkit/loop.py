"""The one row loop: every command that appends result rows computes its missing units here.

Its users: :func:`eval.runner.run` (NIAH, LongBench, RULER, SCBench: sharded, merged, resumed by a folder's
identity); ``gemfilter bench`` locally, with ``--engine`` and with ``--turns``, and the lab's conversation and
decode benches (one JSONL file whose rows carry their settings); the probes (:func:`every_row`). Each says what a
unit is and which are done; the loop owns the rest, the same for all:

- the units still to compute (:func:`missing`), in the order given;
- the progress bar, with each command's postfix;
- each unit's rows written as soon as they are computed (by the command's ``write``: an appended, fsynced JSONL
  line), so that an interrupted run loses at most the unit in progress and a rerun computes only the rest.

Nothing here imports torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Hashable, Iterable


@dataclass(frozen=True)
class Unit:
    """One unit of work, which makes the rows of one result.

    file: its result file, relative to the run folder (``results.jsonl``, ``pred/gemfilter/qasper.jsonl``);
    key: its resume key in that file (the key a stored row of it gives); data: what computing it needs (a record,
    a prepared sample, a route); not compared.
    """

    file: str
    key: Hashable
    data: Any = field(default=None, compare=False, hash=False)


def stored_rows(path, setting: dict, required: tuple = ()) -> list:
    """The rows of the JSONL file ``path`` made with ``setting`` (each of its keys equal); [] when there is no file.
    required: fields a row must hold (else it is skipped with a warning, and its unit computed again)."""
    from .io import read_jsonl

    return [r for r in read_jsonl(path, required=required) if all(r.get(k) == v for k, v in setting.items())]


def missing(units: Iterable[Unit], done: dict) -> list:
    """The units whose key is not among ``done[unit.file]`` (``done``: {file: keys of stored rows}), in order."""
    return [u for u in units if u.key not in done.get(u.file, ())]


def compute(
    units: list,
    predict: Callable[[Unit], Any],
    write: Callable[[Unit, Any], None],
    *,
    desc: str,
    noun: str,
    progress: bool = True,
    postfix: Callable[[Unit, Any], dict] | None = None,
) -> list:
    """Compute ``units`` one after another; return their results in order.

    predict: a unit's result (a row, or the rows of one cell), or None when it has none to store (a failed cell
    that the command goes past: it stays missing, so a rerun tries it again); write: stores a result at once;
    desc, noun: the progress bar's title and unit; progress: show the bar; postfix: what the bar shows after a unit.
    An exception in ``predict`` or ``write`` ends the loop: the results written before it stay.
    """
    from tqdm.auto import tqdm

    results = []
    bar = tqdm(units, desc=desc, unit=noun, disable=not progress)
    try:
        for unit in bar:
            result = predict(unit)
            if result is None:
                continue
            write(unit, result)
            results.append(result)
            if postfix is not None:
                bar.set_postfix(**postfix(unit, result))
    finally:
        bar.close()
    return results


def every_row(
    keys: list, done: dict, predict: Callable[[Hashable], dict], append=None, *, desc: str, noun: str, progress: bool
) -> list:
    """The row of every key, in order: a stored one (``done``: {key: row}) as it is, a missing one computed by
    ``predict(key)`` on :func:`compute` and stored at once by ``append(row)`` (None: kept in memory only)."""
    new = {}

    def write(unit: Unit, row: dict) -> None:
        new[unit.key] = row
        if append is not None:
            append(row)

    units = missing([Unit("rows", key) for key in keys], {"rows": done})
    compute(units, lambda unit: predict(unit.key), write, desc=desc, noun=noun, progress=progress)
    return [done[key] if key in done else new[key] for key in keys]
