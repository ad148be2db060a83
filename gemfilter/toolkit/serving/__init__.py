"""The engine client: generation on an OpenAI-compatible engine from a prompt method's kept tokens (``engine``),
the engine's HTTP client (``upstream``), the selector that filters prompts in front of it (``selector``), with
its chat template (``chat_template``) and prefix cache (``prefix_cache``). Used by ``gemfilter serve``, the vLLM
plugin and the benchmarks' ``--engine``."""
