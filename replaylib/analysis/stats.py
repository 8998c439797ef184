"""Statistics of the three-pass replay measurement (docs/protocol.md section 4; "sec." in
the docstrings below means a section of docs/protocol.md).

Pure functions of record frames: no plotting and no file writing (tables:
``replaylib.analysis.tables``; figures: ``replaylib.analysis.plotting``; the stage: ``replaylib.stages.statistics``).

Every function takes a frame of per-pivot records (``replaylib.analysis.records``) holding *all*
records of a run, and selects the set it is defined on itself:

* common set: pivots where any pass has A != 0 (rates, bias, McNemar, clustered t,
  margin buckets, eligibility);
* exact1-conditioned set: pivots with A_exact1 != 0 (treatment-independent rates);
* all records: critical-token sets and their Jaccard;
* records carrying probe fields: probe statistics; records carrying cache fields: cache.

Passes are named by their column suffix: ``"exact2"`` (the replica, i.e. the noise
floor) and ``"refeed"``; both are compared against ``"exact1"``. sign(0) = 0.
Numerical conventions (sec. 4.6): sample standard deviations (n-1); a t with zero
spread is 0; McNemar z is 0 when b + c = 0; normal 95% CIs (mean +- 1.96 sd/sqrt(n));
Jaccard is None when both sets are empty. Where a statistic needs more records than
there are (a t from fewer than 2 values, a rate over 0 records) it is None.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from .records import PAPER_ROWS

MARGIN_SPLIT = 0.3
JACCARD_THRESHOLDS = (0.5, 0.75)
_EPS = 1e-9  # tolerance for |A| >= threshold (A is quantised in steps of 1/K)
PROBE_FIELDS = (
    "greedy_divergence_exact2",
    "greedy_divergence_refeed",
    "greedy_first_logprob_delta_exact2",
    "greedy_first_logprob_delta_refeed",
)
CACHE_FIELDS = ("cache_ok_exact1", "cache_ok_exact2")


# --------------------------------------------------------------------------- sets

def sign(x) -> np.ndarray:
    """Sign with sign(0) = 0, as integers."""
    return np.sign(np.asarray(x, dtype=float)).astype(int)


def exclude_not_exact(df: pd.DataFrame) -> tuple[pd.DataFrame, int | None]:
    """Drop records whose resume from saved state was not verified (``exact_ok == False``).

    Returns (kept records, number excluded); the count is None when the frame has no
    ``exact_ok`` column (published records). Missing ``exact_ok`` values are kept.
    """
    if "exact_ok" not in df.columns:
        return df, None
    bad = df["exact_ok"].eq(False).fillna(False).astype(bool)
    return df.loc[~bad], int(bad.sum())


def common_set(df: pd.DataFrame) -> pd.DataFrame:
    """Pivots where any pass has A != 0: the paper's reporting denominator (sec. 4.1)."""
    nz = (df["A_exact1"] != 0) | (df["A_exact2"] != 0) | (df["A_refeed"] != 0)
    return df.loc[nz]


def exact1_set(df: pd.DataFrame) -> pd.DataFrame:
    """Pivots with A_exact1 != 0: the treatment-independent (exact1-conditioned) set (sec. 4.1)."""
    return df.loc[df["A_exact1"] != 0]


def _disagrees(df: pd.DataFrame, other: str, reference: str = "exact1") -> np.ndarray:
    return sign(df[f"A_{reference}"]) != sign(df[f"A_{other}"])


def _ratio(num, den):
    return num / den if den else None


def infer_k(df: pd.DataFrame) -> int:
    """K of a run: the ``k`` of its config when the records carry one, else the smallest
    K <= 64 that puts every A on the grid of steps 1/K."""
    ks = {c.get("k") for c in df.attrs.get("configs", {}).values() if c and c.get("k")}
    if len(ks) == 1:
        return int(ks.pop())
    a = np.concatenate([df[f"A_{p}"].to_numpy(float) for p in ("exact1", "exact2", "refeed")])
    for k in range(1, 65):
        if np.all(np.abs(a * k - np.round(a * k)) < 1e-6):
            return k
    raise ValueError("cannot infer K from the A values; pass k= explicitly")


SCREEN_START = 20  # the paper calls problems scanned from index 20 "screened" and names other starts


def _problems_cell(configs: list, fallback: dict) -> str:
    """Problems column of Table 1 from the configs' problem counts and screen settings:
    one cohort "20 screened" / "20 screened from 0" / "primary 0-9", pooled cohorts
    "primary 20 + screened 20"; the count alone where a config says nothing of screening."""
    parts = []
    for c in configs:
        n, screened = int(c["problems"]), c.get("screen_mixed")
        start = c.get("scan_start", fallback.get("scan_start"))
        if screened is None:
            parts.append(str(n))
        elif len(configs) > 1:
            parts.append(f"{'screened' if screened else 'primary'} {n}")
        elif screened:
            parts.append(f"{n} screened" + ("" if start in (None, SCREEN_START) else f" from {start}"))
        else:
            parts.append(f"primary {start or 0}-{(start or 0) + n - 1}")
    return " + ".join(parts)


def row_meta(label: str, df: pd.DataFrame | None = None) -> dict:
    """Model, K, continuation temperature, problems and batch-invariance of one row.

    Read from the ``config`` blocks the records carry (``df.attrs["configs"]``: one per
    published file, or the run's parameters); the continuation temperature is the
    config's ``cont_temp``, or its trunk ``temperature`` where ``cont_temp`` is null (the
    harness's convention). A field no config holds comes from ``PAPER_ROWS[label]``
    (only fields the published files lack), else "-".
    """
    configs = [c for c in (df.attrs.get("configs", {}) if df is not None else {}).values() if c]
    paper = PAPER_ROWS.get(label, {})

    def field(get, default="-"):
        values = list(dict.fromkeys(v for v in map(get, configs) if v is not None))
        return " + ".join(map(str, values)) if len(values) > 1 else (values[0] if values else default)

    temp = field(lambda c: c["temperature"] if c.get("cont_temp") is None and "cont_temp" in c
                 and "temperature" in c else c.get("cont_temp"))
    has_counts = configs and all(isinstance(c.get("problems"), int) for c in configs)
    return {
        "model": field(lambda c: c.get("model"), paper.get("model", "-")),
        "k": field(lambda c: c.get("k"), paper.get("k", "-")),
        "cont_temp": temp if temp != "-" else paper.get("cont_temp", "-"),
        "problems": _problems_cell(configs, paper) if has_counts else paper.get("problems", "-"),
        "batch_invariant": bool(field(lambda c: c.get("batch_invariant"), paper.get("batch_invariant", False))),
    }


# --------------------------------------------------------------------------- rates

def disagreement(df: pd.DataFrame, other: str, reference: str = "exact1") -> dict:
    """Sign disagreement of pass ``other`` with ``reference`` (exact1) over the records given (sec. 4.2).

    flips = #{sign(A_reference) != sign(A_other)}, split into zero-crossings (one side 0)
    and polarity reversals (both non-zero, opposite signs). Rates are flips / n (exact
    integer numerator and denominator are kept; rate None when n = 0).
    """
    s1 = sign(df[f"A_{reference}"])
    sx = sign(df[f"A_{other}"])
    flips = int(np.sum(s1 != sx))
    polarity = int(np.sum(s1 * sx == -1))
    n = len(df)
    return {
        "flips": flips,
        "rate": _ratio(flips, n),
        "zero_crossings": flips - polarity,
        "polarity": polarity,
        "polarity_rate": _ratio(polarity, n),
    }


def rates(df: pd.DataFrame, subset: str = "common") -> dict:
    """Refeed and floor (exact2) disagreement over the common or exact1-conditioned set."""
    if subset not in ("common", "exact1"):
        raise ValueError(f"subset must be 'common' or 'exact1', not {subset!r}")
    sub = common_set(df) if subset == "common" else exact1_set(df)
    return {
        "n": len(sub),
        "refeed": disagreement(sub, "refeed"),
        "floor": disagreement(sub, "exact2"),
    }


def excess_pp(r: dict) -> float | None:
    """Excess = refeed rate - floor rate, in percentage points, from ``rates()`` output."""
    if not r["n"]:
        return None
    return 100.0 * (r["refeed"]["flips"] - r["floor"]["flips"]) / r["n"]


def eligibility(df: pd.DataFrame) -> dict:
    """Where common pivots come from (sec. 4.2): A_exact1 != 0, or non-zero only under refeed
    (A_refeed != 0, A_exact1 = A_exact2 = 0), or only under the replica (A_exact2 != 0,
    A_exact1 = A_refeed = 0). Pivots non-zero under both refeed and replica but not exact1
    are the remainder of the common set."""
    df = common_set(df)
    z1, z2, zr = (df["A_exact1"] == 0), (df["A_exact2"] == 0), (df["A_refeed"] == 0)
    return {
        "exact1_nonzero": int((~z1).sum()),
        "only_refeed": int((~zr & z1 & z2).sum()),
        "only_replica": int((~z2 & z1 & zr).sum()),
    }


# --------------------------------------------------------------------------- inference

def _t_stat(values) -> tuple[float | None, float | None, bool]:
    """(mean, one-sample t, spread>0) with sample sd; t = 0 for zero spread, None if n < 2."""
    v = np.asarray(values, dtype=float)
    if len(v) == 0:
        return None, None, False
    mean = float(v.mean())
    if len(v) < 2:
        return mean, None, False
    sd = float(v.std(ddof=1))
    if sd == 0:
        return mean, 0.0, False
    return mean, mean / (sd / math.sqrt(len(v))), True


def bias(df: pd.DataFrame) -> dict:
    """Bias of re-feeding: mean of (A_refeed - A_exact1) over the common set, its t
    (sample sd, zero spread -> 0) and normal 95% CI mean +- 1.96 sd/sqrt(n) (sec. 4.3)."""
    c = common_set(df)
    d = (c["A_refeed"] - c["A_exact1"]).to_numpy(dtype=float)
    mean, t, _ = _t_stat(d)
    ci = None
    if len(d) >= 2:
        half = 1.96 * float(d.std(ddof=1)) / math.sqrt(len(d))
        ci = [mean - half, mean + half]
    return {"mean": mean, "t": t, "ci95": ci, "n": len(d)}


def compare(common: pd.DataFrame, other: str, floor: str = "exact2", reference: str = "exact1",
            floor_reference: str = "exact1") -> dict:
    """Pass ``other`` against ``reference`` (exact1) beside the replica floor (``floor`` against
    ``floor_reference``: exact2 against exact1), over the pivots given (the common set): the one
    comparison Table 1, the transplant table and the campaigns use.

    flips, rate, zero-crossings and polarity reversals of ``other`` (``disagreement``); the
    floor's flips; the excess in pp; McNemar b (only ``other`` disagrees), c (only the floor),
    z = (b - c)/sqrt(b + c), 0 when b + c = 0; and the problem-clustered t: per problem with a
    pivot here, d = (flips - floor flips)/n, one-sample t of d over problems (sample sd; 0 for
    zero spread, ``t_spread`` False; None for fewer than 2 problems), its mean in pp, and the
    counts of problems where ``other`` disagrees more, less, or equally (sec. 4.3)."""
    mine, base = _disagrees(common, other, reference), _disagrees(common, floor, floor_reference)
    n = len(common)
    b, c = int(np.sum(mine & ~base)), int(np.sum(base & ~mine))
    per = pd.DataFrame({"problem_id": common["problem_id"].to_numpy(), "r": mine.astype(int),
                        "f": base.astype(int)}).groupby("problem_id").agg(n=("r", "size"), r=("r", "sum"),
                                                                            f=("f", "sum"))
    per["d"] = (per["r"] - per["f"]) / per["n"]
    mean, t, spread = _t_stat(per["d"])
    floor_flips = int(base.sum())
    return {**disagreement(common, other, reference), "n": n, "floor_flips": floor_flips,
            "excess_pp": None if not n else 100.0 * (int(mine.sum()) - floor_flips) / n,
            "mcnemar_b": b, "mcnemar_c": c, "mcnemar_z": (b - c) / math.sqrt(b + c) if b + c else 0.0,
            "clustered_t": t, "t_spread": spread, "n_problems": len(per),
            "mean_excess_pp": None if mean is None else 100.0 * mean,
            "worse": int((per["r"] > per["f"]).sum()), "better": int((per["r"] < per["f"]).sum()),
            "equal": int((per["r"] == per["f"]).sum())}


def mcnemar(df: pd.DataFrame) -> dict:
    """McNemar z = (b - c)/sqrt(b + c) on the common set; b = only refeed disagrees with
    exact1, c = only the replica does; z = 0 when b + c = 0 (sec. 4.3)."""
    cmp = compare(common_set(df), "refeed")
    return {"b": cmp["mcnemar_b"], "c": cmp["mcnemar_c"], "z": cmp["mcnemar_z"]}


def clustered(df: pd.DataFrame) -> dict:
    """Problem-clustered test of the excess (sec. 4.3).

    Per problem with at least one common pivot (problems without any are left out):
    d = (refeed flips - floor flips) / that problem's common n; one-sample t of d over
    problems (sample sd; 0 for zero spread; None for fewer than 2 problems).
    ``mean_excess`` is the mean of d in percentage points; counts of problems where
    refeed disagrees more, the floor disagrees more, or both equally; ``spread``: whether the
    per-problem values differ (the paper prints "-" for a t without spread).
    """
    cmp = compare(common_set(df), "refeed")
    return {"n_problems": cmp["n_problems"], "mean_excess": cmp["mean_excess_pp"], "t": cmp["clustered_t"],
            "refeed_worse": cmp["worse"], "floor_worse": cmp["better"], "equal": cmp["equal"],
            "spread": cmp["t_spread"]}


TABLE1_QUANTITIES = ["n (common)", "refeed %", "refeed polarity %", "floor %", "floor polarity %", "excess pp",
                     "t_clust", "z"]


def table1_numbers(df: pd.DataFrame) -> dict:
    """Table 1's quantities of one record set (records not verified exact excluded), unrounded:
    None where Table 1 prints "-" (no common pivot; a t without spread; z with b + c = 0)."""
    df = exclude_not_exact(df)[0]
    r = rates(df, "common")
    cmp = compare(common_set(df), "refeed")
    pct = (lambda x: None if x is None else 100.0 * x)
    return {"n (common)": r["n"], "refeed %": pct(r["refeed"]["rate"]),
            "refeed polarity %": pct(r["refeed"]["polarity_rate"]), "floor %": pct(r["floor"]["rate"]),
            "floor polarity %": pct(r["floor"]["polarity_rate"]), "excess pp": excess_pp(r),
            "t_clust": cmp["clustered_t"] if cmp["t_spread"] else None,
            "z": cmp["mcnemar_z"] if cmp["mcnemar_b"] + cmp["mcnemar_c"] else None,
            "refeed flips": r["refeed"]["flips"], "floor flips": r["floor"]["flips"]}


def critical_set(df: pd.DataFrame, pass_: str, threshold: float) -> set:
    """Critical tokens of one pass: {(problem_id, rollout, abs_pos) : |A| >= threshold}."""
    sel = df.loc[df[f"A_{pass_}"].abs() >= threshold - _EPS]
    return set(zip(sel["problem_id"], sel["rollout"], sel["abs_pos"]))


def jaccard_sets(a: set, b: set) -> float | None:
    """|a & b| / |a | b|; None when both are empty."""
    union = a | b
    return len(a & b) / len(union) if union else None


def jaccard(df: pd.DataFrame, threshold: float) -> dict:
    """Critical-token agreement on all records (sec. 4.4): Jaccard of the refeed set vs the
    exact1 set, against the replica (exact2) vs exact1 Jaccard (the ceiling)."""
    s1 = critical_set(df, "exact1", threshold)
    return {
        "n_exact1": len(s1),
        "refeed": jaccard_sets(s1, critical_set(df, "refeed", threshold)),
        "replica": jaccard_sets(s1, critical_set(df, "exact2", threshold)),
    }


def selection_gap(df: pd.DataFrame, threshold: float) -> dict:
    """How much of the critical-token selection gap re-feeding adds (sec. 4.4).

    Refeed's gap from perfect agreement with exact1 is 1 - J_refeed; the replica's own gap
    1 - J_replica is measurement noise, so re-feeding adds (J_replica - J_refeed) of it:
    ``share_added_by_refeed`` = (J_replica - J_refeed) / (1 - J_refeed). None where a
    Jaccard is undefined or J_refeed = 1 (no gap)."""
    j = jaccard(df, threshold)
    jr, jf = j["refeed"], j["replica"]
    share = None if jr is None or jf is None or jr == 1 else (jf - jr) / (1 - jr)
    return {"threshold": threshold, "refeed": jr, "replica": jf,
            "refeed_gap": None if jr is None else 1 - jr, "share_added_by_refeed": share}


def selection_near_threshold(df: pd.DataFrame, threshold: float, k: int) -> dict:
    """Where critical-token selections disagree (sec. 4.4): for refeed and the
    replica against exact1, the pivots selected (|A| >= threshold) under one pass and not
    the other (``disagreements``); ``within_1_over_k``: those where one of the two |A|
    lies within 1/K of the threshold (one step of the estimator away from flipping the
    selection); ``unselected_one_step_below``: those where the unselected |A| is at least
    threshold - 1/K."""
    a1 = df["A_exact1"].abs().to_numpy(float)
    out = {"threshold": threshold, "k": k}
    for name, pass_ in (("refeed", "refeed"), ("replica", "exact2")):
        ao = df[f"A_{pass_}"].abs().to_numpy(float)
        s1, so = a1 >= threshold - _EPS, ao >= threshold - _EPS
        dis = s1 != so
        near = (np.abs(a1 - threshold) <= 1 / k + _EPS) | (np.abs(ao - threshold) <= 1 / k + _EPS)
        unselected = np.where(s1, ao, a1)
        out[name] = {"disagreements": int(dis.sum()), "within_1_over_k": int((dis & near).sum()),
                     "unselected_one_step_below": int((dis & (unselected >= threshold - 1 / k - _EPS)).sum())}
    return out


def margin_buckets(df: pd.DataFrame, split: float = MARGIN_SPLIT) -> dict:
    """Refeed and floor disagreement rates on the common set, split at the pivot's top-1 vs
    top-2 logprob gap: margin < split ("lt") and margin >= split ("ge") (sec. 4.3)."""
    c = common_set(df)
    out = {"split": split}
    for key, mask in (("lt", c["margin"] < split), ("ge", c["margin"] >= split)):
        sub = c.loc[mask]
        out[key] = {
            "n": len(sub),
            "refeed_rate": disagreement(sub, "refeed")["rate"],
            "floor_rate": disagreement(sub, "exact2")["rate"],
        }
    return out


# --------------------------------------------------------------------------- channels

def _present(df: pd.DataFrame, cols) -> pd.Series:
    mask = pd.Series(True, index=df.index)
    for col in cols:
        if col not in df.columns:
            return pd.Series(False, index=df.index)
        mask &= df[col].notna()
    return mask


def probe_deltas(df: pd.DataFrame, pass_: str) -> np.ndarray:
    """Per-pivot max over arms of |first-token logprob delta| vs exact1, on probe records."""
    sub = df.loc[_present(df, PROBE_FIELDS)]
    if len(sub) == 0:
        return np.array([], dtype=float)
    return sub[f"greedy_first_logprob_delta_{pass_}"].to_numpy(dtype=float)


def _probe_side(sub: pd.DataFrame, pass_: str) -> dict:
    div = sub[f"greedy_divergence_{pass_}"].astype(bool).to_numpy()
    deltas = np.sort(np.abs(sub[f"greedy_first_logprob_delta_{pass_}"].to_numpy(dtype=float)))
    nonzero = deltas[deltas != 0]
    n = len(deltas)
    return {
        "divergence_rate": float(div.mean()),
        "bit_exact_rate": float(np.sum(deltas == 0) / n),
        "median_nonzero": float(nonzero[len(nonzero) // 2]) if len(nonzero) else None,
        "p90": float(deltas[int(math.floor(0.9 * n))]),
    }


def probes(df: pd.DataFrame) -> dict | None:
    """Greedy-probe channel (sec. 4.5) on records carrying probe fields; None if none do.

    divergence_rate: share of pivots where either arm's greedy probe tokens differ from
    exact1's; bit_exact_rate: share of per-pivot max |first-token logprob delta| == 0;
    median_nonzero: element floor(m/2) of the m sorted non-zero deltas; p90: element
    floor(0.9 n) of the n sorted deltas.
    """
    sub = df.loc[_present(df, PROBE_FIELDS)]
    if len(sub) == 0:
        return None
    return {"n": len(sub), "refeed": _probe_side(sub, "refeed"), "replica": _probe_side(sub, "exact2")}


def sign_test_p(k: int, n: int) -> float:
    """P(X >= k) for X ~ Binomial(n, 1/2): the one-sided exact sign test (McNemar's exact test on the
    n discordant pairs, k of them one way)."""
    return sum(math.comb(n, i) for i in range(k, n + 1)) / 2 ** n


def _paired_exactness(refeed_same: np.ndarray, replica_same: np.ndarray) -> dict:
    """Paired bit-exactness of re-feed and the replica against exact1 on the same pivots: the counts,
    the discordant pairs (b: only the replica reproduced exact1; c: only re-feed did) and the one-sided
    exact McNemar p of 'the replica reproduces exact1 more often than re-feed'."""
    b = int(np.sum(replica_same & ~refeed_same))
    c = int(np.sum(refeed_same & ~replica_same))
    return {"n": int(len(refeed_same)), "refeed_exact": int(refeed_same.sum()), "replica_exact": int(replica_same.sum()),
            "b": b, "c": c, "p": sign_test_p(b, b + c) if b + c else 1.0}


def probe_contrast(df: pd.DataFrame) -> dict:
    """The grading-free contrast, over every pivot carrying the channel (not only the common set, since
    it needs no non-zero A): per pivot, whether the greedy probe (tokens and first-token logprobs, both
    arms) and the K continuations of both arms reproduced exact1's bit for bit, re-feed against the
    replica. None for a channel the records lack (published records keep no continuation tokens)."""
    out = {"probe": None, "continuations": None}
    sub = df.loc[_present(df, PROBE_FIELDS)]
    if len(sub):
        same = {p: (~sub[f"greedy_divergence_{p}"].astype(bool)
                    & (sub[f"greedy_first_logprob_delta_{p}"].astype(float) == 0)).to_numpy()
                for p in ("refeed", "exact2")}
        out["probe"] = _paired_exactness(same["refeed"], same["exact2"])
    cont = df.loc[_present(df, ("cont_diff_refeed", "cont_diff_exact2"))]
    if len(cont):
        out["continuations"] = _paired_exactness((cont["cont_diff_refeed"] == 0).to_numpy(),
                                                 (cont["cont_diff_exact2"] == 0).to_numpy())
    return out


def cache(df: pd.DataFrame) -> dict | None:
    """Cache instrumentation (sec. 3.3, 4.5): share of records whose exact1 /
    exact2 resume was verified (num_cached_tokens at least the block-aligned prefix); None
    without the fields. Give it all records, before any exclusion (``summarize`` does)."""
    sub = df.loc[_present(df, CACHE_FIELDS)]
    if len(sub) == 0:
        return None
    return {
        "n": len(sub),
        "exact1_ok_rate": float(sub["cache_ok_exact1"].astype(bool).mean()),
        "exact2_ok_rate": float(sub["cache_ok_exact2"].astype(bool).mean()),
    }


def _own_set(df: pd.DataFrame, other: str) -> dict:
    """exact1 vs ``other`` over the pivots where at least one of those two A is non-zero."""
    el = df.loc[(df["A_exact1"] != 0) | (df[f"A_{other}"] != 0)]
    flips = int(np.sum(_disagrees(el, other)))
    return {"eligible": len(el), "flips": flips, "rate": _ratio(flips, len(el))}


def preregistered(df: pd.DataFrame, split: float = MARGIN_SPLIT) -> dict:
    """The pre-registered metrics as registered (sec. 5.3), in the layout of the
    harness's ``aggregate`` block: primary = sign disagreement of exact1 vs refeed over the
    pivots where either of the two is non-zero, the floor (exact1 vs exact2) over its own
    such set, both again by margin bucket; secondary: mean |A_exact1 - A_refeed| over all
    pivots and the greedy-probe divergence rates (records carrying them)."""
    out = {"n_pivots": len(df), "primary_exact_vs_refeed": _own_set(df, "refeed"),
           "floor_exact_vs_exact": _own_set(df, "exact2")}
    for key, mask in ((f"margin_lt_{split:g}", df["margin"] < split), (f"margin_ge_{split:g}", df["margin"] >= split)):
        sub = df.loc[mask]
        out[key] = {"exact_vs_refeed": _own_set(sub, "refeed"), "floor": _own_set(sub, "exact2")}
    delta = (df["A_exact1"] - df["A_refeed"]).abs()
    out["mean_abs_A_delta_exact_vs_refeed"] = float(delta.mean()) if len(df) else None
    div = df.loc[_present(df, ("greedy_divergence_exact2", "greedy_divergence_refeed"))]
    if len(div):
        out["greedy_probe"] = {"n": len(div),
                               "refeed_divergence_rate": float(div["greedy_divergence_refeed"].astype(bool).mean()),
                               "exact2_divergence_rate": float(div["greedy_divergence_exact2"].astype(bool).mean())}
    return out


def passes_identical(df: pd.DataFrame) -> bool:
    """Whether all three passes agree on every channel (sec. 3.5): equal A on
    every record and, on records carrying probe fields, no greedy-probe divergence and
    every first-token logprob delta exactly 0. False for an empty frame."""
    if len(df) == 0:
        return False
    same = bool(((df["A_exact1"] == df["A_exact2"]) & (df["A_exact1"] == df["A_refeed"])).all())
    sub = df.loc[_present(df, PROBE_FIELDS)]
    for p in ("exact2", "refeed"):
        same &= not sub[f"greedy_divergence_{p}"].astype(bool).any()
        same &= bool((sub[f"greedy_first_logprob_delta_{p}"].astype(float) == 0).all())
    return same


# --------------------------------------------------------------------------- summary

def summarize(df: pd.DataFrame, exclude_flagged: bool = True) -> dict:
    """All section-4 quantities of one record set, as a JSON-ready dict (floats unrounded).

    With ``exclude_flagged`` and an ``exact_ok`` column, records with exact_ok == False
    are left out of every statistic except the cache instrumentation, which is computed
    over all records before the exclusion; the number left out is reported as
    ``excluded_not_exact``, at the top level and inside ``cache``.
    """
    excluded = None
    all_records = df
    if exclude_flagged:
        df, excluded = exclude_not_exact(df)
    common = rates(df, "common")
    cond = rates(df, "exact1")
    cache_ = cache(all_records)
    if cache_ is not None and excluded is not None:
        cache_["excluded_not_exact"] = excluded
    out = {
        "n_records": len(df),
        "n_problems": int(df["problem_id"].nunique()),
        "common": common,
        "exact1_conditioned": cond,
        "excess_pp": excess_pp(common),
        "excess_pp_exact1": excess_pp(cond),
        "eligibility": eligibility(df),
        "bias": bias(df),
        "mcnemar": mcnemar(df),
        "clustered": {k: v for k, v in clustered(df).items() if k != "spread"},
        "jaccard": {str(t): jaccard(df, t) for t in JACCARD_THRESHOLDS},
        "margin": margin_buckets(df),
        "probes": probes(df),
        "contrast": probe_contrast(df),
        "cache": cache_,
    }
    if excluded is not None:
        out["excluded_not_exact"] = excluded
    return out


def text_numbers(df: pd.DataFrame, exclude_flagged: bool = True) -> dict:
    """The in-text numbers beyond ``summarize`` (the statistics stage adds them to each
    row of summary.json): per threshold the share of the selection gap re-feeding adds
    and where selection disagreements lie (``near_threshold``, None where K cannot be
    inferred), and the pre-registered metrics as registered."""
    if exclude_flagged:
        df = exclude_not_exact(df)[0]
    try:
        k = infer_k(df)
    except ValueError:  # A values off every 1/K grid: no near-threshold check
        k = None
    return {
        "selection": {str(t): {**selection_gap(df, t),
                               "near_threshold": None if k is None else selection_near_threshold(df, t, k)}
                      for t in JACCARD_THRESHOLDS},
        "preregistered": preregistered(df),
    }
