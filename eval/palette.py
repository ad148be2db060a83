"""Colours the benchmarks' figures share: low to high score, as the GemFilter repo's NIAH heatmaps."""

COLORS = ["#F0496E", "#EBB839", "#0CD79F"]
