"""ICL probes from Z. Shi's dissertation (2024): one package per experiment.

- ``icl_probes.looped``: Ch. 8, the looped linear transformer does multi-step gradient descent.
- ``icl_probes.label_flip``: Ch. 5, label-flip ICL with LLMs and the rank-r theory simulation.
- ``icl_probes.modular``: Ch. 4, modular addition with k inputs, Fourier features and grokking.
- ``icl_probes.sparse_parity``: Ch. 5, Sec. 5.5, sparse-parity ICL with two-layer multi-head linear attention.

Each runs as ``python -m icl_probes.<name> --help``. Importing this package runs nothing.
"""
