"""``python -m gemfilter.lab.serve.burst``: concurrent bursts through ``gemfilter serve`` and straight to its engine.

Each burst sends N requests at once (one thread each, released together by a barrier) to
``/v1/completions``, non-streamed, and counts the answers that are complete (HTTP 200 with a choice that
has text and a finish reason); everything else (a reset, a refused connection, an HTTP error, a timeout)
counts as failed, by kind. It runs the same bursts against each target in turn, in one run, and prints a
table: answered / sent, p50 and p95 latency, and the burst's wall time.

Example (a vLLM on :8000 and ``gemfilter serve --engine http://127.0.0.1:8000/v1 --port 8100``)::

    python -m gemfilter.lab.serve.burst --target direct=http://127.0.0.1:8000/v1 \\
        --target proxy=http://127.0.0.1:8100/v1 --bursts small=100x16,large=20x1000
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
import urllib.error
import urllib.request

from gemfilter.toolkit.entry import command

from .bench import quantile

WORDS = (
    "the quick brown fox jumps over the lazy dog while seven wise owls count stars above a quiet harbour town"
).split()


def prompt_of(tokens: int, salt: int) -> str:
    """About ``tokens`` words of filler, different per request (``salt``), so no prefix cache serves it."""
    words = [WORDS[(salt * 7 + i) % len(WORDS)] for i in range(tokens)]
    return f"Request {salt}. " + " ".join(words) + "\nSummary:"


def one_request(url: str, body: dict, timeout: float) -> tuple:
    """(outcome, seconds): "ok", or the kind of failure."""
    start = time.perf_counter()
    req = urllib.request.Request(
        url + "/completions", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            answer = json.loads(resp.read())
        choice = (answer.get("choices") or [{}])[0]
        ok = isinstance(choice.get("text"), str) and choice.get("finish_reason")
        return ("ok" if ok else "incomplete answer"), time.perf_counter() - start
    except urllib.error.HTTPError as err:
        return f"HTTP {err.code}", time.perf_counter() - start
    except (ConnectionResetError, ConnectionRefusedError, BrokenPipeError) as err:
        return type(err).__name__, time.perf_counter() - start
    except (TimeoutError, urllib.error.URLError, OSError, ValueError) as err:
        reason = getattr(err, "reason", err)
        return type(reason).__name__, time.perf_counter() - start


def burst(url: str, model: str, count: int, tokens: int, max_tokens: int, timeout: float, salt0: int) -> dict:
    """Send ``count`` requests at once; return the outcome counts, latencies and wall time."""
    results: list = [None] * count
    gate = threading.Barrier(count)

    def worker(i):
        body = {"model": model, "prompt": prompt_of(tokens, salt0 + i), "max_tokens": max_tokens, "temperature": 0}
        gate.wait()
        results[i] = one_request(url, body, timeout)

    threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(count)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - start
    outcomes: dict = {}
    for outcome, _ in results:
        outcomes[outcome] = outcomes.get(outcome, 0) + 1
    ok = [s for outcome, s in results if outcome == "ok"]  # quantile sorts
    return {
        "sent": count,
        "answered": outcomes.get("ok", 0),
        "failures": {k: v for k, v in outcomes.items() if k != "ok"},
        "p50_s": quantile(ok, 50),
        "p95_s": quantile(ok, 95),
        "wall_s": wall,
    }


def parse_bursts(text: str) -> list:
    """``name=COUNTxTOKENS,...`` -> [(name, count, tokens)]."""
    out = []
    for item in filter(None, text.split(",")):
        name, _, spec = item.partition("=")
        count, _, tokens = spec.partition("x")
        try:
            count, tokens = int(count), int(tokens)
        except ValueError:
            raise ValueError(f"--bursts {item!r}: give name=COUNTxTOKENS, e.g. small=100x16") from None
        if not name or count < 1 or count > 1000 or tokens < 1:
            raise ValueError(f"--bursts {item!r}: a name, 1..1000 requests and >= 1 prompt words")
        out.append((name, count, tokens))
    if not out:
        raise ValueError("--bursts is empty; e.g. small=100x16,large=20x1000")
    return out


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m gemfilter.lab.serve.burst",
        description=__doc__.split("\n\n")[0],
        epilog=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--target",
        action="append",
        required=True,
        metavar="NAME=URL",
        help="an OpenAI-compatible base URL ending in /v1, named (repeat: e.g. direct=... and proxy=...)",
    )
    p.add_argument("--model", default=None, help="model id to ask for (default: the first target's first model)")
    p.add_argument(
        "--bursts",
        default="small=100x16,large=20x1000",
        help="bursts as name=COUNTxWORDS (default small=100x16,large=20x1000)",
    )
    p.add_argument("--max-tokens", type=int, default=8, help="tokens each request generates (default 8)")
    p.add_argument("--timeout", type=float, default=900.0, help="seconds a request may take (default 900)")
    p.add_argument("--json", default=None, help="also write the results to this JSON file")
    return p


def first_model(url: str, timeout: float) -> str:
    with urllib.request.urlopen(url + "/models", timeout=timeout) as resp:
        return json.loads(resp.read())["data"][0]["id"]


@command(name="python -m gemfilter.lab.serve.burst")
def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        targets = [t.split("=", 1) for t in args.target]
        if any(len(t) != 2 or not t[1].startswith("http") for t in targets):
            raise ValueError("--target takes NAME=URL, e.g. proxy=http://127.0.0.1:8100/v1")
        bursts = parse_bursts(args.bursts)
        if args.max_tokens < 1 or not 0 < args.timeout < float("inf"):
            raise ValueError("--max-tokens must be >= 1 and --timeout a finite number of seconds > 0")
        model = args.model or first_model(targets[0][1].rstrip("/"), args.timeout)
    except (ValueError, OSError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    rows, salt = [], 0
    for bname, count, words in bursts:
        for tname, url in targets:
            r = burst(url.rstrip("/"), model, count, words, args.max_tokens, args.timeout, salt)
            salt += count
            rows.append({"burst": bname, "target": tname, "words": words, **r})
            print(
                f"{bname} ({count} x {words} words) -> {tname}: {r['answered']}/{r['sent']} answered", file=sys.stderr
            )
    print("| burst | target | answered | failures | p50 s | p95 s | wall s |\n|---|---|---|---|---|---|---|")
    for r in rows:
        fails = ", ".join(f"{k} {v}" for k, v in r["failures"].items()) or "none"

        def fmt(x):
            return "-" if x is None else f"{x:.2f}"

        print(
            f"| {r['burst']} ({r['sent']} x {r['words']} words) | {r['target']} | {r['answered']}/{r['sent']} | "
            f"{fails} | {fmt(r['p50_s'])} | {fmt(r['p95_s'])} | {r['wall_s']:.1f} |"
        )
    if args.json:
        from gemfilter.toolkit.io import write_json_atomic

        write_json_atomic(args.json, {"model": model, "max_tokens": args.max_tokens, "rows": rows})
    return 0 if all(r["answered"] == r["sent"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
