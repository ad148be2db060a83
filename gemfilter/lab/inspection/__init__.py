"""Inspection: what each layer's last query row looks at (Shi et al. 2024, Figs. 9.2, 9.5 and G.5).

- :mod:`gemfilter.toolkit.trace` (shared with the probes): :func:`~gemfilter.toolkit.trace.trace` and its capture
  points, kept indices, needle distances.
- :mod:`.report`: the ``gemfilter inspect`` and ``gemfilter calibrate`` commands: figures and tables.
- :mod:`.calibrate`: the paper's layer rule from NIAH probes, and the stored per-model calibration.
"""
