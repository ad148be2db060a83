"""Every bad model_arg is one ``error:`` line before the model loads,
whole-document tasks are refused for compressing methods, ``ratio`` is per row, defaults are recorded, and
``python -m eval.harness`` runs the harness with the class registered. Tiny models, local tasks (test_lm_eval)."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from test_lm_eval import evaluate, tasks  # noqa: F401  (the local task folder fixture)

import gemfilter

pytestmark = pytest.mark.usefixtures("quiet")
ROOT = Path(__file__).resolve().parents[1]

ROLLING_YAML = """task: gf_local_ppl
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: loglikelihood_rolling
doc_to_text: ""
doc_to_target: "{{{{text}}}}"
metric_list:
  - metric: word_perplexity
"""


@pytest.fixture
def no_load(monkeypatch):
    """Fail the test if any weights load: the harness's hf model loads them in its __init__."""
    from lm_eval.models.huggingface import HFLM

    def refuse(*args, **kwargs):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(HFLM, "__init__", refuse)


BAD_ARGS = [
    ("layer=9", r"layer=9 is outside \[0, 4\)"),
    ("layer=-1", r"layer=-1 must be a 0-based whole number >= 0"),
    ("attn=warp", "attn='warp' is not a kernel; allowed: banded, sdpa"),
    ("topk=-1", "gemfilter: topk=-1 must be >= 1"),
    ("method=fastkv:k=512,tsp_len=0", "fastkv: tsp_len=0 must be >= 1"),  # tsp_len: its own key, in the spec
    ("colour=blue", "unknown key\\(s\\) colour; allowed: pretrained, method, topk, ratio, layer, attn and the harness"),
    ("batch_size=4", "batch_size is the harness's own option; give it as --batch_size"),
    ("method=snapkv,topk=16", "snapkv: topk=16 must exceed the window of 32"),
]


@pytest.mark.parametrize("args, msg", BAD_ARGS)
def test_every_bad_model_arg_is_refused_before_the_model_loads(tiny_model_dir, no_load, args, msg):
    """How the harness builds the model from --model_args (its CLI passes these three options itself)."""
    from eval.harness.adapter import GemFilterLM

    with pytest.raises(ValueError, match=msg):
        GemFilterLM.create_from_arg_string(
            f"pretrained={tiny_model_dir},{args}", {"batch_size": 1, "max_batch_size": None, "device": "cpu"}
        )


# Through the command line, once per kind of check (each run indexes the harness's task folders, ~4 s): a
# value checked against the model's config, and a key the harness passes itself.
@pytest.mark.slow  # the harness's command, which indexes its task folders (~14 s a run)
@pytest.mark.parametrize("args, msg", [BAD_ARGS[0], BAD_ARGS[6]])
def test_a_bad_model_arg_is_one_error_line_of_the_command(
    tiny_model_dir,
    tasks,
    capsys,
    no_load,  # noqa: F811
    args,
    msg,
):
    from eval.harness.cli import main

    rc = main(
        [
            "run",
            "--model",
            "gemfilter",
            "--model_args",
            f"pretrained={tiny_model_dir},{args}",
            "--tasks",
            "gf_local_mc",
            "--include_path",
            str(tasks),
            "--limit",
            "1",
            "--device",
            "cpu",
        ]
    )
    # without the "--- Logging error ---" blocks of the harness's logger, which writes to an earlier test's
    # captured (closed) stream: an artefact of running in-process under pytest
    err = re.sub(r"--- Logging error ---.*?\nArguments: [^\n]*\n", "", capsys.readouterr().err, flags=re.S)
    assert rc == 2 and not re.search(r"^\w+(Error|Exception): ", err, re.M)  # no exception's last line
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and re.search(msg, lines[0]), err


def test_whole_document_tasks_are_refused_by_name_for_a_compressing_method(tiny_model_dir, tmp_path):
    data = tmp_path / "ppl.jsonl"
    data.write_text(
        "".join(json.dumps({"text": " ".join(f"w{4 + (i * j) % 90}" for j in range(40))}) + "\n" for i in range(2))
    )
    (tmp_path / "ppl.yaml").write_text(ROLLING_YAML.format(data=data))
    args = f"pretrained={tiny_model_dir},dtype=float32,layer=2"
    with pytest.raises(ValueError, match="gf_local_ppl score whole documents .* run them with method=full"):
        evaluate("gemfilter", args + ",method=gemfilter,topk=8", tmp_path, task_names=("gf_local_ppl",))
    full = evaluate("gemfilter", args + ",method=full", tmp_path, task_names=("gf_local_ppl",))
    assert "word_perplexity,none" in full["results"]["gf_local_ppl"]


def test_ratio_gives_each_row_of_a_batch_its_own_budget(tiny_model_dir, tasks, monkeypatch):  # noqa: F811
    from transformers import AutoTokenizer

    used = []
    real = gemfilter.apply

    def spy(model, method, **kwargs):
        used.append(method.topk)
        return real(model, method, **kwargs)

    monkeypatch.setattr(gemfilter, "apply", spy)
    out = evaluate(
        "gemfilter",
        f"pretrained={tiny_model_dir},dtype=float32,method=gemfilter,ratio=0.3,layer=2",
        tasks,
        task_names=("gf_local_gen",),
        batch_size=4,
    )
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    prompts = [s["doc"]["context"] for s in out["samples"]["gf_local_gen"]]  # doc_to_text: the context
    expected = sorted(max(1, round(0.3 * len(tok(p)["input_ids"]))) for p in prompts)
    assert sorted(used) == expected and len(set(expected)) > 1


def test_the_defaults_are_recorded_in_the_results(tiny_model_dir, tasks):  # noqa: F811
    out = evaluate("gemfilter", f"pretrained={tiny_model_dir},dtype=float32", tasks, task_names=("gf_local_mc",))
    config = out["config"]
    assert (config["gemfilter_method"], config["gemfilter_topk"], config["gemfilter_ratio"]) == (
        "gemfilter",
        1024,
        None,
    )
    model = gemfilter.load_model(str(tiny_model_dir))[0]
    assert config["gemfilter_layer"] == gemfilter.default_layer(model)


def test_python_m_eval_harness_runs_the_harness_with_the_class_registered(tiny_model_dir, tasks, tmp_path):  # noqa: F811
    out = tmp_path / "out"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "eval.harness",
            "run",
            "--model",
            "gemfilter",
            "--model_args",
            f"pretrained={tiny_model_dir},dtype=float32,method=gemfilter,topk=12,layer=2",
            "--tasks",
            "gf_local_mc",
            "--include_path",
            str(tasks),
            "--output_path",
            str(out),
            "--limit",
            "1",
            "--device",
            "cpu",
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**__import__("os").environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"},
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert len(list(out.rglob("results_*.json"))) == 1


def test_what_was_kept_is_measured_into_the_results(tiny_model_dir, tasks):  # noqa: F811
    """The results' config says what the method kept, read from the caches (not from topk): at k=12 every
    generate prefill of the 4-layer Llama caches 12 rows per layer and runs 12 positions through the last layer."""
    out = evaluate(
        "gemfilter",
        f"pretrained={tiny_model_dir},dtype=float32,method=gemfilter:k=12,layer=2",
        tasks,
        task_names=("gf_local_gen",),
        batch_size=1,
    )
    kept = out["config"]["gemfilter_kept"]
    docs = len(out["samples"]["gf_local_gen"])
    assert kept["generate_prefills"] == docs and kept["loglikelihood_rows"] == 0
    assert kept["kv_rows_per_layer"] == [[12, 12]] * 4 and kept["propagated"] == [12, 12]
    mc = evaluate(
        "gemfilter",
        f"pretrained={tiny_model_dir},dtype=float32,method=gemfilter:k=12,layer=2",
        tasks,
        task_names=("gf_local_mc",),
    )["config"]["gemfilter_kept"]
    assert mc["generate_prefills"] == 0 and mc["loglikelihood_rows"] > 0 and mc["kept"][1] <= 12
