"""Stage 4: every statistic, the tables and the figures (replaylib.analysis.products), from this run's
records or the paper's."""
from __future__ import annotations

import pandas as pd

from ..analysis import products
from ..core.paths import figures_dir, tables_dir
from ..runtime import outputs
from ..runtime.units import Declared


def inputs(params, out_dir=None) -> dict:
    where = {"tables_dir": tables_dir(params.config, out_dir), "figures_dir": figures_dir(params.config, out_dir)}
    if params.records == "published":
        return where
    replay = outputs.located(params, outputs.REPLAY, out_dir)
    return {**where, "records": {"replay": replay / "records.parquet", "layer_profile": replay / "layer_profile.parquet",
                                 "invariant": outputs.located(params, outputs.INVARIANT, out_dir) / "records.parquet"}}


STAGE = Declared("04_statistics", products.KERNEL, inputs,
                 lambda params, out_dir, unit: pd.read_csv(tables_dir(params.config, out_dir) / "tab1_main.csv"))
run, plan, preview = STAGE.run, STAGE.plan, STAGE.preview
