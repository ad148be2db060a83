"""Modular addition with k inputs: Fourier features and grokking (Z. Shi 2024, Ch. 4, appendix C.10).

- ``data``: the p^k inputs a in Z_p^k with label (a_1 + ... + a_k) mod p, split into train/test.
- ``mlp``: the one-hidden-layer network of Eq. 4.2 (k-th power activation).
- ``transformer``: the one- and two-layer transformers of Figs. 4.3 and 4.4.
- ``fourier``: per-neuron maximum normalised power, argmax frequencies, 2-D DFT of W^{KQ}.
- ``train``: AdamW training (C.10.1) with warm-up, evaluated on train and test.
- ``experiments``: presets and one seeded run function per figure; ``plots``: Figs. 4.1-4.4.

Run ``python -m icl_probes.modular --help``. Importing this package runs nothing.
"""
