"""Label-flip ICL (Z. Shi, dissertation 2024, Ch. 5): why larger models do ICL differently.

- :mod:`.data`: the task registry (SST-2, Subj, GLUE binary tasks through ``datasets``, a local
  JSONL folder, or the generated offline ``synthetic`` task).
- :mod:`.prompts`: the M-shot template with a share of exemplar labels flipped (Figs. 5.1-5.2).
- :mod:`.llm`: the multi-model sweep (label-word log-probs or generation), resumable JSONL, plots.
- :mod:`.ablation`: final-layer last-row attention, relevant vs irrelevant sentence (Fig. 5.3).
- :mod:`.theory`: rank-r linear self-attention under label noise (Sec. 5.4, Thms 5.4.1-5.4.3).

Run ``python -m icl_probes.label_flip --help``. Importing this package runs nothing.
"""
