"""The speed and memory benchmark (``gemfilter bench``; Shi et al. 2024, Fig. 9.3 and Theorem 9.3).

- :mod:`.core`: one measurement, and the fresh-subprocess worker (``python -m gemfilter.lab.bench.core --worker``).
- :mod:`.report`: the ``gemfilter bench`` command: options, resumable runs, medians, ratios, tables and plots.
- :mod:`.paper`: the ``--preset paper`` settings, the paper's ratios and table, and H2O's memory limit.
- :mod:`.archs`: ``config:<arch>`` models, the paper's architectures with random weights (``gemfilter/configs``).
"""
