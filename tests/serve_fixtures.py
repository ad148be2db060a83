"""Fixtures for the proxy's tests: a stub OpenAI-compatible engine on localhost, and a character tokenizer.

The stub serves only the proxy's error paths and records what it was sent; the equivalence checks
use a real vLLM (tests/test_serve_vllm.py).
"""

import json
import select
import socket
import struct
import threading
import time
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from tiny_models import BUILDERS, FILTER_LAYER

LAYER = FILTER_LAYER["llama"]
PROMPT = list(range(3, 43))  # 40 token ids


class CharTokenizer:
    """Offline tokenizer for the tiny models: one id (3..95) per character; BOS 1 when special tokens are added."""

    chat_template = "{% for m in messages %}<{{ m.role }}>{{ m.content }}\n{% endfor %}<assistant>"

    def __call__(self, text, add_special_tokens=True):
        return {"input_ids": ([1] if add_special_tokens else []) + [3 + ord(c) % 93 for c in text]}

    def apply_chat_template(self, messages, add_generation_prompt=True, tokenize=False, chat_template=None):
        for m in messages:
            if not isinstance(m, dict) or "role" not in m or "content" not in m:
                raise ValueError("each message needs a role and a content")
        if chat_template is not None:  # a template given by the caller, rendered as transformers does (jinja2)
            import jinja2

            def fail(message):
                raise ValueError(message)

            return (
                jinja2.Environment()
                .from_string(chat_template)
                .render(
                    messages=messages,
                    bos_token="<bos>",
                    add_generation_prompt=add_generation_prompt,
                    raise_exception=fail,
                )
            )
        return "".join(f"<{m['role']}>{m['content']}\n" for m in messages) + "<assistant>"

    def decode(self, ids, skip_special_tokens=False):
        return "".join(chr(i) for i in ids)


#: The ways the stub misbehaves (``StubEngine.mode``), each one a fault of the engine's, never the client's.
MISBEHAVIOURS = ("html", "empty", "no-choices", "cut-body", "cut-stream", "reset", "stall", "error", "slow")


class StubEngine:
    """A stub engine: records each body; ``mode`` picks "ok", "error" (HTTP 500), "slow", "not-json",
    "broken-stream", or one of :data:`MISBEHAVIOURS`: "html" (a 200 HTML page), "empty" (``{}``),
    "no-choices" (``{"choices": []}``), "cut-body" (a JSON body cut short), "cut-stream" (one chunk, then the
    connection closes), "reset" (one chunk, then a TCP reset), "stall" (part of the answer, then silence).

    Its completions answer "ok" and echo the prompt ids it got as ``prompt_token_ids``; streamed, it sends
    the two chunks "o" and "k", then [DONE]. ``/tokenize`` answers ``tokens`` (set by the test). "slow" waits
    ``delay`` seconds, watching its connection: a client that closes it is counted in ``cancelled``. ``peak``
    is the most requests it served at once. ``GET /models`` lists ``max_model_len`` (None: not listed).
    """

    def __init__(self, tokens=None):
        self.bodies, self.paths, self.mode, self.tokens, self.delay = [], [], "ok", tokens or [], 2.0
        self.cancelled, self.active, self.peak, self._lock = 0, 0, 0, threading.Lock()
        self.max_model_len = 512
        stub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def _json(self, status, data):
                raw = json.dumps(data).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                try:
                    self.wfile.write(raw)
                except BrokenPipeError:  # the proxy gave up waiting (its timeout test)
                    pass

            def do_GET(self):
                card = {"id": "stub-model", "object": "model"}
                if stub.max_model_len is not None:  # vLLM lists each model's context length
                    card["max_model_len"] = stub.max_model_len
                self._json(200, {"object": "list", "data": [card]})

            def _raw(self, status, kind, raw, length=None):
                self.send_response(status)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(raw) if length is None else length))
                self.end_headers()
                self.wfile.write(raw)
                self.close_connection = True

            def _reset(self):
                """Close with a TCP reset, as a process that dies does."""
                self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                self.connection.close()
                self.close_connection = True

            def _wait(self, seconds):
                """Sleep ``seconds``; False (and counted) as soon as the peer closes the connection."""
                end = time.monotonic() + seconds
                while time.monotonic() < end:
                    ready, _, _ = select.select([self.connection], [], [], 0.02)
                    if ready and self.connection.recv(1, socket.MSG_PEEK) == b"":
                        with stub._lock:
                            stub.cancelled += 1
                        return False
                return True

            def do_POST(self):
                with stub._lock:
                    stub.active += 1
                    stub.peak = max(stub.peak, stub.active)
                try:
                    self._post()
                finally:
                    with stub._lock:
                        stub.active -= 1

            def _post(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                stub.bodies.append(body)
                stub.paths.append(self.path)
                if self.path == "/tokenize":
                    return self._json(200, {"tokens": stub.tokens, "count": len(stub.tokens)})
                if stub.mode == "error":
                    return self._json(500, {"error": {"message": "engine exploded", "code": 500}})
                if stub.mode == "slow" and not self._wait(stub.delay):
                    self.close_connection = True
                    return None
                if stub.mode == "html":
                    return self._raw(200, "text/html", b"<html><body>502 Bad Gateway</body></html>")
                if stub.mode in ("empty", "no-choices"):
                    return self._raw(200, "application/json", b"{}" if stub.mode == "empty" else b'{"choices": []}')
                cut = stub.mode in ("stall", "reset", "cut-stream") and not body.get("stream")
                if stub.mode == "cut-body" or cut:
                    if stub.mode == "reset":
                        return self._reset()
                    self._raw(200, "application/json", b'{"id": "cmpl-1", "choices": [{"te', length=200)
                    if stub.mode == "stall":
                        time.sleep(stub.delay)
                    return None
                if stub.mode == "not-json":
                    raw = b"<html>gateway</html>"
                    self.send_response(200)
                    self.send_header("Content-Length", str(len(raw)))
                    self.end_headers()
                    return self.wfile.write(raw)
                chat = self.path.endswith("chat/completions")
                prompt = body.get("prompt")
                choice = (
                    {"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}
                    if chat
                    else {"index": 0, "text": "ok", "finish_reason": "stop", "prompt_token_ids": prompt}
                )
                if not body.get("stream"):
                    return self._json(
                        200,
                        {
                            "id": "cmpl-1",
                            "object": "chat.completion" if chat else "text_completion",
                            "created": 1,
                            "model": body.get("model"),
                            "choices": [choice],
                            "usage": {"prompt_tokens": 3, "completion_tokens": 1},
                        },
                    )
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Connection", "close")
                self.end_headers()
                for piece in ("o", "k"):
                    for index in range(int(body.get("n") or 1)):  # one chunk per choice, as vLLM streams n > 1
                        chunk = {
                            "id": "cmpl-1",
                            "object": "text_completion",
                            "created": 1,
                            "model": body.get("model"),
                            "choices": [{"index": index, "text": piece, "finish_reason": None}],
                        }
                        self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
                    self.wfile.flush()
                    if stub.mode in ("broken-stream", "stall") and not self._wait(stub.delay):
                        return None
                    if stub.mode == "cut-stream":
                        self.close_connection = True
                        return None
                    if stub.mode == "reset":
                        return self._reset()
                self.wfile.write(b"data: [DONE]\n\n")
                self.close_connection = True

        class Server(ThreadingHTTPServer):
            request_queue_size = 2048  # as vLLM's (uvicorn's) backlog: bursts through the proxy reach it whole

        self.server = Server(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True)
        self.thread.start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def model():
    return BUILDERS["llama"]()


@pytest.fixture
def stub():
    engine = StubEngine()
    yield engine
    engine.close()


@pytest.fixture
def make_proxy(model, stub):
    """``make(timeout=0.5, selector=None, **ProxyServer options)`` starts a proxy (gemfilter, topk 16) in front of
    the stub and returns its base URL; every proxy is stopped at the end."""
    from gemfilter.lab.serve.proxy import ProxyServer
    from gemfilter.toolkit.serving.selector import Selector
    from gemfilter.toolkit.serving.upstream import Upstream

    servers = []

    def make(timeout=0.5, selector=None, **options):
        server = ProxyServer(
            ("127.0.0.1", 0),
            selector or Selector(model, CharTokenizer(), LAYER),
            Upstream(stub.url, timeout=timeout),
            **{"method": "gemfilter", "topk": 16, "quiet": True, **options},
        )
        threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_address[1]}"

    yield make
    for server in servers:
        server.shutdown()
        server.server_close()


@pytest.fixture
def proxy(make_proxy):
    return make_proxy()


def post(url, body, raw=None, timeout=10):
    """(status, parsed JSON or the SSE data payloads, headers)."""
    data = raw if raw is not None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"}, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            text = resp.read().decode()
            status, headers = resp.status, resp.headers
    except urllib.error.HTTPError as err:
        text, status, headers = err.read().decode(), err.code, err.headers
    if headers.get("Content-Type", "").startswith("text/event-stream"):
        return status, [line[6:] for line in text.splitlines() if line.startswith("data: ")], headers
    return status, json.loads(text), headers
