"""The one run loop (eval/runner.py) with a benchmark that needs no model: units, resume, identity, merge.

The toy benchmark answers each unit with arithmetic, so every expected row is computed here by hand; a
"conversation" unit makes one row holding several turns, as the multi-turn benchmark does.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from types import SimpleNamespace

import pytest

from eval.runner import Benchmark, Unit, run


@dataclass(frozen=True)
class ToyConfig:
    model: str | None = "toy"
    scale: int = 2
    items: tuple = (1, 2, 3)
    turns: int = 3
    attn: str | None = None
    dtype: str | None = None
    engine: str | None = None
    extra: dict = field(default_factory=dict)

    def identity(self) -> dict:
        return {"model": self.model, "scale": self.scale}


class Toy(Benchmark):
    name, noun, required = "Toy", "conversation", ("_id", "turns")

    def __init__(self, config, fail_at=None):
        super().__init__(config)
        self.fail_at, self.calls = fail_at, []

    def validate(self):
        if self.config.scale < 1:
            raise ValueError(f"scale must be >= 1, got {self.config.scale}")

    def units(self, out, state, say):
        return [Unit(f"pred/{'odd' if i % 2 else 'even'}.jsonl", str(i), i) for i in self.config.items]

    def row_key(self, row):
        return row["_id"]

    def start(self, model, tokenizer, done):
        def predict(unit):
            if unit.data == self.fail_at:
                raise KeyboardInterrupt  # a run cut off in the middle
            self.calls.append(unit.data)
            # one row per conversation, each turn's answer depending on the turns before it
            answers, total = [], 0
            for t in range(self.config.turns):
                total += unit.data * self.config.scale + t
                answers.append(total)
            return {"_id": unit.key, "turns": answers}

        return predict


MODEL = (SimpleNamespace(config=SimpleNamespace(), hf_device_map={"": "cpu"}), None)


def expected(i, scale=2, turns=3):
    out, total = [], 0
    for t in range(turns):
        total += i * scale + t
        out.append(total)
    return out


def test_rows_per_file_in_unit_order_and_a_rerun_computes_nothing(tmp_path):
    bench = Toy(ToyConfig(items=(3, 1, 2, 4)))
    merged = run(bench, tmp_path / "out", model_and_tokenizer=MODEL, progress=False)
    assert merged == {
        "pred/odd.jsonl": [{"_id": "3", "turns": expected(3)}, {"_id": "1", "turns": expected(1)}],
        "pred/even.jsonl": [{"_id": "2", "turns": expected(2)}, {"_id": "4", "turns": expected(4)}],
    }
    stored = [json.loads(x) for x in (tmp_path / "out/pred/odd.jsonl").read_text().splitlines()]
    assert stored == merged["pred/odd.jsonl"]
    assert not list((tmp_path / "out/pred").glob("*rank*"))  # shards merged and removed
    assert json.loads((tmp_path / "out/config.json").read_text())["scale"] == 2
    again = Toy(ToyConfig(items=(3, 1, 2, 4)))
    assert run(again, tmp_path / "out", model_and_tokenizer=MODEL, progress=False) == merged and again.calls == []


def test_an_interrupted_run_resumes_with_only_the_missing_units(tmp_path):
    out = tmp_path / "out"
    with pytest.raises(KeyboardInterrupt):
        run(Toy(ToyConfig(items=(1, 2, 3, 4)), fail_at=3), out, model_and_tokenizer=MODEL, progress=False)
    assert (out / "pred/odd.jsonl.rank0").is_file()  # unit 1's row survived in its shard
    rest = Toy(ToyConfig(items=(1, 2, 3, 4)))
    merged = run(rest, out, model_and_tokenizer=MODEL, progress=False)
    assert rest.calls == [3, 4]
    assert [r["turns"] for r in merged["pred/odd.jsonl"]] == [expected(1), expected(3)]


def test_max_units_leaves_the_rest_for_a_later_run(tmp_path, capsys):
    first = Toy(ToyConfig(items=(1, 2, 3)))
    run(first, tmp_path / "out", model_and_tokenizer=MODEL, max_units=2)
    assert first.calls == [1, 2]
    assert (
        "Toy: 3 conversations, 0 already done, 2 to compute over 1 process(es), 1 left for a later run"
        in capsys.readouterr().out
    )
    second = Toy(ToyConfig(items=(1, 2, 3)))
    run(second, tmp_path / "out", model_and_tokenizer=MODEL)
    assert second.calls == [3] and "2 already done, 1 to compute" in capsys.readouterr().out


def test_another_setup_is_refused_and_a_bad_one_writes_nothing(tmp_path):
    out = tmp_path / "out"
    run(Toy(ToyConfig(items=(1,))), out, model_and_tokenizer=MODEL, progress=False)
    with pytest.raises(ValueError, match="holds results of another setup \\(scale: 2 there, 3 now\\)"):
        run(Toy(ToyConfig(items=(1,), scale=3)), out, model_and_tokenizer=MODEL, progress=False)
    with pytest.raises(ValueError, match="scale must be >= 1, got 0"):
        run(Toy(ToyConfig(scale=0)), tmp_path / "fresh", model_and_tokenizer=MODEL, progress=False)
    assert not (tmp_path / "fresh").exists()


def test_a_torn_row_is_recomputed(tmp_path):
    out = tmp_path / "out"
    run(Toy(ToyConfig(items=(1, 3))), out, model_and_tokenizer=MODEL, progress=False)
    path = out / "pred/odd.jsonl"
    path.write_text(path.read_text().splitlines()[0] + "\n" + '{"_id": "3"}\n')  # the second row lost its turns
    again = Toy(ToyConfig(items=(1, 3)))
    with pytest.warns(UserWarning, match="that conversation will be rerun"):
        merged = run(again, out, model_and_tokenizer=MODEL, progress=False)
    assert again.calls == [3] and merged["pred/odd.jsonl"][1]["turns"] == expected(3)


def test_a_file_no_unit_has_reached_is_not_written(tmp_path):
    merged = run(Toy(ToyConfig(items=(1, 2))), tmp_path / "out", model_and_tokenizer=MODEL, progress=False, max_units=1)
    assert list(merged) == ["pred/odd.jsonl"] and not (tmp_path / "out/pred/even.jsonl").exists()
