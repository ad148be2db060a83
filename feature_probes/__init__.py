"""Feature-learning probes: three small CPU experiments, one package each.

- ``feature_probes.midpoint_mixup``: Chidambaram, Wang, Wu, Ge (ICML 2023), Midpoint Mixup on multi-view data.
- ``feature_probes.mrp``: Pan, Zhou, Yan, mask-reconstruction pretraining in a teacher-student setting.
- ``feature_probes.parity``: Z. Shi's dissertation, Ch. 2 / App. A.7.1, gradient feature learning on parities.

Each runs as ``python -m feature_probes.<name> --help``. Importing this package runs nothing.
"""
