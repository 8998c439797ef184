"""Power planning [ours]: how many problems and pivots make the problem-clustered t clear a
threshold, for a target excess and floor, by simulation from the published records.

Each simulated campaign draws problems (with replacement) from the published main pooled
row, keeps each problem's own rates (problems differ a lot), shifts them so that the mean
floor and excess hit the targets, draws Bernoulli flips for `pivots` common pivots per
problem, and computes the paper's clustered t (docs/protocol.md section 4). Power is the share
of campaigns whose t exceeds the threshold: by default the one a verdict needs at that many problems
(``t_needed``).

    python -m replaylib.power --excess 10 --floor 15 --problems 10 20 40 --pivots 10 20 40
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from ..core.paths import PAPER_RECORDS
from . import records, stats


def t_needed(n_problems: int) -> float:
    """The clustered t that shows the excess over n_problems (at least 2): Student's 97.5% point at n_problems - 1
    degrees of freedom, never below the paper's 2. At 40 problems that is 2.02, the paper's rule; at 2 problems it is
    12.7, since without any excess a t over two problems would clear 2 one time in seven (Student's t at 1 degree)."""
    from scipy import stats as scipy_stats  # here, not at import: it takes longer to import than all else here
    return max(2.0, float(scipy_stats.t.ppf(0.975, n_problems - 1)))


def problem_rates(df: pd.DataFrame) -> pd.DataFrame:
    """Per problem with common pivots: its floor (exact2) and refeed disagreement rates."""
    common = stats.common_set(df)
    s1 = stats.sign(common["A_exact1"])
    out = pd.DataFrame({"problem_id": common["problem_id"].to_numpy(),
                        "refeed": (s1 != stats.sign(common["A_refeed"])).astype(float),
                        "floor": (s1 != stats.sign(common["A_exact2"])).astype(float)})
    return out.groupby("problem_id")[["refeed", "floor"]].mean()


def clustered_t(refeed_flips: np.ndarray, floor_flips: np.ndarray) -> np.ndarray:
    """The paper's clustered t per campaign: arrays [campaigns, problems, pivots] of 0/1."""
    d = (refeed_flips - floor_flips).mean(axis=2)  # per problem: (refeed - floor flips) / n
    n = d.shape[1]
    sd = d.std(axis=1, ddof=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        t = d.mean(axis=1) / (sd / np.sqrt(n))
    return np.where(sd > 0, t, 0.0)


def simulate(rates: pd.DataFrame, n_problems: int, pivots: int, excess_pp: float | None = None,
             floor_pct: float | None = None, threshold: float | None = None, draws: int = 2000, seed: int = 0) -> dict:
    """Power of the clustered t for one design; targets in percentage points (None: as published); the threshold
    None: ``t_needed(n_problems)``."""
    threshold = t_needed(n_problems) if threshold is None else threshold
    rng = np.random.default_rng(seed)
    floor = rates["floor"].to_numpy()
    excess = rates["refeed"].to_numpy() - floor  # per problem; refeed moves with the floor
    if floor_pct is not None:
        floor = floor + (floor_pct / 100 - floor.mean())
    if excess_pp is not None:
        excess = excess - excess.mean() + excess_pp / 100
    floor, refeed = np.clip(floor, 0, 1), np.clip(floor + excess, 0, 1)
    pick = rng.integers(0, len(rates), size=(draws, n_problems))
    shape = (draws, n_problems, pivots)
    ref = rng.random(shape) < refeed[pick][..., None]
    flo = rng.random(shape) < floor[pick][..., None]
    t = clustered_t(ref.astype(float), flo.astype(float))
    return {"problems": n_problems, "pivots_per_problem": pivots, "pivots": n_problems * pivots,
            "excess_pp": float((refeed - floor).mean() * 100), "floor_pct": float(floor.mean() * 100),
            "threshold": threshold, "power": float((t > threshold).mean()), "median_t": float(np.median(t))}


def plan(excess_pp=None, floor_pct=None, problems=(10, 20, 40), pivots=(10, 20, 40), threshold=None,
         draws=2000, seed=0, records_df: pd.DataFrame | None = None) -> pd.DataFrame:
    """A table of power over a grid of problems x pivots per problem."""
    df = records_df if records_df is not None else records.load_paper_row("main pooled", PAPER_RECORDS)
    rates = problem_rates(df)
    return pd.DataFrame([simulate(rates, n, p, excess_pp, floor_pct, threshold, draws, seed)
                         for n in problems for p in pivots])
