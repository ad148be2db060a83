"""What ``gemfilter serve`` makes of a request: chat content parts, chat
length defaults, fields about the prompt, usage, the embedded model's chat template, and client faults
answered 400 by name, options refused before anything loads.

Expected prompts are written out by hand (or computed by the tokenizer on a hand-built text), never taken
from the proxy.
"""

import re

import pytest
import torch
from serve_fixtures import LAYER, PROMPT, CharTokenizer, make_proxy, model, post, proxy, stub  # noqa: F401

import gemfilter
from gemfilter.toolkit.serving.chat_template import GEMMA3, fallback_template
from gemfilter.toolkit.serving.selector import Selector

TOK = CharTokenizer()


def chat_ids(content: str) -> list:
    return TOK(TOK.apply_chat_template([{"role": "user", "content": content}]), add_special_tokens=False)["input_ids"]


# --- A: content parts ------------------------------------------------------------------------------
PARTS = [{"type": "text", "text": "x" * 30}, "y" * 5, {"type": "input_text", "text": "what?"}]
JOINED = "x" * 30 + "\n" + "y" * 5 + "\nwhat?"  # vLLM joins text parts with a newline


def test_chat_content_parts_are_joined_as_vllm_does(proxy, stub, model):
    messages = [{"role": "user", "content": PARTS}]
    status, answer, _ = post(proxy + "/v1/chat/completions", {"messages": messages, "max_tokens": 3})
    ids = chat_ids(JOINED)
    ref = gemfilter.select_tokens(model, torch.tensor([ids]), layer=LAYER, topk=16).kept_ids[0].tolist()
    assert status == 200 and stub.bodies[-1]["prompt"] == ref
    assert answer["gemfilter"]["prompt_tokens"] == len(ids) == 60  # <user>, 42 characters, a newline, <assistant>


def test_the_passthrough_decision_counts_the_joined_parts(proxy, stub):
    n = len(chat_ids(JOINED))  # 60 tokens
    body = {"messages": [{"role": "user", "content": PARTS}], "model": "stub-model"}
    status, answer, _ = post(proxy + "/v1/chat/completions", {**body, "gemfilter": {"topk": n}})
    assert status == 200 and answer["gemfilter"]["passthrough"] and stub.paths[-1] == "/v1/chat/completions"
    assert stub.bodies[-1] == body  # the engine gets the parts as sent, and joins them itself
    status, answer, _ = post(proxy + "/v1/chat/completions", {**body, "gemfilter": {"topk": n - 1}})
    assert status == 200 and not answer["gemfilter"]["passthrough"] and answer["gemfilter"]["kept_tokens"] == n - 1


@pytest.mark.parametrize(
    "part, message",
    [
        (
            {"type": "image_url", "image_url": {"url": "http://x/a.png"}},
            "messages\\[0\\].content\\[1\\] has type 'image_url': the proxy tokenizes text only",
        ),
        ({"type": "text", "text": 5}, "messages\\[0\\].content\\[1\\] of type 'text' needs a string 'text'"),
        (7, "messages\\[0\\].content\\[1\\] must be an object"),
    ],
)
def test_a_part_that_is_not_text_is_refused_by_type(proxy, stub, part, message):
    body = {"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}, part]}]}
    status, answer, _ = post(proxy + "/v1/chat/completions", body)
    assert status == 400 and re.search(message, answer["error"]["message"]), answer
    assert stub.bodies == []


# --- B: a filtered chat's length -----------------------------------------------------------------
def test_a_filtered_chat_without_max_tokens_is_not_cut_to_the_completions_default(proxy, stub):
    status, _, _ = post(proxy + "/v1/chat/completions", {"messages": [{"role": "user", "content": "x" * 40}]})
    sent = stub.bodies[-1]
    assert status == 200 and stub.paths[-1] == "/v1/completions" and len(sent["prompt"]) == 16
    assert sent["max_tokens"] == 512 - 16  # vLLM's chat: the engine's max_model_len minus the prompt it gets


def test_a_filtered_chat_without_max_tokens_needs_an_engine_that_reports_its_length(proxy, stub):
    stub.max_model_len = None
    status, answer, _ = post(proxy + "/v1/chat/completions", {"messages": [{"role": "user", "content": "x" * 40}]})
    assert status == 400 and answer["error"]["message"].startswith(
        "give max_tokens (or max_completion_tokens): this engine reports no max_model_len"
    )
    assert [p for p in stub.paths if p.endswith("completions")] == []


def test_max_completion_tokens_wins_over_max_tokens_as_in_vllm_s_chat(proxy, stub):
    post(
        proxy + "/v1/chat/completions",
        {"messages": [{"role": "user", "content": "x" * 40}], "max_tokens": 3, "max_completion_tokens": 7},
    )
    assert stub.bodies[-1]["max_tokens"] == 7 and "max_completion_tokens" not in stub.bodies[-1]


# --- C: fields about the prompt, and usage -----------------------------------------------------------
@pytest.mark.parametrize(
    "route, field, value",
    [
        ("/v1/completions", "echo", True),
        ("/v1/completions", "prompt_logprobs", 1),
        ("/v1/completions", "truncate_prompt_tokens", 8),
        ("/v1/chat/completions", "echo", True),
        ("/v1/chat/completions", "continue_final_message", True),
        ("/v1/chat/completions", "add_generation_prompt", False),
    ],
)
def test_fields_about_the_prompt_are_refused_by_name_on_a_filtered_prompt(proxy, stub, route, field, value):
    prompt = {"prompt": PROMPT} if route == "/v1/completions" else {"messages": [{"role": "user", "content": "x" * 40}]}
    status, answer, _ = post(proxy + route, {**prompt, field: value})
    assert status == 400 and answer["error"]["message"].startswith(f"{field} cannot be served for a filtered prompt")
    assert stub.bodies == []


def test_echo_on_a_prompt_that_passes_through_reaches_the_engine(proxy, stub):
    status, _, _ = post(proxy + "/v1/completions", {"prompt": "short", "echo": True, "gemfilter": {"topk": 64}})
    assert status == 200 and stub.bodies[-1]["echo"] is True and stub.bodies[-1]["prompt"] == "short"


def test_usage_counts_the_client_s_prompt_and_the_metadata_the_kept_tokens(proxy, stub):
    status, answer, _ = post(proxy + "/v1/completions", {"prompt": PROMPT, "max_tokens": 1})
    # The stub counts 3 prompt tokens and 1 completion token; the client sent 40, of which 16 were kept.
    assert status == 200 and answer["usage"] == {"prompt_tokens": 40, "completion_tokens": 1, "total_tokens": 41}
    assert answer["gemfilter"]["kept_tokens"] == 16


# --- I: the embedded model's chat template -------------------------------------------------------------
def test_gemma3_template_renders_gemma_s_turn_format_with_the_embedded_tokenizer():
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(gemfilter.models.embedded_model_dir())
    assert getattr(tok, "chat_template", None) is None and fallback_template(None, tok) == GEMMA3
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": " Hi "},
        {"role": "assistant", "content": "Hello."},
        {"role": "user", "content": "Bye"},
    ]
    text = tok.apply_chat_template(messages, chat_template=GEMMA3, add_generation_prompt=True, tokenize=False)
    assert text == (
        "<bos><start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n"
        "<start_of_turn>model\nHello.<end_of_turn>\n"
        "<start_of_turn>user\nBye<end_of_turn>\n<start_of_turn>model\n"
    )
    assert tok(text, add_special_tokens=False)["input_ids"].count(tok.bos_token_id) == 1
    assert fallback_template("some/other-model", tok) is None


def test_a_chat_on_a_model_without_template_uses_gemma3_s_and_goes_as_ids(make_proxy, stub, model):
    tok = CharTokenizer()
    tok.chat_template = None
    url = make_proxy(selector=Selector(model, tok, LAYER, chat_template=GEMMA3))
    status, answer, _ = post(
        url + "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "gemfilter": {"topk": 64}}
    )
    expected = tok("<bos><start_of_turn>user\nhi<end_of_turn>\n<start_of_turn>model\n", add_special_tokens=False)
    assert status == 200 and stub.paths[-1] == "/v1/completions"  # the engine has no template either
    assert stub.bodies[-1]["prompt"] == expected["input_ids"]
    assert stub.bodies[-1]["max_tokens"] == 512 - len(expected["input_ids"])
    assert answer["object"] == "chat.completion" and answer["choices"][0]["message"]["content"] == "ok"
    assert answer["gemfilter"]["passthrough"]


# --- 10: client faults are 400s that name the field ----------------------------------------------------
@pytest.mark.parametrize(
    "route, body, message",
    [
        (
            "/v1/completions",
            {"prompt": [5, -1, 7]},
            "'prompt' token ids must be whole numbers in \\[0, 96\\).*position 1 holds -1",
        ),
        ("/v1/completions", {"prompt": [5, 96]}, "in \\[0, 96\\) \\(the model's vocabulary\\); position 1 holds 96"),
        (
            "/v1/completions",
            {"prompt": "hello", "add_special_tokens": "no"},
            "'add_special_tokens' must be true or false, got 'no'",
        ),
        ("/v1/completions", {"prompt": PROMPT, "stream": "yes"}, "'stream' must be true or false, got 'yes'"),
        (
            "/v1/chat/completions",
            {"messages": [{"content": "hi"}]},
            "messages\\[0\\] must be an object with a string 'role'",
        ),
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": 5}]},
            "messages\\[0\\].content must be a string or a list of content parts",
        ),
    ],
)
def test_client_faults_are_400s_naming_the_field(proxy, stub, route, body, message):
    status, answer, _ = post(proxy + route, body)
    assert status == 400 and re.search(message, answer["error"]["message"]), answer
    assert stub.bodies == []


# --- 9: options refused before anything loads ---------------------------------------------------------
@pytest.mark.parametrize(
    "argv, message",
    [
        (["--port", "70000"], "--port must be a whole number in [0, 65535], got 70000"),
        (["--timeout", "inf"], "--timeout must be a number of seconds in (0, 86400], got inf"),
        (["--timeout", "nan"], "--timeout must be a number of seconds in (0, 86400], got nan"),
        (["--timeout", "-1"], "--timeout must be a number of seconds in (0, 86400], got -1.0"),
        (["--client-timeout", "0"], "--client-timeout must be a number of seconds in (0, 86400], got 0.0"),
        (["--backlog", "0"], "--backlog must be a whole number in [1, 65535], got 0"),
        (["--max-concurrency", "0"], "--max-concurrency must be a whole number in [1, 4096], got 0"),
        (["--selector-cache-gb", "-1"], "--selector-cache-gb must be a number of GB in [0, 1024] (0: off), got -1.0"),
        (["--selector-cache-gb", "nan"], "--selector-cache-gb must be a number of GB in [0, 1024] (0: off), got nan"),
    ],
)
def test_bad_serve_options_get_one_error_line_before_anything_loads(monkeypatch, capsys, argv, message):
    from gemfilter.lab.cli import main
    from gemfilter.toolkit.serving import selector, upstream

    def never(*args, **kwargs):
        raise AssertionError("reached the engine or loaded the selector before checking the options")

    monkeypatch.setattr(selector, "load_selector", never)
    monkeypatch.setattr(upstream.Upstream, "models", never)
    assert main(["serve", "--upstream", "http://127.0.0.1:1/v1", *argv]) == 2
    assert capsys.readouterr().err == f"error: {message}\n"
