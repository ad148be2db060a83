"""A small client for an OpenAI-compatible engine (vLLM, SGLang, TGI, ...), standard library only.

Every failure becomes an :class:`UpstreamError` carrying the HTTP status the proxy answers with:
502 when the engine cannot be reached or answers something that is not JSON, 504 when it does not
answer within the timeout, and the engine's own status when it answers with an error.
"""

from __future__ import annotations

import json
import socket
import urllib.error
import urllib.request


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

    def _open(self, url: str, body: dict | None):
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(url, data=data, method="GET" if body is None else "POST",
                                     headers={"Content-Type": "application/json", "Accept": "application/json"})
        try:
            return urllib.request.urlopen(req, timeout=self.timeout)
        except urllib.error.HTTPError as err:
            raise UpstreamError(err.code, f"the engine answered {err.code} at {url}: {_error_text(err.read())}") from err
        except (TimeoutError, socket.timeout) as err:
            raise UpstreamError(504, f"the engine at {url} did not answer within {self.timeout:g} s") from err
        except (urllib.error.URLError, ConnectionError, OSError) as err:
            reason = getattr(err, "reason", err)
            raise UpstreamError(502, f"the engine at {url} is unreachable: {reason}") from err

    def _read_json(self, resp, url: str):
        try:
            raw = resp.read()
        except (TimeoutError, socket.timeout) as err:
            raise UpstreamError(504, f"the engine at {url} stopped answering for {self.timeout:g} s") from err
        finally:
            resp.close()
        try:
            return json.loads(raw)
        except ValueError as err:
            raise UpstreamError(502, f"the engine at {url} answered something that is not JSON: {raw[:200]!r}") from err

    def get(self, path: str):
        url = self.url + path
        return self._read_json(self._open(url, None), url)

    def post(self, path: str, body: dict, root: bool = False):
        url = (self.root if root else self.url) + path
        return self._read_json(self._open(url, body), url)

    def stream(self, path: str, body: dict):
        """Yield the ``data:`` payloads of an SSE answer as strings, ``[DONE]`` included."""
        url = self.url + path
        resp = self._open(url, body)
        try:
            while True:
                try:
                    line = resp.readline()
                except (TimeoutError, socket.timeout) as err:
                    raise UpstreamError(504, f"the engine's stream at {url} stalled for {self.timeout:g} s") from err
                if not line:
                    return
                line = line.strip()
                if line.startswith(b"data:"):
                    yield line[5:].strip().decode("utf-8")
        finally:
            resp.close()

    def model_ids(self) -> list:
        """The model ids the engine serves (``GET /models``)."""
        data = self.get("/models")
        return [m.get("id") for m in data.get("data", []) if isinstance(m, dict)] if isinstance(data, dict) else []

    def default_model(self) -> str:
        """The first model id the engine lists, asked once; the model field of requests that name none."""
        if self._model is None:
            ids = self.model_ids()
            if not ids:
                raise UpstreamError(502, f"the engine at {self.url} lists no model at GET /models")
            self._model = ids[0]
        return self._model


def check_completion(data, url: str) -> dict:
    """The first choice of a non-streamed ``/completions`` answer, checked; :class:`UpstreamError` (502) otherwise.

    A 200 that is not a completion (``{}``, no ``choices``, a choice without text or finish reason, token ids
    that are not ints) is the engine's fault, never a result: it must not become an empty answer in a row.
    """
    choices = data.get("choices") if isinstance(data, dict) else None
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise UpstreamError(502, f"the engine at {url} answered 200 without a completion (no choices): "
                            f"{json.dumps(data)[:200]}")
    choice = choices[0]
    ids = choice.get("token_ids")
    if not isinstance(choice.get("text"), str) or not choice.get("finish_reason") or (
            ids is not None and not (isinstance(ids, list) and all(type(i) is int for i in ids))):
        raise UpstreamError(502, f"the engine at {url} answered an incomplete choice (text, finish_reason and "
                            f"token ids expected): {json.dumps(choice)[:200]}")
    return choice


class CheckedUpstream(Upstream):
    """An :class:`Upstream` whose answers are complete or an :class:`UpstreamError`: a body cut short is a 502
    (not an ``http.client.IncompleteRead``), and a ``/completions`` answer passes :func:`check_completion`.
    What the eval runners generate through, so that a broken answer is an error, never a stored result."""

    def _read_json(self, resp, url: str):
        import http.client

        try:
            return super()._read_json(resp, url)
        except http.client.HTTPException as err:
            raise UpstreamError(502, f"the engine's answer at {url} was cut short: {type(err).__name__}") from err

    def post(self, path: str, body: dict, root: bool = False):
        data = super().post(path, body, root=root)
        if path.endswith("/completions") and not path.endswith("chat/completions"):
            check_completion(data, (self.root if root else self.url) + path)
        return data
