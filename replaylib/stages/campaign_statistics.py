"""Campaign statistics."""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from ..analysis import live_vs_published
from ..analysis import records as rec
from ..core.files import atomic_save, atomic_write_bytes, sha256_file
from ..core.paths import figures_dir, out_root, tables_dir
from ..runtime.campaigns import Campaign
from ..runtime.fingerprint import code_fingerprint
from ..runtime.params import Params
from ..runtime.registry import CAMPAIGN
from ..runtime.rundir import changed_outputs, execute_notebook, write_finished


def live_frame(p: Params, out_dir=None, invariant: bool = False) -> pd.DataFrame:
    """One configuration's records (stage 3, or stage 5's), with its settings as the frame's config."""
    stage = "05_batch_invariant" if invariant else "03_three_pass_replay"
    df = rec.load_records(out_root(out_dir) / "runs" / p.config / stage / "records.parquet")
    config = next(iter(df.attrs["configs"].values())) or {}
    df.attrs["configs"] = {p.config: {**config, "screen_mixed": p.screen_mixed, "scan_start": p.problem_start}}
    return df


def record_files(c: Campaign, out_dir=None) -> dict:
    """Every records file the campaign statistics read, relative to the out root."""
    files = {f"runs/{name}/03_three_pass_replay/records.parquet" for r in c.rows for name in r.configs}
    files |= {f"runs/{name}/03_three_pass_replay/records.parquet" for name in c.figure3}
    files.add(f"runs/{c.invariant.configs[0]}/05_batch_invariant/records.parquet")
    return {f: out_root(out_dir) / f for f in sorted(files)}


def live_rows(c: Campaign, out_dir=None) -> dict:
    """{label: records}: every row pooled as listed (deduplicated), then the batch-invariant row."""
    rows = {r.label: rec.pool([live_frame(c.configs[n], out_dir) for n in r.configs]) for r in c.rows}
    rows[c.invariant.label] = live_frame(c.configs[c.invariant.configs[0]], out_dir, invariant=True)
    return rows


def statistics(c: Campaign, out_dir=None) -> dict:
    """Table 1, Figures 1-3 and live_vs_published for the campaign; records what it wrote."""
    from ..analysis import plotting, tables
    rows = live_rows(c, out_dir)
    tdir, fdir = tables_dir(c.label, out_dir), figures_dir(c.label, out_dir)
    products = tables.write_table(tables.table1(rows), "tab1_main", tdir)
    main = rows[c.figure1]
    fig3 = pd.concat([live_frame(c.configs[n], out_dir) for n in c.figure3], ignore_index=True)
    inv = rows[c.invariant.label]
    products += plotting.save_figure(plotting.fig1_quadrants(main, label=c.figure1)[0], "fig1_quadrants", fdir,
                                     plotting.fig1_data(main))
    products += plotting.save_figure(plotting.fig2_configs(rows)[0], "fig2_configs", fdir, plotting.fig2_data(rows))
    products += plotting.save_figure(plotting.fig3_logprob_ecdf(fig3, inv)[0], "fig3_logprob_ecdf", fdir,
                                     plotting.fig3_data(fig3, inv))
    table = live_vs_published.compare(c, rows, c.bootstrap_draws)
    claims = live_vs_published.verdicts(c, rows)
    csv = tdir / "live_vs_published.csv"
    atomic_save(csv, lambda tmp: table.to_csv(tmp, index=False))
    md = tdir / "live_vs_published.md"
    atomic_write_bytes(md, live_vs_published.comparison_markdown(c, table, claims).encode())
    products += [csv, md]
    import matplotlib.pyplot as plt
    plt.close("all")
    root = out_root(out_dir).resolve()
    inputs = {rel: sha256_file(p) for rel, p in record_files(c, out_dir).items()}
    manifest = {"campaign": c.label, "campaign_file": str(c.path), "campaign_sha256": sha256_file(c.path),
                "code": code_fingerprint(CAMPAIGN.name), "inputs": inputs, "claims": claims,
                "products": {p.resolve().relative_to(root).as_posix(): sha256_file(p) for p in sorted(set(products))}}
    write_finished(root / "runs" / c.label, manifest)
    return manifest


def statistics_staleness(c: Campaign, out_dir=None) -> str | None:
    """Why the campaign statistics must run, or None when they are up to date."""
    run_dir = out_root(out_dir) / "runs" / c.label
    try:
        manifest = json.loads((run_dir / "manifest.json").read_text())
    except (OSError, json.JSONDecodeError):
        return "not run yet"
    if not (run_dir / "DONE").exists():
        return "not finished"
    if manifest.get("campaign_sha256") != sha256_file(c.path):
        return "campaign file changed"
    if manifest.get("code") != code_fingerprint(CAMPAIGN.name):
        return "notebook or library code changed"
    files = record_files(c, out_dir)
    now = {rel: (sha256_file(p) if p.exists() else None) for rel, p in files.items()}
    if now != manifest.get("inputs"):
        return "records changed"
    changed = changed_outputs(out_root(out_dir), manifest.get("products", {}))
    return f"{changed[0]} changed or missing" if changed else None


def execute_statistics(c: Campaign, out_dir=None) -> Path:
    """Run notebooks/06_campaign.ipynb with papermill; returns the executed notebook."""
    from ..core.paths import notebook_path
    output = out_root(out_dir) / "runs" / c.label / f"{CAMPAIGN.name}.ipynb"
    output.parent.mkdir(parents=True, exist_ok=True)
    execute_notebook(notebook_path(CAMPAIGN.name), output, {"campaign": str(c.path), "out_dir": str(out_root(out_dir))})
    return output
