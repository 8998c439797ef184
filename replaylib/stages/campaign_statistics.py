"""The campaign statistics (notebooks/06_campaign.ipynb): Table 1, Figures 1-3 and live_vs_published from
the live records of a campaign's configurations, in tables/campaign-<name>/ and figures/campaign-<name>/,
recorded in runs/campaign-<name>/06_campaign/ like any stage (runtime.campaigns.CampaignDir)."""
from __future__ import annotations

from ..analysis import live_vs_published, plotting, tables
from ..core.files import atomic_save, atomic_write_bytes
from ..core.paths import figures_dir, tables_dir
from ..runtime import outputs
from ..runtime.campaigns import Campaign, CampaignDir
from ..runtime.rundir import product_digests


def run(c: Campaign, out_dir=None) -> dict:
    """Write the campaign's tables and figures; returns the manifest."""
    stage = CampaignDir(c, out_dir).begin()

    def replay(name: str):  # a frame of its own for each use: the rows' pools and Figure 3's
        return outputs.load_replay(c.configs[name], out_dir)

    rows = live_vs_published.live_rows(c, replay, outputs.load_invariant(c.configs[c.invariant_config()], out_dir))
    tdir, fdir = tables_dir(c.label, out_dir), figures_dir(c.label, out_dir)
    products = tables.write_table(tables.table1(rows), "tab1_main", tdir)
    for name, ((fig, _), data) in live_vs_published.figures(c, rows, replay).items():
        products += plotting.save_figure(fig, name, fdir, data)
    table = live_vs_published.comparison_table(c, rows, c.bootstrap_draws)
    claims = live_vs_published.verdicts(c, rows)
    csv, md = tdir / "live_vs_published.csv", tdir / "live_vs_published.md"
    atomic_save(csv, lambda tmp: table.to_csv(tmp, index=False))
    atomic_write_bytes(md, live_vs_published.comparison_markdown(c, table, claims).encode())
    import matplotlib.pyplot as plt
    plt.close("all")
    return stage.finish([], {"products": product_digests(products + [csv, md], out_dir), "claims": claims})
