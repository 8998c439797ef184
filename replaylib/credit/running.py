"""Credit's pivots pooled over a training run's steps: a step holds few comparable pivots (with 4 rollouts, 0 or
1), so the rates that decide anything are the run's. The replica floor's and re-feed's shares of sign changes
with 95% Wilson intervals, and the verdict on "re-feed's credit differs above the floor" as the statistics stage
gives it (replaylib.analysis.claims: holds, underpowered until the run has the power to tell, does not hold)."""
from __future__ import annotations

import math

import pandas as pd

from ..analysis import claims, stats
from .tool import records_of

CLAIM = "re-feed's credit differs above the floor"
VERDICT_VALUE = {"holds": 1.0, "underpowered": 0.0, "does not hold": -1.0}  # "not measured" is left out


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """The Wilson score interval of k successes in n (n > 0): unlike the normal one, sound at 0 of n."""
    centre = (k + z * z / 2) / (n + z * z)
    half = z * math.sqrt(k * (n - k) / n + z * z / 4) / (n + z * z)
    return max(0.0, centre - half), min(1.0, centre + half)


class Pooled:
    """The verified pivots of every step so far, as the statistics stage's records."""

    def __init__(self):
        self.records = pd.DataFrame()
        self.verdict: claims.Verdict | None = None

    def add(self, frame: pd.DataFrame) -> None:
        if len(frame):
            kept = stats.exclude_not_exact(records_of(frame))[0]
            self.records = pd.concat([self.records, kept], ignore_index=True)
        if len(self.records):
            self.verdict = claims.excess_above_floor(self.records)

    def metrics(self, prefix: str = "credit/") -> dict:
        """Pooled common pivots and problems; the floor's and re-feed's rates with their intervals (where there
        is a common pivot); the verdict as 1 (holds), 0 (underpowered) or -1 (does not hold)."""
        if not len(self.records):
            return {f"{prefix}pooled_common_pivots": 0.0}
        common = stats.common_set(self.records)
        rates = stats.rates(self.records, "common")
        found = {"pooled_common_pivots": len(common), "pooled_problems": common["problem_id"].nunique()}
        n = rates["n"]
        for name, key in (("floor", "floor"), ("refeed", "refeed")):
            if n:
                flips = rates[key]["flips"]
                found[f"pooled_{name}"] = flips / n
                found[f"pooled_{name}_lo"], found[f"pooled_{name}_hi"] = wilson(flips, n)
        if self.verdict is not None and self.verdict.verdict in VERDICT_VALUE:
            found["refeed_above_floor"] = VERDICT_VALUE[self.verdict.verdict]
        return {f"{prefix}{k}": float(v) for k, v in found.items()}

    def line(self) -> str:
        v = self.verdict
        if v is None:
            return f"credit: {CLAIM}: not measured (no verified pivot pooled yet)"
        return f"credit: {CLAIM}: {v.verdict} ({v.value}" + (f"; {v.why})" if v.why else ")")
