"""The campaign statistics (notebooks/06_campaign.ipynb): Table 1, Figures 1-3 and live_vs_published from
the live records of a campaign's configurations (replaylib.analysis.live_vs_published), in
tables/campaign-<name>/ and figures/campaign-<name>/, recorded in runs/campaign-<name>/06_campaign/ like any
stage (runtime.campaigns.CampaignStage)."""
from __future__ import annotations

from ..analysis import live_vs_published
from ..core.paths import figures_dir, stage_dir, tables_dir
from ..runtime import outputs
from ..runtime.campaigns import Campaign, CampaignStage
from ..runtime.stagedir import StageDir
from ..runtime.units import NoEngine, run_stage


def inputs(c: Campaign, out_dir=None) -> dict:
    return {"campaign": c, "tables_dir": tables_dir(c.label, out_dir), "figures_dir": figures_dir(c.label, out_dir),
            "replay": {n: stage_dir(n, outputs.REPLAY, out_dir) / "records.parquet" for n in c.replay_configs()},
            "invariant": {label: stage_dir(n, outputs.INVARIANT, out_dir) / "records.parquet"
                          for label, n in c.invariant_configs().items()}}


def run(c: Campaign, out_dir=None) -> list[dict]:
    """Write the campaign's tables and figures; returns the claims' verdicts."""
    sd = StageDir(definition=CampaignStage(c, out_dir))
    return run_stage(sd, live_vs_published.KERNEL, None, lambda: inputs(c, out_dir), lambda n: NoEngine())
