"""``gemfilter serve`` against a stub engine on localhost: what it sends, what it answers, every error path.

The selection runs on a tiny random Llama; what the proxy sends upstream is compared with
``gemfilter.select_tokens`` on the same model. The real-engine checks are in tests/test_serve_vllm.py.
"""

import json
import threading
import urllib.error
import urllib.request

import pytest
import torch
from serve_fixtures import LAYER, PROMPT, CharTokenizer, StubEngine, make_proxy, model, post, proxy, stub  # noqa: F401

import gemfilter
from gemfilter.lab.serve.proxy import ProxyServer
from gemfilter.toolkit.serving.selector import Selector, cut_config
from gemfilter.toolkit.serving.upstream import PROBE, Upstream, check_tokenizer


def test_a_prompt_within_topk_passes_through_unchanged(proxy, stub):
    body = {"model": "stub-model", "prompt": "short text", "max_tokens": 5, "temperature": 0}
    status, answer, _ = post(proxy + "/v1/completions", {**body, "gemfilter": {"topk": 64}})
    assert status == 200 and stub.bodies[-1] == body and stub.paths[-1] == "/v1/completions"
    assert answer["gemfilter"]["passthrough"] and answer["gemfilter"]["kept_tokens"] == 11  # BOS + 10 characters


def test_a_long_prompt_sends_the_selection_kept_ids(proxy, stub, model):
    status, answer, headers = post(proxy + "/v1/completions", {"prompt": PROMPT, "max_tokens": 5})
    ref = gemfilter.select_tokens(model, torch.tensor([PROMPT]), layer=LAYER, topk=16).kept_ids[0].tolist()
    assert status == 200 and stub.bodies[-1]["prompt"] == ref and len(ref) == 16
    assert stub.bodies[-1]["model"] == "stub-model"  # filled in from the engine's /v1/models
    meta = answer["gemfilter"]
    assert meta == json.loads(headers["X-GemFilter"])
    assert (meta["method"], meta["topk"], meta["layer"], meta["prompt_tokens"], meta["kept_tokens"]) == (
        "gemfilter",
        16,
        LAYER,
        40,
        16,
    )
    assert answer["choices"][0]["prompt_token_ids"] == ref


@pytest.mark.parametrize("method", ["gemfilter-span", "middle-row", "largest-row"])
def test_method_and_topk_are_overridden_per_request(proxy, stub, model, method):
    tok = CharTokenizer()
    text = "A b c. D e f g. " * 4 + "Question?"
    status, answer, _ = post(proxy + "/v1/completions", {"prompt": text, "gemfilter": {"method": method, "topk": 24}})
    ids = tok(text)["input_ids"]
    m = gemfilter.get_method(method, layer=LAYER, topk=24)
    ref = gemfilter.select_tokens(model, torch.tensor([ids]), layer=LAYER, topk=24, method=m, tokenizer=tok)
    assert status == 200 and stub.bodies[-1]["prompt"] == ref.kept_ids[0].tolist()
    assert answer["gemfilter"]["method"] == method and answer["gemfilter"]["kept_tokens"] == 24


def test_method_full_sends_the_whole_prompt(proxy, stub):
    status, answer, _ = post(proxy + "/v1/completions", {"prompt": PROMPT, "gemfilter": {"method": "full"}})
    assert status == 200 and stub.bodies[-1]["prompt"] == PROMPT and answer["gemfilter"]["passthrough"]


def test_streamed_completion_relays_chunks_with_the_metadata_first(proxy, stub):
    status, chunks, _ = post(proxy + "/v1/completions", {"prompt": PROMPT, "stream": True})
    assert status == 200 and chunks[-1] == "[DONE]"
    parsed = [json.loads(c) for c in chunks[:-1]]
    assert [p["choices"][0]["text"] for p in parsed] == ["o", "k"]
    assert parsed[0]["gemfilter"]["kept_tokens"] == 16 and "gemfilter" not in parsed[1]
    assert stub.bodies[-1]["stream"] is True


def test_a_filtered_chat_goes_to_completions_and_comes_back_as_chat(proxy, stub, model):
    messages = [{"role": "user", "content": "x" * 40 + " what?"}]
    status, answer, _ = post(
        proxy + "/v1/chat/completions", {"messages": messages, "max_completion_tokens": 7, "temperature": 0}
    )
    tok = CharTokenizer()
    ids = tok(tok.apply_chat_template(messages), add_special_tokens=False)["input_ids"]
    ref = gemfilter.select_tokens(model, torch.tensor([ids]), layer=LAYER, topk=16).kept_ids[0].tolist()
    sent = stub.bodies[-1]
    assert stub.paths[-1] == "/v1/completions" and sent["prompt"] == ref and sent["max_tokens"] == 7
    assert "messages" not in sent and "max_completion_tokens" not in sent
    assert status == 200 and answer["object"] == "chat.completion"
    assert answer["choices"][0]["message"] == {"role": "assistant", "content": "ok"}
    status, chunks, _ = post(proxy + "/v1/chat/completions", {"messages": messages, "stream": True})
    parsed = [json.loads(c) for c in chunks[:-1]]
    assert [p["choices"][0]["delta"] for p in parsed] == [{"role": "assistant", "content": "o"}, {"content": "k"}]
    assert all(p["object"] == "chat.completion.chunk" for p in parsed) and chunks[-1] == "[DONE]"


def test_a_short_chat_passes_through_to_chat(proxy, stub):
    body = {"messages": [{"role": "user", "content": "hi"}], "model": "stub-model"}
    status, answer, _ = post(proxy + "/v1/chat/completions", {**body, "gemfilter": {"topk": 64}})
    assert status == 200 and stub.paths[-1] == "/v1/chat/completions" and stub.bodies[-1] == body
    assert answer["choices"][0]["message"]["content"] == "ok"


def test_models_are_the_engine_s(proxy):
    with urllib.request.urlopen(proxy + "/v1/models", timeout=5) as resp:
        assert json.loads(resp.read())["data"][0]["id"] == "stub-model"


@pytest.mark.parametrize(
    "body, raw, message",
    [
        (None, b"{not json", "the body is not valid JSON"),
        (None, b"[1, 2]", "the body must be a JSON object, got list"),
        ({"prompt": PROMPT, "gemfilter": {"method": "nope"}}, None, "unknown method 'nope'; allowed: fastkv, full"),
        ({"prompt": PROMPT, "gemfilter": {"method": "snapkv"}}, None, "KV-cache methods such as snapkv evict inside"),
        ({"prompt": PROMPT, "gemfilter": {"topk": 0}}, None, "gemfilter: topk=0 must be >= 1"),
        ({"prompt": PROMPT, "gemfilter": {"topk": "9"}}, None, "gemfilter: topk must be an int, got '9'"),
        ({"prompt": PROMPT, "gemfilter": {"method": "gemfilter:k=0"}}, None, "gemfilter: topk=0 must be >= 1"),
        ({"prompt": PROMPT, "gemfilter": {"method": "gemfilter:k=8", "topk": 9}}, None, "give the budget once"),
        ({"prompt": PROMPT, "gemfilter": {"method": "gemfilter:layer=1"}}, None, "selector holds layers 0..2"),
        (
            {"prompt": PROMPT, "gemfilter": {"layer": 3}},
            None,
            "unknown gemfilter option.s. layer; allowed: method, topk",
        ),
        ({"prompt": PROMPT, "gemfilter": 5}, None, "'gemfilter' must be an object"),
        ({"prompt": ["a", "b"]}, None, "one prompt per request"),
        ({"prompt": ""}, None, "one prompt per request"),
        (
            {"prompt": [3 + i % 90 for i in range(600)]},
            None,
            "the prompt has 600 tokens; the selector's model takes at most 512",
        ),
    ],
)
def test_bad_requests_get_400_with_what_is_allowed(proxy, stub, body, raw, message):
    status, answer, _ = post(proxy + "/v1/completions", body, raw=raw)
    assert status == 400 and answer["error"]["type"] == "invalid_request_error"
    assert __import__("re").search(message, answer["error"]["message"]), answer
    assert stub.bodies == []  # nothing reached the engine


def test_chat_only_fields_are_refused_for_a_filtered_prompt(proxy, stub):
    body = {"messages": [{"role": "user", "content": "y" * 50}], "tools": [{"type": "function"}]}
    status, answer, _ = post(proxy + "/v1/chat/completions", body)
    assert status == 400 and "tools cannot be served for a filtered prompt" in answer["error"]["message"]


def test_an_unreachable_engine_is_a_502(model):
    stub = StubEngine()
    url = stub.url
    stub.close()  # nothing listens there any more
    server = ProxyServer(
        ("127.0.0.1", 0), Selector(model, CharTokenizer(), LAYER), Upstream(url, timeout=2), quiet=True
    )
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        status, answer, _ = post(
            f"http://127.0.0.1:{server.server_address[1]}/v1/completions", {"prompt": PROMPT, "model": "m"}
        )
    finally:
        server.shutdown()
        server.server_close()
    assert status == 502 and "is unreachable" in answer["error"]["message"]


def test_start_up_refuses_an_engine_with_another_tokenizer():
    tok = CharTokenizer()
    stub = StubEngine(tokens=tok(PROBE)["input_ids"])
    try:
        check_tokenizer(Upstream(stub.url), tok, "stub-model")  # the same ids: accepted
        assert stub.bodies[-1] == {"model": "stub-model", "prompt": PROBE, "add_special_tokens": True}
        stub.tokens = stub.tokens[:-1] + [7]
        with pytest.raises(ValueError, match="the selector's tokenizer and the engine's differ"):
            check_tokenizer(Upstream(stub.url), tok, "stub-model")
    finally:
        stub.close()


def test_bad_server_settings_are_refused(model):
    sel = Selector(model, CharTokenizer(), LAYER)
    with pytest.raises(ValueError, match="must be an http.s. URL"):
        Upstream("localhost:8000")
    with pytest.raises(ValueError, match="method 'snapkv' cannot run in front of an engine"):
        ProxyServer(("127.0.0.1", 0), sel, Upstream("http://127.0.0.1:1/v1"), method="snapkv")


def test_cut_config_keeps_the_first_layers_and_their_types():
    from transformers import Gemma3TextConfig

    cfg = cut_config(
        Gemma3TextConfig(
            num_hidden_layers=6, sliding_window=8, layer_types=["sliding_attention"] * 5 + ["full_attention"]
        ),
        3,
    )
    assert cfg.num_hidden_layers == 3 and cfg.layer_types == ["sliding_attention"] * 3
    with pytest.raises(ValueError, match="must lie in \\[1, 3\\]"):
        cut_config(cfg, 4)


def test_a_failure_inside_the_proxy_is_a_500_with_its_message(proxy, monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("selector out of memory")

    monkeypatch.setattr(Selector, "choose", broken)
    status, answer, _ = post(proxy + "/v1/completions", {"prompt": PROMPT})
    assert status == 500 and answer["error"]["message"] == "the proxy failed: RuntimeError: selector out of memory"


def test_serve_and_bench_report_an_unreachable_engine_without_a_traceback(capsys, tmp_path):
    from gemfilter.lab.bench.report import main as bench_main
    from gemfilter.lab.cli import main

    stub = StubEngine()
    url = stub.url
    stub.close()  # nothing listens there any more
    assert main(["serve", "--upstream", url, "--port", "0"]) == 2
    assert "error: the engine at " in capsys.readouterr().err
    with pytest.raises(SystemExit, match="error: the engine at .* is unreachable"):
        bench_main(["--engine", url, "--methods", "gemfilter", "--lengths", "1k", "--out", str(tmp_path / "b")])


def test_a_method_spec_sets_the_budget_and_a_request_topk_replaces_it(make_proxy, stub, model):
    url = make_proxy(method="gemfilter-span:k=20", topk=None)
    text = "A b c. D e f g. " * 4 + "Question?"
    status, answer, _ = post(url + "/v1/completions", {"prompt": text})
    assert status == 200 and (answer["gemfilter"]["method"], answer["gemfilter"]["topk"]) == ("gemfilter-span:k=20", 20)
    status, answer, _ = post(url + "/v1/completions", {"prompt": text, "gemfilter": {"topk": 24}})
    assert status == 200 and answer["gemfilter"]["topk"] == 24 and answer["gemfilter"]["kept_tokens"] == 24
    status, answer, _ = post(url + "/v1/completions", {"prompt": text, "gemfilter": {"method": "gemfilter:k=30"}})
    assert status == 200 and (answer["gemfilter"]["method"], answer["gemfilter"]["kept_tokens"]) == (
        "gemfilter:k=30",
        30,
    )
