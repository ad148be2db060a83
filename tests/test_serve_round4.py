"""``gemfilter serve``, reliability round four, items 1-5: a selector that serves only clients still there, errors
in vLLM's order, unfiltered chats served with every field, a role delta per choice, vLLM's ids and 405s.

The stub engine records what the proxy sends; what vLLM itself answers is checked in tests/test_serve_vllm.py."""

import json
import socket
import threading
import time
import urllib.request

import pytest
from serve_fixtures import LAYER, PROMPT, CharTokenizer, make_proxy, model, post, proxy, stub  # noqa: F401

from gemfilter.toolkit.serving.chat_template import GEMMA3
from gemfilter.toolkit.serving.selector import Selector

pytestmark = pytest.mark.usefixtures("quiet")
SELECTION_S = 0.4


@pytest.fixture
def slow_selection(monkeypatch):
    """Every selection takes at least SELECTION_S seconds (the review's ~2K-token prompts on a shared model)."""
    from gemfilter.methods.prompt import GemFilter

    real = GemFilter.select

    def slow(self, *args, **kwargs):
        time.sleep(SELECTION_S)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(GemFilter, "select", slow)


def send_and_leave(url: str, body: dict, after: float) -> None:
    """A client that sends a request, then gives up after ``after`` seconds (closes its socket)."""
    host, port = url.split("//")[1].split(":")
    raw = json.dumps(body).encode()
    sock = socket.create_connection((host, int(port)))
    sock.sendall(
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        + f"Content-Length: {len(raw)}\r\n\r\n".encode()
        + raw
    )
    time.sleep(after)
    sock.close()


def test_departed_clients_are_not_selected(make_proxy, stub, slow_selection):
    """Item 1: 6 clients that each send a filtered prompt and leave after 0.2 s; the next request must wait for at
    most the one selection already running, not for the departed clients' selections one after another."""
    url = make_proxy(timeout=5)
    body = {"prompt": PROMPT, "model": "stub-model", "max_tokens": 2}
    leavers = [threading.Thread(target=send_and_leave, args=(url, body, 0.2)) for _ in range(6)]
    for t in leavers:
        t.start()
        time.sleep(0.01)
    for t in leavers:
        t.join()
    status, answer, _ = post(url + "/v1/completions", body, timeout=30)
    assert status == 200, answer
    meta = answer["gemfilter"]
    own = meta["selection_seconds"] - meta["selector_wait_seconds"]
    assert own >= SELECTION_S
    assert meta["selector_wait_seconds"] <= own + 0.3, meta  # at most the selection that was running when it came
    completions = [b for b, p in zip(stub.bodies, stub.paths) if p == "/v1/completions"]
    assert len(completions) == 1  # the departed clients' requests never reached the engine


def test_an_unknown_model_is_404_before_any_field_error(make_proxy, stub):
    """Item 2: an unknown model with a chat that gives no max_tokens answered 400 "this engine reports no
    max_model_len ... give max_tokens" instead of the engine's 404."""
    stub.max_model_len = None
    url = make_proxy()
    long = {"role": "user", "content": "x" * 60}
    status, answer, _ = post(url + "/v1/chat/completions", {"model": "gpt-4o", "messages": [long]})
    assert status == 404 and answer["error"]["message"] == "The model `gpt-4o` does not exist."
    status, answer, _ = post(url + "/v1/chat/completions", {"model": "stub-model", "messages": [long]})
    assert status == 400 and "give max_tokens" in answer["error"]["message"]  # a listed model: the field's error
    status, answer, _ = post(url + "/v1/completions", {"model": "gpt-4o", "prompt": PROMPT, "gemfilter": {"x": 1}})
    assert status == 404


def template_proxy(make_proxy, model):
    tok = CharTokenizer()
    tok.chat_template = None  # the embedded model's case: the proxy supplies Gemma 3's template
    return make_proxy(selector=Selector(model, tok, LAYER, chat_template=GEMMA3))


@pytest.mark.parametrize(
    "field, value",
    [
        ("logprobs", True),
        ("tools", [{"type": "function", "function": {"name": "f", "parameters": {}}}]),
        ("response_format", {"type": "json_object"}),
    ],
)
def test_an_unfiltered_chat_reaches_the_engine_as_sent(make_proxy, stub, model, field, value):
    """Item 3: on a model whose template the proxy supplies, logprobs, tools and response_format were refused even
    with method full or a short prompt, with advice that could not be followed. Unfiltered, the chat goes to the
    engine's chat endpoint as sent, with the proxy's template; filtered, the refusal names what to send instead."""
    url = template_proxy(make_proxy, model)
    short = {"model": "stub-model", "messages": [{"role": "user", "content": "hi"}], field: value}
    for body in (
        {**short, "gemfilter": {"topk": 256}},  # a prompt of at most topk tokens
        {**short, "messages": [{"role": "user", "content": "x" * 60}], "gemfilter": {"method": "full"}},
    ):
        status, answer, _ = post(url + "/v1/chat/completions", body)
        assert status == 200 and stub.paths[-1] == "/v1/chat/completions", answer
        sent = stub.bodies[-1]
        assert sent[field] == value and sent["messages"] == body["messages"] and sent["chat_template"] == GEMMA3
        assert "gemfilter" not in sent and answer["gemfilter"]["passthrough"]
    status, answer, _ = post(
        url + "/v1/chat/completions", {**short, "messages": [{"role": "user", "content": "x" * 60}]}
    )
    assert status == 400 and '"method": "full"' in answer["error"]["message"]


def test_a_filtered_chat_stream_with_n_2_gives_each_choice_its_role(proxy, stub):
    """Item 4: a chat stream with n = 2 gave the role delta to the first choice only."""
    body = {
        "model": "stub-model",
        "messages": [{"role": "user", "content": "x" * 60}],
        "n": 2,
        "stream": True,
        "max_tokens": 2,
    }
    status, events, _ = post(proxy + "/v1/chat/completions", body)
    assert status == 200 and events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    roles = {}
    for chunk in chunks:
        for c in chunk["choices"]:
            roles.setdefault(c["index"], []).append(c["delta"].get("role"))
    assert sorted(roles) == [0, 1]
    for index, seen in roles.items():
        assert seen[0] == "assistant" and set(seen[1:]) == {None}, (index, seen)
    assert all(c["id"].startswith("chatcmpl-") for c in chunks)


def test_chat_ids_and_other_methods_as_vllm_answers(proxy, stub):
    """Item 5: chat completion ids started cmpl- (vLLM: chatcmpl-); OPTIONS and HEAD answered 501 (vLLM: 405)."""
    status, answer, _ = post(
        proxy + "/v1/chat/completions",
        {"model": "stub-model", "max_tokens": 2, "messages": [{"role": "user", "content": "x" * 60}]},
    )
    assert status == 200 and answer["id"].startswith("chatcmpl-")
    for method, path in (
        ("OPTIONS", "/v1/chat/completions"),
        ("HEAD", "/v1/completions"),
        ("PUT", "/v1/models"),
        ("DELETE", "/health"),
    ):
        req = urllib.request.Request(proxy + path, method=method)
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(req, timeout=5)
        assert err.value.code == 405 and err.value.headers["Allow"] in ("GET", "POST")
