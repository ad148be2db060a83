"""Fixtures for the proxy's tests: a stub OpenAI-compatible engine on localhost, and a character tokenizer.

The stub serves only the proxy's error paths and records what it was sent; the equivalence checks
use a real vLLM (tests/test_serve_vllm.py).
"""

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class CharTokenizer:
    """Offline tokenizer for the tiny models: one id (3..95) per character; BOS 1 when special tokens are added."""

    chat_template = "{% for m in messages %}<{{ m.role }}>{{ m.content }}\n{% endfor %}<assistant>"

    def __call__(self, text, add_special_tokens=True):
        return {"input_ids": ([1] if add_special_tokens else []) + [3 + ord(c) % 93 for c in text]}

    def apply_chat_template(self, messages, add_generation_prompt=True, tokenize=False):
        for m in messages:
            if not isinstance(m, dict) or "role" not in m or "content" not in m:
                raise ValueError("each message needs a role and a content")
        return "".join(f"<{m['role']}>{m['content']}\n" for m in messages) + "<assistant>"

    def decode(self, ids, skip_special_tokens=False):
        return "".join(chr(i) for i in ids)


class StubEngine:
    """A stub engine: records each body; ``mode`` picks "ok", "error" (HTTP 500), "slow", "not-json" or "broken-stream".

    Its completions answer "ok" and echo the prompt ids it got as ``prompt_token_ids``; streamed, it sends
    the two chunks "o" and "k", then [DONE]. ``/tokenize`` answers ``tokens`` (set by the test).
    """

    def __init__(self, tokens=None):
        self.bodies, self.paths, self.mode, self.tokens, self.delay = [], [], "ok", tokens or [], 2.0
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
                self._json(200, {"object": "list", "data": [{"id": "stub-model", "object": "model"}]})

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                stub.bodies.append(body)
                stub.paths.append(self.path)
                if self.path == "/tokenize":
                    return self._json(200, {"tokens": stub.tokens, "count": len(stub.tokens)})
                if stub.mode == "error":
                    return self._json(500, {"error": {"message": "engine exploded", "code": 500}})
                if stub.mode == "slow":
                    time.sleep(stub.delay)
                if stub.mode == "not-json":
                    raw = b"<html>gateway</html>"
                    self.send_response(200)
                    self.send_header("Content-Length", str(len(raw)))
                    self.end_headers()
                    return self.wfile.write(raw)
                chat = self.path.endswith("chat/completions")
                prompt = body.get("prompt")
                choice = ({"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}
                          if chat else {"index": 0, "text": "ok", "finish_reason": "stop", "prompt_token_ids": prompt})
                if not body.get("stream"):
                    return self._json(200, {"id": "cmpl-1", "object": "chat.completion" if chat else "text_completion",
                                            "created": 1, "model": body.get("model"), "choices": [choice],
                                            "usage": {"prompt_tokens": 3, "completion_tokens": 1}})
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Connection", "close")
                self.end_headers()
                for piece in ("o", "k"):
                    chunk = {"id": "cmpl-1", "object": "text_completion", "created": 1, "model": body.get("model"),
                             "choices": [{"index": 0, "text": piece, "finish_reason": None}]}
                    self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
                    self.wfile.flush()
                    if stub.mode == "broken-stream":
                        time.sleep(stub.delay)
                self.wfile.write(b"data: [DONE]\n\n")
                self.close_connection = True

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True)
        self.thread.start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()
