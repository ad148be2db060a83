"""A misbehaving engine: :class:`serve_fixtures.StubEngine` whose completions fail in one named way.

``FaultyEngine(fault, after=n)`` answers its first ``n`` completions as a healthy engine and every later one
with ``fault``; ``fault = None`` is healthy throughout. ``/models`` and ``/tokenize`` are the stub's own.
A healthy stream here is a complete one: ``max_tokens`` chunks of one character, the last with
``finish_reason: "length"``, a usage chunk if ``stream_options.include_usage`` asks for it, then ``[DONE]``.
"""

import json
import time

from serve_fixtures import StubEngine

#: fault -> what the engine does instead of a completion
FAULTS = {
    "html": "200 with an HTML page",
    "empty": "200 with {}",
    "no-choices": '200 with {"choices": []}',
    "cut-body": "a Content-Length longer than the body, then the connection closed",
    "cut-stream": "a stream closed after 2 chunks (no finish reason, no [DONE])",
    "no-done": "a complete stream without its data: [DONE]",
    "cut-chunk": "a chunked stream whose chunk is cut short",
    "error-event": "a stream whose second chunk is an error event",
    "500": "HTTP 500 with an OpenAI error body",
    "stall": "a stream that sends one chunk, then nothing for 3 s",
}


class FaultyEngine(StubEngine):
    """A stub engine that misbehaves in one way from the ``after``-th completion on (see :data:`FAULTS`)."""

    def __init__(self, fault=None, after: int = 0, tokens=None):
        super().__init__(tokens=tokens)
        self.fault, self.after, self.completions = fault, after, 0
        engine, base = self, self.server.RequestHandlerClass

        class Handler(base):
            def do_POST(self):
                if self.path == "/tokenize":
                    return base.do_POST(self)
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                engine.bodies.append(body)
                engine.paths.append(self.path)
                engine.completions += 1
                fault = engine.fault if engine.completions > engine.after else None
                if body.get("stream"):
                    return self._stream(body, fault)
                return self._answer(body, fault)

            def _answer(self, body, fault):
                n = int(body.get("max_tokens", 16))
                good = {
                    "id": "cmpl-1",
                    "object": "text_completion",
                    "model": body.get("model"),
                    "choices": [{"index": 0, "text": "x" * n, "finish_reason": "length"}],
                    "usage": {"prompt_tokens": len(body.get("prompt", [])), "completion_tokens": n},
                }
                if fault == "html":
                    return self._raw(200, "text/html", b"<html><body>gateway</body></html>")
                if fault == "500":
                    return self._json(500, {"error": {"message": "engine exploded", "code": 500}})
                data = {"empty": {}, "no-choices": {"choices": []}}.get(fault, good)
                raw = json.dumps(data).encode()
                if fault == "cut-body":
                    return self._raw(200, "application/json", raw[: len(raw) // 2], length=len(raw))
                return self._raw(200, "application/json", raw)

            def _event(self, data):
                return f"data: {json.dumps(data) if not isinstance(data, str) else data}\n\n".encode()

            def _stream(self, body, fault):
                if fault in ("html", "empty", "no-choices", "cut-body", "500"):
                    return self._answer(body, fault)
                n = int(body.get("max_tokens", 16))
                events = [
                    {
                        "id": "cmpl-1",
                        "object": "text_completion",
                        "model": body.get("model"),
                        "choices": [{"index": 0, "text": "x", "finish_reason": "length" if i == n - 1 else None}],
                    }
                    for i in range(n)
                ]
                if (body.get("stream_options") or {}).get("include_usage"):
                    events.append({"id": "cmpl-1", "choices": [], "usage": {"completion_tokens": n}})
                if fault == "cut-stream":
                    events = events[:2]
                if fault == "error-event":
                    events[1] = {"error": {"message": "engine died", "code": 500}}
                raw = b"".join(self._event(e) for e in events) + (
                    b"" if fault in ("cut-stream", "no-done") else self._event("[DONE]")
                )
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                if fault == "stall":
                    self.send_header("Connection", "close")
                    self.end_headers()
                    self.wfile.write(self._event(events[0]))
                    self.wfile.flush()
                    time.sleep(3)
                elif fault == "cut-chunk":  # one chunk announced at its full size, half of it sent
                    self.send_header("Transfer-Encoding", "chunked")
                    self.end_headers()
                    self.wfile.write(f"{len(raw):x}\r\n".encode() + raw[: len(raw) // 2])
                else:
                    self.send_header("Connection", "close")
                    self.end_headers()
                    self.wfile.write(raw)
                self.wfile.flush()
                self.close_connection = True

        self.server.RequestHandlerClass = Handler
