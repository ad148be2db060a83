"""A small client for an OpenAI-compatible engine (vLLM, SGLang, TGI, ...), standard library only.

Every failure becomes an :class:`UpstreamError` carrying the HTTP status the proxy answers with:

- 502: the engine cannot be reached, closes or resets the connection, cuts its body or stream short
  (a stream that ends without ``[DONE]``), answers something that is not JSON, a completion without
  choices, a streamed request with something that is not an event stream, or a 5xx of its own;
- 504: it does not answer, or its stream stalls, for ``timeout`` seconds;
- the engine's own status when it refuses the request with a 4xx (the client's fault, e.g. a prompt
  longer than the engine's model).

A :class:`Call` passed to :meth:`Upstream.post` or :meth:`Upstream.stream` can be aborted from another
thread: the engine sees its connection close and cancels the request (vLLM does).
"""

from __future__ import annotations

import http.client
import json
import socket
import threading
import urllib.parse


class UpstreamError(OSError):
    """The engine failed; ``status`` is the HTTP status to answer the client with. An OSError, so that the
    commands report it as "error: ..." like any other failed connection or file."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


def _error_text(body: bytes) -> str:
    """The message of an OpenAI-style error body, or the body itself (cut short)."""
    try:
        data = json.loads(body)
        err = data.get("error", data) if isinstance(data, dict) else data
        msg = err.get("message") if isinstance(err, dict) else None
        return str(msg if msg is not None else err)[:2000]
    except ValueError:
        return body.decode("utf-8", "replace")[:2000]


def check_completion(answer, url: str) -> dict:
    """``answer`` if it is a completion whose every choice is complete, else an :class:`UpstreamError` (502) that
    says what the engine sent instead. For any caller of ``/completions`` (the proxy, ``--engine`` runs).

    A 200 that is not a completion (``{}``, no ``choices``, a choice without text (a chat's: message) or finish
    reason, token ids that are not ints) is the engine's fault, never a result: it must not become an empty answer in a
    row.
    """
    choices = answer.get("choices") if isinstance(answer, dict) else None
    if not isinstance(choices, list) or not choices or not all(isinstance(c, dict) for c in choices):
        raise UpstreamError(502, f"the engine at {url} answered without a list of choices: {json.dumps(answer)[:200]}")
    for choice in choices:
        ids = choice.get("token_ids")
        content = isinstance(choice.get("text"), str) or isinstance(choice.get("message"), dict)  # or a chat's
        if (
            not content
            or not choice.get("finish_reason")
            or (ids is not None and not (isinstance(ids, list) and all(type(i) is int for i in ids)))
        ):
            raise UpstreamError(
                502,
                f"the engine at {url} answered an incomplete choice (text or message, "
                f"finish_reason and token ids expected): {json.dumps(choice)[:200]}",
            )
    return answer


class Call:
    """One request to the engine, abortable from another thread (:meth:`abort`): the proxy's client left."""

    def __init__(self):
        self.sock = None
        self.aborted = False
        self._lock = threading.Lock()

    def attach(self, conn) -> None:
        """Hold the connected socket of ``conn`` (http.client drops its own reference once a response that
        closes the connection has begun; the response's reader keeps the socket open)."""
        with self._lock:
            self.sock = conn.sock
            if self.aborted:
                self._shut()

    def abort(self) -> None:
        """Close the connection to the engine now; a read waiting on it returns at once."""
        with self._lock:
            self.aborted = True
            self._shut()

    def _shut(self):
        if self.sock is not None:
            try:
                self.sock.shutdown(socket.SHUT_RDWR)  # wakes a blocked recv in the other thread; close() would not
            except OSError:
                pass


class Upstream:
    """The engine at ``url`` (its OpenAI base, e.g. ``http://127.0.0.1:8000/v1``).

    timeout: seconds to wait for the connection and for each read (a stream's gap between chunks).
    """

    def __init__(self, url: str, timeout: float = 600.0):
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"--upstream must be an http(s) URL such as http://127.0.0.1:8000/v1, got {url!r}")
        self.url = url.rstrip("/")
        self.root = self.url[: -len("/v1")] if self.url.endswith("/v1") else self.url
        self.timeout = timeout
        self._model = None
        self._max_len = {}
        self._listed = None  # the model ids of the last GET /models

    # --- one exchange ---------------------------------------------------------------------------
    def _open(self, url: str, body: dict | None, call: Call | None = None):
        """(connection, response) for ``url``; an error status becomes an :class:`UpstreamError`."""
        parts = urllib.parse.urlsplit(url)
        cls = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
        conn = cls(parts.hostname, parts.port, timeout=self.timeout)
        call = call or Call()
        try:
            conn.connect()
        except (TimeoutError, socket.timeout) as err:
            raise UpstreamError(
                504, f"the engine at {url} did not accept a connection within {self.timeout:g} s"
            ) from err
        except OSError as err:
            raise UpstreamError(502, f"the engine at {url} is unreachable: {err}") from err
        call.attach(conn)
        path = parts.path + (f"?{parts.query}" if parts.query else "")
        data = None if body is None else json.dumps(body).encode()
        headers = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}
        try:
            conn.request("GET" if body is None else "POST", path, body=data, headers=headers)
            resp = conn.getresponse()
        except BaseException as err:
            conn.close()
            raise self._failure(err, url, "did not answer") from err
        if resp.status >= 400:
            raw = self._read(conn, resp, url)
            status = resp.status if resp.status < 500 else 502  # a 5xx is the engine's fault, not the proxy's
            raise UpstreamError(status, f"the engine answered {resp.status} at {url}: {_error_text(raw)}")
        return conn, resp

    def _failure(self, err: BaseException, url: str, what: str) -> BaseException:
        """The :class:`UpstreamError` for an exception raised while talking to the engine (others unchanged)."""
        if isinstance(err, (TimeoutError, socket.timeout)):
            return UpstreamError(504, f"the engine at {url} {what} within {self.timeout:g} s")
        if isinstance(err, http.client.IncompleteRead):
            got = len(err.partial)
            part = f"of {got + err.expected} announced" if err.expected is not None else "into a chunk of its stream"
            return UpstreamError(
                502, f"the engine at {url} cut its answer short: the connection closed {got} bytes {part}"
            )
        if isinstance(err, (http.client.HTTPException, OSError)):
            return UpstreamError(
                502, f"the engine at {url} closed or reset the connection: {type(err).__name__}: {err}"
            )
        return err

    def _read(self, conn, resp, url: str) -> bytes:
        try:
            return resp.read()
        except Exception as err:
            raise self._failure(err, url, "stopped sending its answer") from err
        finally:
            resp.close()
            conn.close()

    def _json(self, url: str, body: dict | None, call: Call | None = None):
        conn, resp = self._open(url, body, call)
        raw = self._read(conn, resp, url)
        try:
            return json.loads(raw)
        except ValueError as err:
            raise UpstreamError(502, f"the engine at {url} answered something that is not JSON: {raw[:200]!r}") from err

    # --- the API --------------------------------------------------------------------------------
    def get(self, path: str):
        return self._json(self.url + path, None)

    def post(self, path: str, body: dict, root: bool = False, call: Call | None = None):
        return self._json((self.root if root else self.url) + path, body, call)

    def complete(self, path: str, body: dict, call: Call | None = None) -> dict:
        """:meth:`post` to a completions endpoint, checked to hold choices (:func:`check_completion`)."""
        return check_completion(self.post(path, body, call=call), self.url + path)

    def stream(self, path: str, body: dict, call: Call | None = None):
        """Yield the ``data:`` payloads of an SSE answer as strings, ending with ``[DONE]``; a stream that is
        not SSE, stalls, is reset or ends before ``[DONE]`` raises :class:`UpstreamError` instead."""
        url = self.url + path
        conn, resp = self._open(url, body, call)
        try:
            kind = resp.getheader("Content-Type", "")
            if not kind.startswith("text/event-stream"):
                raw = self._read(conn, resp, url)
                raise UpstreamError(
                    502,
                    f"the engine at {url} answered a streamed request with {kind or 'no type'}, "
                    f"not an event stream: {raw[:200]!r}",
                )
            while True:
                try:
                    line = resp.readline()
                except (TimeoutError, socket.timeout) as err:
                    raise UpstreamError(
                        504, f"the engine's stream at {url} stalled: no chunk for {self.timeout:g} s"
                    ) from err
                except Exception as err:
                    raise self._failure(err, url, "") from err
                if not line:
                    raise UpstreamError(
                        502, f"the engine's stream at {url} ended before [DONE]: the answer is incomplete"
                    )
                line = line.strip()
                if line.startswith(b"data:"):
                    data = line[5:].strip().decode("utf-8", "replace")
                    yield data
                    if data == "[DONE]":
                        return
        finally:
            resp.close()
            conn.close()

    # --- the engine's models ----------------------------------------------------------------------
    def models(self) -> list:
        """The model objects the engine serves (``GET /models``)."""
        data = self.get("/models")
        listed = data.get("data", []) if isinstance(data, dict) else []
        return [m for m in listed if isinstance(m, dict)]

    def model_ids(self) -> list:
        """The model ids the engine serves (``GET /models``)."""
        return [m.get("id") for m in self.models()]

    def max_model_len(self, model: str) -> int | None:
        """The context length the engine reports for ``model`` at ``GET /models`` (vLLM's ``max_model_len``),
        asked once per model; None if it reports none."""
        if model not in self._max_len:
            found = [m.get("max_model_len") for m in self.models() if m.get("id") == model]
            value = found[0] if found else None
            self._max_len[model] = value if isinstance(value, int) and not isinstance(value, bool) else None
        return self._max_len[model]

    def serves(self, model: str) -> bool:
        """Whether the engine lists ``model`` at ``GET /models`` (asked again when a name is not in the last list,
        so a model the engine loads later is found)."""
        if model in (self._listed or ()):
            return True
        self._listed = set(self.model_ids())
        return model in self._listed

    def default_model(self) -> str:
        """The first model id the engine lists, asked once; the model field of requests that name none."""
        if self._model is None:
            ids = self.model_ids()
            if not ids:
                raise UpstreamError(502, f"the engine at {self.url} lists no model at GET /models")
            self._model = ids[0]
        return self._model


#: A text every tokenizer pair must agree on before kept ids are sent (accents, CJK, an emoji, tabs).
PROBE = 'GemFilter keeps 1024 of 120,000 tokens: the needle ("7 days") — überall, 東京, 🙂!\n\tdone.'


def check_tokenizer(upstream, tokenizer, model: str) -> None:
    """Refuse to start unless the engine tokenizes :data:`PROBE` to the same ids as the selector (vLLM's
    ``POST /tokenize``): kept ids from another tokenizer would be other tokens."""
    ours = tokenizer(PROBE, add_special_tokens=True)["input_ids"]
    try:
        theirs = upstream.post("/tokenize", {"model": model, "prompt": PROBE, "add_special_tokens": True}, root=True)
    except UpstreamError as err:
        raise ValueError(
            f"could not compare tokenizers: {err}. The check uses the engine's POST /tokenize "
            "(vLLM has it); pass --skip-tokenizer-check to start without it"
        ) from err
    tokens = theirs.get("tokens") if isinstance(theirs, dict) else None
    if tokens != ours:
        raise ValueError(
            f"the selector's tokenizer and the engine's differ: {PROBE!r} is {ours[:12]}... here and "
            f"{(tokens or [])[:12]}... at the engine. Serve the same model (or one with the same "
            "tokenizer) on both sides"
        )
