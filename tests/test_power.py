"""Power planning from the published records."""
import numpy as np
import pandas as pd
import pytest

from replaylib import power as power_cli
from replaylib.analysis import power


def test_clustered_t_matches_the_statistics_definition():
    ref = np.array([[[1, 0, 1, 0], [1, 1, 0, 0], [0, 0, 0, 1]]], dtype=float)
    flo = np.array([[[0, 0, 0, 0], [1, 0, 0, 0], [0, 0, 0, 0]]], dtype=float)
    d = np.array([0.5, 0.25, 0.25])
    assert np.isclose(power.clustered_t(ref, flo)[0], d.mean() / (d.std(ddof=1) / np.sqrt(3)))
    assert power.clustered_t(flo, flo)[0] == 0.0  # zero spread: t = 0, as in the paper


def test_power_grows_with_problems_and_with_the_effect():
    rates = pd.DataFrame({"refeed": [0.4, 0.35, 0.5, 0.3], "floor": [0.2, 0.25, 0.3, 0.2]})
    small = power.simulate(rates, 5, 10, draws=500)
    large = power.simulate(rates, 40, 10, draws=500)
    assert 0 <= small["power"] <= large["power"] <= 1 and large["power"] > 0.9
    null = power.simulate(rates, 40, 10, excess_pp=0.0, draws=500)
    assert null["power"] < 0.1 and abs(null["excess_pp"]) < 1e-9
    shifted = power.simulate(rates, 10, 10, excess_pp=5.0, floor_pct=20.0, draws=200)
    assert abs(shifted["floor_pct"] - 20.0) < 1e-6 and abs(shifted["excess_pp"] - 5.0) < 1e-6


def test_the_t_a_verdict_needs_keeps_its_error_rate_at_few_problems():
    assert power.t_needed(40) == pytest.approx(2.0227, abs=1e-4) and power.t_needed(200) == 2.0  # the paper's 2
    assert power.t_needed(2) == pytest.approx(12.706, abs=1e-3) and power.t_needed(3) == pytest.approx(4.303, abs=1e-3)
    # no excess, normal per-problem differences: t > 2 would pass about 15% of 2-problem runs, t_needed about 2.5%
    rng = np.random.default_rng(0)
    d = rng.normal(size=(20000, 2))
    t = d.mean(axis=1) / (d.std(axis=1, ddof=1) / np.sqrt(2))
    assert 0.13 < (t > 2).mean() < 0.17 and 0.02 < (t > power.t_needed(2)).mean() < 0.03
    rates = pd.DataFrame({"refeed": [0.4, 0.35, 0.5, 0.3], "floor": [0.2, 0.25, 0.3, 0.2]})
    assert power.simulate(rates, 3, 10, draws=20)["threshold"] == power.t_needed(3)
    assert power.simulate(rates, 3, 10, threshold=2.0, draws=20)["threshold"] == 2.0


def test_plan_runs_on_the_published_records():
    table = power.plan(problems=[20], pivots=[16], draws=300)
    row = table.iloc[0]
    assert row.pivots == 320 and row.power > 0.8  # the paper's effect is large at its own size
    assert 15 < row.excess_pp < 25


def test_a_floor_target_alone_keeps_the_excess():
    rates = pd.DataFrame({"refeed": [0.4, 0.35, 0.5, 0.3], "floor": [0.2, 0.25, 0.3, 0.2]})
    moved = power.simulate(rates, 10, 10, floor_pct=10.0, draws=50)
    assert moved["floor_pct"] == pytest.approx(10.0) and moved["excess_pp"] == pytest.approx(15.0)
    assert power.simulate(rates, 10, 10, draws=50)["excess_pp"] == pytest.approx(15.0)


def test_cli_floor_without_excess_keeps_the_papers_excess(capsys):
    assert power_cli.main(["--floor", "20", "--problems", "20", "--pivots", "16", "--draws", "50"]) == 0
    moved = capsys.readouterr().out.splitlines()
    assert power_cli.main(["--problems", "20", "--pivots", "16", "--draws", "50"]) == 0
    paper = capsys.readouterr().out.splitlines()
    header = paper[0].split()
    row_moved, row_paper = dict(zip(header, moved[1].split())), dict(zip(header, paper[1].split()))
    assert float(row_moved["floor_pct"]) == pytest.approx(20.0, abs=1e-3)
    assert row_moved["excess_pp"] == row_paper["excess_pp"]
