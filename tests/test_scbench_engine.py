"""``gemfilter-scbench run --engine URL`` against an engine that answers with a tiny random model's greedy ``generate``.

Independent check: the engine rows of ``full`` and of ``gemfilter@reselect`` equal the local runner's rows
(``Conversation``: the history's cache, reselect per turn) turn by turn (prediction, score, kept, history), though
the engine path selects with the proxy's selector and its prefix cache and generates from plain kept ids.
"""

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import torch
from test_scbench_runner import BASE, CharTokenizer, tiny  # noqa: F401 - the module's fixture

from eval.scbench.runner import RunConfig, run

pytestmark = pytest.mark.usefixtures("quiet")


class Tok(CharTokenizer):
    def __call__(self, text, add_special_tokens=True):
        return {"input_ids": self.encode(text, add_special_tokens)}


class ModelEngine:
    """An OpenAI-compatible engine on localhost whose streamed completions are ``model.generate`` (greedy, EOS)."""

    def __init__(self, model, tok):
        engine = self
        self.prompts = []

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _json(self, data):
                raw = json.dumps(data).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            def do_GET(self):
                self._json({"object": "list", "data": [{"id": "tiny", "object": "model", "max_model_len": 4096}]})

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                if self.path == "/tokenize":
                    return self._json({"tokens": tok.encode(body["prompt"])})
                engine.prompts.append(body["prompt"])
                ids = torch.tensor([body["prompt"]])
                with torch.no_grad():
                    out = model.generate(ids, max_new_tokens=body["max_tokens"], do_sample=False)[0, ids.shape[1] :]
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Connection", "close")
                self.end_headers()
                for i, t in enumerate(out.tolist()):
                    text = tok.decode([t], skip_special_tokens=True)
                    chunk = {
                        "choices": [{"index": 0, "text": text, "finish_reason": "stop" if i == len(out) - 1 else None}]
                    }
                    self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
                self.wfile.write(b"data: [DONE]\n\n")
                self.close_connection = True

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.mark.slow  # a run through an engine and one local run (~8 s a mode)
@pytest.mark.parametrize("mode", ["multi-turn", "multi-request"])
def test_engine_rows_equal_the_local_rows(tiny, tmp_path, mode):  # noqa: F811 - the imported fixture
    model, _ = tiny
    tok = Tok()
    config = RunConfig(
        **{**BASE, "methods": ("full", "gemfilter:k=48,layer=2"), "protocols": ("reselect",), "modes": (mode,)}
    )
    local = run(config, tmp_path / "local", model_and_tokenizer=(model, tok), progress=False)
    engine = ModelEngine(model, tok)
    try:
        remote = run(
            RunConfig(**{**config.__dict__, "engine": engine.url}),
            tmp_path / "engine",
            model_and_tokenizer=(model, tok),
            progress=False,
        )
    finally:
        engine.close()
    assert sorted(local) == sorted(remote) and len(local) == 4
    for file, rows in local.items():
        for here, there in zip(rows, remote[file]):
            assert there["engine"] == engine.url and here["_id"] == there["_id"]
            for a, b in zip(here["turns"], there["turns"]):
                assert (a["prediction"], a["score"], a["kept"], a["history_tokens"]) == (
                    b["prediction"],
                    b["score"],
                    b["kept"],
                    b["history_tokens"],
                ), (file, here["_id"], a["turn_idx"])
    cached = [
        t["selector_cached_tokens"] for f, rows in remote.items() if "gemfilter" in f for r in rows for t in r["turns"]
    ]
    assert max(cached) > 0  # later turns (multi-turn) or queries (multi-request) started from the cached prefix
    assert max(len(p) for p in engine.prompts) > 48  # full sent whole prompts; gemfilter sent 48 kept ids


def test_reuse_and_cache_methods_are_refused_with_an_engine(tmp_path):
    with pytest.raises(ValueError, match=r"--engine runs full .* not gemfilter:k=48,layer=2@reuse, snapkv:k=64"):
        run(
            RunConfig(**{**BASE, "engine": "http://127.0.0.1:9/v1"}), tmp_path / "out", model_and_tokenizer=(None, None)
        )
    assert not (tmp_path / "out").exists()


def test_topk_and_layer_reach_the_engine_rows(tiny, tmp_path):  # noqa: F811 - the imported fixture
    """With --engine too, --topk and --layer are the defaults of the specs that set none (item 6)."""
    model, _ = tiny
    engine = ModelEngine(model, Tok())
    try:
        config = RunConfig(
            **{
                **BASE,
                "methods": ("gemfilter",),
                "topk": 16,
                "layer": 1,
                "protocols": ("reselect",),
                "tasks": ("scbench_mf",),
                "num_samples": 1,
                "engine": engine.url,
                "timeout": 30,
            }
        )
        merged = run(config, tmp_path / "out", model_and_tokenizer=(model, Tok()), progress=False)
    finally:
        engine.close()
    row = merged["multi-turn/2048/gemfilter@reselect/scbench_mf.jsonl"][0]
    assert row["topk"] == 16 and row["layer"] == 1 and {t["kept"] for t in row["turns"]} == {16}
    assert {len(p) for p in engine.prompts} == {16}
