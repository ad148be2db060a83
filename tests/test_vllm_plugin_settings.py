"""The vLLM plugin's configuration (GEMFILTER_* variables), its entry points and ``gemfilter vllm-plugin``, no vLLM.

What the plugin does inside a real vLLM is checked by tests/test_vllm_plugin.py (slow).
"""

import json
import re
from pathlib import Path

import pytest
from docs_blocks import docs_block
from tiny_models import load_toml

from gemfilter.lab.cli import main
from gemfilter.lab.serve import vllm_plugin
from gemfilter.lab.serve.vllm_plugin import VARIABLES, Settings, check_environment, selector_name, settings_from_env

ROOT = Path(__file__).resolve().parents[1]


def test_no_variable_gives_the_defaults_a_request_without_a_field_passes():
    s = settings_from_env({})
    assert s == Settings() and s.scope == "requested" and s.method == "gemfilter" and s.topk is None
    assert s.defaults == {"method": "gemfilter", "topk": None}


def test_every_variable_is_read():
    env = {
        "GEMFILTER_METHOD": "gemfilter-span:k=256",
        "GEMFILTER_TOPK": "",
        "GEMFILTER_SCOPE": "all",
        "GEMFILTER_SELECTOR_MODEL": "meta-llama/Llama-3.2-1B",
        "GEMFILTER_LAYER": "7",
        "GEMFILTER_SELECTOR_CACHE_GB": "0",
        "GEMFILTER_SELECTOR_WORKERS": "2",
        "GEMFILTER_THREADS": "2",
        "GEMFILTER_ATTN": "sdpa",
        "GEMFILTER_SKIP_TOKENIZER_CHECK": "1",
        "GEMFILTER_CACHE": "/tmp/x",
    }
    assert settings_from_env(env) == Settings(
        method="gemfilter-span:k=256",
        scope="all",
        model="meta-llama/Llama-3.2-1B",
        layer=7,
        cache_gb=0.0,
        workers=2,
        threads=2,
        attn="sdpa",
        check_tokenizer=False,
    )
    assert settings_from_env({"GEMFILTER_TOPK": "512"}).defaults == {"method": "gemfilter", "topk": 512}


@pytest.mark.parametrize(
    "env, message",
    [
        ({"GEMFILTER_TOPK": "0"}, "GEMFILTER_TOPK must be a whole number >= 1, got '0'"),
        ({"GEMFILTER_TOPK": "1k"}, "GEMFILTER_TOPK must be a whole number >= 1, got '1k'"),
        (
            {"GEMFILTER_METHOD": "snapkv"},
            "GEMFILTER_METHOD / GEMFILTER_TOPK: method 'snapkv' cannot run in front of an engine",
        ),
        ({"GEMFILTER_METHOD": "gemfiltr"}, "GEMFILTER_METHOD / GEMFILTER_TOPK: unknown method 'gemfiltr'"),
        ({"GEMFILTER_METHOD": "gemfilter:k=64", "GEMFILTER_TOPK": "8"}, None),  # the spec's budget wins, as on the CLI
        ({"GEMFILTER_SCOPE": "everything"}, "GEMFILTER_SCOPE must be one of requested, all, got 'everything'"),
        ({"GEMFILTER_LAYER": "-1"}, "GEMFILTER_LAYER must be a whole number >= 0, got '-1'"),
        ({"GEMFILTER_SELECTOR_WORKERS": "65"}, "GEMFILTER_SELECTOR_WORKERS must be a whole number [1, 64], got '65'"),
        ({"GEMFILTER_SELECTOR_CACHE_GB": "nan"}, "GEMFILTER_SELECTOR_CACHE_GB must be a number of GB in [0, 1024]"),
        ({"GEMFILTER_SELECTOR_CACHE_GB": "-1"}, "GEMFILTER_SELECTOR_CACHE_GB must be a number of GB in [0, 1024]"),
        ({"GEMFILTER_ATTN": "flash"}, "GEMFILTER_ATTN must be one of banded, sdpa"),
        ({"GEMFILTER_SKIP_TOKENIZER_CHECK": "yes"}, "GEMFILTER_SKIP_TOKENIZER_CHECK must be 0 or 1, got 'yes'"),
        ({"GEMFILTER_TOP_K": "8"}, "unknown variable(s) GEMFILTER_TOP_K; the plugin reads GEMFILTER_METHOD, "),
    ],
)
def test_a_bad_variable_is_one_error_naming_it(env, message):
    if message is None:
        settings_from_env(env)
        return
    with pytest.raises(ValueError) as err:
        settings_from_env(env)
    assert str(err.value).startswith(message) and "\n" not in str(err.value)


def test_the_start_up_check_runs_only_when_vllm_plugins_names_the_plugin(monkeypatch):
    monkeypatch.setenv("GEMFILTER_TOPK", "zero")
    monkeypatch.delenv("VLLM_PLUGINS", raising=False)
    check_environment()  # not allowlisted: vLLM loads general plugins for every server, the check stays out
    monkeypatch.setenv("VLLM_PLUGINS", "lora_filesystem_resolver")
    check_environment()
    monkeypatch.setenv("VLLM_PLUGINS", "lora_filesystem_resolver,gemfilter")
    with pytest.raises(SystemExit) as exit_:
        check_environment()
    assert str(exit_.value) == "error: gemfilter plugin: GEMFILTER_TOPK must be a whole number >= 1, got 'zero'"


def test_the_selector_loads_vllm_s_model_and_the_embedded_folder_as_the_embedded_model(monkeypatch, tmp_path):
    monkeypatch.setenv("GEMFILTER_CACHE", str(tmp_path))
    (tmp_path / "gemma3-270m-dequantized").mkdir()
    assert selector_name(Settings(), "meta-llama/Llama-3.1-8B") == "meta-llama/Llama-3.1-8B"
    assert (
        selector_name(Settings(model="meta-llama/Llama-3.2-1B"), "meta-llama/Llama-3.1-8B") == "meta-llama/Llama-3.2-1B"
    )
    assert selector_name(Settings(), str(tmp_path / "gemma3-270m-dequantized")) is None
    assert selector_name(Settings(model="embedded"), "anything") is None


def test_the_entry_points_are_declared():
    points = load_toml(ROOT / "pyproject.toml")["project"]["entry-points"]
    assert points["vllm.endpoint_plugins"] == {"gemfilter": "gemfilter.lab.serve.vllm_plugin:GemFilterPlugin"}
    assert points["vllm.general_plugins"] == {"gemfilter": "gemfilter.lab.serve.vllm_plugin:check_environment"}
    plugin = vllm_plugin.GemFilterPlugin()  # vLLM's factory call: no argument, nothing loaded
    assert plugin.name == "gemfilter" and plugin.required_tasks == ("generate",) and plugin.selector is None


def test_every_gemfilter_variable_of_the_project_is_known_to_the_plugin():
    """The plugin refuses unknown GEMFILTER_* names as typos, so every one the project reads must be listed."""
    used = set()
    for path in [*ROOT.glob("gemfilter/**/*.py"), *ROOT.glob("eval/**/*.py"), *ROOT.glob("scripts/*")]:
        if path.is_file():
            used |= set(re.findall(r"\bGEMFILTER_[A-Z_]+\b", path.read_text(encoding="utf-8", errors="replace")))
    known = {name for name, _, _ in VARIABLES} | set(vllm_plugin.OTHER_VARIABLES)
    assert used - known == set()


def test_vllm_plugin_command_prints_the_settings_or_one_error_line(monkeypatch, capsys):
    for name in [k for k in __import__("os").environ if k.startswith("GEMFILTER_") and k != "GEMFILTER_CACHE"]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("GEMFILTER_SCOPE", "all")
    assert main(["vllm-plugin"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"^scope\s+all$", out, re.M) and re.search(r"^method\s+gemfilter$", out, re.M)
    monkeypatch.setenv("GEMFILTER_LAYER", "x")
    assert main(["vllm-plugin"]) == 2
    assert capsys.readouterr().err == "error: GEMFILTER_LAYER must be a whole number >= 0, got 'x'\n"
    with pytest.raises(SystemExit) as exit_:
        main(["vllm-plugin", "--help"])
    assert exit_.value.code == 0
    help_text = capsys.readouterr().out
    assert all(name in help_text for name, _, _ in VARIABLES) and "VLLM_PLUGINS=gemfilter" in help_text


def test_docs_list_every_variable_and_the_transformers_overlap():
    text = (ROOT / "docs" / "serving.md").read_text(encoding="utf-8")
    assert all(f"| `{name}` |" in text for name, _, _ in VARIABLES)
    assert "the overlap is 5.17 to 5.19" in " ".join(text.split())


def test_the_plugin_s_ttft_table_in_the_docs_is_the_committed_run():
    """docs/serving.md's plugin table is measured/serve-plugin/bench-engine.md's, which ``gemfilter bench`` wrote from
    the committed rows; and those rows give it again."""
    import json

    from gemfilter.lab.serve.bench import markdown, summarize

    block = docs_block("serving.md", "plugin-ttft-measured")
    measured = ROOT / "measured" / "serve-plugin"
    table = (measured / "bench-engine.md").read_text(encoding="utf-8")
    rows = [line for line in block.strip().splitlines()]
    assert rows and all(line in table.splitlines() for line in rows)
    meta = json.loads((measured / "bench-engine.json").read_text())["meta"]
    runs = [json.loads(line) for line in (measured / "bench-engine.jsonl").read_text().splitlines()]
    assert markdown(summarize(runs, meta["method"]), meta) == table


@pytest.mark.parametrize(
    "scope, body, filtered",
    [
        ("requested", {"prompt": "x"}, False),
        ("requested", {"prompt": "x", "gemfilter": {}}, True),
        ("requested", {"prompt": "x", "gemfilter": None}, True),  # then refused by name, as by gemfilter serve
        ("all", {"prompt": "x"}, True),
        ("all", [1, 2], False),
        ("requested", None, False),  # not JSON: vLLM's own error
    ],
)
def test_which_requests_the_plugin_filters(scope, body, filtered):
    plugin = vllm_plugin.GemFilterPlugin()
    plugin.settings = Settings(scope=scope)
    assert plugin.filters(body) is filtered


def relayed(events, plan):
    import asyncio

    closed = []

    async def source():
        try:
            for e in events:
                yield e
        finally:
            closed.append(True)

    async def collect():
        return [e async for e in vllm_plugin._relay(source(), plan)]

    return asyncio.run(collect()), closed


def test_the_stream_relay_rewrites_each_chunk_and_ends_as_gemfilter_serve_does():
    from gemfilter.lab.serve.bodies import AnswerPlan

    def chunk(text, index=0):
        return (
            "data: "
            + json.dumps(
                {
                    "id": "cmpl-1",
                    "object": "text_completion",
                    "choices": [{"index": index, "text": text, "finish_reason": None}],
                }
            )
            + "\n\n"
        )

    meta = {"method": "gemfilter", "kept_tokens": 8}
    # a chat filtered as ids: chat chunks with one role delta per choice, the metadata on the first chunk only; an
    # event split over two pieces, and a keep-alive comment, pass as vLLM sent them
    first, second = chunk("o"), chunk("k")
    out, closed = relayed(
        [first[:10], first[10:], ": keep-alive\n\n", second, "data: [DONE]\n\n", chunk("late")],
        AnswerPlan(meta, convert=True, prompt_tokens=40),
    )
    data = [json.loads(e[6:]) for e in out if e.startswith("data: {")]
    assert out[1] == ": keep-alive\n\n" and out[-1] == "data: [DONE]\n\n" and len(out) == 4
    assert [d["choices"][0]["delta"] for d in data] == [{"role": "assistant", "content": "o"}, {"content": "k"}]
    assert data[0]["gemfilter"] == meta and "gemfilter" not in data[1] and data[0]["id"] == "chatcmpl-1"
    assert closed == [True]  # vLLM's generator is closed: nothing after [DONE] is read
    # vLLM's error event ends the stream without the [DONE] vLLM sends after it
    error = 'data: {"error": {"message": "boom", "type": "InternalServerError", "code": 500}}\n\n'
    out, closed = relayed([chunk("o"), error, "data: [DONE]\n\n"], AnswerPlan(meta, convert=False, prompt_tokens=None))
    assert out[-1] == error and "[DONE]" not in "".join(out) and closed == [True]
