"""``gemfilter serve`` under bursts and bad clients: connections queue instead of
being reset, a client that leaves closes the engine's request, a client that stops sending is dropped, and
request bodies are read whole (Content-Length or chunked) or refused once, with the connection closed.

Clients here talk raw HTTP over sockets, as broken or impatient clients do.
"""

import json
import socket
import threading
import time
import urllib.parse
from concurrent.futures import ThreadPoolExecutor

import pytest
from serve_fixtures import LAYER, PROMPT, CharTokenizer, make_proxy, model, post, proxy, stub  # noqa: F401

from gemfilter.lab.serve.proxy import ProxyServer
from gemfilter.toolkit.serving.selector import Selector
from gemfilter.toolkit.serving.upstream import Upstream


def address(url):
    parts = urllib.parse.urlsplit(url)
    return parts.hostname, parts.port


def request_bytes(body: dict, path="/v1/completions", extra=b"") -> bytes:
    raw = json.dumps(body).encode()
    return (
        (
            f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {len(raw)}\r\n"
            "Connection: close\r\n"
        ).encode()
        + extra
        + b"\r\n"
        + raw
    )


def read_all(sock, timeout=5.0) -> bytes:
    """Everything the server sends until it closes the connection (a timeout fails the test)."""
    sock.settimeout(timeout)
    out = b""
    while True:
        piece = sock.recv(65536)
        if not piece:
            return out
        out += piece


def wait_for(predicate, seconds):
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(0.02)
    return predicate()


# --- E: bursts ----------------------------------------------------------------------------------
def test_a_burst_that_arrives_before_the_proxy_accepts_is_queued_and_answered(model, stub):
    """100 clients connect at once while the accept loop is not running: with a backlog of 5 (socketserver's
    default) most connects would be dropped; with the default backlog every one is queued, then answered."""
    server = ProxyServer(
        ("127.0.0.1", 0), Selector(model, CharTokenizer(), LAYER), Upstream(stub.url, timeout=5), topk=16, quiet=True
    )
    addr = server.server_address[:2]
    try:

        def connect(_):
            try:
                return socket.create_connection(addr, timeout=1.5)
            except OSError:
                return None

        with ThreadPoolExecutor(100) as pool:
            socks = list(pool.map(connect, range(100)))
        connected = [s for s in socks if s is not None]
        threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

        def exchange(sock):
            with sock:
                sock.sendall(request_bytes({"prompt": "hi", "model": "stub-model", "max_tokens": 1}))
                return read_all(sock, timeout=20).split(b"\r\n", 1)[0]

        with ThreadPoolExecutor(20) as pool:
            answers = list(pool.map(exchange, connected))
    finally:
        server.shutdown()
        server.server_close()
    assert len(connected) == 100
    assert answers == [b"HTTP/1.1 200 OK"] * 100


def test_100_concurrent_requests_are_all_answered(make_proxy, stub):
    url = make_proxy(timeout=10)
    barrier = threading.Barrier(100)

    def one(i):
        barrier.wait()
        prompt = PROMPT if i % 2 else "short"  # half are filtered (a selection each), half pass through
        return post(url + "/v1/completions", {"prompt": prompt, "model": "stub-model", "max_tokens": 1}, timeout=60)[0]

    with ThreadPoolExecutor(100) as pool:
        statuses = list(pool.map(one, range(100)))
    assert statuses == [200] * 100 and len(stub.bodies) == 100


def test_max_concurrency_bounds_the_requests_handled_at_once(make_proxy, stub):
    url = make_proxy(timeout=10, max_concurrency=2)
    stub.mode, stub.delay = "slow", 0.4
    with ThreadPoolExecutor(6) as pool:
        statuses = list(
            pool.map(lambda _: post(url + "/v1/completions", {"prompt": PROMPT, "model": "m"})[0], range(6))
        )
    assert statuses == [200] * 6 and stub.peak == 2


@pytest.mark.parametrize(
    "option, value, message",
    [
        ("backlog", 0, "--backlog must be a whole number in \\[1, 65535\\], got 0"),
        ("max_concurrency", 0, "--max-concurrency must be a whole number in \\[1, 4096\\], got 0"),
        ("client_timeout", float("nan"), "--client-timeout must be a number of seconds in \\(0, 86400\\], got nan"),
    ],
)
def test_bad_limits_are_refused_by_name(model, option, value, message):
    with pytest.raises(ValueError, match=message):
        ProxyServer(
            ("127.0.0.1", 0),
            Selector(model, CharTokenizer(), LAYER),
            Upstream("http://127.0.0.1:1/v1"),
            **{option: value},
        )


# --- F: a client that leaves ----------------------------------------------------------------------
@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
def test_a_client_that_leaves_closes_the_engine_s_request(make_proxy, stub, stream):
    url = make_proxy(timeout=10)
    stub.mode, stub.delay = ("stall" if stream else "slow"), 5.0
    sock = socket.create_connection(address(url), timeout=5)
    sock.sendall(request_bytes({"prompt": PROMPT, "model": "m", "stream": stream}))
    if stream:
        assert b'"text": "o"' in sock.recv(65536) or b'"text": "o"' in sock.recv(65536)  # headers, first chunk
    else:
        assert wait_for(lambda: stub.bodies, 5)  # the engine is working on it
    start = time.monotonic()
    sock.close()
    assert wait_for(lambda: stub.cancelled == 1, 2.0), "the engine's request stayed open after the client left"
    assert time.monotonic() - start < 2.0


# --- G and 13: a client that stops sending --------------------------------------------------------
def test_a_client_that_stops_sending_its_body_gets_a_408_after_the_client_timeout(make_proxy, stub):
    url = make_proxy(client_timeout=0.5)
    with socket.create_connection(address(url), timeout=5) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{")
        start = time.monotonic()
        answer = read_all(sock, timeout=5)
    assert answer.startswith(b"HTTP/1.1 408") and time.monotonic() - start < 3
    assert b"within the read timeout" in answer and stub.bodies == []


def test_a_body_shorter_than_its_content_length_is_a_400_naming_both(make_proxy, stub):
    url = make_proxy()
    with socket.create_connection(address(url), timeout=5) as sock:
        sock.sendall(b'POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{"prompt": 1}')
        sock.shutdown(socket.SHUT_WR)
        answer = read_all(sock, timeout=5)
    assert answer.startswith(b"HTTP/1.1 400") and b"the body ended after 13 of 1000 bytes" in answer


def test_an_idle_connection_is_closed_after_the_client_timeout(make_proxy):
    url = make_proxy(client_timeout=0.3)
    with socket.create_connection(address(url), timeout=5) as sock:
        assert read_all(sock, timeout=3) == b""  # closed by the proxy, no thread held


# --- H: chunked bodies ----------------------------------------------------------------------------
def test_a_chunked_body_is_read_whole(make_proxy, stub):
    url = make_proxy()
    raw = json.dumps({"prompt": "short text", "model": "stub-model", "max_tokens": 1}).encode()
    chunked = b"%x\r\n%s\r\n%x;ext=1\r\n%s\r\n0\r\nX-Trailer: t\r\n\r\n" % (10, raw[:10], len(raw) - 10, raw[10:])
    with socket.create_connection(address(url), timeout=5) as sock:
        sock.sendall(
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
            b"Connection: close\r\n\r\n" + chunked
        )
        answer = read_all(sock)
    assert answer.startswith(b"HTTP/1.1 200") and stub.bodies[-1]["prompt"] == "short text"


@pytest.mark.parametrize(
    "chunked, message",
    [
        (b"zz\r\n{}\r\n0\r\n\r\n", b"bad chunk size line"),
        (b"2\r\n{}}}\r\n0\r\n\r\n", b"a chunk longer than its size line says"),
    ],
)
def test_a_bad_chunked_body_gets_one_400_and_the_connection_closes(make_proxy, stub, chunked, message):
    url = make_proxy()
    with socket.create_connection(address(url), timeout=5) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n" + chunked)
        answer = read_all(sock)
    assert answer.startswith(b"HTTP/1.1 400") and message in answer
    assert answer.count(b"HTTP/1.1") == 1 and b"<html" not in answer.lower() and stub.bodies == []


def test_the_server_s_own_errors_are_json_not_html(make_proxy):
    url = make_proxy()
    with socket.create_connection(address(url), timeout=5) as sock:
        sock.sendall(b"BREW /pot HTTP/1.1\r\nHost: x\r\n\r\n")
        answer = read_all(sock)
    head, body = answer.split(b"\r\n\r\n", 1)
    assert head.startswith(b"HTTP/1.1 501") and json.loads(body)["error"]["code"] == 501


def test_the_burst_tool_counts_every_answer_through_the_proxy_and_direct(make_proxy, stub, capsys, tmp_path):
    """python -m gemfilter.lab.serve.burst against the stub directly and through the proxy: every request answered;
    against a closed port every request is counted as failed, by kind, and the exit status says so."""
    from gemfilter.lab.serve.burst import main

    proxy = make_proxy(timeout=30)
    out = tmp_path / "burst.json"
    assert (
        main(
            [
                "--target",
                f"direct={stub.url}",
                "--target",
                f"proxy={proxy}/v1",
                "--bursts",
                "small=40x12",
                "--model",
                "stub-model",
                "--json",
                str(out),
            ]
        )
        == 0
    )
    rows = json.loads(out.read_text())["rows"]
    assert [(r["target"], r["answered"], r["sent"]) for r in rows] == [("direct", 40, 40), ("proxy", 40, 40)]
    assert "| small (40 x 12 words) | proxy | 40/40 | none |" in capsys.readouterr().out
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{s.getsockname()[1]}/v1"
    assert main(["--target", f"gone={closed}", "--bursts", "one=3x4", "--model", "m", "--timeout", "5"]) == 1
    assert "| one (3 x 4 words) | gone | 0/3 | ConnectionRefusedError 3 |" in capsys.readouterr().out
    assert main(["--target", "nourl", "--bursts", "a=1x1"]) == 2
    assert "error: --target takes NAME=URL" in capsys.readouterr().err


@pytest.mark.parametrize("n", [1, 2, 5, 19, 20, 21, 100])
def test_every_lab_table_takes_percentiles_by_numpy_s_nearest_rank(n):
    """The burst tool and the conversation tables share one rule: p50 the median, p95 numpy's ``nearest`` rank
    (for 20 values the 19th, not the slowest); ``None`` entries are dropped and an empty list gives ``None``."""
    import numpy as np

    from gemfilter.lab.serve.bench import quantile

    values = list(np.random.default_rng(n).permutation(np.arange(n, dtype=float) ** 1.5))
    assert quantile(values + [None], 95) == np.percentile(values, 95, method="nearest")
    assert quantile(values, 50) == np.median(values)
    assert quantile([None], 95) is None and quantile([], 50) is None
