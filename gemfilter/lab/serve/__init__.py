"""GemFilter in front of a serving engine: the selection runs here, the generation on an OpenAI-compatible
engine such as vLLM (``gemfilter serve``; Shi et al. 2024, Algorithm 2, second stage on the engine).

- :mod:`.selector`: a model that holds only layers 0..r, and the per-request selection.
- :mod:`.upstream`: the engine client (standard library HTTP, errors with their HTTP status).
- :mod:`.proxy`: the OpenAI-compatible proxy server.
- :mod:`.vllm_plugin`: the same requests inside vLLM's own server (``VLLM_PLUGINS=gemfilter``), no proxy.
- :mod:`.bodies`: the request and answer handling both share.
"""
