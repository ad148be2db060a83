"""``gemfilter serve`` in front of an engine that misbehaves: never a silent 200.

Each way the stub engine fails (serve_fixtures.MISBEHAVIOURS) must reach the client as an HTTP error with
the engine's fault named (502, or 504 for a timeout), or, once a stream has started, as one final error
event with no ``[DONE]``; the official openai client must raise on each.
"""

import json

import openai
import pytest
from serve_fixtures import MISBEHAVIOURS, PROMPT, make_proxy, model, post, proxy, stub  # noqa: F401

#: mode -> (status, whether a stream has started when the fault shows): the expected answer, streamed or not.
EXPECTED = {
    "html": {False: (502, "answered something that is not JSON"), True: (502, "not an event stream")},
    "empty": {False: (502, "without a list of choices"), True: (502, "not an event stream")},
    "no-choices": {False: (502, "without a list of choices"), True: (502, "not an event stream")},
    "cut-body": {False: (502, "cut its answer short"), True: (502, "cut its answer short")},
    "cut-stream": {False: (502, "cut its answer short"), True: (502, "ended before \\[DONE\\]")},
    "reset": {False: (502, "closed or reset the connection"), True: (502, "closed or reset the connection")},
    "stall": {False: (504, "stopped sending its answer within 0.5 s"), True: (504, "stalled: no chunk for 0.5 s")},
    "error": {
        False: (502, "the engine answered 500 at .*: engine exploded"),
        True: (502, "the engine answered 500 at .*: engine exploded"),
    },
    "slow": {False: (504, "did not answer within 0.5 s"), True: (504, "did not answer within 0.5 s")},
}
#: Faults that show only after the engine's first chunk: the stream has started, so they come as an event.
IN_STREAM = {"cut-stream", "reset", "stall"}


def test_the_matrix_covers_every_misbehaviour():
    assert set(EXPECTED) == set(MISBEHAVIOURS)


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
@pytest.mark.parametrize("mode", MISBEHAVIOURS)
def test_a_misbehaving_engine_is_never_a_silent_200(proxy, stub, mode, stream):
    import re

    stub.mode = mode
    status, answer, _ = post(proxy + "/v1/completions", {"prompt": PROMPT, "model": "m", "stream": stream})
    code, message = EXPECTED[mode][stream]
    if stream and mode in IN_STREAM:
        assert status == 200 and answer[0] != "[DONE]" and json.loads(answer[0])["choices"][0]["text"] == "o"
        assert "[DONE]" not in answer  # the stream ends with the error event, never with [DONE]
        error = json.loads(answer[-1])["error"]
    else:
        assert status == code, answer
        error = answer["error"]
    assert error["code"] == code and error["type"] == "upstream_error"
    assert re.search(message, error["message"]), error


def test_a_chat_stream_cut_short_ends_with_an_error_event(proxy, stub):
    stub.mode = "cut-stream"
    status, events, _ = post(
        proxy + "/v1/chat/completions",
        {"messages": [{"role": "user", "content": "x" * 40}], "model": "stub-model", "stream": True},
    )
    assert status == 200 and json.loads(events[0])["choices"][0]["delta"]["content"] == "o"
    assert "[DONE]" not in events and "ended before [DONE]" in json.loads(events[-1])["error"]["message"]


def test_a_healthy_stream_ends_with_done(proxy, stub):
    status, events, _ = post(proxy + "/v1/completions", {"prompt": PROMPT, "model": "m", "stream": True})
    assert status == 200 and events[-1] == "[DONE]" and all("error" not in json.loads(e) for e in events[:-1])


@pytest.mark.parametrize("mode", ["cut-stream", "reset", "stall"])
def test_the_openai_client_raises_when_the_engine_fails_mid_stream(proxy, stub, mode):
    stub.mode = mode
    client = openai.OpenAI(base_url=proxy + "/v1", api_key="none", max_retries=0, timeout=10)
    stream = client.completions.create(model="m", prompt=PROMPT, stream=True)
    texts = []
    with pytest.raises(openai.APIError, match="the engine"):
        for chunk in stream:
            texts.append(chunk.choices[0].text)
    assert texts == ["o"]


def test_the_openai_client_raises_on_a_bad_engine_answer(proxy, stub):
    stub.mode = "no-choices"
    client = openai.OpenAI(base_url=proxy + "/v1", api_key="none", max_retries=0, timeout=10)
    with pytest.raises(openai.APIStatusError, match="without a list of choices") as info:
        client.completions.create(model="m", prompt=PROMPT)
    assert info.value.status_code == 502


def test_the_engine_s_own_error_event_ends_the_stream_without_done(proxy, stub, monkeypatch):
    """vLLM reports a failure inside a stream as an error event followed by [DONE]; the proxy relays the event
    and stops there, so that its stream never carries both."""
    from gemfilter.toolkit.serving.upstream import Upstream

    def failing(self, path, body, call=None):
        yield json.dumps({"id": "c", "choices": [{"index": 0, "text": "o", "finish_reason": None}]})
        yield json.dumps({"error": {"message": "engine died", "code": 500}})
        yield "[DONE]"

    monkeypatch.setattr(Upstream, "stream", failing)
    status, events, _ = post(proxy + "/v1/completions", {"prompt": PROMPT, "model": "m", "stream": True})
    assert status == 200 and events[-1] == json.dumps({"error": {"message": "engine died", "code": 500}})
    assert "[DONE]" not in events
