"""The client side of one proxy connection: reading the request body, and noticing a client that left.

Both work on the handler's socket with the standard library only, so that the proxy never waits on a
client forever (:func:`read_body`: a read timeout, Content-Length or chunked bodies) and never keeps an
engine generating for nobody (:class:`ClientWatch`).
"""

from __future__ import annotations

import json
import select
import socket
import threading

from .bodies import MAX_BODY, BadRequest


class ClientTimeout(BadRequest):
    """The client stopped sending its request (HTTP 408)."""


def _read_exact(rfile, size: int, what: str) -> bytes:
    try:
        raw = rfile.read(size)
    except TimeoutError as err:  # socket.timeout is TimeoutError
        raise ClientTimeout(f"the client sent no more of {what} within the read timeout") from err
    if len(raw) < size:
        raise BadRequest(f"{what} ended after {len(raw)} of {size} bytes")
    return raw


def _read_line(rfile, what: str) -> bytes:
    try:
        line = rfile.readline(1024)
    except TimeoutError as err:
        raise ClientTimeout(f"the client sent no more of {what} within the read timeout") from err
    if not line.endswith(b"\n"):
        raise BadRequest(f"{what}: a chunk header or trailer line is missing, cut or longer than 1024 bytes")
    return line


def read_chunked(rfile) -> bytes:
    """A ``Transfer-Encoding: chunked`` body (RFC 9112 7.1), trailers skipped, at most :data:`MAX_BODY` bytes."""
    parts, total = [], 0
    while True:
        line = _read_line(rfile, "the chunked body")
        try:
            size = int(line.split(b";")[0].strip(), 16)
        except ValueError as err:
            raise BadRequest(f"the chunked body has a bad chunk size line {line[:40]!r}") from err
        if size < 0:
            raise BadRequest(f"the chunked body has a negative chunk size {size}")
        if size == 0:
            break
        total += size
        if total > MAX_BODY:
            raise BadRequest(f"the body has more than {MAX_BODY} bytes; at most {MAX_BODY} are accepted")
        parts.append(_read_exact(rfile, size, "a chunk of the body"))
        if _read_line(rfile, "the chunked body").strip():
            raise BadRequest("the chunked body has a chunk longer than its size line says")
    while _read_line(rfile, "the chunked body's trailer").strip():
        pass
    return b"".join(parts)


def read_body(headers, rfile) -> dict:
    """The request's JSON object, from a Content-Length or a chunked body; BadRequest (400), ClientTimeout
    (408) or a message for each way it can be wrong."""
    coding = headers.get("Transfer-Encoding")
    length = headers.get("Content-Length")
    if coding is not None:
        if coding.strip().lower() != "chunked" or length is not None:
            raise BadRequest(f"Transfer-Encoding {coding!r} is not accepted: send chunked alone, or a Content-Length")
        raw = read_chunked(rfile)
    else:
        if length is None or not length.strip().isdigit():
            raise BadRequest(
                "the request needs a Content-Length header (or Transfer-Encoding: chunked) and a JSON body"
            )
        if int(length) > MAX_BODY:
            raise BadRequest(f"the body has {int(length)} bytes; at most {MAX_BODY} are accepted")
        raw = _read_exact(rfile, int(length), "the body")
    try:
        body = json.loads(raw)
    except ValueError as err:
        raise BadRequest(f"the body is not valid JSON: {err}") from err
    if not isinstance(body, dict):
        raise BadRequest(f"the body must be a JSON object, got {type(body).__name__}")
    return body


class ClientWatch:
    """While the engine works, poll the client's socket; if the client closed it, call ``on_gone`` once.

    A readable socket with nothing to read is a closed one (EOF). A client that sends more (a pipelined
    request) is present, and the watch stops. A client that half-closes its side after the request is
    taken to have left.
    """

    def __init__(self, sock, on_gone, interval: float = 0.1):
        self.sock, self.on_gone, self.interval = sock, on_gone, interval
        self.gone = False
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="client-watch")

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._done.set()  # not joined: the answer goes out now, the thread ends within one interval

    def _run(self):
        while not self._done.is_set():
            try:
                ready, _, _ = select.select([self.sock], [], [], self.interval)
            except (OSError, ValueError):  # the socket was closed under us
                return
            if not ready or self._done.is_set():
                continue
            try:
                data = self.sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
            except (BlockingIOError, InterruptedError):
                continue
            except OSError:
                data = b""
            if data:
                return
            self.gone = True
            self.on_gone()
            return
