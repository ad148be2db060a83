"""lm-evaluation-harness adapter and gemfilter.score, on local tasks written here (no network).

References: the harness's own ``hf`` model (k >= n), plain ``model(...)`` forwards on the tokens
``gemfilter.select_tokens`` keeps (k < n), and ``generate``'s own scores for the cache methods.
"""

import json

import lm_eval  # noqa: E402  (a declared dependency: a missing one must fail, not skip)
import pytest
import torch
from tiny_models import BUILDERS, FILTER_LAYER, DotTokenizer

import gemfilter
from gemfilter.methods import REGISTRY, get_method

pytestmark = pytest.mark.usefixtures("quiet")

GEN_YAML = """task: gf_local_gen
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: generate_until
doc_to_text: "{{{{context}}}}"
doc_to_target: "{{{{answer}}}}"
generation_kwargs:
  until: ["w2"]
  max_gen_toks: 6
  do_sample: false
metric_list:
  - metric: exact_match
"""

MC_YAML = """task: gf_local_mc
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{context}}}}"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: "{{{{label}}}}"
metric_list:
  - metric: acc
"""


def words(rng, n):
    return " ".join(f"w{rng.randrange(4, 96)}" for _ in range(n))


@pytest.fixture(scope="module")
def tasks(tmp_path_factory):
    import random

    rng = random.Random(0)
    folder = tmp_path_factory.mktemp("lm-eval-tasks")
    gen = [{"context": words(rng, 30 + 5 * i), "answer": words(rng, 2)} for i in range(4)]
    mc = [
        {"context": words(rng, 30 + 5 * i), "choices": [words(rng, 1 + j) for j in range(3)], "label": i % 3}
        for i in range(4)
    ]
    for name, rows, yaml in (("gen", gen, GEN_YAML), ("mc", mc, MC_YAML)):
        data = folder / f"{name}.jsonl"
        data.write_text("".join(json.dumps(r) + "\n" for r in rows))
        (folder / f"{name}.yaml").write_text(yaml.format(data=data))
    return folder


@pytest.fixture(scope="module")
def model_dirs(tiny_model_dir, tmp_path_factory):
    """{family: folder}: the tiny Llama of conftest, and a tiny Gemma 3 saved with the same word tokenizer."""
    import shutil

    gemma = tmp_path_factory.mktemp("tiny-gemma3")
    BUILDERS["gemma3"]().save_pretrained(gemma)
    for f in tiny_model_dir.iterdir():
        if "token" in f.name or f.name == "special_tokens_map.json":
            shutil.copy(f, gemma / f.name)
    return {"llama": tiny_model_dir, "gemma3": gemma}


def evaluate(model, model_args, tasks, task_names=("gf_local_gen", "gf_local_mc"), batch_size=1):
    from lm_eval.tasks import TaskManager

    import eval.harness.adapter  # noqa: F401  (registers 'gemfilter')

    out = lm_eval.simple_evaluate(
        model=model,
        model_args=model_args,
        tasks=list(task_names),
        batch_size=batch_size,
        task_manager=TaskManager(include_path=str(tasks), include_defaults=False),
        log_samples=True,
        device="cpu",
    )
    return out


def per_sample(out, task):
    return [
        (s["doc_id"], s["resps"], s["filtered_resps"], s.get("acc", s.get("exact_match"))) for s in out["samples"][task]
    ]


@pytest.mark.parametrize("family", ["llama", "gemma3"])
@pytest.mark.parametrize("method", ["gemfilter", "snapkv", "fastkv"])
def test_k_at_least_n_equals_the_harness_hf_model(model_dirs, tasks, method, family):
    path = model_dirs[family]
    hf = evaluate("hf", f"pretrained={path},dtype=float32", tasks)
    ours = evaluate(
        "gemfilter", f"pretrained={path},dtype=float32,method={method},topk=512,layer={FILTER_LAYER[family]}", tasks
    )
    for task in ("gf_local_gen", "gf_local_mc"):
        a, b = per_sample(hf, task), per_sample(ours, task)
        assert len(a) == len(b) == 4
        for (da, ra, fa, ma), (db, rb, fb, mb) in zip(a, b):
            assert da == db and ma == mb, (method, task, da)  # the same per-sample metric
            if task == "gf_local_gen":
                assert ra == rb, (method, da)
            else:  # log-likelihoods equal up to float rounding (other matmul shapes than the harness's forward)
                got, want = [float(x[0]) for x in fb], [float(x[0]) for x in fa]
                assert got == pytest.approx(want, abs=1e-5), (method, da)
        assert ours["results"][task] == hf["results"][task]


@pytest.mark.parametrize("family", ["llama", "gemma3"])
def test_k_below_n_scores_the_context_tokens_select_tokens_keeps(model_dirs, tasks, family):
    """Each choice's log-likelihood is the plain model's on select_tokens' kept context + the choice."""
    from eval.harness.adapter import GemFilterLM

    layer = FILTER_LAYER[family]
    lm = GemFilterLM(pretrained=str(model_dirs[family]), dtype="float32", method="gemfilter", topk=12, layer=layer)
    out = evaluate(lm, None, tasks, task_names=("gf_local_mc",), batch_size=4)
    checked = 0
    for sample in out["samples"]["gf_local_mc"]:
        for (context, continuation), resp in zip([a for a in sample["arguments"]], sample["resps"]):
            ctx, cont = lm._encode_pair(context, continuation)
            sel = gemfilter.select_tokens(lm.model, torch.tensor([ctx]), layer=layer, topk=12)
            kept = torch.tensor(ctx)[sel.indices[0]]
            assert len(kept) == 12 < len(ctx)
            ids = torch.cat([kept, torch.tensor(cont)])[None]
            with torch.no_grad():
                logp = torch.log_softmax(lm.model(input_ids=ids[:, :-1]).logits[0, len(kept) - 1 :].float(), -1)
            want = float(logp.gather(1, torch.tensor(cont)[:, None]).sum())
            assert float(resp[0][0]) == pytest.approx(want, abs=1e-4)
            checked += 1
    assert checked == 12  # 4 questions x 3 choices


def test_left_padded_generation_batch_equals_single_rows(tiny_model_dir, tasks):
    args = f"pretrained={tiny_model_dir},dtype=float32,method=gemfilter,topk=12,layer=2"
    one = per_sample(evaluate("gemfilter", args, tasks, task_names=("gf_local_gen",), batch_size=1), "gf_local_gen")
    four = per_sample(evaluate("gemfilter", args, tasks, task_names=("gf_local_gen",), batch_size=4), "gf_local_gen")
    assert one == four


def test_model_args_are_checked_with_what_is_allowed(tiny_model_dir):
    from eval.harness.adapter import GemFilterLM

    for kwargs, msg in [
        ({"method": "magic"}, "unknown method 'magic'; allowed: .*gemfilter"),
        ({"topk": 8, "ratio": 0.5}, "topk or ratio, not both"),
        ({"ratio": 2.0}, r"gemfilter: ratio=2 must be in \(0, 1\]"),
        ({"layer": 9}, r"layer=9 is outside \[0, 4\)"),
    ]:
        with pytest.raises(ValueError, match=msg):
            GemFilterLM(pretrained=str(tiny_model_dir), dtype="float32", **kwargs)


@pytest.mark.parametrize("family", ["llama", "gemma3"])
def test_score_equals_the_plain_model_when_nothing_is_dropped(family):
    model = BUILDERS[family]()
    ctx = torch.randint(3, 96, (40,), generator=torch.Generator().manual_seed(1))
    cont = torch.randint(3, 96, (6,), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        logits = model(torch.cat([ctx, cont[:-1]])[None]).logits[0, 39:].float()
    want = torch.log_softmax(logits, -1).gather(1, cont[:, None])[:, 0]
    for name in sorted(REGISTRY):
        got = gemfilter.score(
            model, ctx, cont, get_method(name, topk=40, layer=FILTER_LAYER[family]), tokenizer=DotTokenizer()
        )
        one_pass = getattr(REGISTRY[name], "one_pass_scoring", False)
        assert torch.allclose(got.logprobs, want, atol=0 if one_pass else 1e-5), name
        assert got.kept == 40


@pytest.mark.parametrize("name", ["snapkv", "h2o", "gemfilter-one-run", "fastkv", "gemfilter-orig-pos", "gemfilter"])
def test_score_of_the_methods_own_greedy_answer_matches_generate(name):
    """Cache path against generate: the method's greedy continuation scores as greedy, with generate's
    own log-probabilities."""
    import dataclasses

    model = BUILDERS["llama"]()
    ctx = torch.randint(3, 96, (1, 64), generator=torch.Generator().manual_seed(1))
    method = get_method(name, topk=40, layer=2)
    if name == "fastkv":
        method = dataclasses.replace(method, tsp_len=48)
    out = gemfilter.generate(
        model, ctx, method=method, max_new_tokens=5, output_scores=True, return_dict_in_generate=True
    )
    cont = out.new_tokens[0]
    want = torch.stack([torch.log_softmax(s[0].float(), -1)[t] for s, t in zip(out.output.scores, cont)])
    got = gemfilter.score(model, ctx[0], cont, method)
    assert got.greedy
    assert torch.allclose(got.logprobs, want, atol=1e-4), name


def test_score_refuses_empty_inputs():
    model = BUILDERS["llama"]()
    with pytest.raises(ValueError, match="context_ids must be a non-empty"):
        gemfilter.score(model, [], [5])
    with pytest.raises(ValueError, match="continuation_ids must be a non-empty"):
        gemfilter.score(model, [5, 6], [])


def test_cli_forwards_to_the_harness_and_writes_its_results_json(tiny_model_dir, tasks, tmp_path, capsys):
    from eval.harness.cli import main

    out = tmp_path / "out"
    rc = main(
        [
            "run",
            "--model",
            "gemfilter",
            "--model_args",
            f"pretrained={tiny_model_dir},dtype=float32,method=gemfilter-span,topk=12,layer=2",
            "--tasks",
            "gf_local_mc",
            "--include_path",
            str(tasks),
            "--output_path",
            str(out),
            "--log_samples",
            "--limit",
            "2",
            "--device",
            "cpu",
        ]
    )
    assert rc == 0
    results = list(out.rglob("results_*.json"))
    assert len(results) == 1
    data = json.loads(results[0].read_text())
    assert "acc,none" in data["results"]["gf_local_mc"] and data["config"]["model"] == "gemfilter"
    assert list(out.rglob("samples_gf_local_mc_*.jsonl"))


@pytest.mark.parametrize("family", ["llama", "gemma3"])
def test_k_below_n_generation_equals_gemfilter_generate(model_dirs, tasks, family):
    from eval.harness.adapter import GemFilterLM

    layer = FILTER_LAYER[family]
    lm = GemFilterLM(pretrained=str(model_dirs[family]), dtype="float32", method="gemfilter", topk=12, layer=layer)
    out = evaluate(lm, None, tasks, task_names=("gf_local_gen",), batch_size=1)
    for sample in out["samples"]["gf_local_gen"]:
        context = sample["arguments"][0][0]
        ids = lm.tok_encode(context)
        got = gemfilter.generate(lm.model, torch.tensor([ids]), layer=layer, topk=12, max_new_tokens=6)
        text = lm.tokenizer.decode(got.new_tokens[0]).split("w2")[0]
        assert sample["resps"][0][0] == text


@pytest.mark.slow
def test_embedded_model_runs_a_local_task_end_to_end(tmp_path):
    """The acceptance command on the embedded model: gemfilter-span, k=256, a local multiple-choice task whose
    contexts (about 600 tokens) are longer than k; the harness's usual results JSON comes out."""
    from eval.harness.cli import main

    filler = "The grass is green and the sky is blue. The sun is yellow. " * 40
    rows = [
        {
            "context": f"{filler}The secret fruit is {fruit}. {filler}Question: what is the secret fruit? Answer:",
            "choices": ["apple", "banana", "cherry"],
            "label": i,
        }
        for i, fruit in enumerate(["apple", "banana"])
    ]
    data = tmp_path / "mc.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "tasks").mkdir()
    (tmp_path / "tasks" / "mc.yaml").write_text(MC_YAML.format(data=data).replace("gf_local_mc", "gf_embedded_mc"))
    out = tmp_path / "out"
    rc = main(
        [
            "run",
            "--model",
            "gemfilter",
            "--model_args",
            "pretrained=embedded,method=gemfilter-span,topk=256",
            "--tasks",
            "gf_embedded_mc",
            "--include_path",
            str(tmp_path / "tasks"),
            "--output_path",
            str(out),
            "--log_samples",
            "--device",
            "cpu",
        ]
    )
    assert rc == 0
    data = json.loads(next(out.rglob("results_*.json")).read_text())
    assert 0.0 <= data["results"]["gf_embedded_mc"]["acc,none"] <= 1.0
    samples = [json.loads(line) for line in next(out.rglob("samples_gf_embedded_mc_*.jsonl")).read_text().splitlines()]
    assert len(samples) == 2 and all(len(s["resps"]) == 3 for s in samples)
