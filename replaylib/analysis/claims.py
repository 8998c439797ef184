"""The paper's claims, judged on records: holds, does not hold, underpowered, or not measured.

A claim "does not hold" only where the records could have shown it, and "underpowered" says
that they could not: three eligible pivots cannot refute a 9% floor. Each verdict carries its
n and the number behind it. The thresholds, and why:

- the replica floor is above zero: one replica flip proves it (an engine that replays a pass
  exactly cannot flip a sign). With none, it does not hold when exact2 reproduced exact1 on every
  channel (continuation tokens included: the floor is then exactly zero), or when a floor as low
  as the paper's lowest (``PAPER_MIN_FLOOR``) would have shown a flip with probability at least
  1 - ``ALPHA``; otherwise it is underpowered.
- re-feed disagrees above the floor (excess > 0, problem-clustered t above ``power.t_needed``: the
  paper's t > 2, or Student's 97.5% point where fewer problems make that larger, 12.7 at 2 problems):
  where it fails, it does not hold only if the paper's own effect (its main pooled records,
  ``power.simulate``) would clear that t at this size (problems, common pivots per problem) with
  probability ``POWER``.
- batch-invariant identity: exact (one differing channel refutes it; nothing to power).
- re-feed's greedy probe is bit-exact less often than the replica's: a one-sided exact McNemar test
  on the paired pivots at ``ALPHA``; it does not hold where re-feed is significantly the more exact,
  or where ``MIN_SELECTED`` pivots or more have no pair the claim's way.
- Jaccard of re-feed's critical set below the replica's: needs ``MIN_SELECTED`` pivots selected
  under exact1 to say that it does not hold.
- zero-crossings dominate polarity reversals among re-feed's flips: a one-sided sign test at
  ``ALPHA`` either way; fewer flips than that test needs are underpowered.
- re-feeding is unbiased (the 95% CI of mean(A_refeed - A_exact1) contains 0): holds only if the
  interval is narrow enough to rule out a bias of ``BIAS_RESOLUTION``; an interval that excludes 0
  refutes it; fewer than ``MIN_SELECTED`` common pivots decide neither.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import pandas as pd

from ..core.paths import PAPER_RECORDS
from . import power, records, stats

PAPER_MIN_FLOOR = 0.091  # the lowest replica floor the paper published (its GRPO row)
ALPHA = 0.05
POWER = 0.8
MIN_SELECTED = 10
BIAS_RESOLUTION = 0.05
PROBLEM_GRID = (8, 16, 32, 64, 128)  # problem counts searched for "about N problems would do"


@dataclass
class Verdict:
    verdict: str  # holds, does not hold, underpowered, not measured
    n: int | None  # the size the verdict rests on
    value: str  # the number behind it
    why: str = ""


def _replica_identical(df: pd.DataFrame) -> bool | None:
    """exact2 reproduced exact1 on every channel, continuation tokens included; None when the
    records lack a channel (published records keep no continuation tokens)."""
    cols = ("cont_diff_exact2", "greedy_divergence_exact2", "greedy_first_logprob_delta_exact2")
    if len(df) == 0 or not all(c in df.columns for c in cols):
        return None
    return bool((df["A_exact1"] == df["A_exact2"]).all() and (df["cont_diff_exact2"] == 0).all()
                and not df["greedy_divergence_exact2"].astype(bool).any()
                and (df["greedy_first_logprob_delta_exact2"].astype(float) == 0).all())


def floor_above_zero(df: pd.DataFrame) -> Verdict:
    r = stats.rates(df, "common")
    n, flips = r["n"], r["floor"]["flips"]
    value = f"{flips}/{n} replica flips"
    if flips:
        return Verdict("holds", n, value)
    if _replica_identical(df):
        return Verdict("does not hold", len(df), value,
                       f"exact2 reproduced exact1 on every channel at all {len(df)} pivots: the floor is exactly 0")
    if n == 0:
        return Verdict("not measured", 0, value, "no common pivot")
    p_none = (1 - PAPER_MIN_FLOOR) ** n
    if p_none > ALPHA:
        return Verdict("underpowered", n, value, f"a {100 * PAPER_MIN_FLOOR:.1f}% floor would give no flip in {n} "
                                                 f"with probability {p_none:.2f}")
    return Verdict("does not hold", n, value, f"a {100 * PAPER_MIN_FLOOR:.1f}% floor would give a flip in {n} "
                                              f"with probability {1 - p_none:.2f}")


@functools.lru_cache(maxsize=1)
def _paper_rates():
    return power.problem_rates(records.load_paper_row("main pooled", PAPER_RECORDS))


def excess_power(n_problems: int, pivots_per_problem: int, draws: int = 400) -> float:
    """Probability that the paper's main pooled effect clears the clustered t a verdict needs at this size."""
    return power.simulate(_paper_rates(), n_problems, max(1, pivots_per_problem), draws=draws)["power"]


def sign_power(df: pd.DataFrame) -> dict:
    """Whether the sign statistics have power at this size: the probability that the paper's main
    pooled effect clears the clustered t a verdict needs with this run's problems and common pivots per problem, and
    the size that would do (problems from ``PROBLEM_GRID`` at the same pivots per problem; None where
    none of them does)."""
    r, cl = stats.rates(df, "common"), stats.clustered(df)
    n, problems = r["n"], cl["n_problems"]
    out = {"n": n, "problems": problems, "per_problem": None, "power": 0.0, "powered": False,
           "needed_problems": None, "needed_pivots": None, "searched_problems": max(PROBLEM_GRID)}
    if n == 0 or problems < 2:  # no clustered t at all
        return out
    per_problem = max(1, round(n / problems))
    p = excess_power(problems, per_problem)
    need = problems if p >= POWER else next(
        (m for m in PROBLEM_GRID if m > problems and excess_power(m, per_problem) >= POWER), None)
    return {**out, "per_problem": per_problem, "power": p, "powered": p >= POWER, "needed_problems": need,
            "needed_pivots": None if need is None else need * per_problem}


def excess_above_floor(df: pd.DataFrame) -> Verdict:
    r = stats.rates(df, "common")
    cl = stats.clustered(df)
    ex, t, problems = stats.excess_pp(r), cl["t"], cl["n_problems"]
    value = ("-" if ex is None else f"excess {ex:+.1f} pp") + ("" if t is None else f", t {t:.2f}") + \
        f" over {problems} problems (n {r['n']})"
    needed = power.t_needed(problems) if problems >= 2 else None
    if ex is not None and t is not None and ex > 0 and t > needed:
        return Verdict("holds", r["n"], value)
    if r["n"] == 0 or problems < 2:
        return Verdict("underpowered" if r["n"] else "not measured", r["n"], value,
                       "a clustered t needs common pivots in 2 problems or more")
    sp = sign_power(df)
    if not sp["powered"]:
        need = sp["needed_problems"]
        return Verdict("underpowered", r["n"], value,
                       f"the paper's effect would clear t > {needed:.2f} with probability {sp['power']:.2f} at "
                       f"{problems} problems of {sp['per_problem']} common pivots" +
                       (f"; about {need} problems would do" if need else ""))
    return Verdict("does not hold", r["n"], value, f"the paper's effect would clear t > {needed:.2f} with "
                                                   f"probability {sp['power']:.2f} at this size")


def probes_differ(df: pd.DataFrame) -> Verdict:
    """Re-feed's greedy probe reproduces exact1 bit for bit less often than the replica's (the paper:
    61-94% of replica probes bit-exact, 2.6-5.7% of re-fed ones): a one-sided exact McNemar test on the
    paired pivots. It does not hold where re-feed is the more exact one significantly, or where
    ``MIN_SELECTED`` pivots or more show no pair going the claim's way."""
    c = stats.probe_contrast(df)["probe"]
    if c is None:
        return Verdict("not measured", 0, "no record carries the greedy probe")
    value = (f"bit-exact: replica {c['replica_exact']}/{c['n']}, refeed {c['refeed_exact']}/{c['n']}; "
             f"discordant {c['b']}:{c['c']}, exact McNemar p {c['p']:.2g}")
    if c["p"] < ALPHA:
        return Verdict("holds", c["n"], value)
    if c["c"] + c["b"] and stats.sign_test_p(c["c"], c["b"] + c["c"]) < ALPHA:
        return Verdict("does not hold", c["n"], value, "re-feed reproduced exact1 more often than the replica")
    if c["b"] == 0 and c["n"] >= MIN_SELECTED:
        return Verdict("does not hold", c["n"], value, "no pivot where only the replica reproduced exact1")
    return Verdict("underpowered", c["n"], value,
                   f"{c['b'] + c['c']} discordant pivots cannot give p < {ALPHA}" if 0.5 ** (c["b"] + c["c"]) >= ALPHA
                   else "the discordant pivots decide neither way")


def batch_invariant_identity(df: pd.DataFrame) -> Verdict:
    if len(df) == 0:
        return Verdict("not measured", 0, "no pivot")
    same = stats.passes_identical(df)
    value = f"{len(df)} pivots, all passes identical on every channel: {'yes' if same else 'no'}"
    return Verdict("holds" if same else "does not hold", len(df), value)


def jaccard_below_ceiling(df: pd.DataFrame) -> Verdict:
    j = stats.jaccard(df, 0.5)
    n = j["n_exact1"]
    if j["refeed"] is None or j["replica"] is None:
        return Verdict("not measured", n, "no pivot selected (|A| >= 0.5)")
    value = f"refeed {j['refeed']:.2f} vs replica {j['replica']:.2f} ({n} selected under exact1)"
    if j["refeed"] < j["replica"]:
        return Verdict("holds", n, value)
    if n < MIN_SELECTED:
        return Verdict("underpowered", n, value, f"fewer than {MIN_SELECTED} pivots selected under exact1")
    return Verdict("does not hold", n, value)


def zero_crossings_dominate(df: pd.DataFrame) -> Verdict:
    d = stats.rates(df, "common")["refeed"]
    zc, pol = d["zero_crossings"], d["polarity"]
    n = zc + pol
    value = f"{zc} zero-crossings, {pol} polarity reversals"
    if n == 0:
        return Verdict("not measured", 0, value, "re-feed changed no sign")
    if stats.sign_test_p(zc, n) < ALPHA:
        return Verdict("holds", n, value)
    if stats.sign_test_p(pol, n) < ALPHA:
        return Verdict("does not hold", n, value)
    return Verdict("underpowered", n, value, f"a sign test over {n} flips decides neither way at {ALPHA}")


def bias_mean_zero(df: pd.DataFrame) -> Verdict:
    b = stats.bias(df)
    if b["ci95"] is None:
        return Verdict("not measured", b["n"], "fewer than 2 common pivots")
    lo, hi = b["ci95"]
    value = f"mean {b['mean']:+.3f}, 95% CI [{lo:+.3f}, {hi:+.3f}]"
    if b["n"] < MIN_SELECTED:  # a normal interval over a handful of pivots decides nothing
        return Verdict("underpowered", b["n"], value, f"fewer than {MIN_SELECTED} common pivots")
    if lo > 0 or hi < 0:
        return Verdict("does not hold", b["n"], value)
    if hi - lo > 2 * BIAS_RESOLUTION:
        return Verdict("underpowered", b["n"], value, f"the interval cannot rule out a bias of {BIAS_RESOLUTION}")
    return Verdict("holds", b["n"], value)


# the claims, and the rows each is judged on: the stock engine's, or the batch-invariant one's
CLAIMS = [
    ("re-feed disagrees with exact1 above the replica floor (excess > 0, clustered t > 2 and Student's 97.5%)",
     excess_above_floor,
     "stock"),
    ("the replica floor is above zero on the stock engine", floor_above_zero, "stock"),
    ("batch-invariant rows: all passes identical on every channel", batch_invariant_identity, "invariant"),
    ("re-feed's greedy probe is bit-exact less often than the replica's (exact McNemar, one-sided)", probes_differ,
     "stock"),
    ("Jaccard of re-feed's selection (|A| >= 0.5) below the replica ceiling", jaccard_below_ceiling, "stock"),
    ("re-feed's sign changes are mostly zero-crossings, not polarity reversals", zero_crossings_dominate, "stock"),
    ("re-feeding is unbiased: the 95% CI of mean(A_refeed - A_exact1) contains 0", bias_mean_zero, "stock"),
]
ORDER = ("does not hold", "holds", "underpowered", "not measured")


def combine(per_row: dict[str, Verdict]) -> tuple[str, str]:
    """One verdict over rows: does not hold if a row refutes it, else holds if a row shows it, else
    underpowered, else not measured; the detail names every row's verdict and number."""
    if not per_row:
        return "not measured", "no row could measure it"
    verdict = next(v for v in ORDER if any(x.verdict == v for x in per_row.values()))
    parts = []
    for v in ORDER:
        rows = [f"{label} ({x.value}{'; ' + x.why if x.why else ''})" for label, x in per_row.items() if x.verdict == v]
        if rows:
            parts.append(f"{v} on {', '.join(rows)}")
    return verdict, "; ".join(parts)


def judge(stock: dict[str, pd.DataFrame], invariant: dict[str, pd.DataFrame]) -> list[dict]:
    """Every claim over rows {label: records} (records not verified exact already excluded)."""
    out = []
    for claim, fn, kind in CLAIMS:
        rows = stock if kind == "stock" else invariant
        per_row = {label: fn(df) for label, df in rows.items()}
        verdict, detail = combine(per_row)
        out.append({"claim": claim, "verdict": verdict, "detail": detail,
                    "rows": {label: vars(v) for label, v in per_row.items()}})
    return out
