"""[ours] Statistics beyond the paper's sign statistics (``replaylib.analysis.stats``, whose
conventions hold here): the problem bootstrap and the intervals of Table 1, the statsmodels
cross-check, the passes of the pass table against exact1 (``replaylib.measure.passes``), the
pass order, the resumes' exactness, the cache transplants and the per-layer profile.
"""
from __future__ import annotations

import math
import warnings

import numpy as np
import pandas as pd

from ..measure import passes
from .stats import (
    _EPS,
    TABLE1_QUANTITIES,
    _disagrees,
    _ratio,
    clustered,
    common_set,
    compare,
    excess_pp,
    exclude_not_exact,
    jaccard,
    rates,
    sign,
)


def _per_problem_counts(df: pd.DataFrame, threshold: float = 0.5) -> pd.DataFrame:
    """Per problem (all problems in the records): the additive pieces of Table 1's quantities
    (common pivots, flips and polarity reversals of refeed and the replica, McNemar's b and c)
    and of both Jaccards at the threshold."""
    c = common_set(df)
    s1 = df["A_exact1"].abs() >= threshold - _EPS
    sr = df["A_refeed"].abs() >= threshold - _EPS
    s2 = df["A_exact2"].abs() >= threshold - _EPS
    parts = pd.DataFrame({
        "problem_id": df["problem_id"].to_numpy(),
        "inter_r": (s1 & sr).to_numpy(int), "union_r": (s1 | sr).to_numpy(int),
        "inter_f": (s1 & s2).to_numpy(int), "union_f": (s1 | s2).to_numpy(int),
    }).groupby("problem_id").sum()
    fr, ff = _disagrees(c, "refeed"), _disagrees(c, "exact2")
    s_1 = sign(c["A_exact1"])
    flips = pd.DataFrame({
        "problem_id": c["problem_id"].to_numpy(),
        "n": 1,
        "r": fr.astype(int),
        "f": ff.astype(int),
        "rp": (s_1 * sign(c["A_refeed"]) == -1).astype(int),
        "fp": (s_1 * sign(c["A_exact2"]) == -1).astype(int),
        "b": (fr & ~ff).astype(int),
        "c": (ff & ~fr).astype(int),
    }).groupby("problem_id").sum()
    return parts.join(flips, how="left").fillna(0)


def _percentile_ci(x: np.ndarray) -> list | None:
    x = x[np.isfinite(x)]
    if len(x) == 0:
        return None
    lo, hi = np.percentile(x, [2.5, 97.5])
    return [float(lo), float(hi)]


def problem_bootstrap(df: pd.DataFrame, n_boot: int = 2000, rng=0) -> dict:
    """The one bootstrap [ours]: resample problems with replacement (a problem drawn twice counts as
    two clusters; ``rng``: a seed or a numpy Generator) and recompute, per draw, Table 1's
    quantities (``TABLE1_QUANTITIES``) and both Jaccards at |A| >= 0.5 from the per-problem counts.
    Returns {quantity: array of n_boot draws}, NaN where a draw leaves it undefined (no common
    pivot; a t without spread or over fewer than 2 problems; z with b + c = 0); {} without problems."""
    rng = np.random.default_rng(rng)
    counts = _per_problem_counts(df, 0.5)
    m = len(counts)
    if m == 0:
        return {}
    idx = rng.integers(0, m, size=(n_boot, m))
    w = np.zeros((n_boot, m))
    np.add.at(w, (np.repeat(np.arange(n_boot), m), idx.ravel()), 1.0)
    s = {col: w @ counts[col].to_numpy(float) for col in counts.columns}
    # per problem with common pivots: d = (r - f)/n; its weighted mean, sample sd and t over the draw
    has = counts["n"].to_numpy(float) > 0
    d = np.where(has, (counts["r"] - counts["f"]).to_numpy(float) / np.where(has, counts["n"], 1), 0.0)
    wh = w[:, has]
    k = wh.sum(axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        mean = (wh @ d[has]) / k
        var = (wh * (d[has][None, :] - mean[:, None]) ** 2).sum(axis=1) / (k - 1)
        t = np.where((k >= 2) & (var > 0), mean / np.sqrt(var / k), np.nan)
        bc = s["b"] + s["c"]
        out = {
            "n (common)": s["n"],
            "refeed %": np.where(s["n"] > 0, 100.0 * s["r"] / s["n"], np.nan),
            "refeed polarity %": np.where(s["n"] > 0, 100.0 * s["rp"] / s["n"], np.nan),
            "floor %": np.where(s["n"] > 0, 100.0 * s["f"] / s["n"], np.nan),
            "floor polarity %": np.where(s["n"] > 0, 100.0 * s["fp"] / s["n"], np.nan),
            "excess pp": 100.0 * (s["r"] - s["f"]) / s["n"],
            "t_clust": t,
            "z": np.where(bc > 0, (s["b"] - s["c"]) / np.sqrt(bc), np.nan),
            "jaccard_refeed_0.5": s["inter_r"] / s["union_r"],
            "jaccard_replica_0.5": s["inter_f"] / s["union_f"],
        }
    return out


def bootstrap(df: pd.DataFrame, n_boot: int = 2000, rng=0) -> dict:
    """[ours] Problem-level bootstrap 95% percentile CIs of the excess (pp) and of both
    Jaccards at |A| >= 0.5 (``problem_bootstrap``), beside their point estimates."""
    draws = problem_bootstrap(df, n_boot, rng)
    if not draws:
        return {"n_boot": n_boot, "n_problems": 0, "excess_pp": None,
                "jaccard_refeed_0.5": None, "jaccard_replica_0.5": None}
    point = {
        "excess_pp": excess_pp(rates(df, "common")),
        "jaccard_refeed_0.5": jaccard(df, 0.5)["refeed"],
        "jaccard_replica_0.5": jaccard(df, 0.5)["replica"],
    }
    out = {"n_boot": n_boot, "n_problems": int(df["problem_id"].nunique())}
    for key, name in (("excess_pp", "excess pp"), ("jaccard_refeed_0.5", "jaccard_refeed_0.5"),
                      ("jaccard_replica_0.5", "jaccard_replica_0.5")):
        out[key] = {"estimate": point[key], "ci95": _percentile_ci(draws[name])}
    return out


def table1_intervals(df: pd.DataFrame, n_boot: int, seed: int = 0) -> dict:
    """95% percentile intervals of Table 1's quantities (records not verified exact excluded); None
    for a quantity defined in fewer than half of the draws."""
    draws = problem_bootstrap(exclude_not_exact(df)[0], n_boot, seed)
    out = {}
    for q in TABLE1_QUANTITIES:
        v = draws.get(q, np.array([]))
        v = v[np.isfinite(v)]
        out[q] = _percentile_ci(v) if len(v) >= max(2, n_boot // 2) else None
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


def _measured(df: pd.DataFrame, names) -> list[str]:
    """The passes among names whose A every record carries."""
    return [p for p in names if f"A_{p}" in df.columns and df[f"A_{p}"].notna().all()]


def pass_comparisons(df: pd.DataFrame) -> pd.DataFrame:
    """[ours] Every pass of the pass table but the transplants (``transplant``) against exact1, and
    each replica of another pass (refeed2: refeed's) against that pass, on the common set of all
    passes present (any A != 0); flagged records excluded."""
    df = exclude_not_exact(df)[0]
    present = _measured(df, [p for p in passes.PASSES if passes.PASSES[p].group != "transplant"])
    nz = np.zeros(len(df), dtype=bool)
    for p in present:
        nz |= df[f"A_{p}"].to_numpy(float) != 0
    common = df.loc[nz]
    pairs = [("exact1", p) for p in present if p != "exact1"]
    pairs += [(passes.PASSES[p].replica_of, p) for p in present
              if passes.PASSES[p].replica_of not in (None, "exact1") and passes.PASSES[p].replica_of in present]
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
    if "state_established" in df.columns:  # how each pivot's decode-time state came to be resumed
        out["state_established"] = {str(k): int(v) for k, v in df["state_established"].value_counts().items()}
    return out


# --------------------------------------------------------------------------- [ours] transplants

def _probe_first(df: pd.DataFrame, pass_: str) -> list | None:
    """Per record, {arm: first-token logprob} of a pass's greedy probes (None where absent)."""
    import json
    col = f"greedy_first_{pass_}"
    if col not in df.columns:
        return None
    out = []
    for v in df[col]:
        v = json.loads(v) if isinstance(v, str) else v
        out.append(None if v is None else {arm: float(x[1]) for arm, x in dict(v).items()})
    return out


def _probe_equal_share(df: pd.DataFrame, a: str, b: str) -> float | None:
    """Share of records whose greedy probes' first-token logprobs are bit-identical in passes a and b
    (both arms)."""
    pa, pb = _probe_first(df, a), _probe_first(df, b)
    if pa is None or pb is None or not len(df):
        return None
    pairs = [(x, y) for x, y in zip(pa, pb) if x is not None and y is not None]
    return _ratio(sum(x == y for x, y in pairs), len(pairs)) if pairs else None


def transplant(df: pd.DataFrame) -> pd.DataFrame:
    """[ours] Where re-feeding's change enters: the replica (exact2), refeed and the cache
    transplants (the pass table's group "transplant"), each against exact1, as Table 1 computes
    refeed's row.

    On the common set of all the passes present (any A != 0; flagged records excluded): sign
    disagreement with exact1 (rate, polarity reversals), the excess over the replica floor in
    pp, McNemar z of the pass against the replica (b: only the pass disagrees, c: only the
    replica), the problem-clustered t of the per-problem excess, and disagreement with refeed.
    Against refeed too, as against exact1: the excess over the replica floor, McNemar z and the
    clustered t of each pass's disagreement with refeed (the floor: refeed2 against refeed where the
    run has it, else exact2 against exact1). Over all records: the share of pivots whose
    greedy-probe first-token logprobs are bit-identical to exact1's and to refeed's (the channel
    that does not need power). If the change follows the cache, xplant_refeed_kv behaves as refeed
    and xplant_decode_kv as exact1."""
    df = exclude_not_exact(df)[0]
    transplants = passes.names("transplant")
    present = _measured(df, ["exact2", "refeed", *transplants])
    cols = ["pass", "n", "flips", "rate", "polarity", "excess_pp", "mcnemar_b", "mcnemar_c", "mcnemar_z",
            "clustered_t", "n_problems", "flips_vs_refeed", "rate_vs_refeed", "excess_pp_vs_refeed",
            "mcnemar_z_vs_refeed", "clustered_t_vs_refeed", "pivots", "probe_equal_exact1", "probe_equal_refeed"]
    if not {"exact2", "refeed"} <= set(present) or not set(transplants) & set(present):
        return pd.DataFrame(columns=cols)
    nz = df["A_exact1"].to_numpy(float) != 0
    for p in present:
        nz |= df[f"A_{p}"].to_numpy(float) != 0
    common = df.loc[nz]
    floor, floor_reference = ("refeed2", "refeed") if _measured(df, ["refeed2"]) else ("exact2", "exact1")
    out = []
    for p in present:
        cmp = compare(common, p)
        vs = compare(common, p, floor, "refeed", floor_reference) if p != "refeed" else {}
        vs_refeed = vs.get("flips", 0)  # refeed against itself: none
        out.append({"pass": p, "n": cmp["n"], "flips": cmp["flips"], "rate": cmp["rate"],
                    "polarity": cmp["polarity"], "excess_pp": cmp["excess_pp"], "mcnemar_b": cmp["mcnemar_b"],
                    "mcnemar_c": cmp["mcnemar_c"], "mcnemar_z": cmp["mcnemar_z"], "clustered_t": cmp["clustered_t"],
                    "n_problems": cmp["n_problems"], "flips_vs_refeed": vs_refeed,
                    "rate_vs_refeed": _ratio(vs_refeed, len(common)), "excess_pp_vs_refeed": vs.get("excess_pp"),
                    "mcnemar_z_vs_refeed": vs.get("mcnemar_z"), "clustered_t_vs_refeed": vs.get("clustered_t"),
                    "pivots": len(df),
                    "probe_equal_exact1": _probe_equal_share(df, "exact1", p),
                    "probe_equal_refeed": _probe_equal_share(df, "refeed", p)})
    return pd.DataFrame(out, columns=cols)


def layer_profile_summary(profile: pd.DataFrame) -> pd.DataFrame:
    """[ours] The per-pivot, per-layer profile of |decode-time - re-fed| K and V (replay stage's
    layer_profile.parquet) summarised over pivots: per layer and tensor, the share of pivots
    whose state differs at that layer, and the median and max over pivots of the max |difference|
    at prompt positions, at generated positions before the last, at the last prefix position,
    and relative to the layer's largest |value|."""
    cols = ["layer", "tensor", "pivots", "share_differing", "median_prompt", "median_generated", "median_last",
            "max_all", "median_relative", "median_first_diff_vs_prompt_end", "median_share_positions_differing"]
    if profile is None or not len(profile):
        return pd.DataFrame(columns=cols)
    out = []
    for (layer, tensor), g in profile.groupby(["layer", "tensor"], sort=True):
        diff = g[g["first_diff_pos"] >= 0]
        out.append({"layer": int(layer), "tensor": tensor, "pivots": len(g),
                    "share_differing": float((g["max_abs_diff"] > 0).mean()),
                    "median_prompt": float(g["max_abs_diff_prompt"].median()),
                    "median_generated": float(g["max_abs_diff_generated"].median()),
                    "median_last": float(g["max_abs_diff_last"].median()),
                    "max_all": float(g["max_abs_diff"].max()),
                    "median_relative": float((g["max_abs_diff"] / g["max_abs_value"].where(g["max_abs_value"] > 0)).median()),
                    # where differences start, relative to the first generated position (< 0: inside the prompt)
                    "median_first_diff_vs_prompt_end": (float((diff["first_diff_pos"] - diff["prompt_len"]).median())
                                                        if len(diff) else None),
                    "median_share_positions_differing": float(g["share_positions_differing"].median())})
    return pd.DataFrame(out, columns=cols)
