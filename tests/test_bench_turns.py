"""``gemfilter bench --engine URL --turns T``: conversations through an engine, against a stub engine on localhost.

What the engine receives turn by turn (multi-turn: the history grows by the question and the engine's answer;
multi-request: the document and one question), the rows and cells stored, resume after a failed cell, the
selector's wait and its parallel workers, and vLLM's metrics text. The real-engine run is in docs/serving.md.
"""

import threading

import pytest
from engine_faults import FaultyEngine
from niah_fixtures import save_tiny_model, word_tokenizer

from gemfilter.lab.bench import report as bench_report
from gemfilter.lab.serve import turns
from gemfilter.toolkit.io import read_jsonl
from gemfilter.toolkit.serving.selector import Selector
from gemfilter.toolkit.serving.upstream import PROBE

pytestmark = pytest.mark.usefixtures("quiet")


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp("tiny-word"))


@pytest.fixture
def engine():
    """A healthy stub engine whose tokenizer check passes (set ``fault`` / ``after`` to make it fail); closed after."""
    stub = FaultyEngine(tokens=word_tokenizer()(PROBE)["input_ids"])
    yield stub
    stub.close()


def args_for(model_dir, url, out, *extra):
    return [
        "--engine",
        url,
        "--model",
        str(model_dir),
        "--methods",
        "gemfilter",
        "--lengths",
        "300",
        "--topk",
        "16",
        "--layer",
        "2",
        "--gen-tokens",
        "3",
        "--turns",
        "3",
        "--timeout",
        "5",
        "--out",
        str(out),
        *extra,
    ]


def requests_of(rows, **match):
    return [r for r in rows if r.get("kind") == "request" and all(r[k] == v for k, v in match.items())]


def test_each_route_mode_and_concurrency_is_a_cell_of_n_conversations(tiny_dir, tmp_path, engine):
    assert (
        bench_report.main(
            args_for(tiny_dir, engine.url, tmp_path, "--mode", "multi-turn,multi-request", "--concurrency", "1,2")
        )
        == 0
    )
    rows = read_jsonl(tmp_path / "bench-turns.jsonl")
    routes = ("full", "gemfilter, cached", "gemfilter, uncached")
    cells = [r for r in rows if r["kind"] == "cell"]
    assert sorted((c["mode"], c["concurrency"], c["route"]) for c in cells) == sorted(
        (m, n, r) for m in ("multi-turn", "multi-request") for n in (1, 2) for r in routes
    )
    for c in cells:
        got = requests_of(rows, cell=c["cell"])
        assert c["requests"] == len(got) == 3 * c["concurrency"]
        assert sorted((r["conversation"], r["turn"]) for r in got) == [
            (i, t) for i in range(c["concurrency"]) for t in (1, 2, 3)
        ]
    for r in requests_of(rows, route="gemfilter, cached") + requests_of(rows, route="gemfilter, uncached"):
        assert r["kept_tokens"] == 16 and r["selector_wait_seconds"] is not None
    full = requests_of(rows, route="full")
    assert all(r["kept_tokens"] == r["prompt_tokens"] and r["done"] for r in full)
    text = (tmp_path / "bench-turns.md").read_text()
    assert "## multi-turn, 300 tokens, N = 2" in text and "| multi-request | 300 | 2 | gemfilter, cached | 6 |" in text


def test_multi_turn_sends_the_history_and_multi_request_the_document_alone(tiny_dir, tmp_path, engine):
    assert (
        bench_report.main(
            args_for(tiny_dir, engine.url, tmp_path, "--routes", "full", "--mode", "multi-turn,multi-request")
        )
        == 0
    )
    sent = [b["prompt"] for b in engine.bodies if b.get("max_tokens") == 3]  # not the warm-up's (2 tokens)
    tok = word_tokenizer()
    answer = tok("x" * 3, add_special_tokens=False)["input_ids"]  # the stub's answer: 3 chunks "x"
    turn, request = sent[:3], sent[3:6]  # multi-turn's conversation first, then multi-request's
    for before, after in zip(turn, turn[1:]):  # each prompt extends the last one by its answer and a question
        assert after[: len(before)] == before and after[len(before) : len(before) + len(answer)] == answer
    doc = request[0][
        : len(request[0]) - len(tok(turns.QUESTION.format(name="Amber"), add_special_tokens=False)["input_ids"])
    ]
    assert all(p[: len(doc)] == doc for p in request) and len({len(p) for p in request}) == 1


def test_a_failed_cell_stores_nothing_and_a_rerun_runs_only_the_cells_not_finished(tiny_dir, tmp_path, capsys, engine):
    # warm-up (3), the full cell (3), then the cached cell fails at its third turn
    engine.fault, engine.after = "500", 3 + 3 + 2
    with pytest.raises(SystemExit) as exit_:
        bench_report.main(args_for(tiny_dir, engine.url, tmp_path))
    assert exit_.value.code == 2 and "gemfilter, cached, multi-turn, N=1, conversation 0" in str(exit_.value)
    rows = read_jsonl(tmp_path / "bench-turns.jsonl")
    assert [c["route"] for c in rows if c["kind"] == "cell"] == ["full"]
    assert not (tmp_path / "bench-turns.md").exists()
    engine.fault, before = None, engine.completions
    assert bench_report.main(args_for(tiny_dir, engine.url, tmp_path)) == 0
    assert engine.completions - before == 3 + 2 * 3  # warm-up, then the two proxy cells, not full again
    before = engine.completions
    assert bench_report.main(args_for(tiny_dir, engine.url, tmp_path)) == 0
    assert engine.completions == before  # everything stored: the tables are written from the rows


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--mode", "chat"], "--mode 'chat': give distinct modes from multi-turn, multi-request"),
        (["--routes", "full,engine"], "--routes 'full,engine': give distinct routes from full, cached, uncached"),
        (["--concurrency", "0"], "--concurrency"),
        (["--methods", "full"], "--turns compares full with a prompt method"),
    ],
)
def test_bad_options_are_one_error_line(tiny_dir, tmp_path, extra, message, engine):
    with pytest.raises(SystemExit, match="error: " + message.replace("(", r"\(")):
        bench_report.main(args_for(tiny_dir, engine.url, tmp_path) + extra)
    assert engine.completions == 0


def test_turns_without_an_engine_is_refused(tmp_path):
    with pytest.raises(SystemExit, match="--turns times conversations through a serving engine"):
        bench_report.main(["--turns", "3", "--out", str(tmp_path)])


class _Blocking:
    """A prompt method whose selection waits for ``barrier``: two selections finish only if both run at once."""

    topk = 4
    scores_last_row = False

    def __init__(self, barrier):
        self.barrier = barrier

    def select(self, model, ids, tokenizer=None):
        import types

        import torch

        self.barrier.wait(timeout=1)
        return types.SimpleNamespace(kept_ids=torch.arange(4)[None])


@pytest.mark.parametrize("workers", [1, 2])
def test_selector_workers_run_selections_side_by_side_and_report_the_wait(workers):
    barrier = threading.Barrier(2)
    sel = Selector(torch_module(), word_tokenizer(), 0, max_tokens=100, workers=workers)
    sel.method_for = lambda n, method, topk=None: _Blocking(barrier)
    out, errors = [], []

    def ask():
        try:
            out.append(sel.choose(list(range(10)), "gemfilter"))
        except threading.BrokenBarrierError as err:
            errors.append(err)

    threads = [threading.Thread(target=ask) for _ in range(2)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    if workers == 2:  # both inside the selector at once: the barrier opens, nobody waited for a slot
        assert not errors and len(out) == 2 and all(c.waited < 1 for c in out)
    else:  # one at a time: the first times out at the barrier alone, which breaks it for the second
        assert len(errors) == 2 and not out
    with pytest.raises(ValueError, match="selector workers must be a whole number >= 1"):
        Selector(torch_module(), word_tokenizer(), 0, workers=0)


def torch_module():
    import torch

    model = torch.nn.Linear(2, 2)
    model.config = type("Config", (), {"get_text_config": lambda self: type("T", (), {"vocab_size": 10})()})()
    return model


def test_engine_metrics_read_vllm_s_prometheus_text(monkeypatch):
    text = "\n".join(
        [
            "# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.",
            'vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25',
            'vllm:prompt_tokens_cached_total{engine="0",model_name="m"} 4096.0',
            'vllm:prompt_tokens_total{engine="0",model_name="m"} 8192.0',
            'vllm:prompt_tokens_total{engine="1",model_name="m"} 8.0',
            'vllm:cache_config_info{block_size="16",enable_prefix_caching="True",engine="0"} 1.0',
            'vllm:generation_tokens_total{engine="0",model_name="m"} 50.0',
        ]
    )
    monkeypatch.setattr(turns, "metrics_text", lambda base, timeout=5.0: text)
    assert turns.engine_metrics("http://x/v1") == {
        "kv_cache_usage_perc": 0.25,
        "prompt_tokens_cached_total": 4096.0,
        "prompt_tokens_total": 8200.0,
    }
    assert turns.prefix_caching("http://x/v1") is True
    monkeypatch.setattr(turns, "metrics_text", lambda base, timeout=5.0: "")
    assert turns.engine_metrics("http://x/v1") == {} and turns.prefix_caching("http://x/v1") is None


def test_no_cell_meets_another_cell_s_document(tiny_dir, tmp_path, monkeypatch, engine):
    """The same document bodies on every route, but a first line per route, mode, N and run: no engine or selector
    cache can serve one cell (or one run) from another."""
    from serve_fixtures import CharTokenizer

    tok, hay = CharTokenizer(), list(range(3, 96)) * 20
    tok.bos_token_id = 1
    a, facts = turns.make_document(tok, hay, 400, 3, seed=5, salt="full/multi-turn/1/x")
    b, same = turns.make_document(tok, hay, 400, 3, seed=5, salt="full/multi-request/1/x")
    head = len(tok("Document 0123456789ab.\n", add_special_tokens=False)["input_ids"]) + 1
    assert a[:head] != b[:head] and a[head:] == b[head:] and facts == same
    salts, make = [], turns.make_document
    monkeypatch.setattr(
        turns, "make_document", lambda *a, **k: salts.append(a[5] if len(a) > 5 else "") or make(*a, **k)
    )
    for out in ("a", "b"):
        assert (
            bench_report.main(
                args_for(
                    tiny_dir,
                    engine.url,
                    tmp_path / out,
                    "--routes",
                    "full,cached",
                    "--mode",
                    "multi-turn,multi-request",
                )
            )
            == 0
        )
    cells = [s for s in salts if s != "warm-up"]
    assert len(cells) == 2 * 4 and len(set(cells)) == 8  # 2 runs x 2 modes x 2 routes, each its own first line
