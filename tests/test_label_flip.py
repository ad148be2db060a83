"""Label-flip ICL (icl_probes.label_flip): prompts, data errors, scoring, sweep resume, ablation, theory."""

import json
import math
import re

import pytest
import torch
from tiny_models import BUILDERS

from icl_probes.label_flip import ablation, llm, theory
from icl_probes.label_flip.cli import main
from icl_probes.label_flip.data import Example, Task, get_task, load_examples, synthetic_examples
from icl_probes.label_flip.prompts import class_index, make_prompt, n_flips

SST2 = get_task("sst2")
SPEC_PROMPT = (
    "sentence: show us a good time\nThe answer is positive.\n\n"
    "sentence: as dumb and cheesy\nThe answer is negative.\n\n"
    "sentence: it 's a charming and often affecting journey\nThe answer is"
)
SPEC_SWAPPED = (
    "sentence: as dumb and cheesy\nThe answer is negative.\n\n"
    "sentence: show us a good time\nThe answer is positive.\n\n"
    "sentence: it 's a charming and often affecting journey\nThe answer is"
)


def test_prompt_matches_the_spec_template_character_for_character():
    train = [Example(("show us a good time",), 1), Example(("as dumb and cheesy",), 0)]
    query = Example(("it 's a charming and often affecting journey",), 1)
    by_class = class_index(train)
    seen = set()
    for seed in range(20):  # both exemplar orders occur; each must be the spec's text exactly
        p = make_prompt(SST2, train, by_class, query, 2, 0, seed, 0)
        assert p.text in (SPEC_PROMPT, SPEC_SWAPPED)
        assert p.text.startswith(p.prefix)
        seen.add(p.text)
        flipped = make_prompt(SST2, train, by_class, query, 2, 100, seed, 0).text
        expect = (
            p.text.replace("is positive.", "is TMP.")
            .replace("is negative.", "is positive.")
            .replace("is TMP.", "is negative.")
        )
        assert flipped == expect
    assert seen == {SPEC_PROMPT, SPEC_SWAPPED}


@pytest.mark.parametrize("per_prompt", [False, True])
def test_exactly_the_requested_share_is_flipped_and_never_the_query(per_prompt):
    train = synthetic_examples("train", 200)
    truth = {ex.inputs[0]: ex.label for ex in train}
    queries = synthetic_examples("test", 10)
    words = {"negative": 0, "positive": 1}
    expected = {0: 0, 25: 4, 50: 8, 75: 12, 100: 16}  # share * 16 / 100, by hand
    for seed in (100, 13):
        for i, q in enumerate(queries):
            flipped_sets = []
            for share, k in expected.items():
                p = make_prompt(
                    get_task("synthetic"), train, class_index(train), q, 16, share, seed, i, per_prompt=per_prompt
                )
                blocks = p.text.split("\n\n")
                assert len(blocks) == 17 and blocks[-1] == f"sentence: {q.inputs[0]}\nThe answer is"
                assert p.query_label == q.label
                shown = [re.fullmatch(r"sentence: (.*)\nThe answer is (\w+)\.", b).groups() for b in blocks[:-1]]
                wrong = {j for j, (s, w) in enumerate(shown) if words[w] != truth[s]}  # text against the data
                assert len(wrong) == k
                assert sum(truth[s] for s, _ in shown) == 8  # balanced: 8 positive exemplars
                flipped_sets.append(wrong)
            assert all(a <= b for a, b in zip(flipped_sets, flipped_sets[1:]))  # nested across shares


def test_bad_user_input_gets_clear_errors(tmp_path, monkeypatch, capsys):
    with pytest.raises(ValueError, match="0..100"):
        n_flips(110, 16)
    with pytest.raises(ValueError, match="allowed: .*sst2"):
        get_task("imdb")
    import datasets

    def offline(*a, **k):
        raise ConnectionError("offline")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    with pytest.raises(ConnectionError, match="--data-dir"):
        load_examples(SST2, "train")
    with pytest.raises(FileNotFoundError, match="sst2/train.jsonl"):
        load_examples(SST2, "train", data_dir=tmp_path)
    (tmp_path / "sst2").mkdir()
    (tmp_path / "sst2" / "train.jsonl").write_text(
        '{"sentence": "fine", "label": 1}\n\n{"sentence": "bad", "label": -1}\n'
    )
    with pytest.raises(ValueError, match="label must be an int in 0..1"):
        load_examples(SST2, "train", data_dir=tmp_path)
    (tmp_path / "sst2" / "train.jsonl").write_text(
        '{"sentence": " fine ", "label": 1}\n\n{"sentence": "bad", "label": 0}\n'
    )
    assert load_examples(SST2, "train", data_dir=tmp_path) == [Example(("fine",), 1), Example(("bad",), 0)]
    for argv, msg in (
        (["llm", "--shares", "0,150"], "0..100"),
        (["llm", "--datasets", "imdb"], "unknown dataset"),
        (["theory", "--ranks", "0,3"], "ranks must be"),
    ):
        with pytest.raises(SystemExit) as exc:
            main(argv)
        assert exc.value.code == 2 and msg in capsys.readouterr().err


# ---- scoring and the sweep on tiny models (word-level tokenizer: words w4..w95) ----

WTASK = Task("wtask", (("sentence", "sentence"),), ("w10", "w11"))


def wloader(task, split):
    g = torch.Generator().manual_seed(0 if split == "train" else 1)
    return [
        {"sentence": " ".join(f"w{int(i)}" for i in torch.randint(20, 90, (5,), generator=g)), "label": j % 2}
        for j in range(40)
    ]


@pytest.fixture(scope="module")
def tiny(tiny_model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval(), AutoTokenizer.from_pretrained(tiny_model_dir)


def manual_logprob(model, tok, prompt, word):
    """log p(word tokens | prompt) from one plain forward pass over prompt + word."""
    ids = tok(prompt)["input_ids"]
    cont = tok(" " + word, add_special_tokens=False)["input_ids"]
    with torch.no_grad():
        lp = model(torch.tensor([ids + cont])).logits[0].log_softmax(-1)
    return sum(float(lp[len(ids) - 1 + j, t]) for j, t in enumerate(cont))


@pytest.mark.parametrize("family", ["llama", "gemma3"])
@pytest.mark.parametrize("words", [("w10", "w11"), ("w10 w12", "w11")])
def test_label_logprobs_equal_a_plain_forward_with_and_without_the_prefix_cache(tiny, family, words):
    model = BUILDERS[family]()  # gemma3: sliding window 8 < prompt length, so the cached path is tested on it
    tok = tiny[1]
    train, evals = [load_examples(WTASK, s, loader=wloader) for s in ("train", "test")]
    scorer = llm.LabelScorer(model, tok)
    for i in range(3):
        p = make_prompt(WTASK, train, class_index(train), evals[i], 4, 50, 7, i)
        want = [manual_logprob(model, tok, p.text, w) for w in words]
        assert scorer(p.text, words, p.prefix) == pytest.approx(want, abs=1e-4)
        assert llm.label_logprobs(model, tok, p.text, words) == pytest.approx(want, abs=1e-4)
    assert scorer.cache_hits >= 3


def test_sweep_writes_one_row_per_cell_resumes_and_plots(tiny, tmp_path):
    loads = []

    def model_loader(name, device):
        loads.append(name)
        return (tiny[0] if name == "tiny-llama" else BUILDERS["gemma3"]()), tiny[1]

    cfg = llm.SweepConfig(
        models=("tiny-llama", "tiny-gemma"), datasets=("wtask",), shares=(0, 50, 100), seeds=(1, 2), m=4, n_eval=3
    )
    from icl_probes.label_flip import data

    data.TASKS["wtask"] = WTASK
    try:
        rows = llm.run_sweep(cfg, tmp_path, loader=wloader, model_loader=model_loader, progress=False)
        path = tmp_path / "label_flip.jsonl"
        lines = path.read_text().splitlines()
        assert len(rows) == len(lines) == 2 * 3 * 2 * 3 and loads == ["tiny-llama", "tiny-gemma"]
        # interrupt: drop the last 4 rows (all tiny-gemma) and leave a torn line; the rerun redoes only those
        path.write_text("\n".join(lines[:-4]) + "\n" + lines[-1][:20])
        rows2 = llm.run_sweep(cfg, tmp_path, loader=wloader, model_loader=model_loader, progress=False)
        assert loads == ["tiny-llama", "tiny-gemma", "tiny-gemma"]
        keys = [(r["model"], r["share"], r["seed"], r["index"]) for r in rows2]
        assert len(keys) == len(set(keys)) == 36
        by_key = {(r["model"], r["share"], r["seed"], r["index"]): r for r in rows}
        for r in rows2:  # recomputed rows equal the first run's
            assert r["pred"] == by_key[(r["model"], r["share"], r["seed"], r["index"])]["pred"]
            assert r["pred"] == max(range(2), key=lambda j: r["logprobs"][j]) and r["correct"] == int(
                r["pred"] == r["label"]
            )
            assert r["n_flipped"] == {0: 0, 50: 2, 100: 4}[r["share"]]
        with pytest.raises(ValueError, match="other settings"):
            llm.run_sweep(
                llm.SweepConfig(**{**cfg.__dict__, "m": 2}), tmp_path, loader=wloader, model_loader=model_loader
            )
        summary = llm.summarize(rows2)
        for model in ("tiny-llama", "tiny-gemma"):  # mean over seeds of per-seed accuracy, by hand
            per_seed = [
                sum(r["correct"] for r in rows2 if r["model"] == model and r["share"] == 50 and r["seed"] == s) / 3
                for s in (1, 2)
            ]
            assert summary[model]["wtask"][50][0] == pytest.approx(sum(per_seed) / 2)
        llm.plot(summary, tmp_path / "fig.png")
        assert (tmp_path / "fig.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    finally:
        del data.TASKS["wtask"]


def test_average_over_datasets_is_per_seed_then_over_seeds():
    rows = [
        dict(model="m", dataset=d, share=0, seed=s, correct=c)
        for d, s, cs in (("a", 1, [1, 1]), ("b", 1, [0, 0, 0, 1]), ("a", 2, [1, 0]), ("b", 2, [1, 1, 1, 1]))
        for c in cs
    ]
    avg = llm.summarize(rows)["m"]["average"][0]
    # seed 1: (1 + 0.25)/2 = 0.625; seed 2: (0.5 + 1)/2 = 0.75; mean 0.6875, population std 0.0625
    assert avg[0] == pytest.approx(0.6875) and avg[1] == pytest.approx(0.0625)


# ---- Fig. 5.3: per-head last rows and the span norms ----


@pytest.mark.parametrize("family", ["llama", "gemma3"])
def test_per_head_last_row_equals_the_models_own_eager_attentions(family):
    from gemfilter.toolkit.trace import trace

    model = BUILDERS[family]()
    model.set_attn_implementation("eager")
    ids = torch.randint(4, 96, (1, 40), generator=torch.Generator().manual_seed(5))
    tr = trace(model, ids, names=("attn_last_row_heads",))
    with torch.no_grad():
        attn = model(ids, output_attentions=True).attentions
    for layer, a in enumerate(attn):
        assert tr[("attn_last_row_heads", layer)].shape == (4, 40)
        assert torch.allclose(tr[("attn_last_row_heads", layer)], a[0, :, -1, :], atol=1e-5), layer
    assert ("attn_last_row_heads", 0) not in trace(model, ids).store  # opt-in only


def test_ablation_norms_equal_eager_attention_on_the_right_tokens(tiny, tmp_path):
    import random

    model, tok = tiny
    model.set_attn_implementation("eager")
    train, evals = [load_examples(WTASK, s, loader=wloader) for s in ("train", "test")]
    irrelevant = ("w30 w31 w32.", "w40 w41 w42 w43.")
    exemplars = train[:4]
    p = ablation.build(WTASK, exemplars, [e.label for e in exemplars], evals[0], "w11", irrelevant, random.Random(0))
    assert p.text.endswith("The answer is w11")
    assert p.text[slice(*p.relevant)] == evals[0].inputs[0] and p.text[slice(*p.irrelevant)] in irrelevant
    got = ablation.measure(model, tok, p)
    words = [(m.start(), m.end()) for m in re.finditer(r"\S+", p.text)]  # whitespace tokens, by hand
    with torch.no_grad():
        last = model(torch.tensor([tok(p.text)["input_ids"]]), output_attentions=True).attentions[-1][0, :, -1, :]
    for name, (a, b) in (("relevant", p.relevant), ("irrelevant", p.irrelevant)):
        cols = [i for i, (s, e) in enumerate(words) if s < b and e > a]
        assert got[f"{name}_tokens"] == len(cols) == len(p.text[a:b].split())
        assert got[f"{name}_norm"] == pytest.approx(float(last[:, cols].pow(2).sum().sqrt()), abs=1e-5)
        assert got[f"{name}_mass"] == pytest.approx(float(last[:, cols].sum(-1).mean()), abs=1e-5)
    model.set_attn_implementation("sdpa")

    from icl_probes.label_flip import data

    data.TASKS["wtask"] = WTASK
    try:
        rows = ablation.run_ablation(
            ["tiny"],
            "wtask",
            tmp_path,
            n_prompts=3,
            m=4,
            loader=wloader,
            model_loader=lambda n, d: tiny,
            progress=False,
        )
        assert sorted((r["index"], r["kind"]) for r in rows) == [(i, k) for i in range(3) for k in ("correct", "wrong")]
        again = ablation.run_ablation(
            ["tiny"],
            "wtask",
            tmp_path,
            n_prompts=3,
            m=4,
            loader=wloader,
            model_loader=lambda n, d: pytest.fail("nothing left to do"),
            progress=False,
        )
        assert len(again) == 6 and len((tmp_path / "ablation.jsonl").read_text().splitlines()) == 6
        # another seed draws other exemplars: its rows are computed, not taken from seed 100's
        other = ablation.run_ablation(
            ["tiny"],
            "wtask",
            tmp_path,
            n_prompts=3,
            m=4,
            seed=101,
            loader=wloader,
            model_loader=lambda n, d: tiny,
            progress=False,
        )
        assert {r["seed"] for r in other} == {101} and len(other) == 6
        assert len((tmp_path / "ablation.jsonl").read_text().splitlines()) == 12
        ablation.plot(rows, tmp_path / "ab.png")
        assert (tmp_path / "ab.png").stat().st_size > 0
    finally:
        del data.TASKS["wtask"]


# ---- Sec. 5.4 theory against a Monte Carlo written here ----


def mc_loss(q, lam, v, w, sigma, m, n, seed):
    """Independent Monte Carlo of E[(x_q^T U h - <w, x_q>)^2], h = (1/M) sum x_i (<w, x_i> + eps_i)."""
    g = torch.Generator().manual_seed(seed)
    d = lam.numel()
    cov_root = q @ torch.diag(lam.sqrt())
    u = q @ torch.diag(v) @ q.T
    errs = []
    for _ in range(n // 50_000):
        x = torch.randn(50_000, m, d, generator=g, dtype=torch.float64) @ cov_root.T
        y = x @ w + sigma * torch.randn(50_000, m, generator=g, dtype=torch.float64)
        h = (x * y[..., None]).mean(1)
        xq = torch.randn(50_000, d, generator=g, dtype=torch.float64) @ cov_root.T
        errs.append((((xq @ u) * h).sum(-1) - xq @ w) ** 2)
    e = torch.cat(errs)
    return float(e.mean()), float(e.std() / math.sqrt(e.numel()))


@pytest.mark.parametrize("r,sigma", [(1, 0.0), (3, 0.5), (3, 2.0), (6, 1.0)])
def test_closed_form_loss_agrees_with_monte_carlo(r, sigma):
    d, n_pre, m = 6, 50, 8
    lam = torch.tensor([1.0, 0.7, 0.5, 0.3, 0.2, 0.1], dtype=torch.float64)
    q = theory.random_orthogonal(d, torch.Generator().manual_seed(3))
    coords = torch.tensor([0.8, -1.1, 0.6, 1.3, -0.9, 0.7], dtype=torch.float64)  # w = Q (s + xi)
    s, xi = coords.clone(), coords.clone()
    s[r:], xi[:r] = 0, 0
    v = theory.optimal_v(lam, r, n_pre)
    assert torch.allclose(v[:r], n_pre / ((n_pre + 1) * lam[:r] + lam.sum())) and not v[r:].any()
    cf = theory.closed_form_loss(lam, v, s, xi, sigma**2, m)
    mean, se = mc_loss(q, lam, v, q @ coords, sigma, m, 200_000, seed=r)
    assert abs(mean - cf) < 4 * se, (mean, cf, se)


def test_thm_5_4_1_v_star_is_the_least_squares_optimum():
    """Fit U on the top-r eigenspace by least squares on sampled pretraining prompts (N examples,
    w ~ N(0, I), no noise): the fit must be Q_r diag(v*_1..r) Q_r^T. Fitted in the eigenbasis
    (Q = I, no loss of generality: the loss is rotation invariant), so the fit must be diag(v*_1..r)."""
    d, r, n_pre, n = 4, 2, 20, 200_000
    lam = torch.tensor([1.0, 0.6, 0.3, 0.1], dtype=torch.float64)
    g = torch.Generator().manual_seed(11)
    x = torch.randn(n, n_pre, d, generator=g, dtype=torch.float64) * lam.sqrt()  # eigenbasis coordinates
    w = torch.randn(n, d, generator=g, dtype=torch.float64)
    h = (x * (x @ w[:, :, None])).mean(1)
    xq = torch.randn(n, d, generator=g, dtype=torch.float64) * lam.sqrt()
    feats = (xq[:, :r, None] * h[:, None, :r]).reshape(n, r * r)  # y_hat = sum_ab U_ab xq_a h_b
    coef = torch.linalg.lstsq(feats, (xq * w).sum(-1, keepdim=True)).solution.reshape(r, r)
    want = theory.optimal_v(lam, r, n_pre)[:r]
    assert torch.allclose(torch.diagonal(coef), want, rtol=0.03), (coef, want)
    assert coef.fill_diagonal_(0).abs().max() < 0.03 * want.max()


def test_loss_gap_grows_with_rank_as_thm_5_4_3_states():
    d, n_pre, m = 10, 1000, 16
    lam = theory.eigenvalues(d, "inverse")
    assert torch.allclose(lam, 1 / torch.arange(1, 11, dtype=torch.float64))
    s = torch.zeros(d, dtype=torch.float64)
    s[0] = 1.0
    zero = torch.zeros(d, dtype=torch.float64)
    tr = float(lam.sum())
    gaps = {}
    for sigma2 in (0.0, 1.0, 4.0):
        base = theory.closed_form_loss(lam, theory.optimal_v(lam, 1, n_pre), s, zero, sigma2, m)
        for r2 in range(2, 11):
            gap = theory.closed_form_loss(lam, theory.optimal_v(lam, r2, n_pre), s, zero, sigma2, m) - base
            thm = (lam[0] + sigma2) / m * sum((n_pre * lam[i] / ((n_pre + 1) * lam[i] + tr)) ** 2 for i in range(1, r2))
            assert gap == pytest.approx(float(thm), rel=1e-9)
            assert gap == pytest.approx((r2 - 1) * (1 + sigma2) / m, rel=0.05)  # the theorem's approximation
            gaps[(sigma2, r2)] = gap
    for sigma2 in (0.0, 1.0, 4.0):  # larger r: larger gap, and a steeper rise with sigma^2
        assert all(gaps[(sigma2, r)] < gaps[(sigma2, r + 1)] for r in range(2, 10))
    slope = {r: (gaps[(4.0, r)] - gaps[(0.0, r)]) / 4 for r in range(2, 11)}
    assert all(slope[r] < slope[r + 1] for r in range(2, 10))
    # one gap against the Monte Carlo of this file (common random numbers: the same seed for both ranks)
    q = theory.random_orthogonal(d, torch.Generator().manual_seed(0))
    l1, se1 = mc_loss(q, lam, theory.optimal_v(lam, 1, n_pre), q @ s, 1.0, m, 100_000, seed=9)
    l6, se6 = mc_loss(q, lam, theory.optimal_v(lam, 6, n_pre), q @ s, 1.0, m, 100_000, seed=9)
    assert abs((l6 - l1) - gaps[(1.0, 6)]) < 4 * (se1 + se6) and l6 - l1 > 0


def test_theory_run_reports_consistent_tables(tmp_path):
    cfg = theory.TheoryConfig(d=5, ranks=(1, 3, 5), sigmas=(0.0, 1.0), samples=20_000, chunk=10_000)
    res = theory.run(cfg)
    assert [(x["r"], x["sigma"]) for x in res["loss"]] == [(r, s) for r in (1, 3, 5) for s in (0.0, 1.0)]
    assert all(abs(x["z"]) < 4.5 for x in res["loss"])
    assert [round(x["closed_form"], 9) for x in res["slopes"]] == [
        round(sum((1000 / (1001 + sum(1 / j for j in range(1, 6)) * i)) ** 2 for i in range(1, r + 1)) / 16, 9)
        for r in (1, 3, 5)
    ]
    theory.plot(res, tmp_path / "t.png")
    json.dumps(res)
    assert (tmp_path / "t.png").read_bytes()[:4] == b"\x89PNG"


# ---- the embedded Gemma 3 270M ----


@pytest.mark.slow
def test_embedded_model_scores_single_token_labels_and_runs_all_five_shares(tmp_path):
    import gemfilter

    torch.set_num_threads(2)
    model, tok = gemfilter.load_model()
    prompt = "sentence: show us a good time\nThe answer is"
    base = tok(prompt)["input_ids"]
    for word in ("positive", "negative"):
        full = tok(prompt + " " + word)["input_ids"]
        assert full[: len(base)] == base and len(full) == len(base) + 1  # one token after "The answer is"
    cfg = llm.SweepConfig(datasets=("synthetic",), seeds=(100,), n_eval=4)
    rows = llm.run_sweep(cfg, tmp_path, model_loader=lambda n, d: (model, tok), progress=False)
    assert sorted({r["share"] for r in rows}) == [0, 25, 50, 75, 100] and len(rows) == 20
    task = get_task("synthetic")
    train, evals = synthetic_examples("train"), synthetic_examples("test")
    p = make_prompt(task, train, class_index(train), evals[0], 16, 50, 100, 0)
    want = [manual_logprob(model, tok, p.text, w) for w in task.label_words]  # plain forward, no cache
    assert llm.LabelScorer(model, tok)(p.text, task.label_words, p.prefix) == pytest.approx(want, abs=2e-3)
