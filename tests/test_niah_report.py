"""NIAH heatmaps and summary table on hand-made rows."""

import matplotlib

matplotlib.use("Agg")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
from matplotlib.colors import to_rgba  # noqa: E402

from eval.niah.report import draw, markdown_table, pivot, summarize, write_report  # noqa: E402


def row(method, length, depth, recall, seconds=1.0, rouge1=0.0, hit=0.0, kept=100, n=200):
    return {
        "method": method,
        "length": length,
        "depth": depth,
        "recall": recall,
        "rouge1": rouge1,
        "hit": hit,
        "seconds": seconds,
        "kept": kept,
        "prompt_tokens": n,
    }


ROWS = [
    row("a", 1000, 0, 1.0, seconds=1.0, rouge1=8.0, hit=1.0),
    row("a", 2000, 0, 0.5, seconds=2.0, rouge1=4.0),
    row("a", 1000, 50, 0.0, seconds=3.0),
    row("a", 2000, 50, 11 / 12, seconds=6.0, rouge1=6.0, hit=1.0),
    row("b", 1000, 0, 0.25, seconds=0.5, kept=40),
]


def test_pivot_rows_are_depths_from_zero_columns_lengths():
    depths, lengths, grid = pivot(ROWS, "a")
    assert depths == [0, 50] and lengths == [1000, 2000]
    np.testing.assert_allclose(grid, [[1.0, 0.5], [0.0, 11 / 12]])
    _, _, grid_b = pivot(ROWS, "b")  # same axes for every method; cells it lacks are NaN
    assert grid_b[0, 0] == 0.25 and np.isnan(grid_b[1, 1])


def test_summary_means_by_hand():
    a, b = summarize(ROWS)
    assert a["method"] == "a" and a["cells"] == 4
    assert a["recall"] == pytest.approx((1 + 0.5 + 0 + 11 / 12) / 4)  # 0.6042
    assert a["seconds"] == pytest.approx(3.0) and a["rouge1"] == pytest.approx(4.5) and a["hit"] == 0.5
    assert (b["recall"], b["seconds"], b["kept"]) == (0.25, 0.5, 40)
    table = markdown_table(ROWS, "model-x")
    assert "| a | 0.604 | 4.50 | 0.50 | 100 / 200 | 3.00 | 4 |" in table
    assert "| b | 0.250 | 0.00 | 0.00 | 40 / 200 | 0.50 | 1 |" in table


def test_heatmap_follows_the_conventions():
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    mesh = draw(ax, ROWS, "a", "model-x")
    assert ax.get_ylim() == (2, 0)  # depth 0 on top
    assert [t.get_text() for t in ax.get_yticklabels()] == ["0", "50"]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["1000", "2000"]
    assert (ax.get_xlabel(), ax.get_ylabel()) == ("Token Limit", "Depth Percent")
    assert "model-x" in ax.get_title() and "| a" in ax.get_title() and "average score 0.604" in ax.get_title()
    assert (mesh.norm.vmin, mesh.norm.vmax) == (0, 1)
    for x, color in ((0.0, "#F0496E"), (0.5, "#EBB839"), (1.0, "#0CD79F")):
        np.testing.assert_allclose(mesh.cmap(x), to_rgba(color), atol=0.01)
    np.testing.assert_allclose(mesh.get_edgecolor()[0], to_rgba("grey"))
    assert mesh.get_linewidth()[0] == 0.5
    np.testing.assert_allclose(np.asarray(mesh.get_array()).reshape(2, 2), [[1.0, 0.5], [0.0, 11 / 12]])
    draw(ax, ROWS, "a", "model-x", metric="rouge1")  # rouge1 x10 is scaled to 0..1
    np.testing.assert_allclose(np.asarray(ax.collections[-1].get_array()).reshape(2, 2), [[0.8, 0.4], [0.0, 0.6]])
    plt.close(fig)


def test_write_report_files(tmp_path):
    import matplotlib.image as mpimg

    paths = write_report(ROWS, tmp_path, "model-x", "topk 40")
    assert sorted(p.name for p in paths) == ["heatmap_a.png", "heatmap_b.png", "heatmaps.png", "summary.md"]
    img = mpimg.imread(tmp_path / "heatmaps.png")
    assert img.shape[1] > img.shape[0] > 200  # two panels side by side
    assert (tmp_path / "summary.md").read_text().startswith("# Needle in a Haystack: model-x\n\ntopk 40\n")
    with pytest.raises(ValueError, match="no NIAH results"):
        write_report([], tmp_path, "model-x")
