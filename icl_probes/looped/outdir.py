"""Output folders that resume: the config is pinned in config.json, so a rerun continues the same run.

A rerun with a different config into the same folder would mix rows from two experiments; it is
refused with a message that names the fields that differ.
"""

from __future__ import annotations

from pathlib import Path

from icl_probes.common import as_stored
from icl_probes.io import check_out_dir, read_json, write_json


def prepare_out(out, cfg, kind: str) -> Path:
    """Create ``out`` and pin ``cfg`` there; raise ValueError if it already holds another config.

    ``device`` is not part of the pin: a run may start on a GPU and resume on the CPU.
    """
    out = check_out_dir(Path(out))
    want = {"experiment": kind, **{k: v for k, v in as_stored(cfg).items() if k != "device"}}
    path = out / "config.json"
    if path.exists():
        have = read_json(path, "run config")
        if have != want:
            diff = sorted(k for k in set(have) | set(want) if have.get(k) != want.get(k))
            raise ValueError(
                f"{out} already holds a run with another config (differs in: {', '.join(diff)}); "
                "rerun with the same options to resume, or pick a new --out"
            )
    else:
        write_json(path, want)
    return out
