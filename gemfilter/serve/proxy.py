"""``gemfilter serve``: an OpenAI-compatible proxy that runs GemFilter's selection before an engine generates.

Paper: Shi et al. 2024, Algorithm 2. The second stage of GemFilter is an ordinary generation from the k
kept tokens at positions 0..k-1, so any engine can run it when it is handed the kept token ids as the
prompt. For each request the proxy tokenizes the prompt (after the chat template, for chat requests),
runs the selection on a local model that holds only layers 0..r (:mod:`gemfilter.serve.selector`), and
sends the kept ids to the engine's ``/v1/completions``; a chat request's answer is turned back into a
chat completion, streamed or not. A prompt of at most k tokens, and ``method: "full"``, pass through
unchanged to the endpoint they were sent to.

Per request, ``{"gemfilter": {"method": ..., "topk": ...}}`` in the body overrides the defaults. Every
answer carries ``"gemfilter": {method, topk, layer, prompt_tokens, kept_tokens, passthrough,
selection_seconds}`` (the first chunk, when streamed) and the header ``X-GemFilter``.
"""

from __future__ import annotations

import json
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from .selector import prompt_methods
from .upstream import UpstreamError

MAX_BODY = 64 * 2**20
OPTIONS = ("method", "topk")
#: Chat fields the engine's completions endpoint cannot serve for a filtered prompt.
CHAT_ONLY = ("tools", "tool_choice", "functions", "function_call", "response_format", "logprobs", "top_logprobs",
             "parallel_tool_calls", "chat_template", "chat_template_kwargs")


class BadRequest(ValueError):
    """The client's request is wrong (HTTP 400)."""


def request_options(body: dict, defaults: dict) -> dict:
    """The request's method and topk: the ``gemfilter`` field over the server's defaults, checked."""
    given = body.get("gemfilter", {})
    if not isinstance(given, dict):
        raise BadRequest(f"'gemfilter' must be an object such as {{\"method\": \"gemfilter\", \"topk\": 1024}}, "
                         f"got {type(given).__name__}")
    unknown = sorted(set(given) - set(OPTIONS))
    if unknown:
        raise BadRequest(f"unknown gemfilter option(s) {', '.join(unknown)}; allowed: {', '.join(OPTIONS)}")
    opts = {**defaults, **given}
    if opts["method"] not in prompt_methods():
        raise BadRequest(f"method {opts['method']!r} cannot run in front of an engine; allowed: "
                         f"{', '.join(prompt_methods())} (KV-cache methods such as snapkv evict inside the engine)")
    topk = opts["topk"]
    if isinstance(topk, bool) or not isinstance(topk, int) or topk < 1:
        raise BadRequest(f"topk must be an int >= 1, got {topk!r}")
    return opts


def prompt_ids(body: dict, tokenizer, chat: bool) -> list:
    """The prompt's token ids, tokenized as the engine would: a completion's prompt with the special tokens
    (unless ``add_special_tokens`` is false), a chat through the chat template without adding them again."""
    if chat:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise BadRequest("'messages' must be a non-empty list of {\"role\": ..., \"content\": ...} objects")
        if getattr(tokenizer, "chat_template", None) is None:
            raise BadRequest("the selector's tokenizer has no chat template: use /v1/completions with a prompt")
        try:
            text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        except Exception as err:  # the template's own message says what is wrong with the messages
            raise BadRequest(f"the chat template rejected the messages: {err}") from err
        return tokenizer(text, add_special_tokens=False)["input_ids"]
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]
    if isinstance(prompt, str) and prompt:
        return tokenizer(prompt, add_special_tokens=body.get("add_special_tokens", True))["input_ids"]
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        return prompt
    raise BadRequest("'prompt' must be one non-empty string or one list of token ids (one prompt per request)")


def completion_body(body: dict, ids: list, chat: bool) -> dict:
    """The engine's /v1/completions body for kept ``ids``: the client's options, the kept ids as the prompt."""
    out = {k: v for k, v in body.items() if k not in ("gemfilter", "messages", "prompt", "max_completion_tokens")}
    if chat:
        refused = [k for k in CHAT_ONLY if k in body]
        if refused:
            raise BadRequest(f"{', '.join(refused)} cannot be served for a filtered chat prompt (the engine's "
                             "completions endpoint generates from the kept ids); send them with method 'full'")
        if "max_completion_tokens" in body:
            out.setdefault("max_tokens", body["max_completion_tokens"])
    out["prompt"] = ids
    return out


def as_chat(completion: dict, chunk: bool, first: bool = False) -> dict:
    """A /v1/completions answer (or stream chunk) as a chat completion (or chat chunk)."""
    choices = []
    for c in completion.get("choices", []):
        extra = {k: v for k, v in c.items() if k not in ("text", "logprobs")}
        text = c.get("text", "")
        if chunk:
            delta = {"role": "assistant", "content": text} if first else {"content": text}
            choices.append({**extra, "delta": delta})
        else:
            choices.append({**extra, "message": {"role": "assistant", "content": text}})
    out = {k: v for k, v in completion.items() if k not in ("choices", "object")}
    out.update(object="chat.completion.chunk" if chunk else "chat.completion", choices=choices)
    return out


class ProxyServer(ThreadingHTTPServer):
    """The HTTP server: a selector, an upstream engine and the default method and topk."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address, selector, upstream, *, method: str = "gemfilter", topk: int = 1024,
                 quiet: bool = False):
        request_options({}, {"method": method, "topk": topk})  # the defaults obey the same rules
        self.selector, self.upstream, self.quiet = selector, upstream, quiet
        self.defaults = {"method": method, "topk": topk}
        super().__init__(address, Handler)

    def handle_error(self, request, client_address):
        import sys

        if not isinstance(sys.exc_info()[1], (BrokenPipeError, ConnectionResetError)):  # a client that left is no error
            super().handle_error(request, client_address)


class Handler(BaseHTTPRequestHandler):
    server: ProxyServer
    protocol_version = "HTTP/1.1"

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
        self.end_headers()
        self.wfile.write(raw)

    def _error(self, status: int, message: str, kind: str):
        self._send_json(status, {"error": {"message": message, "type": kind, "code": status}})

    # --- routes --------------------------------------------------------------------------------
    def do_GET(self):
        if self.path.rstrip("/") == "/health":
            return self._send_json(200, {"status": "ok"})
        if self.path.rstrip("/") == "/v1/models":
            try:
                return self._send_json(200, self.server.upstream.get("/models"))
            except UpstreamError as err:
                return self._error(err.status, str(err), "upstream_error")
        return self._error(404, f"no route GET {self.path}; the proxy serves GET /v1/models, /health and POST "
                                "/v1/completions, /v1/chat/completions", "not_found")

    def do_POST(self):
        self._answered = False  # one handler serves every request of a kept-alive connection
        try:
            self._post()
        except (BrokenPipeError, ConnectionResetError):
            raise
        except Exception as err:  # a bug or a failed selection: say so instead of dropping the connection
            if not getattr(self, "_answered", False):
                self._error(500, f"the proxy failed: {type(err).__name__}: {err}", "internal_error")
            raise

    def _post(self):
        route = self.path.rstrip("/")
        if route not in ("/v1/completions", "/v1/chat/completions"):
            return self._error(404, f"no route POST {self.path}; the proxy serves /v1/completions and "
                                    "/v1/chat/completions", "not_found")
        chat = route.endswith("chat/completions")
        try:
            body = self._read_body()
            opts = request_options(body, self.server.defaults)
            ids = prompt_ids(body, self.server.selector.tokenizer, chat)
            choice = self.server.selector.choose(ids, opts["method"], opts["topk"])
        except (BadRequest, ValueError) as err:
            return self._error(400, str(err), "invalid_request_error")
        meta = choice.meta(self.server.selector.layer)
        if choice.passthrough:
            path = "/chat/completions" if chat else "/completions"
            sent, convert = {k: v for k, v in body.items() if k != "gemfilter"}, False
        else:
            try:
                sent = completion_body(body, choice.ids, chat)
            except BadRequest as err:
                return self._error(400, str(err), "invalid_request_error")
            path, convert = "/completions", chat
        try:
            if "model" not in sent:
                sent["model"] = self.server.upstream.default_model()
            if sent.get("stream"):
                return self._stream(path, sent, meta, convert)
            answer = self.server.upstream.post(path, sent)
        except UpstreamError as err:
            return self._error(err.status, str(err), "upstream_error")
        if convert:
            answer = as_chat(answer, chunk=False)
        answer["gemfilter"] = meta
        self._send_json(200, answer, meta)

    def _read_body(self) -> dict:
        length = self.headers.get("Content-Length")
        if length is None or not length.isdigit():
            raise BadRequest("the request needs a Content-Length header and a JSON body")
        if int(length) > MAX_BODY:
            raise BadRequest(f"the body has {int(length)} bytes; at most {MAX_BODY} are accepted")
        raw = self.rfile.read(int(length))
        try:
            body = json.loads(raw)
        except ValueError as err:
            raise BadRequest(f"the body is not valid JSON: {err}") from err
        if not isinstance(body, dict):
            raise BadRequest(f"the body must be a JSON object, got {type(body).__name__}")
        return body

    def _stream(self, path: str, sent: dict, meta: dict, convert: bool):
        """Relay the engine's SSE stream; the first chunk also carries the gemfilter metadata."""
        chunks = self.server.upstream.stream(path, sent)
        first = next(chunks, None)  # an engine error surfaces here, before any header is sent
        self._answered = True
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Connection", "close")  # the stream ends when the connection closes
        self.send_header("X-GemFilter", json.dumps(meta))
        self.end_headers()
        self.close_connection = True
        n = 0
        try:
            for data in _chain(first, chunks):
                if data != "[DONE]":
                    try:
                        obj = json.loads(data)
                    except ValueError:
                        obj = None
                    if isinstance(obj, dict):
                        if convert and "choices" in obj:
                            obj = as_chat(obj, chunk=True, first=n == 0)
                        if n == 0:
                            obj["gemfilter"] = meta
                        n += 1
                        data = json.dumps(obj)
                self.wfile.write(f"data: {data}\n\n".encode())
                self.wfile.flush()
        except UpstreamError as err:  # headers are gone: report in the stream, then close
            self.wfile.write(f"data: {json.dumps({'error': {'message': str(err), 'code': err.status}})}\n\n".encode())
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client went away


def _chain(first, rest):
    if first is not None:
        yield first
    yield from rest


def serve(server: ProxyServer) -> None:
    """Serve until SIGINT or SIGTERM, then stop taking requests and close the socket."""
    import signal
    import threading

    def stop(*_):
        threading.Thread(target=server.shutdown, daemon=True).start()

    old = {s: signal.signal(s, stop) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        server.serve_forever(poll_interval=0.2)
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)
        server.server_close()
