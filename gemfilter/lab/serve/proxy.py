"""``gemfilter serve``: an OpenAI-compatible proxy that runs GemFilter's selection before an engine generates.

Paper: Shi et al. 2024, Algorithm 2. The second stage of GemFilter is an ordinary generation from the k
kept tokens at positions 0..k-1, so any engine can run it when it is handed the kept token ids as the
prompt. For each request the proxy tokenizes the prompt (after the chat template, for chat requests),
runs the selection on a local model that holds only layers 0..r (:mod:`gemfilter.toolkit.serving.selector`), and
sends the kept ids to the engine's ``/v1/completions``; a chat request's answer is turned back into a
chat completion, streamed or not. A prompt of at most k tokens, and ``method: "full"``, pass through
unchanged to the endpoint they were sent to (a chat on a model whose template the proxy supplies goes
to ``/v1/completions`` as templated ids).

Per request, ``{"gemfilter": {"method": SPEC, "topk": K}}`` in the body overrides the defaults: a method spec
such as ``gemfilter-span:k=512`` (:mod:`gemfilter.methods.spec`), and a budget that replaces its own. Every
answer carries ``"gemfilter": {method, topk, layer, prompt_tokens, kept_tokens, passthrough,
selection_seconds}`` (the first chunk, when streamed) and the header ``X-GemFilter``.

What it guarantees: every stream ends with ``data: [DONE]`` after a complete answer, or with one error
event ``data: {"error": {...}}`` and no ``[DONE]`` (the official openai client raises ``APIError`` on it);
upstream faults answer 502, upstream timeouts 504, client faults 400 (408 for a client that stops
sending), and 500 only for the proxy's own failures. A client that leaves closes the engine's request.
"""

from __future__ import annotations

import json
import math
import threading
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from gemfilter.toolkit.serving.selector import ClientGone
from gemfilter.toolkit.serving.upstream import Call, UpstreamError

from .bodies import (  # noqa: F401
    AnswerPlan,
    BadRequest,
    as_chat,
    chat_max_tokens,
    chat_only,
    check_rewritable,
    completion_body,
    engine_request,
    fix_usage,
    parse_request,
    prompt_ids,
    request_options,
    rewrite_answer,
)
from .connection import ClientTimeout, ClientWatch, read_body

#: (option, low, high) for the server's limits; the CLI checks them before the selector loads.
LIMITS = (("--backlog", 1, 65535), ("--max-concurrency", 1, 4096), ("--client-timeout", 0, 86400))


def check_limits(backlog: int, max_concurrency: int, client_timeout: float) -> None:
    """ValueError naming the option and its range unless the server's limits are usable."""
    for (flag, low, high), value in zip(LIMITS, (backlog, max_concurrency, client_timeout)):
        if flag == "--client-timeout":
            check_seconds(value, flag, high)
        elif isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise ValueError(f"{flag} must be a whole number in [{low}, {high}], got {value!r}")


def check_seconds(value, flag: str, high: float = 86400) -> None:
    """ValueError unless ``value`` is a finite number of seconds in (0, ``high``]."""
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or not 0 < value <= high
    ):
        raise ValueError(f"{flag} must be a number of seconds in (0, {high:g}], got {value!r}")


def error_body(status: int, message: str, kind: str) -> dict:
    """An OpenAI-style error object: the body of an error answer, or the data of a stream's error event."""
    return {"error": {"message": message, "type": kind, "code": status}}


class ProxyServer(ThreadingHTTPServer):
    """The HTTP server: a selector, an upstream engine, the default method (a spec) and topk, and its limits.

    backlog: the listen queue (bursts wait there while every handler is busy; the kernel caps it at
    net.core.somaxconn). max_concurrency: requests handled at once, each on its own thread.
    client_timeout: seconds a client may take to send each part of its request.
    """

    daemon_threads = True
    allow_reuse_address = True

    def __init__(
        self,
        address,
        selector,
        upstream,
        *,
        method: str = "gemfilter",
        topk: int | None = None,
        quiet: bool = False,
        backlog: int = 1024,
        max_concurrency: int = 64,
        client_timeout: float = 60.0,
    ):
        request_options({}, {"method": method, "topk": topk}, selector.layer)  # the defaults obey the same rules
        check_limits(backlog, max_concurrency, client_timeout)
        self.selector, self.upstream, self.quiet = selector, upstream, quiet
        self.defaults = {"method": method, "topk": topk}
        self.request_queue_size = backlog  # read by server_activate's listen()
        self.client_timeout = client_timeout
        self._slots = threading.BoundedSemaphore(max_concurrency)
        self._closing = False
        super().__init__(address, Handler)

    def process_request(self, request, client_address):
        # Wait for a free handler slot; meanwhile new connections queue in the listen backlog.
        while not self._slots.acquire(timeout=0.2):
            if self._closing:
                return self.shutdown_request(request)
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request, client_address):
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()

    def shutdown(self):
        self._closing = True
        super().shutdown()

    def handle_error(self, request, client_address):
        import sys

        if not isinstance(sys.exc_info()[1], (BrokenPipeError, ConnectionResetError)):  # a client that left is no error
            super().handle_error(request, client_address)


class Handler(BaseHTTPRequestHandler):
    server: ProxyServer
    protocol_version = "HTTP/1.1"

    def setup(self):
        self.timeout = self.server.client_timeout  # StreamRequestHandler.setup sets it on the socket
        super().setup()

    def log_message(self, fmt, *args):
        if not self.server.quiet:
            super().log_message(fmt, *args)

    # --- answers -------------------------------------------------------------------------------
    def _send_json(self, status: int, data: dict, meta: dict | None = None):
        raw = json.dumps(data).encode()
        self._answered = True
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        if meta is not None:
            self.send_header("X-GemFilter", json.dumps(meta))
        if status >= 400:  # the request may not have been read to its end: nothing more is read from it
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(raw)

    def _error(self, status: int, message: str, kind: str):
        self._send_json(status, error_body(status, message, kind))

    def send_error(self, code, message=None, explain=None):
        """The standard library's own errors (bad request line, unsupported method, ...) as JSON, not HTML."""
        try:
            phrase = HTTPStatus(code).phrase
        except ValueError:
            phrase = "error"
        self._error(code, message or explain or phrase, "invalid_request_error" if code < 500 else "internal_error")

    # --- routes --------------------------------------------------------------------------------
    def _not_allowed(self):
        """405, as vLLM's server answers a method it has no route for (the standard library's default is 501)."""
        self.close_connection = True  # a body, if any, is not read
        allowed = "GET" if self.path.rstrip("/") in ("/health", "/v1/models") else "POST"
        self._answered = True
        raw = json.dumps(
            error_body(
                405,
                f"Method Not Allowed: {self.command} {self.path}; this route takes {allowed}",
                "invalid_request_error",
            )
        ).encode()
        self.send_response(405)
        self.send_header("Allow", allowed)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.send_header("Connection", "close")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(raw)

    do_HEAD = do_OPTIONS = do_PUT = do_DELETE = do_PATCH = _not_allowed

    def do_GET(self):
        if self.path.rstrip("/") == "/health":
            return self._send_json(200, {"status": "ok"})
        if self.path.rstrip("/") == "/v1/models":
            try:
                return self._send_json(200, self.server.upstream.get("/models"))
            except UpstreamError as err:
                return self._error(err.status, str(err), "upstream_error")
        return self._error(
            404,
            f"no route GET {self.path}; the proxy serves GET /v1/models, /health and POST "
            "/v1/completions, /v1/chat/completions",
            "not_found",
        )

    def do_POST(self):
        self._answered = False  # one handler serves every request of a kept-alive connection
        try:
            self._post()
        except (BrokenPipeError, ConnectionResetError):
            raise
        except Exception as err:  # a bug in the proxy: say so instead of dropping the connection
            if not getattr(self, "_answered", False):
                self._error(500, f"the proxy failed: {type(err).__name__}: {err}", "internal_error")
            raise

    def _post(self):
        route = self.path.rstrip("/")
        if route not in ("/v1/completions", "/v1/chat/completions"):
            self.close_connection = True  # its body is not read
            return self._error(
                404,
                f"no route POST {self.path}; the proxy serves /v1/completions and /v1/chat/completions",
                "not_found",
            )
        chat = route.endswith("chat/completions")
        sel = self.server.selector
        call = Call()
        # From here the client is watched: one that leaves while its request waits for the selector, or while it is
        # selected, is dropped before its selection or before the engine call; later, the engine's request closes.
        body = {}
        with ClientWatch(self.connection, call.abort) as watch:
            try:
                body = read_body(self.headers, self.rfile)
                parsed = parse_request(body, chat, sel, self.server.defaults)  # every check before the selection
                choice = sel.choose(parsed.ids, parsed.opts["method"], parsed.opts["topk"], gone=lambda: watch.gone)
                upstream = self.server.upstream

                def limit():  # the engine's context length, asked for only when a chat gives no token limit
                    return upstream.max_model_len(body.get("model") or upstream.default_model())

                sent, path = engine_request(parsed, choice.ids, sel.chat_template, limit)
            except ClientGone:
                self.close_connection = True
                return None
            except ClientTimeout as err:
                return self._error(408, str(err), "invalid_request_error")
            except UpstreamError as err:  # asking the engine for its models or its length failed
                return self._error(err.status, str(err), "upstream_error")
            except (BadRequest, ValueError) as err:
                if self._unknown(body):  # vLLM's order: the model, then the fields
                    return self._error(404, f"The model `{body['model']}` does not exist.", "NotFoundError")
                return self._error(400, str(err), "invalid_request_error")
            meta = choice.meta(sel.layer)
            plan = AnswerPlan.of(parsed, meta)
            if watch.gone:  # it left during the selection: no engine call
                self.close_connection = True
                return None
            try:
                if "model" not in sent:
                    sent["model"] = self.server.upstream.default_model()
                if sent.get("stream"):
                    return self._stream(path, sent, plan, call, watch)
                answer = self.server.upstream.complete(path, sent, call)
            except UpstreamError as err:
                if watch.gone:  # the client left, and the engine's request was closed for it
                    self.close_connection = True
                    return None
                return self._error(err.status, str(err), "upstream_error")
        if watch.gone:
            self.close_connection = True
            return None
        self._send_json(200, rewrite_answer(answer, plan, chunk=False, first=False), meta)

    def _unknown(self, body: dict) -> bool:
        """Whether ``body`` names a model the engine does not serve (False when the engine cannot say)."""
        model = body.get("model")
        if not isinstance(model, str):
            return False
        try:
            return not self.server.upstream.serves(model)
        except UpstreamError:
            return False

    # --- streams -------------------------------------------------------------------------------
    def _event(self, data: str) -> bool:
        """Write one SSE event to the client; False if the client has gone (its socket, not the engine's)."""
        try:
            self.wfile.write(f"data: {data}\n\n".encode())
            self.wfile.flush()
            return True
        except (BrokenPipeError, ConnectionResetError, TimeoutError):
            return False

    def _stream(self, path: str, sent: dict, plan: AnswerPlan, call: Call, watch: ClientWatch):
        """Relay the engine's SSE stream; the first chunk also carries the gemfilter metadata.

        It ends with ``[DONE]`` once the engine sent it, or with one error event (no ``[DONE]``) when the
        engine's stream fails, is cut, stalls or sends an error of its own.
        """
        chunks = self.server.upstream.stream(path, sent, call)
        try:
            first = next(chunks)  # an engine that fails at once gets an HTTP error, before any header is sent
            self._answered = True
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Cache-Control", "no-cache")
            self.send_header("Connection", "close")  # the stream ends when the connection closes
            self.send_header("X-GemFilter", json.dumps(plan.meta))
            self.end_headers()
            self.close_connection = True
            n = 0
            try:
                data = first
                while True:
                    if data == "[DONE]":
                        self._event(data)
                        return
                    try:
                        obj = json.loads(data)
                    except ValueError:
                        obj = None
                    if not isinstance(obj, dict):
                        raise UpstreamError(
                            502, f"the engine's stream sent a chunk that is not a JSON object: {data[:200]!r}"
                        )
                    if "error" in obj:  # the engine's own error event ends the stream; its [DONE] is not relayed
                        self._event(json.dumps(obj))
                        return
                    if not self._event(json.dumps(rewrite_answer(obj, plan, chunk=True, first=n == 0))):
                        return  # the client left: closing the generator closes the engine's request
                    n += 1
                    data = next(chunks)
            except UpstreamError as err:  # headers are gone: report in the stream, then close
                if not watch.gone:
                    self._event(json.dumps(error_body(err.status, str(err), "upstream_error")))
        finally:
            chunks.close()


def serve(server: ProxyServer) -> None:
    """Serve until SIGINT or SIGTERM, then stop taking requests and close the socket."""
    import signal

    def stop(*_):
        threading.Thread(target=server.shutdown, daemon=True).start()

    old = {s: signal.signal(s, stop) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        server.serve_forever(poll_interval=0.2)
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)
        server.server_close()
