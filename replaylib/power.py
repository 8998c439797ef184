"""Power planning [ours]: how many problems and pivots make the problem-clustered t clear a
threshold, for a target excess and floor, by simulation from the published records.

Each simulated campaign draws problems (with replacement) from the published main pooled
row, keeps each problem's own rates (problems differ a lot), shifts them so that the mean
floor and excess hit the targets, draws Bernoulli flips for `pivots` common pivots per
problem, and computes the paper's clustered t (docs/protocol.md section 4). Power is the share
of campaigns whose t exceeds the threshold.

    python -m replaylib.power --excess 10 --floor 15 --problems 10 20 40 --pivots 10 20 40
"""
from __future__ import annotations

import argparse
import sys

import numpy as np
import pandas as pd

from . import records, stats
from .rundir import REPO


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
             floor_pct: float | None = None, threshold: float = 2.0, draws: int = 2000, seed: int = 0) -> dict:
    """Power of the clustered t for one design; targets in percentage points (None: as published)."""
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


def plan(excess_pp=None, floor_pct=None, problems=(10, 20, 40), pivots=(10, 20, 40), threshold=2.0,
         draws=2000, seed=0, records_df: pd.DataFrame | None = None) -> pd.DataFrame:
    """A table of power over a grid of problems x pivots per problem."""
    df = records_df if records_df is not None else records.load_paper_row("main pooled", REPO / "data" / "paper-records")
    rates = problem_rates(df)
    return pd.DataFrame([simulate(rates, n, p, excess_pp, floor_pct, threshold, draws, seed)
                         for n in problems for p in pivots])


def _bounded(kind, lo=None, hi=None, lo_open=False):
    """An argparse type: a number of `kind` within [lo, hi] (lo excluded with lo_open), one line otherwise."""
    def parse(text):
        try:
            v = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a{'n integer' if kind is int else ' number'}") from None
        if v != v or (lo is not None and (v <= lo if lo_open else v < lo)) or (hi is not None and v > hi):
            rng = f"{'above' if lo_open else 'at least'} {lo}" if lo is not None else ""
            rng += (" and " if rng and hi is not None else "") + (f"at most {hi}" if hi is not None else "")
            raise argparse.ArgumentTypeError(f"{text} is out of range: it must be {rng}")
        return v
    return parse


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line on stderr, exit status 2
        self.exit(2, f"{self.prog}: error: {message}\n")


def main(argv=None) -> int:
    ap = _Parser(prog="python -m replaylib.power", description=__doc__.splitlines()[0])
    ap.add_argument("--excess", type=_bounded(float, -100, 100), default=None,
                    help="target excess in pp (default: the paper's)")
    ap.add_argument("--floor", type=_bounded(float, 0, 100), default=None,
                    help="target floor rate in %% (default: the paper's)")
    ap.add_argument("--problems", type=_bounded(int, 2), nargs="+", default=[10, 20, 40])
    ap.add_argument("--pivots", type=_bounded(int, 1), nargs="+", default=[10, 20, 40],
                    help="common pivots per problem")
    ap.add_argument("--threshold", type=_bounded(float, 0, lo_open=True), default=2.0, help="clustered t to clear")
    ap.add_argument("--draws", type=_bounded(int, 1), default=2000)
    ap.add_argument("--seed", type=_bounded(int, 0), default=0)
    args = ap.parse_args(argv)
    table = plan(args.excess, args.floor, args.problems, args.pivots, args.threshold, args.draws, args.seed)
    print(table.to_string(index=False, float_format=lambda x: f"{x:.3f}"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
