"""Stage 4: every statistic, the tables and the figures (docs/protocol.md sections 4, 5).

Data flows one way: ``stats`` (pure statistics) <- ``tables`` and ``plotting`` <- this
module, which gathers the records, writes tables/<config>/, figures/<config>/ (each figure
with its data as CSV) and runs/<config>/04_statistics/summary.json, and records every
product in the stage's manifest under ``products``, by path relative to the out root.
"""

from __future__ import annotations

from ..analysis import plotting, tables
from ..analysis.products import (
    figures,
    published_inputs,
    run_claims,
    run_inputs,
    summary,
    transplant_tables,
)
from ..core.files import atomic_write_json
from ..core.paths import figures_dir, tables_dir
from ..runtime import outputs
from ..runtime.rundir import StageDir, product_digests

STAGE = "04_statistics"


def run(params, out_dir=None) -> dict:
    """Stage 4: every statistic, Table 1 and the in-text tables, Figures 1-3.

    records: "run" uses this configuration's replay records; "published" the paper's
    seven runs (data/paper-records). Tables go to tables/<config>/, figures (with their
    data as CSV) to figures/<config>/, the summary to runs/<config>/04_statistics/summary.json.
    """
    stage = StageDir(params, STAGE, out_dir).begin()
    if params.records == "published":
        inputs = published_inputs()
    else:
        inputs = run_inputs(params, outputs.load_replay(params, out_dir), outputs.load_invariant(params, out_dir),
                            outputs.load_layer_profile(params, out_dir))
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
