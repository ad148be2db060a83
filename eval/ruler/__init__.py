"""RULER (Hsieh et al. 2024, "RULER: What's the Real Context Size of Your Long-Context Language Models?";
code NVIDIA/RULER): synthetic long-context tasks, generated offline, with every gemfilter method.

Modules, in RULER's own prepare -> predict -> evaluate order:
``tasks`` (the 13 task configs of ``synthetic.yaml`` with the official templates), ``sources`` (word
lists, essay haystack, sentence splitter), ``synthetic`` (niah / variable tracking / common and
frequent words generators), ``qa`` (SQuAD and HotpotQA documents), ``prepare`` (sizing every sample to
the token budget with the model's tokenizer, one JSONL per task and length), ``runner`` (resumable,
shardable predictions), ``metrics`` (string_match_all / string_match_part), ``report``, ``cli``.
"""
