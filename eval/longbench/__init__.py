"""LongBench v1, English tasks (THUDM/LongBench; Bai et al. 2023), as used in the GemFilter paper's Table 9.1.

Modules: ``tasks`` (the task table with the official prompt templates), ``data`` (hub or local
``<config>.jsonl`` loading), ``pipeline`` (middle truncation, chat template, greedy generation through
any gemfilter method), ``metrics`` (the official metrics by name), ``runner`` (resumable, shardable
predictions in the official layout), ``report`` (scoring and the Table 9.1 layout), ``cli``.
"""
