"""The shared toolkit: what the lab's commands and the benchmarks (``eval/``) both use, belonging to neither.

Result files (``io``), command-line options and method specs (``options``), the haystack (``haystack``),
console entry points (``entry``), the attention trace that inspection and the probes read (``trace``) and
the engine client (``serving``: an OpenAI-compatible engine, the selector that filters prompts in front of it,
its chat template and prefix cache). It imports only the plugin's core; the lab, ``eval/`` and the probes
import it, and it imports none of them (``tests/test_layering.py``).
"""
