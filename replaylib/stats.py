"""Statistics of the three-pass replay measurement (PROTOCOL.md section 4), and tables.

Every function takes a frame of per-pivot records (``replaylib.records``) holding *all*
records of a run, and selects the set it is defined on itself:

* common set: pivots where any pass has A != 0 (rates, bias, McNemar, clustered t,
  margin buckets, eligibility);
* exact1-conditioned set: pivots with A_exact1 != 0 (treatment-independent rates);
* all records: critical-token sets and their Jaccard;
* records carrying probe fields: probe statistics; records carrying cache fields: cache.

Passes are named by their column suffix: ``"exact2"`` (the replica, i.e. the noise
floor) and ``"refeed"``; both are compared against ``"exact1"``. sign(0) = 0.
Numerical conventions (section 4): sample standard deviations (n-1); a t with zero
spread is 0; McNemar z is 0 when b + c = 0; normal 95% CIs (mean +- 1.96 sd/sqrt(n));
Jaccard is None when both sets are empty. Where a statistic needs more records than
there are (a t from fewer than 2 values, a rate over 0 records) it is None.
"""

from __future__ import annotations

import math
import warnings
from pathlib import Path

import numpy as np
import pandas as pd

from replaylib.records import PAPER_ROWS

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
    """Pivots where any pass has A != 0: the pre-registered common denominator (sec. 4)."""
    nz = (df["A_exact1"] != 0) | (df["A_exact2"] != 0) | (df["A_refeed"] != 0)
    return df.loc[nz]


def exact1_set(df: pd.DataFrame) -> pd.DataFrame:
    """Pivots with A_exact1 != 0: the treatment-independent (exact1-conditioned) set."""
    return df.loc[df["A_exact1"] != 0]


def _disagrees(df: pd.DataFrame, other: str) -> np.ndarray:
    return sign(df["A_exact1"]) != sign(df[f"A_{other}"])


def _ratio(num, den):
    return num / den if den else None


# --------------------------------------------------------------------------- rates

def disagreement(df: pd.DataFrame, other: str) -> dict:
    """Sign disagreement of pass ``other`` with exact1 over the records given (sec. 4).

    flips = #{sign(A_exact1) != sign(A_other)}, split into zero-crossings (one side 0)
    and polarity reversals (both non-zero, opposite signs). Rates are flips / n (exact
    integer numerator and denominator are kept; rate None when n = 0).
    """
    s1 = sign(df["A_exact1"])
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
    """Where common pivots come from (sec. 4): A_exact1 != 0, or non-zero only under refeed
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
    (sample sd, zero spread -> 0) and normal 95% CI mean +- 1.96 sd/sqrt(n) (sec. 4)."""
    c = common_set(df)
    d = (c["A_refeed"] - c["A_exact1"]).to_numpy(dtype=float)
    mean, t, _ = _t_stat(d)
    ci = None
    if len(d) >= 2:
        half = 1.96 * float(d.std(ddof=1)) / math.sqrt(len(d))
        ci = [mean - half, mean + half]
    return {"mean": mean, "t": t, "ci95": ci, "n": len(d)}


def mcnemar(df: pd.DataFrame) -> dict:
    """McNemar z = (b - c)/sqrt(b + c) on the common set; b = only refeed disagrees with
    exact1, c = only the replica does; z = 0 when b + c = 0 (sec. 4)."""
    c_ = common_set(df)
    fr, ff = _disagrees(c_, "refeed"), _disagrees(c_, "exact2")
    b, c = int(np.sum(fr & ~ff)), int(np.sum(ff & ~fr))
    z = (b - c) / math.sqrt(b + c) if b + c else 0.0
    return {"b": b, "c": c, "z": z}


def _per_problem_excess(df: pd.DataFrame) -> pd.DataFrame:
    """Per problem with >= 1 common pivot: n, refeed flips, floor flips, d = (r - f)/n."""
    c = common_set(df)
    g = pd.DataFrame({
        "problem_id": c["problem_id"].to_numpy(),
        "r": _disagrees(c, "refeed").astype(int),
        "f": _disagrees(c, "exact2").astype(int),
    }).groupby("problem_id").agg(n=("r", "size"), r=("r", "sum"), f=("f", "sum"))
    g["d"] = (g["r"] - g["f"]) / g["n"]
    return g


def _clustered(df: pd.DataFrame) -> tuple[dict, bool]:
    g = _per_problem_excess(df)
    mean, t, spread = _t_stat(g["d"])
    out = {
        "n_problems": len(g),
        "mean_excess": None if mean is None else 100.0 * mean,
        "t": t,
        "refeed_worse": int((g["r"] > g["f"]).sum()),
        "floor_worse": int((g["r"] < g["f"]).sum()),
        "equal": int((g["r"] == g["f"]).sum()),
    }
    return out, spread


def clustered(df: pd.DataFrame) -> dict:
    """Problem-clustered test of the excess (sec. 4).

    Per problem with at least one common pivot (problems without any are left out):
    d = (refeed flips - floor flips) / that problem's common n; one-sample t of d over
    problems (sample sd; 0 for zero spread; None for fewer than 2 problems).
    ``mean_excess`` is the mean of d in percentage points; counts of problems where
    refeed disagrees more, the floor disagrees more, or both equally.
    """
    return _clustered(df)[0]


def critical_set(df: pd.DataFrame, pass_: str, threshold: float) -> set:
    """Critical tokens of one pass: {(problem_id, rollout, abs_pos) : |A| >= threshold}."""
    sel = df.loc[df[f"A_{pass_}"].abs() >= threshold - _EPS]
    return set(zip(sel["problem_id"], sel["rollout"], sel["abs_pos"]))


def jaccard_sets(a: set, b: set) -> float | None:
    """|a & b| / |a | b|; None when both are empty."""
    union = a | b
    return len(a & b) / len(union) if union else None


def jaccard(df: pd.DataFrame, threshold: float) -> dict:
    """Critical-token agreement on all records (sec. 4): Jaccard of the refeed set vs the
    exact1 set, against the replica (exact2) vs exact1 Jaccard (the ceiling)."""
    s1 = critical_set(df, "exact1", threshold)
    return {
        "n_exact1": len(s1),
        "refeed": jaccard_sets(s1, critical_set(df, "refeed", threshold)),
        "replica": jaccard_sets(s1, critical_set(df, "exact2", threshold)),
    }


def margin_buckets(df: pd.DataFrame, split: float = MARGIN_SPLIT) -> dict:
    """Refeed and floor disagreement rates on the common set, split at the pivot's top-1 vs
    top-2 logprob gap: margin < split ("lt") and margin >= split ("ge") (sec. 4)."""
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
    """Greedy-probe channel (sec. 4) on records carrying probe fields; None if none do.

    divergence_rate: share of pivots where either arm's greedy probe tokens differ from
    exact1's; bit_exact_rate: share of per-pivot max |first-token logprob delta| == 0;
    median_nonzero: element floor(m/2) of the m sorted non-zero deltas; p90: element
    floor(0.9 n) of the n sorted deltas.
    """
    sub = df.loc[_present(df, PROBE_FIELDS)]
    if len(sub) == 0:
        return None
    return {"n": len(sub), "refeed": _probe_side(sub, "refeed"), "replica": _probe_side(sub, "exact2")}


def cache(df: pd.DataFrame) -> dict | None:
    """Cache instrumentation (sec. 3, 4): share of records whose exact1 / exact2 resume was
    verified (num_cached_tokens at least the block-aligned prefix); None without the fields."""
    sub = df.loc[_present(df, CACHE_FIELDS)]
    if len(sub) == 0:
        return None
    return {
        "n": len(sub),
        "exact1_ok_rate": float(sub["cache_ok_exact1"].astype(bool).mean()),
        "exact2_ok_rate": float(sub["cache_ok_exact2"].astype(bool).mean()),
    }


# --------------------------------------------------------------------------- summary

def summarize(df: pd.DataFrame, exclude_flagged: bool = True) -> dict:
    """All section-4 quantities of one record set, as a JSON-ready dict (floats unrounded).

    With ``exclude_flagged`` and an ``exact_ok`` column, records with exact_ok == False
    are left out and their number reported as ``excluded_not_exact``.
    """
    excluded = None
    if exclude_flagged:
        df, excluded = exclude_not_exact(df)
    common = rates(df, "common")
    cond = rates(df, "exact1")
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
        "clustered": clustered(df),
        "jaccard": {str(t): jaccard(df, t) for t in JACCARD_THRESHOLDS},
        "margin": margin_buckets(df),
        "probes": probes(df),
        "cache": cache(df),
    }
    if excluded is not None:
        out["excluded_not_exact"] = excluded
    return out


# --------------------------------------------------------------------------- extras [ours]

def _per_problem_counts(df: pd.DataFrame, threshold: float = 0.5) -> pd.DataFrame:
    """Per problem (all problems in the records): the additive pieces of excess and Jaccard."""
    c = common_set(df)
    s1 = df["A_exact1"].abs() >= threshold - _EPS
    sr = df["A_refeed"].abs() >= threshold - _EPS
    s2 = df["A_exact2"].abs() >= threshold - _EPS
    parts = pd.DataFrame({
        "problem_id": df["problem_id"].to_numpy(),
        "inter_r": (s1 & sr).to_numpy(int), "union_r": (s1 | sr).to_numpy(int),
        "inter_f": (s1 & s2).to_numpy(int), "union_f": (s1 | s2).to_numpy(int),
    }).groupby("problem_id").sum()
    flips = pd.DataFrame({
        "problem_id": c["problem_id"].to_numpy(),
        "n": 1,
        "r": _disagrees(c, "refeed").astype(int),
        "f": _disagrees(c, "exact2").astype(int),
    }).groupby("problem_id").sum()
    return parts.join(flips, how="left").fillna(0)


def _percentile_ci(x: np.ndarray) -> list | None:
    x = x[np.isfinite(x)]
    if len(x) == 0:
        return None
    lo, hi = np.percentile(x, [2.5, 97.5])
    return [float(lo), float(hi)]


def bootstrap(df: pd.DataFrame, n_boot: int = 2000, rng=0) -> dict:
    """[ours] Problem-level bootstrap 95% percentile CIs of the excess (pp) and of both
    Jaccards at |A| >= 0.5: resample problems with replacement (``rng``: a seed or a
    numpy Generator), recompute each statistic on the resampled record set."""
    rng = np.random.default_rng(rng)
    counts = _per_problem_counts(df, 0.5)
    m = len(counts)
    if m == 0:
        return {"n_boot": n_boot, "n_problems": 0, "excess_pp": None,
                "jaccard_refeed_0.5": None, "jaccard_replica_0.5": None}
    idx = rng.integers(0, m, size=(n_boot, m))
    w = np.zeros((n_boot, m))
    np.add.at(w, (np.repeat(np.arange(n_boot), m), idx.ravel()), 1.0)
    s = {col: w @ counts[col].to_numpy(float) for col in counts.columns}
    with np.errstate(divide="ignore", invalid="ignore"):
        exc = 100.0 * (s["r"] - s["f"]) / s["n"]
        jr = s["inter_r"] / s["union_r"]
        jf = s["inter_f"] / s["union_f"]
    point = {
        "excess_pp": excess_pp(rates(df, "common")),
        "jaccard_refeed_0.5": jaccard(df, 0.5)["refeed"],
        "jaccard_replica_0.5": jaccard(df, 0.5)["replica"],
    }
    out = {"n_boot": n_boot, "n_problems": m}
    for key, draws in (("excess_pp", exc), ("jaccard_refeed_0.5", jr), ("jaccard_replica_0.5", jf)):
        out[key] = {"estimate": point[key], "ci95": _percentile_ci(draws)}
    return out


def lpm_clustered(df: pd.DataFrame) -> dict | None:
    """[ours] statsmodels cross-check of the clustered inference: linear probability model
    of disagreement on the common set in long format (one row per pivot and comparison,
    ``refeed`` = 1 for the refeed comparison, 0 for the replica), OLS with problem-
    clustered standard errors. The coefficient on ``refeed`` equals the excess; its z
    (normal reference, statsmodels' default for clustered OLS) sits beside the paper's t.
    None with fewer than 2 problems; z None when the standard error is 0."""
    import statsmodels.api as sm

    c = common_set(df)
    if c["problem_id"].nunique() < 2:
        return None
    y = np.concatenate([_disagrees(c, "refeed"), _disagrees(c, "exact2")]).astype(float)
    x = np.concatenate([np.ones(len(c)), np.zeros(len(c))])
    groups = np.concatenate([c["problem_id"].to_numpy()] * 2)
    with warnings.catch_warnings(), np.errstate(divide="ignore", invalid="ignore"):
        warnings.simplefilter("ignore")
        fit = sm.OLS(y, sm.add_constant(x)).fit(cov_type="cluster", cov_kwds={"groups": groups})
    coef, se = float(fit.params[1]), float(fit.bse[1])
    ok = math.isfinite(se) and se > 0
    return {
        "n_obs": int(fit.nobs),
        "n_clusters": int(c["problem_id"].nunique()),
        "coef_pp": 100.0 * coef,
        "se_pp": 100.0 * se if math.isfinite(se) else None,
        "z": coef / se if ok else None,
        "p": float(fit.pvalues[1]) if ok else None,
    }


def extras(df: pd.DataFrame, seed: int = 0, n_boot: int = 2000, exclude_flagged: bool = True) -> dict:
    """[ours] Beyond the paper: problem bootstrap CIs and the statsmodels LPM cross-check,
    beside the paper's clustered t (same exclusion rule as ``summarize``)."""
    if exclude_flagged:
        df, _ = exclude_not_exact(df)
    return {
        "bootstrap": bootstrap(df, n_boot=n_boot, rng=seed),
        "lpm": lpm_clustered(df),
        "paper_t": clustered(df)["t"],
    }


# --------------------------------------------------------------------------- tables

def _pct(x, digits=1):
    return "-" if x is None else f"{100 * x:.{digits}f}%"


def _num(x, fmt):
    return "-" if x is None else format(x, fmt)


def _excess_cell(r: dict) -> str:
    """Excess in pp as printed in Table 1: signed, one decimal; "0" when nothing flips."""
    if r["n"] and r["refeed"]["flips"] == r["floor"]["flips"] == 0:
        return "0"
    return _num(excess_pp(r), "+.1f")


def row_meta(label: str, df: pd.DataFrame | None = None) -> dict:
    """Model, K, continuation temperature and problems of a row: the paper's metadata for
    a Table 1 label, else read from the published ``config`` kept in ``df.attrs``."""
    if label in PAPER_ROWS:
        return PAPER_ROWS[label]
    meta = {"model": "-", "k": "-", "cont_temp": "-", "problems": "-", "batch_invariant": False}
    configs = [c for c in (df.attrs.get("configs", {}) if df is not None else {}).values() if c]
    if configs:
        c = configs[0]
        temp = c.get("cont_temp")
        meta.update(model=c.get("model", "-"), k=c.get("k", "-"),
                    cont_temp=c.get("temperature", "-") if temp is None else temp,
                    problems=str(sum(x.get("problems", 0) for x in configs)),
                    batch_invariant=bool(c.get("batch_invariant", False)))
    return meta


def _excluded(df):
    return exclude_not_exact(df)[0]


def table1(rows: dict) -> pd.DataFrame:
    """Table 1 (sec. 4): one line per configuration, the paper's columns and rounding;
    "-" where a statistic is undefined (t with zero spread, z with b + c = 0)."""
    out = []
    for label, df in rows.items():
        meta = row_meta(label, df)
        df = _excluded(df)
        r = rates(df, "common")
        cl, spread = _clustered(df)
        mc = mcnemar(df)

        def rate_cell(side):
            if r["n"] == 0:
                return "-"
            if side["flips"] == 0:
                return _pct(side["rate"])
            return f"{_pct(side['rate'])} ({100 * side['polarity_rate']:.1f})"

        temp = meta["cont_temp"]
        out.append({
            "configuration": label,
            "model": meta["model"],
            "K": meta["k"],
            "cont. temp": f"{temp:g}" if isinstance(temp, (int, float)) else temp,
            "problems": meta["problems"],
            "n (common)": r["n"],
            "refeed (polarity)": rate_cell(r["refeed"]),
            "floor (polarity)": rate_cell(r["floor"]),
            "excess pp": _excess_cell(r),
            "t_clust": _num(cl["t"], ".2f") if spread else "-",
            "z": _num(mc["z"], ".2f") if mc["b"] + mc["c"] else "-",
        })
    return pd.DataFrame(out)


def table_jaccard(rows: dict) -> pd.DataFrame:
    """Critical-token Jaccard per configuration at |A| >= 0.5 and 0.75, with the replica
    ceiling (sec. 4, in-text numbers)."""
    out = []
    for label, df in rows.items():
        df = _excluded(df)
        line = {"configuration": label}
        for t in JACCARD_THRESHOLDS:
            j = jaccard(df, t)
            line[f"selected exact1 (|A|>={t})"] = j["n_exact1"]
            line[f"refeed J ({t})"] = _num(j["refeed"], ".3f")
            line[f"replica ceiling ({t})"] = _num(j["replica"], ".3f")
        out.append(line)
    return pd.DataFrame(out)


def table_exact1_excess(rows: dict) -> pd.DataFrame:
    """Treatment-independent excess: rates over the exact1-conditioned set (A_exact1 != 0)."""
    out = []
    for label, df in rows.items():
        r = rates(_excluded(df), "exact1")
        out.append({
            "configuration": label,
            "n (A_exact1 != 0)": r["n"],
            "refeed": _pct(r["refeed"]["rate"]),
            "floor": _pct(r["floor"]["rate"]),
            "excess pp": _excess_cell(r),
        })
    return pd.DataFrame(out)


def table_bias(rows: dict) -> pd.DataFrame:
    """Bias of A_refeed - A_exact1 on the common set: mean, t, normal 95% CI."""
    out = []
    for label, df in rows.items():
        b = bias(_excluded(df))
        ci = b["ci95"]
        out.append({
            "configuration": label,
            "n (common)": b["n"],
            "mean": _num(b["mean"], "+.4f"),
            "t": _num(b["t"], ".3f"),
            "95% CI": "-" if ci is None else f"[{ci[0]:+.4f}, {ci[1]:+.4f}]",
        })
    return pd.DataFrame(out)


def table_margin(rows: dict) -> pd.DataFrame:
    """Disagreement rates by pivot margin (< 0.3 vs >= 0.3) on the common set."""
    out = []
    for label, df in rows.items():
        m = margin_buckets(_excluded(df))
        s = m["split"]
        out.append({
            "configuration": label,
            f"n (<{s})": m["lt"]["n"],
            f"refeed (<{s})": _pct(m["lt"]["refeed_rate"]),
            f"floor (<{s})": _pct(m["lt"]["floor_rate"]),
            f"n (>={s})": m["ge"]["n"],
            f"refeed (>={s})": _pct(m["ge"]["refeed_rate"]),
            f"floor (>={s})": _pct(m["ge"]["floor_rate"]),
        })
    return pd.DataFrame(out)


def table_probes(rows: dict) -> pd.DataFrame:
    """Greedy-probe channel: divergence, bit-exact first-token logprobs, non-zero median, p90."""
    out = []
    for label, df in rows.items():
        p = probes(_excluded(df))
        line = {"configuration": label, "n (probes)": 0 if p is None else p["n"]}
        for side in ("replica", "refeed"):
            q = None if p is None else p[side]
            line[f"{side} divergence"] = "-" if q is None else _pct(q["divergence_rate"])
            line[f"{side} bit-exact"] = "-" if q is None else _pct(q["bit_exact_rate"])
            line[f"{side} median non-zero"] = "-" if q is None else _num(q["median_nonzero"], ".1e")
            line[f"{side} p90"] = "-" if q is None else _num(q["p90"], ".1e")
        out.append(line)
    return pd.DataFrame(out)


def table_eligibility(rows: dict) -> pd.DataFrame:
    """Eligibility sources of the common set: exact1 non-zero, only refeed, only replica,
    and the rest (non-zero under refeed and replica, zero under exact1)."""
    out = []
    for label, df in rows.items():
        df = _excluded(df)
        n = len(common_set(df))
        e = eligibility(df)
        out.append({
            "configuration": label,
            "n (common)": n,
            "exact1 non-zero": e["exact1_nonzero"],
            "only refeed": e["only_refeed"],
            "only replica": e["only_replica"],
            "refeed and replica, not exact1": n - sum(e.values()),
        })
    return pd.DataFrame(out)


def table_cache(rows: dict) -> pd.DataFrame:
    """Cache instrumentation per configuration, with totals over rows that carry the
    fields (and over stock-engine rows, i.e. without batch-invariant runs)."""
    out = []
    tot = {"all": [0, 0, 0], "stock": [0, 0, 0]}
    for label, df in rows.items():
        c = cache(_excluded(df))
        if c is None:
            out.append({"configuration": label, "pivots": "-", "exact1 verified": "-", "exact2 verified": "-"})
            continue
        ok1, ok2 = round(c["exact1_ok_rate"] * c["n"]), round(c["exact2_ok_rate"] * c["n"])
        keys = ["all"] if row_meta(label, df).get("batch_invariant") else ["all", "stock"]
        for k in keys:
            tot[k] = [tot[k][0] + c["n"], tot[k][1] + ok1, tot[k][2] + ok2]
        out.append({"configuration": label, "pivots": c["n"],
                    "exact1 verified": _pct(c["exact1_ok_rate"]), "exact2 verified": _pct(c["exact2_ok_rate"])})
    for k, name in (("stock", "total, stock engine"), ("all", "total")):
        n, ok1, ok2 = tot[k]
        if n:
            out.append({"configuration": name, "pivots": n,
                        "exact1 verified": _pct(ok1 / n), "exact2 verified": _pct(ok2 / n)})
    return pd.DataFrame(out)


def table_bootstrap(rows: dict, seed: int = 0, n_boot: int = 2000) -> pd.DataFrame:
    """[ours] Bootstrap 95% CIs (problems resampled) and the statsmodels LPM cross-check
    beside the paper's clustered t."""
    out = []
    for label, df in rows.items():
        e = extras(df, seed=seed, n_boot=n_boot)
        b, lpm = e["bootstrap"], e["lpm"]
        spread = _clustered(_excluded(df))[1]

        def cell(entry, fmt):
            if not entry or entry["estimate"] is None:
                return "-"
            ci = entry["ci95"]
            ci_s = "" if ci is None else f" [{format(ci[0], fmt)}, {format(ci[1], fmt)}]"
            return format(entry["estimate"], fmt) + ci_s

        out.append({
            "configuration": label,
            "excess pp [95% CI]": cell(b["excess_pp"], "+.1f"),
            "refeed J 0.5 [95% CI]": cell(b["jaccard_refeed_0.5"], ".3f"),
            "replica J 0.5 [95% CI]": cell(b["jaccard_replica_0.5"], ".3f"),
            "t_clust (paper)": _num(e["paper_t"], ".2f") if spread else "-",
            "LPM excess pp": "-" if lpm is None else _num(lpm["coef_pp"], "+.1f"),
            "LPM cluster SE pp": "-" if lpm is None else _num(lpm["se_pp"], ".2f"),
            "LPM z": "-" if lpm is None else _num(lpm["z"], ".2f"),
        })
    return pd.DataFrame(out)


EXTRA_PASSES = ("exact2", "refeed", "refeed2", "serial", "block16")


def pass_comparisons(df: pd.DataFrame) -> pd.DataFrame:
    """[ours] Every pass against exact1, and refeed against its own replica refeed2, on the
    common set of all passes present (any A != 0); flagged records excluded."""
    df = exclude_not_exact(df)[0]
    present = [p for p in ("exact1", *EXTRA_PASSES) if f"A_{p}" in df.columns and df[f"A_{p}"].notna().all()]
    nz = np.zeros(len(df), dtype=bool)
    for p in present:
        nz |= df[f"A_{p}"].to_numpy(float) != 0
    common = df.loc[nz]
    pairs = [("exact1", p) for p in present if p != "exact1"]
    if {"refeed", "refeed2"} <= set(present):
        pairs.append(("refeed", "refeed2"))
    out = []
    for a, b in pairs:
        sa, sb = sign(common[f"A_{a}"]), sign(common[f"A_{b}"])
        flips = int((sa != sb).sum())
        out.append({"comparison": f"{b} vs {a}", "n": len(common), "flips": flips,
                    "rate": _ratio(flips, len(common)), "polarity": int(((sa * sb) < 0).sum())})
    return pd.DataFrame(out, columns=["comparison", "n", "flips", "rate", "polarity"])


def by_pass_order(df: pd.DataFrame) -> pd.DataFrame:
    """[ours] Refeed and floor disagreement stratified by the order the passes ran in."""
    if "pass_order" not in df.columns:
        return pd.DataFrame(columns=["pass_order", "n", "refeed_rate", "floor_rate", "excess_pp"])
    out = []
    for order, sub in exclude_not_exact(df)[0].groupby("pass_order"):
        r = rates(sub, "common")
        out.append({"pass_order": order, "n": r["n"], "refeed_rate": r["refeed"]["rate"],
                    "floor_rate": r["floor"]["rate"], "excess_pp": excess_pp(r)})
    return pd.DataFrame(out)


def resume_exactness(df: pd.DataFrame) -> dict:
    """[ours] How exact the resumes were: state verified, first post-pivot step bit-exact,
    trunk regenerated bit for bit (shares over the records that carry each check)."""
    out = {"n": len(df)}
    for col in ("exact_ok", "first_step_exact", "regenerates_trunk"):
        if col in df.columns:
            v = df[col].dropna().astype(bool)
            out[col] = {"checked": int(len(v)), "held": int(v.sum()), "share": _ratio(int(v.sum()), len(v))}
    return out


def _labelled(rows: dict, fn) -> pd.DataFrame:
    frames = []
    for label, df in rows.items():
        t = fn(df)
        if len(t):
            frames.append(t.assign(configuration=label))
    if not frames:
        return pd.DataFrame({"configuration": list(rows), "note": "no records with these fields"})
    t = pd.concat(frames, ignore_index=True)
    return t[["configuration"] + [c for c in t.columns if c != "configuration"]]


def table_passes(rows: dict) -> pd.DataFrame:
    """[ours] Extra passes (refeed2, serial, block16) against exact1, and refeed vs refeed2."""
    return _labelled(rows, pass_comparisons)


def table_pass_order(rows: dict) -> pd.DataFrame:
    """[ours] Refeed and floor disagreement by pass order."""
    return _labelled(rows, by_pass_order)


def table_exactness(rows: dict) -> pd.DataFrame:
    """[ours] Resume exactness per configuration."""
    out = []
    for label, df in rows.items():
        e = resume_exactness(df)
        row = {"configuration": label, "pivots": e["n"]}
        for col in ("exact_ok", "first_step_exact", "regenerates_trunk"):
            c = e.get(col)
            row[col] = "-" if not c or not c["checked"] else f"{c['held']}/{c['checked']}"
        out.append(row)
    return pd.DataFrame(out)


TABLES = {
    "tab1_main": table1,
    "tab2_jaccard": table_jaccard,
    "tab3_exact1_excess": table_exact1_excess,
    "tab4_bias": table_bias,
    "tab5_margin": table_margin,
    "tab6_probes": table_probes,
    "tab7_eligibility": table_eligibility,
    "tab8_cache": table_cache,
    "tab9_bootstrap": table_bootstrap,
    "tab10_passes": table_passes,
    "tab11_pass_order": table_pass_order,
    "tab12_exactness": table_exactness,
}


def all_tables(rows: dict, n_boot: int = 2000) -> dict:
    """Every table by file name (``TABLES``), for rows {label: record frame}."""
    return {name: (fn(rows, n_boot=n_boot) if fn is table_bootstrap else fn(rows)) for name, fn in TABLES.items()}


def _markdown(df: pd.DataFrame) -> str:
    cells = [[str(c) for c in df.columns]] + [[str(v) for v in row] for row in df.itertuples(index=False)]
    esc = [[c.replace("|", "\\|") for c in line] for line in cells]
    lines = ["| " + " | ".join(esc[0]) + " |", "|" + "|".join("---" for _ in esc[0]) + "|"]
    lines += ["| " + " | ".join(line) + " |" for line in esc[1:]]
    return "\n".join(lines) + "\n"


def write_table(df: pd.DataFrame, name: str, tables_dir) -> list[Path]:
    """Write ``name.csv``, ``name.md`` and ``name.tex`` under ``tables_dir``; returns paths."""
    tables_dir = Path(tables_dir)
    tables_dir.mkdir(parents=True, exist_ok=True)
    from replaylib.rundir import atomic_save, atomic_write_bytes
    paths = [tables_dir / f"{name}.{ext}" for ext in ("csv", "md", "tex")]
    atomic_save(paths[0], lambda tmp: df.to_csv(tmp, index=False))
    atomic_write_bytes(paths[1], _markdown(df).encode())
    atomic_write_bytes(paths[2], df.astype(str).to_latex(index=False, escape=True).encode())
    return paths


def write_tables(rows: dict, tables_dir, n_boot: int = 2000) -> list[Path]:
    """Compute and write every table of ``TABLES`` for rows {label: record frame}."""
    paths = []
    for name, df in all_tables(rows, n_boot).items():
        paths += write_table(df, name, tables_dir)
    return paths


# ---------------------------------------------------------------- stage 4


def run(params, out_dir=None) -> dict:
    """Stage 4: every statistic, Table 1 and the in-text tables, Figures 1-3.

    records: "run" uses this configuration's replay records; "published" the paper's
    seven runs (data/paper-records). Tables go to tables/<config>/, figures to
    figures/<config>/, the summary to runs/<config>/04_statistics/summary.json.
    """
    from replaylib import plotting, records as rec, replay
    from replaylib.rundir import REPO, StageDir, atomic_write_json, figures_dir, sha256_file, tables_dir
    stage = StageDir(params, "04_statistics", out_dir).begin()
    if params.records == "published":
        rows = {label: rec.load_paper_row(label, REPO / "data" / "paper-records") for label in PAPER_ROWS}
        main = rows["main pooled"]
    else:
        main = replay.load(params, out_dir)
        invariant = rec.load_records(stage.upstream("05_batch_invariant") / "records.parquet")
        for df, label, inv in [(main, params.config, False), (invariant, f"{params.config} batch-invariant", True)]:
            df.attrs["configs"] = {label: {"model": params.model, "k": params.k, "cont_temp": params.cont_temperature,
                                           "problems": int(df.problem_id.nunique()), "batch_invariant": inv}}
        rows = {params.config: main, f"{params.config} batch-invariant": invariant}
    tdir, fdir = tables_dir(params.config, out_dir), figures_dir(params.config, out_dir)
    products = write_tables(rows, tdir, n_boot=params.bootstrap_draws)
    figures = {"fig1_quadrants": plotting.fig1_quadrants(main), "fig2_configs": plotting.fig2_configs(rows),
               "fig3_logprob_ecdf": plotting.fig3_logprob_ecdf(main)}
    comparisons = pass_comparisons(main)
    if len(comparisons) > 2:  # beyond exact2 and refeed: the extra passes of [ours]
        figures["fig4_passes"] = plotting.fig4_passes(comparisons)
    for name, (fig, _) in figures.items():
        products += plotting.save_figure(fig, name, fdir)
    summary = {"main": summarize(main), "extras": extras(main, seed=0, n_boot=params.bootstrap_draws),
               "resume_exactness": resume_exactness(main),
               "passes": comparisons.to_dict("records"),
               "rows": {label: summarize(df) for label, df in rows.items()}}
    atomic_write_json(stage.file("summary.json"), summary)
    stage.finish(["summary.json"], {"products": {str(p): sha256_file(p) for p in sorted(set(products))}})
    return summary
