"""Tables of the statistics stage (docs/protocol.md section 5): pure statistics from
``replaylib.analysis.stats`` and ``stats_extras`` laid out as the paper prints them, written as CSV,
Markdown and LaTeX.

Two kinds of input: ``rows`` {label: record frame} (one Table 1 row each, pooled where a
row pools files) and ``runs`` {name: run dict} for the tables of one records file each
(``records``: its frame; ``aggregate``, ``per_problem``, ``elapsed_seconds``: the
published file's blocks, ``records.load_blocks``, absent for this package's own runs).
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from ..core.files import atomic_save, atomic_write_bytes
from .stats import (
    JACCARD_THRESHOLDS,
    bias,
    cache,
    clustered,
    common_set,
    eligibility,
    excess_pp,
    exclude_not_exact,
    infer_k,
    jaccard,
    margin_buckets,
    preregistered,
    probes,
    rates,
    row_meta,
    selection_gap,
    selection_near_threshold,
    table1_numbers,
)
from .stats_extras import (
    by_pass_order,
    extras,
    pass_comparisons,
    resume_exactness,
    transplant,
)


def _pct(x, digits=1):
    return "-" if x is None else f"{100 * x:.{digits}f}%"


def _num(x, fmt):
    return "-" if x is None else format(x, fmt)


def _excess_cell(r: dict) -> str:
    """Excess in pp as printed in Table 1: signed, one decimal; "0" when nothing flips."""
    if r["n"] and r["refeed"]["flips"] == r["floor"]["flips"] == 0:
        return "0"
    return _num(excess_pp(r), "+.1f")


def _excluded(df):
    return exclude_not_exact(df)[0]


def table1(rows: dict) -> pd.DataFrame:
    """Table 1 (docs/protocol.md 5.1): one line per configuration, ``stats.table1_numbers`` in the paper's
    columns and rounding; "-" where a statistic is undefined (t with zero spread, z with b + c = 0)."""
    out = []
    for label, df in rows.items():
        meta = row_meta(label, df)
        q = table1_numbers(df)

        def rate_cell(side):
            if q["n (common)"] == 0:
                return "-"
            if q[f"{side} flips"] == 0:
                return f"{q[f'{side} %']:.1f}%"
            return f"{q[f'{side} %']:.1f}% ({q[f'{side} polarity %']:.1f})"

        temp = meta["cont_temp"]
        out.append({
            "configuration": label,
            "model": meta["model"],
            "K": meta["k"],
            "cont. temp": f"{temp:g}" if isinstance(temp, (int, float)) else temp,
            "problems": meta["problems"],
            "n (common)": q["n (common)"],
            "refeed (polarity)": rate_cell("refeed"),
            "floor (polarity)": rate_cell("floor"),
            "excess pp": "0" if q["n (common)"] and q["refeed flips"] == q["floor flips"] == 0
            else _num(q["excess pp"], "+.1f"),
            "t_clust": _num(q["t_clust"], ".2f"),
            "z": _num(q["z"], ".2f"),
        })
    return pd.DataFrame(out)


def table_jaccard(rows: dict) -> pd.DataFrame:
    """Critical-token Jaccard per configuration at |A| >= 0.5 and 0.75, with the replica
    ceiling (docs/protocol.md 4.4, in-text numbers)."""
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
    """Cache instrumentation per configuration over all records, before any exclusion,
    with the records the other tables leave out (exact_ok false) beside it; totals over
    rows that carry the fields (and over stock-engine rows, i.e. without batch-invariant
    runs)."""
    out = []
    tot = {"all": [0, 0, 0], "stock": [0, 0, 0]}
    for label, df in rows.items():
        excluded = exclude_not_exact(df)[1]
        line = {"configuration": label, "excluded (exact_ok false)": "-" if excluded is None else excluded}
        c = cache(df)
        if c is None:
            out.append({**line, "pivots": "-", "exact1 verified": "-", "exact2 verified": "-"})
            continue
        ok1, ok2 = round(c["exact1_ok_rate"] * c["n"]), round(c["exact2_ok_rate"] * c["n"])
        keys = ["all"] if row_meta(label, df).get("batch_invariant") else ["all", "stock"]
        for k in keys:
            tot[k] = [tot[k][0] + c["n"], tot[k][1] + ok1, tot[k][2] + ok2]
        out.append({**line, "pivots": c["n"],
                    "exact1 verified": _pct(c["exact1_ok_rate"]), "exact2 verified": _pct(c["exact2_ok_rate"])})
    for k, name in (("stock", "total, stock engine"), ("all", "total")):
        n, ok1, ok2 = tot[k]
        if n:
            out.append({"configuration": name, "excluded (exact_ok false)": "", "pivots": n,
                        "exact1 verified": _pct(ok1 / n), "exact2 verified": _pct(ok2 / n)})
    cols = ["configuration", "pivots", "exact1 verified", "exact2 verified", "excluded (exact_ok false)"]
    return pd.DataFrame(out, columns=cols)


def table_bootstrap(rows: dict, seed: int = 0, n_boot: int = 2000) -> pd.DataFrame:
    """[ours] Bootstrap 95% CIs (problems resampled) and the statsmodels LPM cross-check
    beside the paper's clustered t."""
    out = []
    for label, df in rows.items():
        e = extras(df, seed=seed, n_boot=n_boot)
        b, lpm = e["bootstrap"], e["lpm"]
        spread = clustered(_excluded(df))["spread"]

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


def table_clustered(rows: dict) -> pd.DataFrame:
    """Per-problem split of the clustered test: problems (with common pivots) where refeed
    disagrees with exact1 more often than the replica does, less often, or equally."""
    out = []
    for label, df in rows.items():
        cl = clustered(_excluded(df))
        spread = cl["spread"]
        out.append({"configuration": label, "problems": cl["n_problems"],
                    "refeed worse": cl["refeed_worse"], "refeed better": cl["floor_worse"], "equal": cl["equal"],
                    "worse-better": f"{cl['refeed_worse']}-{cl['floor_worse']}",
                    "t_clust": _num(cl["t"], ".2f") if spread else "-"})
    return pd.DataFrame(out)


def table_selection(rows: dict) -> pd.DataFrame:
    """Critical-token selection: the share of refeed's selection gap (1 - J_refeed) that
    re-feeding adds beyond the replica, and the check that the selection disagreements lie
    within 1/K of the threshold (``stats.selection_gap``, ``stats.selection_near_threshold``)."""
    out = []
    for label, df in rows.items():
        df = _excluded(df)
        try:
            k = infer_k(df)
        except ValueError:
            k = None
        for t in JACCARD_THRESHOLDS:
            g = selection_gap(df, t)
            line = {"configuration": label, "|A| >=": t, "refeed J": _num(g["refeed"], ".3f"),
                    "replica J": _num(g["replica"], ".3f"),
                    "share of gap added by refeed": _pct(g["share_added_by_refeed"])}
            near = None if k is None else selection_near_threshold(df, t, k)
            for side in ("refeed", "replica"):
                q = None if near is None else near[side]
                line[f"{side} disagreements within 1/K"] = (
                    "-" if q is None else f"{q['within_1_over_k']}/{q['disagreements']}")
            out.append(line)
    return pd.DataFrame(out)


def _prereg_cells(pre: dict) -> dict:
    p, f = pre["primary_exact_vs_refeed"], pre["floor_exact_vs_exact"]
    return {"primary: refeed flips/eligible": f"{p['flips']}/{p['eligible']}", "primary rate": _pct(p["rate"]),
            "floor flips/eligible": f"{f['flips']}/{f['eligible']}", "floor rate": _pct(f["rate"]),
            "secondary: mean |A_exact1 - A_refeed|": _num(pre["mean_abs_A_delta_exact_vs_refeed"], ".4f")}


def table_preregistered(runs: dict) -> pd.DataFrame:
    """The pre-registered primary metric as registered (each comparison on its own eligible
    set) and the secondary mean |A_exact1 - A_refeed|, per run; whether they equal the
    harness's own ``aggregate`` block; the common-set rates of Table 1 beside them."""
    out = []
    for name, run in runs.items():
        df = _excluded(run["records"])
        pre = preregistered(df)
        agg = run.get("aggregate")
        r = rates(df, "common")
        out.append({"run": name, "pivots": len(df), **_prereg_cells(pre),
                    "harness aggregate reproduced": "-" if agg is None else ("yes" if pre == agg else "NO"),
                    "common n": r["n"], "common refeed": _pct(r["refeed"]["rate"]),
                    "common floor": _pct(r["floor"]["rate"])})
    return pd.DataFrame(out)


def table_per_problem(runs: dict) -> pd.DataFrame:
    """The published files' ``per_problem`` blocks: pivots, rollout accuracy, cache
    violations of the exact passes, seconds per pass (exact1, exact2, refeed) and in all."""
    out = []
    for name, run in runs.items():
        for b in run.get("per_problem") or []:
            viol = b.get("cache_violations") or {}
            secs = list(b.get("pass_seconds") or [])
            out.append({"run": name, "problem_id": b["problem_id"], "pivots": b.get("pivots"),
                        "rollout accuracy": b.get("rollout_accuracy"),
                        "cache violations exact1": viol.get("exact1", "-"),
                        "cache violations exact2": viol.get("exact2", "-"),
                        **{f"seconds {p}": (secs[i] if i < len(secs) else "-")
                           for i, p in enumerate(("exact1", "exact2", "refeed"))},
                        "seconds total": b.get("total_seconds")})
    cols = ["run", "problem_id", "pivots", "rollout accuracy", "cache violations exact1", "cache violations exact2",
            "seconds exact1", "seconds exact2", "seconds refeed", "seconds total"]
    return pd.DataFrame(out, columns=cols)


def table_runs(runs: dict) -> pd.DataFrame:
    """One line per published run: its file, pivots, problems, summed per-problem seconds
    and the run's elapsed seconds (``elapsed_seconds``)."""
    out = []
    for name, run in runs.items():
        if run.get("elapsed_seconds") is None and not run.get("per_problem"):
            continue
        blocks = run.get("per_problem") or []
        out.append({"run": name, "file": run.get("file", "-"), "pivots": len(run["records"]),
                    "problems": len(blocks), "per-problem seconds (sum)": round(sum(b.get("total_seconds") or 0
                                                                               for b in blocks), 1),
                    "elapsed seconds": _num(run.get("elapsed_seconds"), ".1f")})
    return pd.DataFrame(out, columns=["run", "file", "pivots", "problems", "per-problem seconds (sum)",
                                      "elapsed seconds"])


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
    """[ours] The passes of the pass table against exact1, and replicas against their pass
    (``stats_extras.pass_comparisons``)."""
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
        states = e.get("state_established")
        row["state established"] = "-" if not states else "; ".join(
            f"{k} {v}" for k, v in sorted(states.items(), key=lambda kv: -kv[1]))
        out.append(row)
    return pd.DataFrame(out)


def table_transplant(main) -> pd.DataFrame:
    """[ours] tab19_transplant: the replica, refeed and the two cache transplants against exact1
    (``stats_extras.transplant``), formatted; empty where the records have no transplant pass."""
    t = transplant(main)
    if not len(t):
        return t
    t = t.astype(object).where(t.notna(), None)  # a missing t prints "-"
    return pd.DataFrame({
        "pass": t["pass"], "n (common)": t["n"],
        "disagreement (polarity)": [f"{_pct(r)} ({p})" for r, p in zip(t["rate"], t["polarity"])],
        "excess pp": [_num(x, "+.1f") for x in t["excess_pp"]],
        "McNemar b/c": [f"{b}/{c}" for b, c in zip(t["mcnemar_b"], t["mcnemar_c"])],
        "z": [_num(x, ".2f") for x in t["mcnemar_z"]], "t_clust": [_num(x, ".2f") for x in t["clustered_t"]],
        "vs refeed": [_pct(r) for r in t["rate_vs_refeed"]],
        "z vs refeed": [_num(x, ".2f") for x in t["mcnemar_z_vs_refeed"]],
        "t_clust vs refeed": [_num(x, ".2f") for x in t["clustered_t_vs_refeed"]], "pivots": t["pivots"],
        "probe = exact1": [_pct(x) for x in t["probe_equal_exact1"]],
        "probe = refeed": [_pct(x) for x in t["probe_equal_refeed"]]})


def table_claims(judged: list[dict]) -> pd.DataFrame:
    """[ours] tab21_claims: the paper's claims judged on the run's records (``claims.judge``): the
    verdict over rows and, per verdict, the rows with their n and number."""
    return pd.DataFrame([{"claim": x["claim"], "verdict": x["verdict"], "detail": x["detail"]} for x in judged],
                        columns=["claim", "verdict", "detail"])


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
    "tab13_clustered": table_clustered,
    "tab14_selection": table_selection,
}
# tables of single records files (``runs``), and Table 1 by cohort
RUN_TABLES = {
    "tab15_preregistered": table_preregistered,
    "tab17_per_problem": table_per_problem,
    "tab18_runs": table_runs,
}


def all_tables(rows: dict, n_boot: int = 2000, runs: dict | None = None, cohorts: dict | None = None) -> dict:
    """Every table by file name: ``TABLES`` of ``rows`` {label: record frame}, ``RUN_TABLES``
    of ``runs`` (default: each row as a run without published blocks) and
    ``tab16_cohorts``, Table 1 of ``cohorts`` {label: frame} (default: the rows)."""
    out = {name: (fn(rows, n_boot=n_boot) if fn is table_bootstrap else fn(rows)) for name, fn in TABLES.items()}
    runs = runs if runs is not None else {label: {"records": df} for label, df in rows.items()}
    for name, fn in RUN_TABLES.items():
        out[name] = fn(runs)
    out["tab16_cohorts"] = table1(cohorts if cohorts is not None else rows)
    return dict(sorted(out.items(), key=lambda kv: int(kv[0][3:].split("_")[0])))


def markdown_text(value) -> str:
    """A value as Markdown text: a notebook renders the Markdown, and HTML in a value (a row label, a model
    name, a params string) must stay text."""
    return str(value).replace("&", "&amp;").replace("<", "&lt;")


def _markdown(df: pd.DataFrame) -> str:
    cells = [[str(c) for c in df.columns]] + [[str(v) for v in row] for row in df.itertuples(index=False)]
    esc = [[markdown_text(c).replace("|", "\\|") for c in line] for line in cells]
    lines = ["| " + " | ".join(esc[0]) + " |", "|" + "|".join("---" for _ in esc[0]) + "|"]
    lines += ["| " + " | ".join(line) + " |" for line in esc[1:]]
    return "\n".join(lines) + "\n"


def _latex(df: pd.DataFrame) -> str:
    # pandas escapes LaTeX's special characters but not < and >, which a LaTeX font or an HTML rendering of
    # the file would not show as text; its own markup holds neither
    latex = df.astype(str).to_latex(index=False, escape=True)
    return latex.replace("<", r"\textless{}").replace(">", r"\textgreater{}")


def write_table(df: pd.DataFrame, name: str, tables_dir) -> list[Path]:
    """Write ``name.csv``, ``name.md`` and ``name.tex`` under ``tables_dir``; returns paths."""
    tables_dir = Path(tables_dir)
    tables_dir.mkdir(parents=True, exist_ok=True)
    paths = [tables_dir / f"{name}.{ext}" for ext in ("csv", "md", "tex")]
    atomic_save(paths[0], lambda tmp: df.to_csv(tmp, index=False))
    atomic_write_bytes(paths[1], _markdown(df).encode())
    atomic_write_bytes(paths[2], _latex(df).encode())
    return paths


def write_tables(rows: dict, tables_dir, n_boot: int = 2000, runs: dict | None = None,
                 cohorts: dict | None = None) -> list[Path]:
    """Compute and write every table of ``all_tables``."""
    paths = []
    for name, df in all_tables(rows, n_boot, runs, cohorts).items():
        paths += write_table(df, name, tables_dir)
    return paths
