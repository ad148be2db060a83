"""Sparse-parity ICL with two-layer multi-head linear attention (Z. Shi 2024, Sec. 5.5): closed-form heads,
noise ratio, label flips, training. Run ``python -m icl_probes.sparse_parity --help``. Importing runs nothing."""
