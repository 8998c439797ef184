"""Lease 11's tables and figures from the returned records (python lease11_products.py ROOT OUT): Table 1 of the
three configurations side by side (the main one, its float32-prefix control on the same pivots, the
prompt-batching control on its own trunks), and per configuration the transplant table (tab19), the layer
profile's summary (tab20) and figures 5 and 6, as the statistics stage writes them (replaylib.analysis). The
stage itself ran on the GPU only where the lease's time allowed; its decode-time states stay there, so the
runner cannot rerun it here."""
import sys
from pathlib import Path

import pandas as pd

from replaylib.analysis import plotting, products, stats_extras, tables
from replaylib.runtime import params

root, out = Path(sys.argv[1]), Path(sys.argv[2])
CONFIGS = ("gpu-embedded-xplant", "gpu-embedded-xplant-fp32", "gpu-embedded-xplant-alone")
rows = {}
for config in CONFIGS:
    stage = root / "runs" / config / "03_three_pass_replay"
    if not (stage / "records.parquet").exists():
        continue
    p = params.load(Path(__file__).resolve().parents[3] / "params" / f"{config}.yaml")
    df = products.with_settings(pd.read_parquet(stage / "records.parquet"), config, p, False)
    rows[config] = df
    profile = pd.read_parquet(stage / "layer_profile.parquet") if (stage / "layer_profile.parquet").exists() else None
    made = products.transplant_tables({"main": df, "layer_profile": profile})
    for name, table in made.items():
        tables.write_table(table, name, out / config)
    transplant = stats_extras.transplant(df)
    if len(transplant):
        plotting.save_figure(plotting.fig5_transplant(transplant)[0], "fig5_transplant", out / config, transplant)
    if profile is not None and len(profile):
        plotting.save_figure(plotting.fig6_layer_profile(profile)[0], "fig6_layer_profile", out / config, profile)
tables.write_table(tables.table1(rows), "tab1_main", out)
print((out / "tab1_main.md").read_text())
for config in rows:
    f = out / config / "tab19_transplant.md"
    if f.exists():
        print(f"{config}: tab19_transplant\n{f.read_text()}")
