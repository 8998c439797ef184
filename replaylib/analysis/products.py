"""Stage 4: every statistic, the tables and the figures (docs/protocol.md sections 4, 5), from the published
records or a run's: its plan (one unit), the unit that computes every table, figure, claim and summary.json
in memory, and the assembly that writes them (tables/<config>/, figures/<config>/ with each figure's data as
CSV, runs/<config>/04_statistics/summary.json; the stage's manifest records every product under
``products``, by path relative to the out root). Data flows one way: ``stats`` (pure statistics) <-
``tables`` and ``plotting`` <- this module."""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from ..core.paths import PAPER_RECORDS
from ..measure.units import Kernel, Outputs, Unit
from . import claims, plotting, stats, stats_extras, tables
from . import records as rec

# the paper's Figure 3 pools these four runs, without deduplication (3,047 pivots)
FIG3_FILES = ("2026-06-11/primary.json", "2026-06-11/screened.json", "2026-06-11/k8.json", "2026-06-11/phi.json")


COHORTS = {"primary": "2026-06-11/primary.json", "screened": "2026-06-11/screened.json"}


def _concat(frames):
    """Frames stacked as they are (no deduplication), their configs kept."""
    frames = list(frames)
    out = pd.concat(frames, ignore_index=True)
    out.attrs = {"configs": {k: v for f in frames for k, v in f.attrs.get("configs", {}).items()}}
    return out


def published_inputs(root=PAPER_RECORDS) -> dict:
    """The paper's inputs: the seven Table 1 rows, each records file as a run with its
    published blocks (the two main cohorts and their pool among them), the cohorts, and
    Figure 3's four pooled runs with the batch-invariant run."""
    rows = {label: rec.load_paper_row(label, root) for label in rec.PAPER_ROWS}
    runs = {}
    for label, meta in rec.PAPER_ROWS.items():
        if len(meta["files"]) > 1:  # a pooled row: each file, then the pool (no harness aggregate)
            for name, f in COHORTS.items():
                runs[name] = {"file": f, "records": rec.load_records(root / f), **rec.load_blocks(root / f)}
            runs[label] = {"file": " + ".join(meta["files"]), "records": rows[label]}
        else:
            f = meta["files"][0]
            runs[label] = {"file": f, "records": rows[label], **rec.load_blocks(root / f)}
    cohorts = {name: runs[name]["records"] for name in COHORTS} | {"main pooled": rows["main pooled"]}
    fig3 = _concat(rec.load_records(root / f) for f in FIG3_FILES)
    return {"rows": rows, "runs": runs, "cohorts": cohorts, "main": rows["main pooled"],
            "main_label": "Pooled main configuration", "fig3": fig3, "invariant": rows["batch-invariant"]}


def with_settings(df: pd.DataFrame, label: str, params, batch_invariant: bool) -> pd.DataFrame:
    """A run's records with its settings as their config (Table 1's model, K and temperature, the cohort)."""
    df.attrs["configs"] = {label: {"model": params.model, "k": params.k, "cont_temp": params.cont_temperature,
                                   "temperature": params.temperature, "problems": int(df.problem_id.nunique()),
                                   "screen_mixed": params.screen_mixed, "scan_start": params.problem_start,
                                   "batch_invariant": batch_invariant}}
    return df


def run_inputs(params, main: pd.DataFrame, invariant: pd.DataFrame, layer_profile: pd.DataFrame | None) -> dict:
    """A configuration's inputs: its replay records and its batch-invariant run (stage 5), each with the
    run's settings, and its layer profile where it has one."""
    main = with_settings(main, params.config, params, False)
    invariant = with_settings(invariant, f"{params.config} batch-invariant", params, True)
    rows = {params.config: main, f"{params.config} batch-invariant": invariant}
    return {"rows": rows, "runs": {label: {"records": df} for label, df in rows.items()}, "cohorts": None,
            "main": main, "main_label": params.config, "fig3": main, "invariant": invariant,
            "layer_profile": layer_profile}

def figures(inputs: dict) -> dict:
    """Every figure of the stage: {name: ((fig, ax), data frame it plots)}."""
    main, rows = inputs["main"], inputs["rows"]
    out = {
        "fig1_quadrants": (plotting.fig1_quadrants(main, label=inputs["main_label"]), plotting.fig1_data(main)),
        "fig2_configs": (plotting.fig2_configs(rows), plotting.fig2_data(rows)),
        "fig3_logprob_ecdf": (plotting.fig3_logprob_ecdf(inputs["fig3"], inputs["invariant"]),
                              plotting.fig3_data(inputs["fig3"], inputs["invariant"])),
    }
    comparisons = stats_extras.pass_comparisons(main)
    if len(comparisons) > 2:  # beyond exact2 and refeed: the extra passes of [ours]
        out["fig4_passes"] = (plotting.fig4_passes(comparisons), comparisons)
    transplant = stats_extras.transplant(main)
    if len(transplant):  # [ours] the cache transplants
        out["fig5_transplant"] = (plotting.fig5_transplant(transplant), transplant)
    profile = inputs.get("layer_profile")
    if profile is not None and len(profile):
        out["fig6_layer_profile"] = (plotting.fig6_layer_profile(profile), profile)
    return out


def transplant_tables(inputs: dict) -> dict:
    """[ours] The transplant tables, where the run has them: tab19_transplant (transplant passes)
    and tab20_layer_profile (the per-layer profile summarised over pivots)."""
    out = {}
    t = tables.table_transplant(inputs["main"])
    if len(t):
        out["tab19_transplant"] = t
    profile = inputs.get("layer_profile")
    if profile is not None and len(profile):
        out["tab20_layer_profile"] = stats_extras.layer_profile_summary(profile)
    return out


def run_claims(inputs: dict) -> list[dict]:
    """The paper's claims judged on this run's rows (replaylib.analysis.claims): the batch-invariant row for the
    identity, every other row for the rest; records not verified exact left out."""
    stock = {label: stats.exclude_not_exact(df)[0] for label, df in inputs["rows"].items()
             if df is not inputs["invariant"]}
    invariant = {label: stats.exclude_not_exact(df)[0] for label, df in inputs["rows"].items()
                 if df is inputs["invariant"]}
    return claims.judge(stock, invariant)


def main_summary(df: pd.DataFrame) -> dict:
    """summary.json's "main": every statistic of the main records, and whether the sign statistics
    have power at this size (the headline's choice of channel reads it)."""
    return {**stats.summarize(df), **stats.text_numbers(df),
            "sign_power": claims.sign_power(stats.exclude_not_exact(df)[0])}


def _records(df: pd.DataFrame) -> list:
    """Rows as dicts with None, not NaN, where a value is missing (strict JSON)."""
    return df.astype(object).where(df.notna(), None).to_dict("records")


def summary(inputs: dict, n_boot: int) -> dict:
    """summary.json: the main row's statistics, extras and exactness, every row, the
    cohorts, and each run's pre-registered metrics beside its harness aggregate, per-problem
    blocks and elapsed seconds (where the files have them)."""
    main, rows = inputs["main"], inputs["rows"]
    runs = {}
    for name, r in inputs["runs"].items():
        pre = stats.preregistered(stats.exclude_not_exact(r["records"])[0])
        agg = r.get("aggregate")
        runs[name] = {"file": r.get("file"), "preregistered": pre, "harness_aggregate": agg,
                      "aggregate_reproduced": None if agg is None else pre == agg,
                      "per_problem": r.get("per_problem"), "elapsed_seconds": r.get("elapsed_seconds")}
    return {
        "main": main_summary(main),
        "claims": inputs["claims"],
        "extras": stats_extras.extras(main, seed=0, n_boot=n_boot),
        "resume_exactness": stats_extras.resume_exactness(main),
        "passes": stats_extras.pass_comparisons(main).to_dict("records"),
        "rows": {label: {**stats.summarize(df), **stats.text_numbers(df)} for label, df in rows.items()},
        "cohorts": {label: stats.summarize(df) for label, df in (inputs["cohorts"] or {}).items()},
        "runs": runs,
        "figure3": plotting.fig3_data(inputs["fig3"], inputs["invariant"]).to_dict("records"),
        "transplant": _records(stats_extras.transplant(main)),
        "layer_profile": (_records(stats_extras.layer_profile_summary(inputs["layer_profile"]))
                          if inputs.get("layer_profile") is not None else []),
    }


def plan(params, inputs, done: dict) -> list[Unit]:
    """One unit: the records the statistics read (the paper's, or this run's stages 3 and 5)."""
    return [Unit("statistics", f"statistics of the {params.records} records", (inputs.get("records"),))]


def statistics_unit(engine, params, records: dict | None) -> dict:
    """Every table, figure and claim and summary.json, in memory; records: the files of this run's stage 3
    (``replay``, ``layer_profile``) and stage 5 (``invariant``), or None for the published records."""
    if params.records == "published":
        inputs = published_inputs()
    else:
        profile = Path(records["layer_profile"])
        inputs = run_inputs(params, rec.load_records(records["replay"]), rec.load_records(records["invariant"]),
                            pd.read_parquet(profile) if profile.exists() else None)
    made = tables.all_tables(inputs["rows"], params.bootstrap_draws, runs=inputs["runs"], cohorts=inputs["cohorts"])
    made.update(transplant_tables(inputs))
    inputs["claims"] = run_claims(inputs)
    made["tab21_claims"] = tables.table_claims(inputs["claims"])
    return {"tables": made, "figures": figures(inputs), "summary": summary(inputs, params.bootstrap_draws)}


def write_products(made: dict, tables_dir, figures_dir) -> list:
    """Write a statistics unit's tables and figures; returns their paths."""
    import matplotlib.pyplot as plt
    products = []
    for name, df in made["tables"].items():
        products += tables.write_table(df, name, tables_dir)
    for name, ((fig, _), data) in made["figures"].items():
        products += plotting.save_figure(fig, name, figures_dir, data)
    plt.close("all")
    return products


def assemble(params, inputs, done: dict) -> Outputs:
    made = done["statistics"]
    return Outputs({"summary.json": made["summary"]}, products=write_products(made, inputs["tables_dir"],
                                                                               inputs["figures_dir"]),
                   result=made["summary"])


KERNEL = Kernel(plan=plan, unit=statistics_unit, assemble=assemble,
                preview=lambda parts: parts["tables"]["tab1_main"], progress=("statistics", "unit"))
