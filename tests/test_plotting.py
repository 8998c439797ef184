"""Figures: smoke tests writing PDF and PNG into a temporary folder."""

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from replaylib import plotting, records

ROOT = Path(__file__).resolve().parents[1]
PAPER = ROOT / "data" / "paper-records"


@pytest.fixture(scope="module")
def main():
    return records.load_paper_row("main pooled", PAPER)


def _saved(fig, name, tmp_path):
    paths = plotting.save_figure(fig, name, tmp_path)
    assert [p.name for p in paths] == [f"{name}.pdf", f"{name}.png"]
    assert all(p.stat().st_size > 1000 for p in paths)
    w, h = fig.get_size_inches()
    assert w <= 7.2 and h <= 7.2


def test_fig1(main, tmp_path):
    fig, axes = plotting.fig1_quadrants(main)
    assert len(axes) == 2
    grid = axes[0].images[0].get_array()
    assert grid.shape == (9, 9) and int(grid.sum()) == 636
    _saved(fig, "fig1_quadrants", tmp_path)


def test_fig2(main, tmp_path):
    rows = {"main pooled": main, "batch-invariant": records.load_paper_row("batch-invariant", PAPER)}
    fig, ax = plotting.fig2_configs(rows)
    heights = [p.get_height() for p in ax.patches]
    assert heights[0] == pytest.approx(100 * 215 / 636) and heights[1] == 0  # refeed bars
    _saved(fig, "fig2_configs", tmp_path)


def test_fig3(main, tmp_path):
    fig, ax = plotting.fig3_logprob_ecdf(main)
    assert ax.get_xscale() == "log"
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert labels == ["replica: 72.3% exactly 0", "refeed: 3.3% exactly 0"]
    _saved(fig, "fig3_logprob_ecdf", tmp_path)


def test_infer_k_and_no_probes():
    df = pd.DataFrame({"problem_id": [1, 1], "rollout": 0, "abs_pos": [1, 2], "margin": 0.5,
                       "A_exact1": [0.125, 0.0], "A_exact2": [0.0, -0.375], "A_refeed": [1.0, 0.5]})
    assert plotting.infer_k(df) == 8
    fig, axes = plotting.fig1_quadrants(df)
    assert axes[0].images[0].get_array().shape == (17, 17)
    with pytest.raises(ValueError, match="no probe fields"):
        plotting.fig3_logprob_ecdf(df.assign(greedy_first_logprob_delta_refeed=np.nan))
