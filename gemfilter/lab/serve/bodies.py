"""The OpenAI request and answer bodies of ``gemfilter serve`` and the vLLM plugin: what they read, check and rewrite.

A request whose prompt is sent to the engine as kept (or templated) token ids is *rewritten*: its body
goes to the engine's ``/v1/completions`` with the ids as the prompt. Fields that describe the prompt
itself (``echo``, ``prompt_logprobs``, ...) cannot be honoured there and are refused by name; the
answer's ``usage.prompt_tokens`` is set back to the client's prompt length (the kept count is
``gemfilter.kept_tokens``).

Both servers run the same steps: :func:`parse_request` (every check, before the selection), the selection,
:func:`engine_request` (what the engine serves), then :func:`rewrite_answer` on its answer or each chunk.
"""

from __future__ import annotations

import dataclasses

MAX_BODY = 64 * 2**20
OPTIONS = ("method", "topk")
#: Chat fields the engine's completions endpoint cannot serve for a rewritten chat prompt.
CHAT_ONLY = (
    "tools",
    "tool_choice",
    "functions",
    "function_call",
    "response_format",
    "logprobs",
    "top_logprobs",
    "parallel_tool_calls",
    "chat_template",
    "chat_template_kwargs",
)
#: Fields about the prompt itself, refused on a rewritten prompt when set (field -> the value that is no-op).
PROMPT_FIELDS = {
    "echo": False,
    "prompt_logprobs": None,
    "truncate_prompt_tokens": None,
    "continue_final_message": False,
    "add_generation_prompt": True,
}
#: Content part types whose text vLLM takes into a chat prompt, and the key holding it.
TEXT_PARTS = {"text": "text", "input_text": "text", "output_text": "text", "refusal": "refusal"}


class BadRequest(ValueError):
    """The client's request is wrong (HTTP 400)."""


def request_options(body: dict, defaults: dict, layer: int | None = None) -> dict:
    """The request's method and topk: the ``gemfilter`` field over the server's defaults, checked.

    body: the request; defaults: ``{"method": spec text, "topk": int or None}`` (``--method``, ``--topk``);
    layer: the selector's filter layer (a spec may name only that one). Returns ``{"method": Spec, "topk":
    default budget or None}``: a ``topk`` in the request replaces the method's budget, a server's ``--topk``
    applies where the spec sets none.
    """
    from gemfilter.toolkit.serving.selector import prompt_methods

    from ...methods import parse_spec

    given = body.get("gemfilter", {})
    if not isinstance(given, dict):
        raise BadRequest(
            f'\'gemfilter\' must be an object such as {{"method": "gemfilter-span:k=512"}} or '
            f'{{"topk": 1024}}, got {type(given).__name__}'
        )
    unknown = sorted(set(given) - set(OPTIONS))
    if unknown:
        raise BadRequest(f"unknown gemfilter option(s) {', '.join(unknown)}; allowed: {', '.join(OPTIONS)}")
    try:
        spec = parse_spec(given.get("method", defaults["method"]))
    except (ValueError, AttributeError) as err:  # AttributeError: a method that is not a string
        raise BadRequest(
            str(err)
            if isinstance(err, ValueError)
            else f'method must be a string such as "gemfilter-span:k=512", got {given["method"]!r}'
        ) from None
    if not spec.cls.serves_engine:
        raise BadRequest(
            f"method {spec.text!r} cannot run in front of an engine; allowed: "
            f"{', '.join(prompt_methods())} (KV-cache methods such as snapkv evict inside the engine)"
        )
    topk = defaults.get("topk")
    if given.get("topk") is not None:
        if "method" in given and (spec.ratio is not None or "topk" in dict(spec.params)):
            raise BadRequest(f"give the budget once: method {spec.text!r} sets it, and so does topk")
        # the request's topk replaces the budget of whichever spec it runs with
        spec = dataclasses.replace(spec, params=tuple(p for p in spec.params if p[0] != "topk"), ratio=None)
        topk = given["topk"]
    own = dict(spec.params).get("layer")
    if own is not None and layer is not None and own != layer:
        raise BadRequest(
            f"{spec.text}: layer={own}, but this proxy's selector holds layers 0..{layer}: it filters "
            f"at layer {layer} only"
        )
    try:
        spec.method(1, topk=topk)  # the budget is checked by the method, with its own message
    except (ValueError, TypeError) as err:
        raise BadRequest(str(err)) from None
    return {"method": spec, "topk": topk}


def check_types(body: dict) -> None:
    """400 for fields of the wrong type that the proxy itself reads."""
    for key in ("stream", "add_special_tokens"):
        if key in body and not isinstance(body[key], bool):
            raise BadRequest(f"'{key}' must be true or false, got {body[key]!r}")


def _part_text(part, where: str) -> str:
    """The text of one content part, as vLLM reads it (a bare string is a text part; no type means text)."""
    if isinstance(part, str):
        return part
    if not isinstance(part, dict):
        raise BadRequest(
            f'{where} must be an object such as {{"type": "text", "text": "..."}}, got {type(part).__name__}'
        )
    kind = part.get("type", "text")
    if kind not in TEXT_PARTS:
        raise BadRequest(
            f"{where} has type {kind!r}: the proxy tokenizes text only; allowed part types: {', '.join(TEXT_PARTS)}"
        )
    text = part.get(TEXT_PARTS[kind])
    if not isinstance(text, str):
        raise BadRequest(f"{where} of type {kind!r} needs a string '{TEXT_PARTS[kind]}', got {text!r}")
    return text


def flatten_messages(messages) -> list:
    """``messages`` with every content a string: text parts joined with a newline, as vLLM does for chat
    templates that take string content; a missing or null content is empty. Other parts are refused (400)."""
    if not isinstance(messages, list) or not messages:
        raise BadRequest('\'messages\' must be a non-empty list of {"role": ..., "content": ...} objects')
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise BadRequest(f"messages[{i}] must be an object with a string 'role' and a 'content'")
        content = m.get("content")
        if isinstance(content, list):
            content = "\n".join(_part_text(p, f"messages[{i}].content[{j}]") for j, p in enumerate(content))
        elif content is None:
            content = ""
        elif not isinstance(content, str):
            raise BadRequest(
                f"messages[{i}].content must be a string or a list of content parts, got {type(content).__name__}"
            )
        out.append({**m, "content": content})
    return out


def check_ids(ids: list, vocab: int | None) -> list:
    """``ids`` if every one is a token id in [0, vocab), else a 400 naming the first bad one."""
    for i, t in enumerate(ids):
        if isinstance(t, bool) or not isinstance(t, int) or t < 0 or (vocab is not None and t >= vocab):
            raise BadRequest(
                f"'prompt' token ids must be whole numbers in [0, {vocab}) (the model's vocabulary); "
                f"position {i} holds {t!r}"
            )
    return ids


def prompt_ids(body: dict, tokenizer, chat: bool, *, template: str | None = None, vocab: int | None = None) -> list:
    """The prompt's token ids, tokenized as the engine would: a completion's prompt with the special tokens
    (unless ``add_special_tokens`` is false), a chat through the chat template (``template`` when the proxy
    supplies one) without adding them again."""
    check_types(body)
    if chat:
        messages = flatten_messages(body.get("messages"))
        if template is None and getattr(tokenizer, "chat_template", None) is None:
            raise BadRequest("the selector's tokenizer has no chat template: use /v1/completions with a prompt")
        kw = {} if template is None else {"chat_template": template}
        try:
            text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False, **kw)
        except Exception as err:  # the template's own message says what is wrong with the messages
            raise BadRequest(f"the chat template rejected the messages: {err}") from err
        return tokenizer(text, add_special_tokens=False)["input_ids"]
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]
    if isinstance(prompt, str) and prompt:
        return tokenizer(prompt, add_special_tokens=body.get("add_special_tokens", True))["input_ids"]
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        return check_ids(prompt, vocab)
    raise BadRequest("'prompt' must be one non-empty string or one list of token ids (one prompt per request)")


def chat_only(body: dict) -> list:
    """The fields of a chat request that only an engine's chat endpoint serves (:data:`CHAT_ONLY`)."""
    return [k for k in CHAT_ONLY if k in body]


def check_rewritable(body: dict, chat: bool) -> None:
    """400 naming the fields that cannot be honoured once the prompt is sent as other token ids."""
    refused = [k for k, noop in PROMPT_FIELDS.items() if k in body and body[k] != noop]
    if chat:
        refused += [k for k in CHAT_ONLY if k in body]
    if refused:
        raise BadRequest(
            f"{', '.join(refused)} cannot be served for a filtered prompt: the engine's completions "
            "endpoint receives the kept token ids, not your prompt; send them with "
            '"gemfilter": {"method": "full"} (or a prompt of at most topk tokens), which the '
            "engine receives as you sent it"
        )


def chat_max_tokens(body: dict) -> int | None:
    """A chat's token limit as vLLM's chat reads it: ``max_completion_tokens``, else ``max_tokens``, else None."""
    given = body.get("max_completion_tokens")
    return given if given is not None else body.get("max_tokens")


def completion_body(body: dict, ids: list, chat: bool, max_model_len: int | None = None) -> dict:
    """The engine's /v1/completions body for ``ids``: the client's options, the ids as the prompt.

    A chat without ``max_tokens``/``max_completion_tokens`` gets ``max_tokens`` = ``max_model_len`` minus
    the ids sent: what vLLM's chat allows (when the model's generation config sets no default), instead of
    the completions default of 16 tokens, which vLLM also applies to an explicit null. Without
    ``max_model_len`` (the engine reports none) such a chat is a 400 asking for ``max_tokens``.
    """
    check_rewritable(body, chat)
    drop = ("gemfilter", "messages", "prompt", "max_completion_tokens", "add_special_tokens") + tuple(PROMPT_FIELDS)
    out = {k: v for k, v in body.items() if k not in drop}
    if chat:
        limit = chat_max_tokens(body)
        if limit is None:
            if max_model_len is None:
                raise BadRequest(
                    "give max_tokens (or max_completion_tokens): this engine reports no max_model_len "
                    "at GET /v1/models, so the proxy cannot apply the chat default (up to the model's "
                    "length), and its completions endpoint would stop at 16 tokens"
                )
            limit = max(max_model_len - len(ids), 1)
        out["max_tokens"] = limit
    out["prompt"] = ids
    return out


def fix_usage(answer: dict, prompt_tokens: int) -> dict:
    """``answer`` with ``usage.prompt_tokens`` = the client's prompt length (the engine counted the kept ids)."""
    usage = answer.get("usage")
    if isinstance(usage, dict) and "prompt_tokens" in usage:
        usage["prompt_tokens"] = prompt_tokens
        if isinstance(usage.get("completion_tokens"), int):
            usage["total_tokens"] = prompt_tokens + usage["completion_tokens"]
    return answer


def as_chat(completion: dict, chunk: bool, roled: set | None = None) -> dict:
    """A /v1/completions answer (or stream chunk) as a chat completion (or chat chunk).

    roled: a stream's choice indices that have had their ``role`` delta: each choice's first chunk gets one, as
    vLLM sends it per choice (``n`` > 1), and its index is added. The id takes vLLM's chat prefix (``chatcmpl-``)."""
    choices = []
    roled = set() if roled is None else roled
    for c in completion.get("choices", []):
        extra = {k: v for k, v in c.items() if k not in ("text", "logprobs")}
        text = c.get("text", "")
        if chunk:
            first = c.get("index", 0) not in roled
            roled.add(c.get("index", 0))
            delta = {"role": "assistant", "content": text} if first else {"content": text}
            choices.append({**extra, "delta": delta})
        else:
            choices.append({**extra, "message": {"role": "assistant", "content": text}})
    out = {k: v for k, v in completion.items() if k not in ("choices", "object")}
    if isinstance(out.get("id"), str) and out["id"].startswith("cmpl-"):
        out["id"] = "chat" + out["id"]
    out.update(object="chat.completion.chunk" if chunk else "chat.completion", choices=choices)
    return out


@dataclasses.dataclass
class Parsed:
    """One request as the selection sees it (:func:`parse_request`): what it asks for and where it goes.

    opts: ``{"method": Spec, "topk": ...}`` (:func:`request_options`); ids: the prompt's token ids (a chat's after
    its template); passthrough: the prompt reaches the engine as sent (``full``, or at most topk tokens);
    as_ids: the engine receives token ids at its completions endpoint (a filtered prompt, or a chat on a model
    whose template the server supplies, unless it asks for what only the chat endpoint serves).
    """

    body: dict
    chat: bool
    opts: dict
    ids: list
    passthrough: bool
    as_ids: bool


def parse_request(body: dict, chat: bool, selector, defaults: dict) -> Parsed:
    """Read and check a completions (or chat) request for ``selector`` (a :class:`~.selector.Selector`) with the
    server's ``defaults`` (``{"method", "topk"}``): BadRequest (or ValueError) naming what is wrong, raised
    before the selection, which is the expensive part."""
    opts = request_options(body, defaults, selector.layer)
    ids = prompt_ids(body, selector.tokenizer, chat, template=selector.chat_template, vocab=selector.vocab_size)
    passthrough = selector.passes_through(len(ids), selector.method_for(len(ids), opts["method"], opts["topk"]))
    # A chat on a model whose template the server supplies goes as templated ids, unless it asks for what only
    # the chat endpoint serves: then it goes there as sent, with the server's template.
    as_ids = not passthrough or (chat and selector.chat_template is not None and not chat_only(body))
    if not passthrough:
        check_rewritable(body, chat)
    return Parsed(body, chat, opts, ids, passthrough, as_ids)


def engine_request(parsed: Parsed, kept: list, template: str | None, max_model_len) -> tuple:
    """(body, path) the engine serves for ``parsed`` once ``kept`` (the selection's ids) is known: the kept ids at
    ``/completions`` (:func:`completion_body`), or the request as sent, minus the ``gemfilter`` field, at its own
    path (``/completions`` or ``/chat/completions``), with ``template`` (the server's, for a model whose
    tokenizer has none) on a chat. max_model_len: ``() -> int or None``, asked only for a chat that gives no
    token limit."""
    body, chat = parsed.body, parsed.chat
    if parsed.as_ids:
        limit = max_model_len() if chat and chat_max_tokens(body) is None else None
        return completion_body(body, kept, chat, limit), "/completions"
    sent = {k: v for k, v in body.items() if k != "gemfilter"}
    if chat and template is not None and "chat_template" not in sent:
        sent["chat_template"] = template  # the engine has no template for this model either
    return sent, "/chat/completions" if chat else "/completions"


@dataclasses.dataclass
class AnswerPlan:
    """How an engine's answer becomes the client's (:func:`rewrite_answer`): the ``gemfilter`` metadata, whether a
    completion turns into a chat completion, the client's prompt length for ``usage`` (None: the engine saw the
    prompt as sent), and the stream's choices that had their ``role`` delta."""

    meta: dict
    convert: bool
    prompt_tokens: int | None
    roled: set = dataclasses.field(default_factory=set)

    @classmethod
    def of(cls, parsed: Parsed, meta: dict) -> "AnswerPlan":
        return cls(meta, parsed.as_ids and parsed.chat, len(parsed.ids) if parsed.as_ids else None)


def rewrite_answer(obj: dict, plan: AnswerPlan, chunk: bool, first: bool) -> dict:
    """An engine answer (or stream chunk) as the client asked for it: chat form, its prompt's usage, and the
    ``gemfilter`` metadata (on an answer, or on a stream's first chunk)."""
    if plan.convert and "choices" in obj:
        obj = as_chat(obj, chunk=chunk, roled=plan.roled)
    if plan.prompt_tokens is not None:
        fix_usage(obj, plan.prompt_tokens)
    if first or not chunk:
        obj["gemfilter"] = plan.meta
    return obj
