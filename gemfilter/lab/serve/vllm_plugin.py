"""GemFilter inside vLLM's own OpenAI server: an endpoint plugin, loaded with ``VLLM_PLUGINS=gemfilter``.

Paper: Shi et al. 2024, "Discovering the Gems in Early Layers", Algorithm 2. Steps 1-4 (the filter pass on
layers 0..r and the top-k) run in vLLM's API server process, on a selector that holds only those layers
(:class:`~gemfilter.toolkit.serving.selector.Selector`, the one ``gemfilter serve`` uses); step 5 (generate from the
k kept tokens at positions 0..k-1) is vLLM's own completion handler, handed the kept ids as a token prompt.
There is no second process and no HTTP hop.

The plugin replaces ``POST /v1/completions`` and ``POST /v1/chat/completions`` (vLLM 0.32's
``vllm.endpoint_plugins`` group; ``vllm/plugins/endpoint_plugins/interface.py``). Every other route (models,
metrics, tokenize, health, ...) is vLLM's, untouched. A request is *filtered* when it carries a ``gemfilter``
field (``extra_body={"gemfilter": {...}}`` in the openai client), or every request when
``GEMFILTER_SCOPE=all``; any other request goes to vLLM's own route as it came (its bytes replayed), so it is
answered exactly as plain vLLM answers it. A filtered request has ``gemfilter serve``'s semantics, from the
same code (:mod:`gemfilter.lab.serve.bodies`): methods per request, refusals by name, ``usage`` counting the
client's prompt, the ``gemfilter`` field (in a stream's first chunk) and the ``X-GemFilter`` header; errors
take vLLM's form (``{"error": {"message", "type", "param", "code"}}``).

Configuration is by environment variable (vLLM's command line takes no flags of a plugin's), read once at
start-up; a bad value stops vLLM before its engine loads, with one ``error:`` line (the check also runs as a
``vllm.general_plugins`` entry, :func:`check_environment`). ``gemfilter vllm-plugin`` prints the settings an
environment gives, and its ``--help`` lists the variables (:data:`VARIABLES`).
"""

import dataclasses
import functools
import json
import os

NAME = "gemfilter"
#: the routes the plugin serves: (path, whether it is the chat route)
ROUTES = (("/v1/completions", False), ("/v1/chat/completions", True))
SCOPES = ("requested", "all")
#: (variable, default, what it sets): every setting the plugin reads, in the order ``--help`` lists them.
VARIABLES = (
    (
        "GEMFILTER_METHOD",
        "gemfilter",
        "the method spec of a request whose gemfilter field names none, e.g. "
        "gemfilter-span:k=512 (full or a prompt method: 'gemfilter methods' lists them)",
    ),
    (
        "GEMFILTER_TOPK",
        "the method's own, 1024 for gemfilter",
        "the budget where neither the spec nor the request sets one, a whole number >= 1",
    ),
    (
        "GEMFILTER_SCOPE",
        "requested",
        "which requests are filtered: 'requested' (those with a gemfilter field; "
        "every other request reaches vLLM's own route untouched) or 'all' (every completion and chat, as 'gemfilter "
        'serve\' does; a request opts out with {"method": "full"})',
    ),
    (
        "GEMFILTER_SELECTOR_MODEL",
        "vLLM's --model",
        "the selector's model (an HF id or a local folder with the "
        "engine's tokenizer; it may be a smaller model of the family); 'embedded' is the embedded Gemma 3 270M",
    ),
    ("GEMFILTER_LAYER", "the model's default", "the filter layer r: the selector holds layers 0..r"),
    (
        "GEMFILTER_SELECTOR_CACHE_GB",
        "1.0",
        "GB of the selector's prefix cache (layers 0..r of prompts seen, in "
        "16-token blocks), in [0, 1024]; 0 turns it off",
    ),
    ("GEMFILTER_SELECTOR_WORKERS", "1", "selections run at once on the one selector model, 1..64"),
    ("GEMFILTER_THREADS", "0", "torch CPU threads of the API server process for the selection (0: torch's choice)"),
    (
        "GEMFILTER_ATTN",
        "banded for the embedded model, else transformers' default",
        "the selector's attention kernel (banded, sdpa, eager, flash_attention_2, flex_attention)",
    ),
    (
        "GEMFILTER_SKIP_TOKENIZER_CHECK",
        "0",
        "1: start even if the selector's tokenizer encodes a probe text to "
        "other ids than vLLM's (kept ids would then be other tokens)",
    ),
)
#: the project's other variables, which the plugin does not read (an unknown GEMFILTER_ name is refused as a typo)
OTHER_VARIABLES = ("GEMFILTER_CACHE", "GEMFILTER_BENCH_PARENT")


@dataclasses.dataclass(frozen=True)
class Settings:
    """The plugin's configuration (:func:`settings_from_env`). model None: the model vLLM serves."""

    method: str = "gemfilter"
    topk: int | None = None
    scope: str = "requested"
    model: str | None = None
    layer: int | None = None
    cache_gb: float = 1.0
    workers: int = 1
    threads: int = 0
    attn: str | None = None
    check_tokenizer: bool = True

    @property
    def defaults(self) -> dict:
        """The server defaults :func:`~gemfilter.lab.serve.bodies.request_options` takes."""
        return {"method": self.method, "topk": self.topk}


def _whole(environ, name: str, low: int, high: int | None = None) -> int | None:
    text = environ.get(name, "").strip()
    if not text:
        return None
    try:
        value = int(text)
    except ValueError:
        value = None
    if value is None or value < low or (high is not None and value > high):
        span = f"[{low}, {high}]" if high is not None else f">= {low}"
        raise ValueError(f"{name} must be a whole number {span}, got {text!r}")
    return value


def settings_from_env(environ=None) -> Settings:
    """The plugin's :class:`Settings` from ``environ`` (default ``os.environ``), every value checked: ValueError
    naming the variable, its allowed values and what it got. Needs no model (the layer and the spec are checked
    against the model's config when the selector loads)."""
    from ...models import ATTN_CHOICES
    from .bodies import BadRequest, request_options

    environ = os.environ if environ is None else environ
    known = {name for name, _, _ in VARIABLES} | set(OTHER_VARIABLES)
    unknown = sorted(k for k in environ if k.startswith("GEMFILTER_") and k not in known)
    if unknown:
        raise ValueError(
            f"unknown variable(s) {', '.join(unknown)}; the plugin reads {', '.join(name for name, _, _ in VARIABLES)}"
        )
    out = {}
    method = environ.get("GEMFILTER_METHOD", "").strip()
    if method:
        out["method"] = method
    topk = _whole(environ, "GEMFILTER_TOPK", 1)
    if topk is not None:
        out["topk"] = topk
    try:  # the spec and the budget obey the rules of a request's own
        request_options({}, {"method": out.get("method", "gemfilter"), "topk": topk})
    except BadRequest as err:
        raise ValueError(f"GEMFILTER_METHOD / GEMFILTER_TOPK: {err}") from None
    scope = environ.get("GEMFILTER_SCOPE", "").strip()
    if scope:
        if scope not in SCOPES:
            raise ValueError(f"GEMFILTER_SCOPE must be one of {', '.join(SCOPES)}, got {scope!r}")
        out["scope"] = scope
    model = environ.get("GEMFILTER_SELECTOR_MODEL", "").strip()
    if model:
        out["model"] = model
    for key, name, low, high in (
        ("layer", "GEMFILTER_LAYER", 0, None),
        ("workers", "GEMFILTER_SELECTOR_WORKERS", 1, 64),
        ("threads", "GEMFILTER_THREADS", 0, None),
    ):
        value = _whole(environ, name, low, high)
        if value is not None:
            out[key] = value
    gb = environ.get("GEMFILTER_SELECTOR_CACHE_GB", "").strip()
    if gb:
        try:
            value = float(gb)
        except ValueError:
            value = float("nan")
        if not 0 <= value <= 1024:  # nan fails this too
            raise ValueError(f"GEMFILTER_SELECTOR_CACHE_GB must be a number of GB in [0, 1024] (0: off), got {gb!r}")
        out["cache_gb"] = value
    attn = environ.get("GEMFILTER_ATTN", "").strip()
    if attn:
        if attn not in ATTN_CHOICES:
            raise ValueError(f"GEMFILTER_ATTN must be one of {', '.join(ATTN_CHOICES)}, got {attn!r}")
        out["attn"] = attn
    skip = environ.get("GEMFILTER_SKIP_TOKENIZER_CHECK", "").strip()
    if skip:
        if skip not in ("0", "1"):
            raise ValueError(f"GEMFILTER_SKIP_TOKENIZER_CHECK must be 0 or 1, got {skip!r}")
        out["check_tokenizer"] = skip == "0"
    return Settings(**out)


def allowlisted(environ=None) -> bool:
    """Whether ``VLLM_PLUGINS`` names this plugin (vLLM loads endpoint plugins only then)."""
    environ = os.environ if environ is None else environ
    return "VLLM_PLUGINS" in environ and NAME in environ["VLLM_PLUGINS"].split(",")


def check_environment() -> None:
    """The ``vllm.general_plugins`` entry: refuse a bad ``GEMFILTER_*`` variable when vLLM starts, before its
    engine loads, with one ``error:`` line (SystemExit). Does nothing unless ``VLLM_PLUGINS`` names the plugin,
    and installs nothing: vLLM calls it in every one of its processes."""
    if not allowlisted():
        return
    try:
        settings_from_env()
    except ValueError as err:
        raise SystemExit(f"error: gemfilter plugin: {err}") from None


def selector_name(settings: Settings, served: str | None):
    """What :func:`~gemfilter.toolkit.serving.selector.open_selector` loads: ``GEMFILTER_SELECTOR_MODEL``, else the
    model vLLM serves. vLLM serving the embedded model's cache folder gets the embedded model (float32, the
    banded kernel, Gemma 3's chat template), as ``gemfilter serve`` loads it."""
    from pathlib import Path

    from ...models import EMBEDDED_DIR_NAME, cache_dir, is_embedded

    name = settings.model or served
    if is_embedded(name):
        return None
    try:
        if Path(name).expanduser().resolve() == (cache_dir() / EMBEDDED_DIR_NAME).resolve():
            return None
    except OSError:
        pass
    return name


def _error(status: int, message: str, kind: str = "BadRequestError"):
    """vLLM's error answer: ``{"error": {"message", "type", "param", "code"}}`` with that status."""
    from fastapi.responses import JSONResponse

    return JSONResponse(
        {"error": {"message": message, "type": kind, "param": None, "code": status}}, status_code=status
    )


def _validated(cls, data: dict):
    """``data`` as vLLM's request model ``cls``; a field it refuses is vLLM's own 400 (its validation handler)."""
    from fastapi.exceptions import RequestValidationError
    from pydantic import ValidationError

    try:
        return cls.model_validate(data)
    except ValidationError as err:  # as FastAPI reports a body it cannot read into the route's model
        raise RequestValidationError(
            [{**e, "loc": ("body", *e["loc"])} for e in err.errors(include_url=False)], body=data
        ) from None


@functools.cache
def _replay_class():
    """The :class:`_Replay` response class (made on first use: Starlette is imported inside vLLM only)."""
    from starlette.responses import Response

    class _Replay(Response):
        """Hands the request, its body replayed, to vLLM's own route: a request the plugin does not filter is served
        exactly as plain vLLM serves it (its validation, errors, cancellation and streaming)."""

        def __init__(self, route, raw: bytes):  # no body of its own: the route sends the answer
            self.route, self.raw, self.background = route, raw, None

        async def __call__(self, scope, receive, send):
            sent = False

            async def replay():
                nonlocal sent
                if not sent:
                    sent = True
                    return {"type": "http.request", "body": self.raw, "more_body": False}
                return await receive()  # then the client's own messages: vLLM's route watches for its disconnect

            await self.route.handle(scope, replay, send)

    return _Replay


class GemFilterPlugin:
    """vLLM endpoint plugin (``vllm.endpoint_plugins`` entry ``gemfilter``): GemFilter's selection in front of
    vLLM's completion handler, in its own server process.

    Paper: Shi et al. 2024, Algorithm 2. vLLM calls :meth:`attach_router` while it builds its app (after its own
    routes) and :meth:`init_state` once its engine is up; the selector loads there.
    """

    name = NAME
    required_tasks = ("generate",)

    def __init__(self):
        self.settings = None
        self.selector = None
        self._pool = None
        self._originals = {}
        self._max_model_len = None

    # --- vLLM's hooks ---------------------------------------------------------------------------
    def attach_router(self, app) -> None:
        """Read the settings, then put the plugin's routes over vLLM's completions and chat routes (the originals
        are kept: requests the plugin does not filter are replayed to them)."""
        from fastapi import Depends, Request
        from fastapi.routing import APIRoute
        from vllm.entrypoints.serve.utils.api_utils import load_aware_call, validate_json_request, with_cancellation

        try:
            self.settings = settings_from_env()
        except ValueError as err:
            raise SystemExit(f"error: gemfilter plugin: {err}") from None
        # The filtered path as vLLM's routes run theirs: cancelled when the client leaves, counted by load tracking.
        self._guarded = with_cancellation(load_aware_call(self._serve))
        for path, chat in ROUTES:
            found = [r for r in app.routes if isinstance(r, APIRoute) and r.path == path and "POST" in r.methods]
            if not found:
                raise SystemExit(f"error: gemfilter plugin: vLLM serves no POST {path} to filter in front of")
            self._originals[path] = found[0]

            def make(path=path, chat=chat):
                async def endpoint(raw_request: Request):
                    return await self.handle(raw_request, path, chat)

                endpoint.__name__ = f"gemfilter_{'chat' if chat else 'completions'}"
                return endpoint

            app.add_api_route(
                path, make(), methods=["POST"], dependencies=[Depends(validate_json_request)], name=f"gemfilter {path}"
            )

    async def init_state(self, engine_client, state, args) -> None:
        """Load the selector (layers 0..r of vLLM's model unless ``GEMFILTER_SELECTOR_MODEL`` says otherwise), check
        its tokenizer against vLLM's, and start the selection threads."""
        import asyncio
        from concurrent.futures import ThreadPoolExecutor

        if engine_client is None:  # vLLM's render-only server: nothing to generate with
            raise SystemExit("error: gemfilter plugin: this vLLM server has no engine (render only)")
        self._max_model_len = engine_client.model_config.max_model_len
        self.selector = await asyncio.to_thread(
            self._load, getattr(args, "model", None), getattr(args, "chat_template", None), engine_client
        )
        # Selections wait for a free selector inside Selector.choose (timed as selector_wait_seconds); the pool is
        # large enough that none waits in the pool's own queue instead, and it is not the loop's default pool,
        # which vLLM uses itself.
        self._pool = ThreadPoolExecutor(max_workers=self.settings.workers + 63, thread_name_prefix="gemfilter")
        state.gemfilter = self
        from vllm.logger import init_logger

        s = self.settings
        init_logger("vllm.plugins.gemfilter").info(
            "gemfilter plugin: filtering %s on %s; default %s, topk %s; selector layers 0..%d; prefix cache %g GB",
            "every request" if s.scope == "all" else "requests with a gemfilter field",
            " and ".join(p for p, _ in ROUTES),
            s.method,
            s.topk or "its own",
            self.selector.layer,
            s.cache_gb,
        )

    def _load(self, served, chat_template, engine_client):
        """The selector for vLLM's model ``served`` (its ``--model``); a layer outside the model, a spec that names
        another layer or a model that does not load is one ``error:`` line, and so is a tokenizer unlike vLLM's."""
        import torch

        from gemfilter.toolkit.serving.selector import open_selector
        from gemfilter.toolkit.serving.upstream import PROBE

        from ...methods import parse_spec
        from .bodies import BadRequest, request_options

        s = self.settings
        if s.threads:
            torch.set_num_threads(s.threads)
        layer = dict(parse_spec(s.method).params).get("layer", s.layer)  # the spec's layer wins, as for every default
        try:
            selector = open_selector(
                selector_name(s, served),
                layer=layer,
                attn=s.attn,
                cache_bytes=int(s.cache_gb * 2**30),
                workers=s.workers,
            )
            request_options({}, s.defaults, selector.layer)  # the defaults obey a request's rules
        except (BadRequest, ValueError, OSError) as err:
            raise SystemExit(f"error: gemfilter plugin: {err}") from None
        if chat_template is not None:  # vLLM's --chat-template: filtered chats use the template vLLM's chats use
            from vllm.renderers.chat_utils import load_chat_template

            selector.tokenizer.chat_template = load_chat_template(chat_template)
            selector.chat_template = None
        if s.check_tokenizer:
            ours = selector.tokenizer(PROBE, add_special_tokens=True)["input_ids"]
            theirs = list(engine_client.get_tokenizer()(PROBE, add_special_tokens=True)["input_ids"])
            if ours != theirs:
                raise SystemExit(
                    f"error: gemfilter plugin: the selector's tokenizer and vLLM's differ: {PROBE!r} is "
                    f"{ours[:12]}... for the selector and {theirs[:12]}... for vLLM; give "
                    "GEMFILTER_SELECTOR_MODEL a model with vLLM's tokenizer (or "
                    "GEMFILTER_SKIP_TOKENIZER_CHECK=1)"
                )
        return selector

    # --- requests -------------------------------------------------------------------------------
    def filters(self, body) -> bool:
        """Whether the plugin filters a request with this (parsed JSON) body; others go to vLLM as they came."""
        return isinstance(body, dict) and ("gemfilter" in body or self.settings.scope == "all")

    async def handle(self, raw_request, path: str, chat: bool):
        raw = await raw_request.body()  # read before anything listens for the client's disconnect
        try:
            body = json.loads(raw)
        except ValueError:
            body = None
        if self.selector is None or not self.filters(body):
            return _replay_class()(self._originals[path], raw)
        return await self._guarded(body, raw_request, chat)

    async def _serve(self, body: dict, raw_request, chat: bool):
        """One filtered request: vLLM's checks of the request as sent, then the plugin's, the selection in a
        thread, and vLLM's completion (or chat) handler on what the engine is to serve."""
        import asyncio
        import threading

        from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
        from vllm.entrypoints.openai.completion.protocol import CompletionRequest

        from gemfilter.toolkit.serving.selector import ClientGone

        from .bodies import AnswerPlan, BadRequest, engine_request, parse_request

        state = raw_request.app.state
        serving = state.openai_serving_chat if chat else state.openai_serving_completion
        if serving is None:
            return _error(501, f"this model does not serve {'chat ' if chat else ''}completions", "NotImplementedError")
        # vLLM's order: the request's fields as its route reads them, then the model, then the plugin's checks.
        client = _validated(
            ChatCompletionRequest if chat else CompletionRequest, {k: v for k, v in body.items() if k != "gemfilter"}
        )
        unknown = await serving._check_model(client)  # the check vLLM's handler starts with
        if unknown is not None:
            return self._answer(unknown, None, raw_request)
        sel = self.selector
        try:
            parsed = parse_request(body, chat, sel, self.settings.defaults)
        except (BadRequest, ValueError) as err:
            return _error(400, str(err))
        gone = threading.Event()
        choose = functools.partial(sel.choose, parsed.ids, parsed.opts["method"], parsed.opts["topk"], gone=gone.is_set)
        try:
            choice = await asyncio.get_running_loop().run_in_executor(self._pool, choose)
        except asyncio.CancelledError:  # the client left: a selection still waiting for the selector is dropped
            gone.set()
            raise
        except ClientGone:
            return None
        except ValueError as err:  # a prompt longer than the selector's model
            return _error(400, str(err))
        try:
            sent, where = engine_request(parsed, choice.ids, sel.chat_template, lambda: self._max_model_len)
        except BadRequest as err:
            return _error(400, str(err))
        plan = AnswerPlan.of(parsed, choice.meta(sel.layer))
        if where == "/chat/completions":
            result = await state.openai_serving_chat.create_chat_completion(
                _validated(ChatCompletionRequest, sent), raw_request
            )
        else:
            completion = state.openai_serving_completion
            if completion is None:
                return _error(501, "this model does not serve completions", "NotImplementedError")
            result = await completion.create_completion(_validated(CompletionRequest, sent), raw_request)
        return self._answer(result, plan, raw_request)

    def _answer(self, result, plan, raw_request):
        """vLLM's handler result as the client's answer: an error as vLLM answers it, a completion rewritten
        (:func:`~gemfilter.lab.serve.bodies.rewrite_answer`), a stream relayed chunk by chunk."""
        from fastapi.responses import JSONResponse, StreamingResponse
        from vllm.entrypoints.serve.engine.protocol import ErrorResponse
        from vllm.entrypoints.serve.utils.orca_metrics import metrics_header
        from vllm.entrypoints.serve.utils.sse_keep_alive import with_sse_keep_alive

        from .bodies import rewrite_answer

        if isinstance(result, ErrorResponse):
            return JSONResponse(content=result.model_dump(), status_code=result.error.code)
        header = {"X-GemFilter": json.dumps(plan.meta)}
        if hasattr(result, "model_dump"):
            data = rewrite_answer(result.model_dump(), plan, chunk=False, first=False)
            extra = metrics_header(raw_request.headers.get("endpoint-load-metrics-format", "")) or {}
            return JSONResponse(content=data, headers={**header, **extra})
        interval = float(getattr(getattr(raw_request.app.state, "args", None), "sse_keep_alive_interval", 0) or 0)
        return StreamingResponse(
            with_sse_keep_alive(_relay(result, plan), interval), media_type="text/event-stream", headers=header
        )


async def _relay(events, plan):
    """vLLM's SSE strings with each chunk rewritten (the first carries the ``gemfilter`` field). It ends with
    ``data: [DONE]`` after a complete answer, or with vLLM's error event alone: as ``gemfilter serve`` relays an
    engine's error event, the stream stops there, without the ``[DONE]`` vLLM sends after it."""
    from .bodies import rewrite_answer

    n, pending = 0, ""
    try:
        async for text in events:
            pending += text
            while "\n\n" in pending:
                event, pending = pending.split("\n\n", 1)
                if not event.startswith("data:"):  # a comment (keep-alive) or a field the plugin does not touch
                    yield event + "\n\n"
                    continue
                data = event[5:].strip()
                if data == "[DONE]":
                    yield "data: [DONE]\n\n"
                    return
                obj = json.loads(data)
                if "error" in obj:
                    yield f"data: {json.dumps(obj)}\n\n"
                    return
                yield f"data: {json.dumps(rewrite_answer(obj, plan, chunk=True, first=n == 0))}\n\n"
                n += 1
    finally:
        await events.aclose()  # a client that left, or an error event: vLLM's generator ends and aborts its request
