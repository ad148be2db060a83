"""NIAH runner on a tiny random Llama with an offline word tokenizer: rows, resume, grids, reports, CLI."""

import json

import pytest
from niah_fixtures import word_tokenizer, write_haystack
from tiny_models import BUILDERS

from eval.niah import runner
from eval.niah.cli import main
from eval.niah.grid import PRESETS, parse_depths, parse_lengths, resolve_grid
from eval.niah.runner import RunConfig, run
from eval.niah.scoring import score_all
from gemfilter.toolkit.io import read_jsonl

LENGTHS, DEPTHS = (240, 260), (0, 50, 100)  # >= 200 buffer + 22 needle tokens


@pytest.fixture(scope="module")
def tiny():
    return BUILDERS["llama"](), word_tokenizer()


@pytest.fixture
def config(tmp_path):
    return RunConfig(
        model="tiny",
        methods=("full", "gemfilter"),
        lengths=LENGTHS,
        depths=DEPTHS,
        topk=40,
        layer=2,
        max_new_tokens=3,
        haystack_dir=str(write_haystack(tmp_path / "hay")),
    )


def strip(rows):
    """Rows without what legitimately differs between runs (timing, which process ran the cell)."""
    return [{k: v for k, v in r.items() if k not in ("seconds", "process")} for r in rows]


def test_presets_are_the_published_grids():
    kl, kd, _ = PRESETS["kamradt"]
    assert (len(kl), kl[0], kl[1], kl[-1]) == (35, 1000, 1441, 16000)  # 1000 + 15000/34 = 1441.2
    assert (len(kd), kd[0], kd[1], kd[-1]) == (35, 0, 3, 100)  # 100/34 = 2.94
    gl, gd, _ = PRESETS["gemfilter-paper"]
    assert (len(gl), gl[0], gl[1], gl[-1]) == (40, 1000, 4256, 128000)  # 1000 + 127000/39 = 4256.4
    assert gd == (0, 11, 22, 33, 44, 56, 67, 78, 89, 100)
    assert PRESETS["cpu-demo"][:2] == ((1000, 2000, 4000, 8000), (0, 25, 50, 75, 100))


def test_grid_parsing_and_errors():
    assert parse_lengths("4k, 1000,2K,1000") == (1000, 2000, 4000)
    assert parse_depths("100,0,12.5,50.0") == (0, 12.5, 50, 100)
    assert resolve_grid("cpu-demo", depths="10") == ((1000, 2000, 4000, 8000), (10,))
    for bad, msg in [
        ("1000,abc", "'abc' is not a number"),
        ("0", "positive whole number"),
        (",", "is empty"),
        ("1.5", "positive whole number"),
    ]:
        with pytest.raises(ValueError, match=msg):
            parse_lengths(bad)
    with pytest.raises(ValueError, match=r"'101' is outside \[0, 100\]"):
        parse_depths("50,101")
    with pytest.raises(ValueError, match="unknown preset 'big'; allowed: kamradt, gemfilter-paper, cpu-demo"):
        resolve_grid("big")


def test_one_row_per_cell_with_scores_and_kept_tokens(tiny, config, tmp_path):
    rows = run(config, tmp_path / "out", model_and_tokenizer=tiny, progress=False)
    assert [(r["method"], r["length"], r["depth"]) for r in rows] == config.cells()  # 2 x 2 x 3, in order
    for r in rows:
        assert r["recall"] == score_all(r["response"])["recall"] and r["rouge1"] == score_all(r["response"])["rouge1"]
        # The prompt is the context (L - 200 tokens) plus the template's 40 word tokens: <| im_start |>
        # This is a very long story book : < book > | </ book >. Based on the content of the book ,
        # Question : What is the best thing to do in San Francisco ? Answer :
        assert r["prompt_tokens"] == r["length"] - 200 + 40
        assert r["kept"] == (r["prompt_tokens"] if r["method"] == "full" else 40)
        assert r["layer"] == (2 if r["method"] == "gemfilter" else None)
        assert r["seconds"] > 0 and r["max_new_tokens"] == 3 and r["model"] == "tiny"
    assert json.loads((tmp_path / "out" / "config.json").read_text())["topk"] == 40
    assert list((tmp_path / "out").glob("results.rank*.jsonl")) == []  # merged, shards removed


def test_interrupted_run_resumes_with_only_the_missing_cells(tiny, config, tmp_path, monkeypatch):
    out = tmp_path / "out"
    real = runner.run_cell
    calls = []

    def stop_after_five(model, tok, method, case, n, *generate):
        if len(calls) == 5:
            raise KeyboardInterrupt  # as if the user pressed Ctrl-C in the sixth cell
        calls.append(case.prompt)
        return real(model, tok, method, case, n, *generate)

    monkeypatch.setattr(runner, "run_cell", stop_after_five)
    with pytest.raises(KeyboardInterrupt):
        run(config, out, model_and_tokenizer=tiny, progress=False)
    first = read_jsonl(out / "results.rank0.jsonl")
    assert len(first) == 5 and not (out / "results.jsonl").exists()

    computed = []

    def counting(model, tok, method, case, n, *generate):
        computed.append(1)
        return real(model, tok, method, case, n, *generate)

    monkeypatch.setattr(runner, "run_cell", counting)
    rows = run(config, out, model_and_tokenizer=tiny, progress=False)
    assert len(computed) == 12 - 5
    assert rows[:5] == first  # the finished cells were kept as they were (same seconds: not rerun)
    monkeypatch.setattr(runner, "run_cell", real)
    straight = run(config, tmp_path / "straight", model_and_tokenizer=tiny, progress=False)
    assert strip(rows) == strip(straight)


def test_a_row_cut_short_by_a_kill_is_recomputed(tiny, config, tmp_path):
    out = tmp_path / "out"
    run(config, out, model_and_tokenizer=tiny, progress=False, max_cells=3)
    lines = (out / "results.jsonl").read_text().splitlines()
    (out / "results.jsonl").write_text("\n".join(lines[:2]) + "\n")
    (out / "results.rank0.jsonl").write_text(lines[2][:40])  # a half-written line, no newline
    with pytest.warns(UserWarning, match="skipping an incomplete row"):
        rows = run(config, out, model_and_tokenizer=tiny, progress=False)
    assert len(rows) == 12 and [(r["method"], r["length"], r["depth"]) for r in rows] == config.cells()


def test_max_cells_then_the_rest(tiny, config, tmp_path):
    out = tmp_path / "out"
    assert len(run(config, out, model_and_tokenizer=tiny, progress=False, max_cells=4)) == 4
    assert len(run(config, out, model_and_tokenizer=tiny, progress=False)) == 12


def test_another_setup_in_the_same_folder_is_refused(tiny, config, tmp_path):
    out = tmp_path / "out"
    run(config, out, model_and_tokenizer=tiny, progress=False, max_cells=1)
    other = RunConfig(**{**config.__dict__, "topk": 64})
    with pytest.raises(ValueError, match="holds results of another setup \\(topk: 40 there, 64 now\\)"):
        run(other, out, model_and_tokenizer=tiny, progress=False)
    # More methods or cells with the same setup are fine: only the new cells run.
    more = RunConfig(**{**config.__dict__, "methods": ("full", "gemfilter", "snapkv")})
    assert len(run(more, out, model_and_tokenizer=tiny, progress=False)) == 18


def test_a_resume_whose_default_layer_changed_is_refused(tiny, config, tmp_path):
    out = tmp_path / "out"
    default = RunConfig(**{**config.__dict__, "layer": None})  # layer: the model's default (2 of 4 here)
    run(default, out, model_and_tokenizer=tiny, progress=False, max_cells=7)  # 6 full cells, 1 gemfilter
    rows = read_jsonl(out / "results.jsonl")
    assert rows[6]["layer"] == 2
    rows[6]["layer"] = 1  # as if a calibration had changed the default since that cell ran
    (out / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(
        ValueError,
        match="finished gemfilter cells used filter layer 1, but this run resolves to "
        "layer 2.*Pass --layer 1 to resume",
    ):
        run(default, out, model_and_tokenizer=tiny, progress=False)


@pytest.mark.parametrize(
    "change, msg",
    [
        ({"methods": ("full", "magic")}, "unknown method 'magic'; allowed: .*gemfilter.*snapkv"),
        ({"methods": ("full", "full")}, "lists a method twice"),
        ({"methods": ()}, "--methods is empty"),
        ({"prompt": "chat"}, "unknown --prompt 'chat'; allowed: gemfilter, kamradt-chat"),
        ({"topk": 0}, "gemfilter: topk=0 must be >= 1"),
        ({"max_new_tokens": 0}, "--max-new-tokens must be an int >= 1"),
        ({"layer": -1}, "gemfilter: layer=-1 must be >= 0"),
    ],
)
def test_bad_settings_are_refused_before_any_work(config, tmp_path, change, msg):
    with pytest.raises(ValueError, match=msg):
        run(RunConfig(**{**config.__dict__, **change}), tmp_path / "out", model_and_tokenizer=(None, None))
    assert not (tmp_path / "out").exists()


def test_cli_end_to_end_on_a_saved_tiny_model(tmp_path, capsys):
    from niah_fixtures import save_tiny_model

    model_dir = save_tiny_model(tmp_path / "model")
    out = tmp_path / "out"
    argv = [
        "--model",
        str(model_dir),
        "--haystack-dir",
        str(write_haystack(tmp_path / "hay")),
        "--lengths",
        "240",
        "--depths",
        "0,100",
        "--methods",
        "full,gemfilter",
        "--topk",
        "40",
        "--layer",
        "2",
        "--max-new-tokens",
        "2",
        "--out",
        str(out),
        "--no-progress",
    ]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "| full |" in printed and "| gemfilter |" in printed
    names = sorted(p.name for p in out.iterdir())
    assert names == [
        "config.json",
        "heatmap_full.png",
        "heatmap_gemfilter.png",
        "heatmaps.png",
        "results.jsonl",
        "summary.md",
    ]
    assert len(read_jsonl(out / "results.jsonl")) == 4
    (out / "heatmaps.png").unlink()
    assert main(["--report-only", "--out", str(out)]) == 0 and (out / "heatmaps.png").is_file()


@pytest.mark.parametrize(
    "argv, msg",
    [
        (["--methods", "full,nope"], "error: unknown method 'nope'; allowed:"),
        (["--lengths", "1k,x"], "error: --lengths: 'x' is not a number"),
        (["--depths", "120"], "error: --depths: '120' is outside [0, 100]"),
        (["--max-cells", "0"], "error: --max-cells must be >= 1"),
    ],
)
def test_cli_bad_input_exits_2_with_a_clear_message(tmp_path, capsys, argv, msg):
    assert main(argv + ["--out", str(tmp_path / "out")]) == 2
    assert msg in capsys.readouterr().err


def test_cli_report_only_on_an_empty_folder(tmp_path, capsys):
    assert main(["--report-only", "--out", str(tmp_path)]) == 2
    assert "no NIAH results" in capsys.readouterr().err


def test_cli_help_teaches(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--help"])
    assert exc.value.code == 0
    text = capsys.readouterr().out
    for needle in (
        "cpu-demo",
        "gemfilter-paper",
        "kamradt",
        "gemfilter-span",
        "snapkv",
        "--haystack-dir",
        "accelerate launch",
        "resumes",
        "heatmap",
    ):
        assert needle in text


def test_fastkv_and_orig_pos_run_through_the_registry(tiny, config, tmp_path):
    """The new methods need no runner code; each row records the method's budget and layer."""
    import dataclasses

    cfg = dataclasses.replace(config, methods=("fastkv", "gemfilter-orig-pos"), lengths=(240,), depths=(50,))
    rows = run(cfg, tmp_path / "out", model_and_tokenizer=tiny, progress=False)
    assert [r["method"] for r in rows] == ["fastkv", "gemfilter-orig-pos"]
    assert all(r["kept"] == 40 and r["layer"] == 2 for r in rows)
