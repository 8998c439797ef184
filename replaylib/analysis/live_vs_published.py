"""A campaign's live rows against the paper's published ones: every Table 1 quantity, published
and live, with its 95% problem-bootstrap interval and whether the published value lies inside;
the paper's claims judged per engine mode (``replaylib.analysis.claims``); and the comparison as Markdown
(tables/campaign-<name>/live_vs_published.{csv,md}). The campaign (``replaylib.campaign``) runs the
configurations and calls these on their records. ``c`` is a campaign (``replaylib.runtime.campaigns.Campaign``),
``row`` one of its rows and ``p`` a configuration's parameters: read, never imported, from the run layer above."""
from __future__ import annotations

import numpy as np
import pandas as pd

from ..core.paths import PAPER_RECORDS
from ..measure.units import Kernel, Outputs, Unit
from . import records as rec
from . import stats, stats_extras, tables

QUANTITIES = stats.TABLE1_QUANTITIES


def quantities(df: pd.DataFrame) -> dict:
    """Table 1's quantities of one record set, unrounded (None where undefined, as Table 1's "-")."""
    q = stats.table1_numbers(df)
    return {k: q[k] for k in QUANTITIES}


def live_frame(df: pd.DataFrame, p) -> pd.DataFrame:
    """One configuration's records in a campaign: the protocol they recorded, with the configuration's
    cohort settings, as the frame's config."""
    config = next(iter(df.attrs["configs"].values())) or {}
    df.attrs["configs"] = {p.config: {**config, "screen_mixed": p.screen_mixed, "scan_start": p.problem_start}}
    return df


def live_rows(c, replay, invariant: dict) -> dict:
    """{label: records}: every row's configurations' replay records (``replay(config)``) pooled as listed
    (deduplicated), then the batch-invariant rows (``invariant``: label -> records)."""
    rows = {r.label: rec.pool([live_frame(replay(n), c.configs[n]) for n in r.configs]) for r in c.rows}
    for r in c.invariants:
        rows[r.label] = live_frame(invariant[r.label], c.configs[r.configs[0]])
    return rows


def figures(c, rows: dict, replay) -> dict:
    """Figures 1-3 of the live rows: {name: ((fig, ax), data frame it plots)}; Figure 3 pools its
    configurations' replay records (``replay(config)``) undeduplicated, beside the batch-invariant row."""
    from . import plotting
    main, inv = rows[c.figure1], rows[c.invariant.label]
    fig3 = pd.concat([live_frame(replay(n), c.configs[n]) for n in c.figure3], ignore_index=True)
    return {"fig1_quadrants": (plotting.fig1_quadrants(main, label=c.figure1), plotting.fig1_data(main)),
            "fig2_configs": (plotting.fig2_configs(rows), plotting.fig2_data(rows)),
            "fig3_logprob_ecdf": (plotting.fig3_logprob_ecdf(fig3, inv), plotting.fig3_data(fig3, inv))}


def comparison_table(c, rows: dict, n_boot: int) -> pd.DataFrame:
    """Every Table 1 quantity of every row: published (from data/paper-records), live, its 95%
    problem-bootstrap interval, and whether the published value lies inside."""
    out = []
    for row in c.rows + c.invariants:
        published = quantities(rec.load_paper_row(row.published, PAPER_RECORDS))
        live = quantities(rows[row.label])
        ci = stats_extras.table1_intervals(rows[row.label], n_boot)
        for q in QUANTITIES:
            pub, val, iv = published[q], live[q], ci[q]
            inside = None if pub is None or iv is None else bool(iv[0] - 1e-9 <= pub <= iv[1] + 1e-9)
            out.append({"row": row.label, "published row": row.published, "quantity": q,
                        "published": pub, "live": val, "ci95_low": None if iv is None else iv[0],
                        "ci95_high": None if iv is None else iv[1],
                        "published inside": "not measured" if inside is None else ("yes" if inside else "no")})
    return pd.DataFrame(out)


def engine_mode(p, model: bool = False) -> str:
    """How a configuration's engine runs, in words: the paper's claims are judged per mode."""
    if p.engine != "vllm":
        mode = f"transformers, {p.device}"
    else:
        mode = f"vLLM {p.vllm_serving}" + (", synchronized passes" if p.pass_submission == "synchronized" else "")
    return f"{p.model}, {mode}" if model else mode


def row_mode(c, row) -> str:
    """A row's engine mode; with the model first where the campaign has a batch-invariant row for each of several
    models (a comparison of models: the claims are judged model by model too)."""
    several = len({c.configs[n].model for r in c.invariants for n in r.configs if n in c.configs}) > 1
    modes = {engine_mode(c.configs[n], several) for n in row.configs if n in c.configs}
    return modes.pop() if len(modes) == 1 else ("mixed" if modes else "")


def verdicts(c, rows: dict) -> list[dict]:
    """One line per claim of the paper and engine mode, from the live rows (replaylib.analysis.claims: holds,
    does not hold, underpowered or not measured): a campaign with rows in several serving modes
    (multi-process vLLM, in-process vLLM) is judged mode by mode, and one with a batch-invariant row for each of
    several models model by model too."""
    from . import claims
    out = []
    for mode in dict.fromkeys(row_mode(c, r) for r in c.rows + c.invariants):
        stock = {r.label: stats.exclude_not_exact(rows[r.label])[0] for r in c.rows if row_mode(c, r) == mode}
        invariant = {r.label: stats.exclude_not_exact(rows[r.label])[0] for r in c.invariants
                     if row_mode(c, r) == mode}
        out += [{**x, "mode": mode} for x in claims.judge(stock, invariant)]
    return out


def _cell(v, quantity: str = ""):
    if v is None or (isinstance(v, float) and np.isnan(v)):
        return "-"
    return f"{v:.0f}" if quantity == "n (common)" else f"{v:.2f}"


def comparison_markdown(c, table: pd.DataFrame, claims: list[dict]) -> str:
    """The comparison and the claims as Markdown; every text from the campaign file (labels, the note) and
    the verdicts naming them are escaped (a notebook renders this)."""
    esc = tables.markdown_text
    lines = [f"# {esc(c.label)}: live vs published", ""]
    if c.note:
        lines += [f"**Note:** {esc(c.note)}", ""]
    lines += ["| row | published row | quantity | published | live | 95% CI (problems) | published inside |",
              "|---|---|---|---|---|---|---|"]
    for r in table.itertuples(index=False):
        q = r.quantity
        ci = ("-" if r.ci95_low is None or pd.isna(r.ci95_low) else
              f"[{_cell(r.ci95_low, q)}, {_cell(r.ci95_high, q)}]")
        label, published_row = (esc(x).replace("|", "\\|") for x in (r.row, r[1]))
        lines.append(f"| {label} | {published_row} | {q} | {_cell(r.published, q)} | {_cell(r.live, q)} | {ci} | "
                     f"{r[7]} |")
    lines += ["", "## The paper's claims, on the live records", ""]
    modes = list(dict.fromkeys(x.get("mode", "") for x in claims))
    for mode in modes:
        if len(modes) > 1:
            lines += [f"### {esc(mode)}", ""]
        lines += [f"- {esc(x['claim'])}: **{esc(x['verdict'])}** ({esc(x['detail'])})" for x in claims
                  if x.get("mode", "") == mode]
        if len(modes) > 1:
            lines.append("")
    return "\n".join(lines) + "\n"


def plan(params, inputs, done: dict) -> list[Unit]:
    """One unit: the campaign's rows from its configurations' records."""
    c = inputs["campaign"]
    return [Unit("campaign", f"campaign {c.name}", (c, inputs["replay"], inputs["invariant"]))]


def campaign_unit(engine, params, c, replay_files: dict, invariant_files: dict) -> dict:
    """Table 1, Figures 1-3, the comparison with the published rows and the claims' verdicts, in memory;
    replay_files: each configuration's replay records file; invariant_files: each batch-invariant row's."""
    from . import tables

    def replay(name: str):  # a frame of its own for each use: the rows' pools and Figure 3's
        return rec.load_records(replay_files[name])

    rows = live_rows(c, replay, {label: rec.load_records(f) for label, f in invariant_files.items()})
    made = {"tab1_main": tables.table1(rows), "figures": figures(c, rows, replay)}
    made["comparison"] = comparison_table(c, rows, c.bootstrap_draws)
    made["claims"] = verdicts(c, rows)
    made["markdown"] = comparison_markdown(c, made["comparison"], made["claims"])
    return made


def assemble(params, inputs, done: dict) -> Outputs:
    """tables/campaign-<name>/ (tab1_main, live_vs_published.csv and .md) and figures/campaign-<name>/."""
    import matplotlib.pyplot as plt

    from ..core.files import atomic_save, atomic_write_bytes
    from . import plotting, tables
    made, tdir, fdir = done["campaign"], inputs["tables_dir"], inputs["figures_dir"]
    products = tables.write_table(made["tab1_main"], "tab1_main", tdir)
    for name, ((fig, _), data) in made["figures"].items():
        products += plotting.save_figure(fig, name, fdir, data)
    csv, md = tdir / "live_vs_published.csv", tdir / "live_vs_published.md"
    atomic_save(csv, lambda tmp: made["comparison"].to_csv(tmp, index=False))
    atomic_write_bytes(md, made["markdown"].encode())
    plt.close("all")
    return Outputs({}, {"claims": made["claims"]}, products=products + [csv, md], result=made["claims"])


KERNEL = Kernel(plan=plan, unit=campaign_unit, assemble=assemble, preview=lambda parts: parts["tab1_main"],
                progress=("campaign", "unit"))
