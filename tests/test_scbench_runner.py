"""gemfilter-scbench's runner (eval/scbench/runner.py) on a tiny random model and a character tokenizer.

Independent check: what the official runner feeds, rebuilt with ``turn_input_ids`` (the official
``GreedySearch.test`` / ``test_scdq`` path) and answered by plain ``generate`` for ``full``, by a fresh
``gemfilter.generate`` for ``reselect``; plus resume, labels per protocol and refusals.
"""

import string

import pytest
import torch
from tiny_models import _build
from transformers import LlamaConfig, LlamaForCausalLM

import gemfilter
from eval.scbench import own
from eval.scbench.prompts import build_prompts, max_input_length, turn_input_ids
from eval.scbench.runner import RunConfig, labelled, run
from eval.scbench.tasks import get_task

pytestmark = pytest.mark.usefixtures("quiet")
CHARS = string.digits + string.ascii_letters + " \n.,:;\"'{}[]()=-_?!/+*%#<>|"


class CharTokenizer:
    """One token per character (92 known, others <unk>); BOS 1, EOS 2, as the tiny models' config."""

    bos_token_id, eos_token_id, pad_token_id = 1, 2, 0
    ids = {c: i + 4 for i, c in enumerate(CHARS[:92])}
    chars = {i: c for c, i in ids.items()}

    def encode(self, text, add_special_tokens=True):
        return ([1] if add_special_tokens else []) + [self.ids.get(c, 3) for c in text]

    def decode(self, ids, skip_special_tokens=False):
        ids = ids.tolist() if torch.is_tensor(ids) else ids
        return "".join(self.chars.get(int(i), "" if skip_special_tokens else "<s>") for i in ids)


TASKS = ("scbench_vt", "scbench_mf")
BASE = dict(
    methods=("full", "gemfilter:k=48,layer=2", "snapkv:k=64"),
    tasks=TASKS,
    lengths=(2048,),
    num_samples=2,
    turns=3,
    protocols=("reselect", "reuse"),
)


@pytest.fixture(scope="module")
def tiny():
    return _build(LlamaForCausalLM, LlamaConfig, max_position_embeddings=4096), CharTokenizer()


def test_labels_per_protocol():
    assert list(labelled(RunConfig(**BASE))) == [
        "full",
        "gemfilter:k=48,layer=2@reselect",
        "gemfilter:k=48,layer=2@reuse",
        "snapkv:k=64",
    ]


@pytest.mark.slow  # every task through the runner (~12 s a mode)
@pytest.mark.parametrize("mode", ["multi-turn", "multi-request"])
def test_turns_are_fed_as_the_official_runner_feeds_them(tiny, tmp_path, mode):
    model, tok = tiny
    config = RunConfig(**{**BASE, "modes": (mode,)})
    merged = run(config, tmp_path / "out", model_and_tokenizer=tiny, progress=False)
    assert len(merged) == 4 * len(TASKS) and all(len(rows) == 2 for rows in merged.values())
    from eval.scbench.generate import make_sample

    method = gemfilter.get_method("gemfilter", topk=48, layer=2)
    for task in TASKS:
        new = get_task(task).max_new_tokens
        for seed in range(2):
            prompts = build_prompts(make_sample(task, tok, 2048, 3, seed=seed, mode=mode), task, mode)
            limit = max_input_length(task, 2048, 3, mode)
            assert len(tok.encode(prompts.first)) <= limit  # the runner feeds the whole context
            full = {r["_id"]: r for r in merged[f"{mode}/2048/full/{task}.jsonl"]}[str(seed)]
            again = {r["_id"]: r for r in merged[f"{mode}/2048/gemfilter:k=48,layer=2@reselect/{task}.jsonl"]}[
                str(seed)
            ]
            for t in range(3):
                ids = torch.tensor([turn_input_ids(prompts, tok, t, max_length=limit)])
                assert full["turns"][t]["history_tokens"] == ids.shape[1]
                plain = model.generate(ids, max_new_tokens=new, do_sample=False)[0, ids.shape[1] :]
                assert full["turns"][t]["prediction"] == tok.decode(plain, skip_special_tokens=True), (task, seed, t)
                fresh = gemfilter.generate(model, ids, method=method, max_new_tokens=new, do_sample=False)
                assert again["turns"][t]["prediction"] == tok.decode(fresh.new_tokens[0], skip_special_tokens=True)
                assert again["turns"][t]["kept"] == min(48, ids.shape[1])
            assert [t["ground_truth"] for t in full["turns"]] == prompts.ground_truth
            assert (full["prefill_s"] is None) == (mode == "multi-turn")


def test_a_rerun_resumes_and_another_setup_is_refused(tiny, tmp_path):
    config = RunConfig(**{**BASE, "methods": ("full",), "tasks": ("scbench_mf",)})
    out = tmp_path / "out"
    assert (
        len(
            run(config, out, model_and_tokenizer=tiny, progress=False, max_units=1)[
                "multi-turn/2048/full/scbench_mf.jsonl"
            ]
        )
        == 1
    )
    rows = run(config, out, model_and_tokenizer=tiny, progress=False)["multi-turn/2048/full/scbench_mf.jsonl"]
    assert [r["_id"] for r in rows] == ["0", "1"]
    with pytest.raises(ValueError, match="another setup \\(turns: 3 there, 2 now\\)"):
        run(RunConfig(**{**BASE, "methods": ("full",), "turns": 2}), out, model_and_tokenizer=tiny, progress=False)


@pytest.mark.parametrize(
    "change, msg",
    [
        ({"modes": ("chat",)}, "--modes: chat; allowed: multi-turn, multi-request"),
        ({"protocols": ("full",)}, "--protocols: full; allowed: reselect, reuse"),
        ({"tasks": ("scbench_qa_eng",)}, "--tasks: scbench_qa_eng; allowed: scbench_kv"),
        ({"methods": ("gemfilter:k=0",)}, "gemfilter: topk=0 must be >= 1"),
        ({"turns": 0}, "--turns must be a whole number >= 1"),
        ({"max_holes": 1.5}, "--max-holes must be a share in \\[0, 1\\]"),
        ({"max_fresh": 8}, "--max-fresh caps the follow-ups of protocols stable, stable-cf, .* and stable-late-runs:"),
        (
            {"max_fresh": 8, "protocols": ("stable-gap", "stable-late-runs"), "fresh_by": "tokens"},
            "--fresh-by tokens: stable-late-runs writes a newly kept token's run whole",
        ),
        (
            {"max_fresh": 8, "protocols": ("stable-gap", "stable-late-runs"), "fresh_by": "runs-new"},
            "--fresh-by runs-new ranks the runs that extend a held one last, .*; stable-gap would pick as --fresh-by",
        ),
        ({"max_fresh": 0, "protocols": ("stable",)}, "--max-fresh is a whole number >= 1"),
        ({"max_fresh": 8, "protocols": ("stable",), "fresh_by": "words"}, "--fresh-by: words; allowed: runs, tokens"),
        ({"max_fresh": 8, "protocols": ("stable",), "fresh_holes": "all"}, "--fresh-holes: all; allowed: capped, sel"),
        ({"outgrown": "grow", "protocols": ("stable-late",)}, "--outgrown: grow; allowed: rebuild, reopen"),
        (
            {"outgrown": "reopen", "protocols": ("reselect", "stable")},
            "--outgrown reopen: add one of stable-gap, stable-late, stable-late-runs to --protocols",
        ),
        ({"engine": "http://x"}, "--engine runs full .* not gemfilter:k=48,layer=2@reuse, snapkv:k=64"),
    ],
)
def test_bad_settings_are_refused_before_any_work(tmp_path, change, msg):
    with pytest.raises(ValueError, match=msg):
        run(RunConfig(**{**BASE, **change}), tmp_path / "out", model_and_tokenizer=(None, None))
    assert not (tmp_path / "out").exists()


def test_every_protocol_the_runner_takes_is_one_a_prompt_method_runs_under(tmp_path, monkeypatch):
    """A protocol no method of the run declares gives no rows at all: refused by name, before any work. (The prompt
    methods declare every protocol the runner takes; a protocol left out of their declaration is refused.)"""
    from eval.scbench.runner import PROMPT_PROTOCOLS
    from gemfilter.methods.base import PromptMethod

    assert set(PROMPT_PROTOCOLS) <= set(PromptMethod.protocols)
    monkeypatch.setattr(PromptMethod, "protocols", tuple(p for p in PromptMethod.protocols if p != "stable-late"))
    config = RunConfig(**{**BASE, "protocols": ("stable-gap", "stable-late")})
    with pytest.raises(ValueError, match="--protocols: no method of --methods runs under stable-late; they run under"):
        run(config, tmp_path / "out", model_and_tokenizer=(None, None))
    assert not (tmp_path / "out").exists()


def test_report_scores_the_rows_again(tiny, tmp_path, capsys):
    from eval.scbench.cli import main
    from eval.scbench.scoring import score_one

    out = tmp_path / "out"
    merged = run(
        RunConfig(**{**BASE, "methods": ("full", "snapkv:k=64")}), out, model_and_tokenizer=tiny, progress=False
    )
    import json

    for path in out.glob("*/*/*/*.jsonl"):  # a stored score is never trusted: the report scores again
        rows = [json.loads(x) for x in path.read_text().splitlines()]
        for row in rows:
            for turn in row["turns"]:
                turn["score"] = -1.0
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    rows = merged["multi-turn/2048/snapkv:k=64/scbench_mf.jsonl"]  # what the table must show, by hand
    want = [
        sum(score_one("scbench_mf", r["turns"][t]["prediction"], r["turns"][t]["ground_truth"]) for r in rows)
        / len(rows)
        for t in range(3)
    ]
    assert main(["report", str(out)]) == 0
    text = (out / "report.md").read_text()
    line = next(x for x in text.splitlines() if x.startswith("| snapkv:k=64 | Math.Find |"))
    assert (
        line == f"| snapkv:k=64 | Math.Find | 2 | {' | '.join(f'{100 * w:.1f}' for w in want)} | "
        f"{100 * sum(want) / 3:.1f} |"
    )
    assert (out / "report.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "(1.00x)" in text  # full's time to first token against itself
    assert main(["run", "--methods", "gemfilter:k=0", "--out", str(tmp_path / "bad")]) == 2
    assert capsys.readouterr().err.strip().endswith("error: gemfilter: topk=0 must be >= 1")


def test_figure_lines_are_told_apart_by_method_colour_and_protocol_style():
    """Thirteen lines (a run of every method at one budget) outgrow matplotlib's ten colours: each label gets its own
    (colour, dash pattern, marker); a method keeps its colour under every protocol and a protocol its style under
    every method, also past ten methods and for a protocol the table does not name."""
    from eval.scbench.report import PROTOCOL_STYLES, line_styles
    from eval.scbench.runner import PROMPT_PROTOCOLS

    # every protocol the runner accepts has a style of its own (a label without one: full and the cache methods)
    assert list(PROTOCOL_STYLES) == ["", *PROMPT_PROTOCOLS]
    methods = [f"m{i}:k=8" for i in range(12)]
    protocols = [*PROTOCOL_STYLES, "stable-new"]
    labels = [f"{m}@{p}" if p else m for m in methods for p in protocols]
    styles = line_styles(labels)
    assert len(set(styles.values())) == len(labels) == 12 * 10
    for m in methods:  # one colour per method, the 11th taking the 1st's with other markers
        assert {styles[x][0] for x in labels if x.split("@")[0] == m} == {f"C{methods.index(m) % 10}"}
    for p in protocols:  # one style per protocol within the first ten methods
        assert len({styles[f"{m}@{p}" if p else m][1:] for m in methods[:10]}) == 1
    assert styles["m0:k=8"][1] == styles["m0:k=8@reselect"][1] == "-"  # both solid, told apart by the marker
    assert styles["m0:k=8"][2] != styles["m0:k=8@reselect"][2]
    ten = line_styles(["full", "snapkv:k=8", "gemfilter:k=8@reselect", "gemfilter:k=8@stable"])
    assert [c for c, _, _ in ten.values()] == ["C0", "C1", "C2", "C2"]


def test_figure_draws_a_label_alike_in_every_panel(monkeypatch, tmp_path):
    """A label keeps its style across panels, also where the panels hold different labels (a method or a protocol in
    one mode only)."""
    import gemfilter.toolkit.io as io
    from eval.scbench.report import figure

    drawn = []
    monkeypatch.setattr(io, "save_png", lambda fig, path, **kw: drawn.append(fig))
    acc = {"acc": [1.0, 0.0]}
    table = {  # fastkv in one panel only: drawn per panel, the labels after it would change colour
        ("multi-request", 4096, "fastkv:k=8", "t"): acc,
        ("multi-request", 4096, "full", "t"): acc,
        ("multi-request", 4096, "gemfilter:k=8@reselect", "t"): acc,
        ("multi-turn", 4096, "gemfilter:k=8@reuse", "t"): acc,
        ("multi-turn", 4096, "gemfilter:k=8@reselect", "t"): acc,
        ("multi-turn", 4096, "full", "t"): acc,
    }
    figure(table, tmp_path / "f.png")
    panels = [
        {x.get_label(): (x.get_color(), x.get_linestyle(), x.get_marker()) for x in ax.get_lines()}
        for ax in drawn[0].axes
    ]
    assert [sorted(p) for p in panels] == [
        ["fastkv:k=8", "full", "gemfilter:k=8@reselect"],
        ["full", "gemfilter:k=8@reselect", "gemfilter:k=8@reuse"],
    ]
    assert (
        panels[0]["full"] == panels[1]["full"]
        and panels[0]["gemfilter:k=8@reselect"] == panels[1]["gemfilter:k=8@reselect"]
    )
    assert panels[1]["gemfilter:k=8@reuse"][0] == panels[1]["gemfilter:k=8@reselect"][0] != panels[1]["full"][0]


def test_multi_request_report_shows_the_context_prefill_apart(tiny, tmp_path):
    from eval.scbench.report import collect, markdown, score_table

    out = tmp_path / "out"
    merged = run(
        RunConfig(**{**BASE, "methods": ("full",), "tasks": ("scbench_mf",), "modes": ("multi-request",)}),
        out,
        model_and_tokenizer=tiny,
        progress=False,
    )
    rows = merged["multi-request/2048/full/scbench_mf.jsonl"]
    prefill = sum(r["prefill_s"] for r in rows) / len(rows)
    text = markdown(score_table(collect(out)))
    assert "| method | context prefill | turn 1 | turn 2 | turn 3 |" in text
    assert f"| full | {prefill:.2f} | " in text


def test_every_method_the_issue_names_runs_in_both_modes(tiny, tmp_path):
    """full, gemfilter, gemfilter-span, snapkv, fastkv (TSP firing) and h2o, both protocols and both modes:
    every conversation has its turns, and gemfilter-span@reselect answers as a fresh gemfilter.generate."""
    from eval.scbench.generate import make_sample

    model, tok = tiny
    methods = (
        "full",
        "gemfilter:k=48,layer=2",
        "gemfilter-span:k=48,layer=2",
        "snapkv:k=64",
        "fastkv:k=64,layer=1,tsp_len=256",
        "h2o:k=64",
    )
    config = RunConfig(
        **{
            **BASE,
            "methods": methods,
            "tasks": ("scbench_mf",),
            "num_samples": 1,
            "modes": ("multi-turn", "multi-request"),
        }
    )
    merged = run(config, tmp_path / "out", model_and_tokenizer=tiny, progress=False)
    labels = list(labelled(config))
    assert len(labels) == 8 and len(merged) == 2 * len(labels)
    for key, rows in merged.items():
        turns = rows[0]["turns"]
        assert len(turns) == 3 and all(0 < t["kept"] <= t["history_tokens"] for t in turns), key
        if "/full/" not in key:  # every method but full keeps fewer tokens than the history
            assert turns[0]["kept"] < turns[0]["history_tokens"], key
    span = gemfilter.get_method("gemfilter-span", topk=48, layer=2)
    prompts = build_prompts(make_sample("scbench_mf", tok, 2048, 3, seed=0), "scbench_mf", "multi-turn")
    limit, new = max_input_length("scbench_mf", 2048, 3, "multi-turn"), get_task("scbench_mf").max_new_tokens
    row = merged["multi-turn/2048/gemfilter-span:k=48,layer=2@reselect/scbench_mf.jsonl"][0]
    for t in range(3):
        ids = torch.tensor([turn_input_ids(prompts, tok, t, max_length=limit)])
        fresh = gemfilter.generate(model, ids, method=span, tokenizer=tok, max_new_tokens=new, do_sample=False)
        assert row["turns"][t]["prediction"] == tok.decode(fresh.new_tokens[0], skip_special_tokens=True), t


def test_topk_and_layer_from_the_command_line_reach_every_row(tiny, tmp_path):
    """--topk and --layer are the defaults of the specs that set none: the rows run at them (reliability round four,
    item 6: they ran at k=1024 and the model's default layer while config.json recorded the values given)."""
    config = RunConfig(
        **{
            **BASE,
            "methods": ("full", "gemfilter"),
            "topk": 16,
            "layer": 1,
            "tasks": ("scbench_mf",),
            "num_samples": 1,
            "protocols": ("reselect",),
        }
    )
    merged = run(config, tmp_path / "out", model_and_tokenizer=tiny, progress=False)
    rows = merged["multi-turn/2048/gemfilter@reselect/scbench_mf.jsonl"]
    assert rows[0]["topk"] == 16 and rows[0]["layer"] == 1
    assert {t["kept"] for t in rows[0]["turns"]} == {16}


@pytest.mark.parametrize(
    "change, msg",
    [
        (
            {"methods": ("middle-row:k=48,layer=2",)},
            "middle-row:k=48,layer=2@reselect: protocol 'reselect' .* reads another row",
        ),
        ({"timeout": 0}, r"--timeout must be a number of seconds in \(0, 86400\], got 0"),
        ({"timeout": float("nan")}, r"--timeout must be a number of seconds in \(0, 86400\], got nan"),
    ],
)
def test_what_cannot_run_is_refused_before_the_model_loads(tiny, tmp_path, change, msg):
    """Checks that came late (item 8): a method that cannot run under reselect was refused at its first conversation,
    after the model loaded and config.json was written; a timeout of 0 or NaN was taken."""
    from types import SimpleNamespace

    config_only = SimpleNamespace(config=tiny[0].config)  # a model with no weights: nothing may run on it
    with pytest.raises(ValueError, match=msg):
        run(RunConfig(**{**BASE, **change}), tmp_path / "out", model_and_tokenizer=(config_only, None))
    assert not (tmp_path / "out" / "config.json").exists()  # the folder stays free for another setup


def whole_budget_turns(tiny, tmp_path, protocol: str) -> tuple:
    """(reselect's turns, ``protocol``'s turns) of one Math.Find sample, multi-turn, with a budget (k=4096) at least
    the prompt, so every turn keeps the whole history; the protocol must answer as reselect does."""
    config = RunConfig(
        **{
            **BASE,
            "methods": ("gemfilter:k=4096,layer=2",),
            "protocols": ("reselect", protocol),
            "tasks": ("scbench_mf",),
            "num_samples": 1,
        }
    )
    merged = run(config, tmp_path / "out", model_and_tokenizer=tiny, progress=False)
    again, other = (
        merged[f"multi-turn/2048/gemfilter:k=4096,layer=2@{p}/scbench_mf.jsonl"][0]["turns"]
        for p in ("reselect", protocol)
    )
    assert [t["prediction"] for t in other] == [t["prediction"] for t in again]
    # each turn records its selection's seconds, a part of its time to first token
    assert all(0 < t["select_s"] <= t["ttft_s"] for t in again + other)
    return again, other


def test_stable_rows_run_on_the_loop_and_record_what_they_recomputed(tiny, tmp_path):
    """The stable protocol through the runner: rows per turn with the tokens recomputed."""
    _, stable = whole_budget_turns(tiny, tmp_path, "stable")
    assert stable[0]["recomputed"] == stable[0]["history_tokens"]
    assert all(0 < t["recomputed"] < t["history_tokens"] for t in stable[1:])  # only the new tokens ran


def test_time_ratios_compare_the_same_tasks_and_recomputed_tokens_are_tabled():
    """A label that ran only some tasks is timed against full over those tasks, not over all of full's; the
    tokens each turn ran through the model get a table when the rows record them (by hand: 2.0 / 4.0 = 0.50x)."""
    from eval.scbench.report import markdown, score_table

    def rows(ttft, redo=None, select=None):
        turn = {"turn_idx": 0, "prediction": "11", "ground_truth": "11", "ttft_s": ttft, "select_s": select}
        return [{"_id": "0", "turns": [dict(turn, **({} if redo is None else {"recomputed": redo}))]}]

    found = {
        ("multi-turn", 4096, "full", "gf_facts"): rows(4.0, 100),
        ("multi-turn", 4096, "full", "gf_vt"): rows(40.0, 100),
        ("multi-turn", 4096, "span@stable", "gf_facts"): rows(2.0, 30, 0.75),
    }
    text = markdown(score_table(found))
    assert "| span@stable | 2.00 (0.50x) |" in text
    assert "| full | 22.00 (1.00x) |" in text
    assert "| span@stable | 30 |" in text and "| full | 100 |" in text
    selection = text.split("The selection's part")[1].split("Tokens run")[0]  # only the label that selects
    assert "| span@stable | 0.75 |" in selection and "| full |" not in selection
    found = {k: rows(v[0]["turns"][0]["ttft_s"]) for k, v in found.items()}  # rows without the fields: no tables
    assert "Tokens run through the model" not in markdown(score_table(found))
    assert "The selection's part" not in markdown(score_table(found))


@pytest.mark.parametrize(
    "task,key,now,other,before",
    [
        # folders of SCBench's tasks compare what they did
        ("gf_facts", "own_query", "\n\n{input}", {}, "own_query: '\\{input\\}' there"),
        # folders without GF.MultiKey keep their identity
        (
            "gf_multikey",
            "multikey_needle",
            "The special magic number for {key} is: {value}.",
            {"methods": ("full",), "tasks": ("gf_facts",)},
            "multikey_needle: 'One of the special magic numbers",
        ),
        (
            "gf_multikey",
            "multikey_keys",
            own.MULTIKEY_KEY_STYLE,
            {"methods": ("full",), "tasks": ("gf_facts",)},
            'multikey_keys: "RULER\'s adjective-noun words" there',
        ),
    ],
)
def test_a_folder_of_own_tasks_fed_in_a_former_format_is_refused(tiny, tmp_path, task, key, now, other, before):
    """The query separator (own_query), GF.MultiKey's needle wording (multikey_needle) and keys (multikey_keys) are
    part of the identity of a folder that runs those tasks: a folder written without them (the former format) is
    refused on resume."""
    import json

    config = RunConfig(**{**BASE, "methods": ("full",), "tasks": (task,), "num_samples": 1, "turns": 2})
    assert config.identity()[key] == now
    assert key not in RunConfig(**{**BASE, **other}).identity()
    out = tmp_path / "out"
    out.mkdir()
    old = {k: v for k, v in config.identity().items() if k != key} | {"model_changes": []}
    (out / "config.json").write_text(json.dumps(old))
    with pytest.raises(ValueError, match=before):
        run(config, out, model_and_tokenizer=tiny, progress=False)


def test_one_untimed_full_conversation_runs_before_the_first_timed_one(tiny, tmp_path, monkeypatch):
    from eval.scbench import runner

    calls = []
    real = runner.converse

    def spy(model, tok, method, protocol, mode, length, task, sample, *rest, **settings):
        calls.append((protocol, len(sample["multi_turns"])))
        return real(model, tok, method, protocol, mode, length, task, sample, *rest, **settings)

    monkeypatch.setattr(runner, "converse", spy)
    config = RunConfig(**{**BASE, "methods": ("snapkv:k=64",), "tasks": ("scbench_mf",), "num_samples": 1})
    rows = run(config, tmp_path / "a", model_and_tokenizer=tiny, progress=False)
    assert calls == [("full", 2), ("reuse", 3)] and len(rows["multi-turn/2048/snapkv:k=64/scbench_mf.jsonl"]) == 1
    calls.clear()
    run(RunConfig(**{**config.__dict__, "warmup": False}), tmp_path / "b", model_and_tokenizer=tiny, progress=False)
    assert calls == [("reuse", 3)]


def test_a_resume_that_would_mix_filter_layers_is_refused(tiny, tmp_path):
    import json

    config = RunConfig(
        **{**BASE, "methods": ("gemfilter:k=48",), "tasks": ("scbench_mf",), "num_samples": 1, "warmup": False}
    )
    out = tmp_path / "out"
    run(config, out, model_and_tokenizer=tiny, progress=False)
    path = out / "multi-turn" / "2048" / "gemfilter:k=48@reselect" / "scbench_mf.jsonl"
    row = json.loads(path.read_text())
    layer = row["layer"]
    path.write_text(json.dumps(row | {"layer": layer - 1}) + "\n")  # as if a calibration had moved the default
    with pytest.raises(ValueError, match=f"used filter layer {layer - 1}, but this run resolves to layer {layer}"):
        run(RunConfig(**{**config.__dict__, "num_samples": 2}), out, model_and_tokenizer=tiny, progress=False)


def test_stable_cf_rows_take_the_context_from_the_first_prompt(tiny, tmp_path):
    """stable-cf through the runner, multi-turn: the first prompt's context ends where the sample's context text
    does (the question after it is the conversation's first kept tokens); with a budget at least the prompt, every
    turn answers as reselect does, and a follow-up runs the conversation's tokens alone."""
    from eval.scbench.generate import make_sample
    from eval.scbench.runner import context_end, feed

    model, tok = tiny
    sample = make_sample("scbench_mf", tok, 2048, turns=3, seed=0, mode="multi-turn")
    prompts = build_prompts(sample, "scbench_mf", "multi-turn")
    first, _ = feed(prompts, tok, "scbench_mf", 2048)
    end = context_end(prompts, sample, tok, first)
    context = str(sample["context"])  # Math.Find's is a list, formatted as Python writes it
    assert tok.decode(first[:end], skip_special_tokens=True).endswith(context)
    assert context[-20:] not in tok.decode(first[end:]) and tok.decode(first[end:]).strip()
    cut = [1] + first[1:100] + first[-(len(first) - end) - 50 :]  # a middle cut keeps the end whole
    assert context_end(prompts, sample, tok, cut) == len(cut) - (len(first) - end)
    _, cf = whole_budget_turns(tiny, tmp_path, "stable-cf")
    assert cf[0]["recomputed"] == cf[0]["history_tokens"]
    # the sample the runner used is the same seed's: its context is the first `end` history tokens
    assert [t["recomputed"] for t in cf[1:]] == [t["history_tokens"] - end for t in cf[1:]]


def conversations_seen(monkeypatch, key: str, missing=None) -> list:
    """A list that every gemfilter.Conversation made from now on appends (protocol, its ``key`` keyword) to."""
    seen = []
    init = gemfilter.Conversation.__init__

    def spy(self, *args, **kw):
        seen.append((kw.get("protocol"), kw.get(key, missing)))
        init(self, *args, **kw)

    monkeypatch.setattr(gemfilter.Conversation, "__init__", spy)
    return seen


def test_max_holes_reaches_the_layout_and_names_the_folder(tiny, tmp_path, monkeypatch):
    """--max-holes: every stable-cf conversation gets it; at 0 (rebuild whenever the context gains or masks a slot)
    stable-cf answers as reselect does with k below the prompt; a folder records it, a folder written before it
    means the default 0.5, and a resume with another value is refused."""
    import json

    seen = conversations_seen(monkeypatch, "max_holes")
    setup = {
        **BASE,
        "methods": ("gemfilter:k=48,layer=2",),
        "protocols": ("reselect", "stable-cf"),
        "tasks": ("scbench_mf",),
        "num_samples": 1,
    }
    out = tmp_path / "out"
    merged = run(RunConfig(**setup, max_holes=0.0), out, model_and_tokenizer=tiny, progress=False)
    again, cf = (
        merged[f"multi-turn/2048/gemfilter:k=48,layer=2@{p}/scbench_mf.jsonl"][0]["turns"]
        for p in ("reselect", "stable-cf")
    )
    assert [t["prediction"] for t in cf] == [t["prediction"] for t in again]
    assert ("stable-cf", 0.0) in seen
    assert json.loads((out / "config.json").read_text())["max_holes"] == 0.0
    with pytest.raises(ValueError, match="max_holes: 0.0 there, 0.25 now"):
        run(RunConfig(**setup, max_holes=0.25), out, model_and_tokenizer=tiny, progress=False)
    stored = json.loads((out / "config.json").read_text())
    del stored["max_holes"]  # a folder written before --max-holes
    (out / "config.json").write_text(json.dumps(stored))
    with pytest.raises(ValueError, match="max_holes: 0.5 there, 0.0 now"):
        run(RunConfig(**setup, max_holes=0.0), out, model_and_tokenizer=tiny, progress=False)
    assert len(run(RunConfig(**setup), out, model_and_tokenizer=tiny, progress=False)) == 2  # resumed: the default


@pytest.mark.parametrize("protocol,max_holes", [("stable-gap", 0.0), ("stable-front", 0.0), ("stable-front", 1.0)])
def test_stable_gap_rows_run_only_what_the_history_gained_when_nothing_changes(tiny, tmp_path, protocol, max_holes):
    """stable-gap and stable-front through the runner, multi-turn: with a budget at least the prompt every turn
    keeps the whole history, so turn 1 runs the first prompt, each follow-up runs only the tokens the history gained
    (its gold answer and question, the model's answer cut off), and it answers as reselect: with --max-holes 0 (no
    free positions), and under stable-front with free positions too, since they lie before the context and leave
    every relative position reselect's."""
    setup = {
        **BASE,
        "methods": ("gemfilter:k=4096,layer=2",),
        "protocols": ("reselect", protocol),
        "tasks": ("scbench_mf",),
        "num_samples": 1,
    }
    merged = run(RunConfig(**setup, max_holes=max_holes), tmp_path / "out", model_and_tokenizer=tiny, progress=False)
    again, gap = (
        merged[f"multi-turn/2048/gemfilter:k=4096,layer=2@{p}/scbench_mf.jsonl"][0]["turns"]
        for p in ("reselect", protocol)
    )
    assert [t["prediction"] for t in gap] == [t["prediction"] for t in again]
    assert gap[0]["recomputed"] == gap[0]["history_tokens"]
    grown = [b["history_tokens"] - a["history_tokens"] for a, b in zip(gap, gap[1:])]
    assert [t["recomputed"] for t in gap[1:]] == grown


def test_max_fresh_reaches_the_layouts_alone_and_names_the_folder(tiny, tmp_path, monkeypatch):
    """--max-fresh: every stable, stable-cf and stable-gap conversation gets it, no other protocol's does; a folder
    records it, --fresh-by and
    --fresh-holes, a folder written before --max-fresh means no cap and one before --fresh-by single tokens and
    capped holes, and a resume with another value is refused."""
    import json

    seen = conversations_seen(monkeypatch, "max_fresh", "absent")
    setup = {
        **BASE,
        "methods": ("gemfilter:k=48,layer=2",),
        "protocols": ("reselect", "stable", "stable-cf", "stable-gap"),
        "tasks": ("scbench_mf",),
        "num_samples": 1,
        "max_holes": 1.0,  # rebuilt only on the first turn: every follow-up is capped
    }
    out = tmp_path / "out"
    merged = run(RunConfig(**setup, max_fresh=4), out, model_and_tokenizer=tiny, progress=False)
    expect = {("stable", 4), ("stable-cf", 4), ("stable-gap", 4), ("reselect", "absent"), ("full", "absent")}
    assert set(seen) == expect  # full: the warm-up
    turns = merged["multi-turn/2048/gemfilter:k=48,layer=2@stable/scbench_mf.jsonl"][0]["turns"]
    assert all(t["recomputed"] <= 4 + t["history_tokens"] - u["history_tokens"] for u, t in zip(turns, turns[1:]))
    stored = json.loads((out / "config.json").read_text())
    assert (stored["max_fresh"], stored["fresh_by"], stored["fresh_holes"]) == (4, "runs", "capped")
    with pytest.raises(ValueError, match="fresh_holes: 'capped' there, 'selection' now"):
        run(RunConfig(**setup, max_fresh=4, fresh_holes="selection"), out, model_and_tokenizer=tiny, progress=False)
    with pytest.raises(ValueError, match="max_fresh: 4 there, 8 now"):
        run(RunConfig(**setup, max_fresh=8), out, model_and_tokenizer=tiny, progress=False)
    with pytest.raises(ValueError, match="fresh_by: 'runs' there, 'tokens' now"):
        run(RunConfig(**setup, max_fresh=4, fresh_by="tokens"), out, model_and_tokenizer=tiny, progress=False)
    del stored["fresh_by"], stored["fresh_holes"]  # a folder written before --fresh-by capped single tokens
    (out / "config.json").write_text(json.dumps(stored))
    with pytest.raises(ValueError, match="fresh_by: 'tokens' there, 'runs' now"):
        run(RunConfig(**setup, max_fresh=4), out, model_and_tokenizer=tiny, progress=False)
    del stored["max_fresh"]  # a folder written before --max-fresh
    (out / "config.json").write_text(json.dumps(stored))
    with pytest.raises(ValueError, match="max_fresh: None there, 4 now"):
        run(RunConfig(**setup, max_fresh=4), out, model_and_tokenizer=tiny, progress=False)
    assert len(run(RunConfig(**setup), out, model_and_tokenizer=tiny, progress=False)) == 4  # no cap: resumed


def test_outgrown_reaches_the_gap_layouts_alone_and_names_the_folder(tiny, tmp_path, monkeypatch):
    """--outgrown: every stable-gap and stable-late* conversation gets it, no other protocol's does; a folder that runs
    one records it, a folder written before it means rebuild, and a resume with another value is refused."""
    import json

    seen = conversations_seen(monkeypatch, "outgrown", "absent")
    setup = {
        **BASE,
        "methods": ("gemfilter:k=48,layer=2",),
        "protocols": ("reselect", "stable", "stable-gap", "stable-late-runs"),
        "tasks": ("scbench_mf",),
        "num_samples": 1,
        "max_holes": 1.0,
    }
    out = tmp_path / "out"
    run(RunConfig(**setup, outgrown="reopen"), out, model_and_tokenizer=tiny, progress=False)
    expect = {("stable-gap", "reopen"), ("stable-late-runs", "reopen")}
    assert set(seen) == expect | {("reselect", "absent"), ("stable", "absent"), ("full", "absent")}  # full: warm-up
    stored = json.loads((out / "config.json").read_text())
    assert stored["outgrown"] == "reopen"
    with pytest.raises(ValueError, match="outgrown: 'reopen' there, 'rebuild' now"):
        run(RunConfig(**setup), out, model_and_tokenizer=tiny, progress=False)
    del stored["outgrown"]  # a folder written before --outgrown rebuilt
    (out / "config.json").write_text(json.dumps(stored))
    with pytest.raises(ValueError, match="outgrown: 'rebuild' there, 'reopen' now"):
        run(RunConfig(**setup, outgrown="reopen"), out, model_and_tokenizer=tiny, progress=False)
    assert len(run(RunConfig(**setup), out, model_and_tokenizer=tiny, progress=False)) == 4  # rebuild: resumed
    reselect_only = {**setup, "protocols": ("reselect",)}
    assert "outgrown" not in RunConfig(**reselect_only).identity()
