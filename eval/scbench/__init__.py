"""SCBench (Li et al. 2024, "SCBench: A KV Cache-Centric Analysis of Long-Context Methods", arXiv 2412.10319;
official code microsoft/MInference, folder ``scbench/``): many queries over one shared context.

Modules: ``tasks`` (the task table with the official templates), ``generate`` (offline generators of
the four synthetic tasks, sized to a token budget), ``prompts`` (the multi-turn and multi-request
prompt builders and each turn's input ids), ``scoring`` (the official scorers and their per-turn and
per-task aggregation). No runner yet; docs/scbench.md says what is built and what is not.
"""
