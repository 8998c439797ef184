"""Stage 4: every statistic, the tables and the figures (docs/protocol.md sections 4, 5).

Data flows one way: ``stats`` (pure statistics) <- ``tables`` and ``plotting`` <- this
module, which gathers the records, writes tables/<config>/, figures/<config>/ (each figure
with its data as CSV) and runs/<config>/04_statistics/summary.json, and records every
product in the stage's manifest under ``products``, by path relative to the out root.
"""

from __future__ import annotations

from ..analysis import plotting, tables
from ..analysis import records as rec
from ..analysis.products import (
    figures,
    published_inputs,
    run_claims,
    summary,
    transplant_tables,
)
from ..core.files import atomic_write_json
from ..core.paths import figures_dir, tables_dir
from ..runtime.rundir import StageDir, product_digests
from . import replay

STAGE = "04_statistics"


def run_inputs(params, stage: StageDir, out_dir=None) -> dict:
    """This configuration's inputs: its replay records and its batch-invariant run (stage 5),
    with the run's parameters as their config (for Table 1's model, K and temperature)."""
    main = replay.load(params, out_dir)
    invariant = rec.load_records(stage.upstream("05_batch_invariant") / "records.parquet")
    for df, label, inv in [(main, params.config, False), (invariant, f"{params.config} batch-invariant", True)]:
        df.attrs["configs"] = {label: {"model": params.model, "k": params.k, "cont_temp": params.cont_temperature,
                                       "temperature": params.temperature, "problems": int(df.problem_id.nunique()),
                                       "screen_mixed": params.screen_mixed, "scan_start": params.problem_start,
                                       "batch_invariant": inv}}
    rows = {params.config: main, f"{params.config} batch-invariant": invariant}
    return {"rows": rows, "runs": {label: {"records": df} for label, df in rows.items()}, "cohorts": None,
            "main": main, "main_label": params.config, "fig3": main, "invariant": invariant,
            "layer_profile": replay.load_layer_profile(params, out_dir)}


def run(params, out_dir=None) -> dict:
    """Stage 4: every statistic, Table 1 and the in-text tables, Figures 1-3.

    records: "run" uses this configuration's replay records; "published" the paper's
    seven runs (data/paper-records). Tables go to tables/<config>/, figures (with their
    data as CSV) to figures/<config>/, the summary to runs/<config>/04_statistics/summary.json.
    """
    stage = StageDir(params, STAGE, out_dir).begin()
    inputs = published_inputs() if params.records == "published" else run_inputs(params, stage, out_dir)
    tdir, fdir = tables_dir(params.config, out_dir), figures_dir(params.config, out_dir)
    products = tables.write_tables(inputs["rows"], tdir, n_boot=params.bootstrap_draws,
                                   runs=inputs["runs"], cohorts=inputs["cohorts"])
    for name, df in transplant_tables(inputs).items():
        products += tables.write_table(df, name, tdir)
    inputs["claims"] = run_claims(inputs)
    products += tables.write_table(tables.table_claims(inputs["claims"]), "tab21_claims", tdir)
    for name, ((fig, _), data) in figures(inputs).items():
        products += plotting.save_figure(fig, name, fdir, data)
    result = summary(inputs, params.bootstrap_draws)
    atomic_write_json(stage.file("summary.json"), result)
    stage.finish(["summary.json"], {"products": product_digests(products, out_dir)})
    return result
