"""Figures of the paper (docs/protocol.md section 5.2), drawn with seaborn on matplotlib.

Each figure has a data function (``fig1_data``, ``fig2_data``, ``fig3_data``) returning the
frame it plots, written as CSV beside the figure, and a drawing function returning
``(fig, ax)``. Figures are plain ``matplotlib.figure.Figure`` objects (no pyplot state,
never shown), sized as the paper's; ``save_figure`` writes PDF, PNG and the data.
``paper_figure`` renders the paper's own figure (vendored in data/paper-figures/) and
``side_by_side`` puts it beside a regenerated one.
"""

from __future__ import annotations

import io
import textwrap
from pathlib import Path

import matplotlib as mpl
import numpy as np
import pandas as pd
import seaborn as sns
from matplotlib.colors import LogNorm
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from ..core.files import atomic_save
from ..core.paths import PAPER_FIGURES
from ..measure import passes
from . import stats

infer_k = stats.infer_k  # kept here for callers of plotting.infer_k

DOUBLE = 7.0
SINGLE = 3.4
_RC = {
    "font.size": 8,
    "axes.titlesize": 8,
    "axes.labelsize": 8,
    "xtick.labelsize": 7,
    "ytick.labelsize": 7,
    "legend.fontsize": 7,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "pdf.fonttype": 42,
}
REFEED_COLOR = "#c0392b"
FLOOR_COLOR = "#7f8c8d"
INVARIANT_COLOR = "#2e86c1"
GROUP_COLOR = {"replica": FLOOR_COLOR, "re-feed": REFEED_COLOR}  # by the pass table's comparison group
PAPER_FILES = {"fig1_quadrants": "fig_quadrants.pdf", "fig2_configs": "fig_configs.pdf",
               "fig3_logprob_ecdf": "fig_logprob_ecdf.pdf"}
FIG3_XLIM = (1e-8, 0.3)  # the paper's x range; zeros are drawn at the left edge


# ------------------------------------------------------------------ Figure 1

def fig1_data(df, k: int | None = None) -> pd.DataFrame:
    """Figure 1's cells: for refeed and the replica, every (A_exact1, A_other) cell of the
    (2K+1) x (2K+1) grid with its count of common-set pivots (flagged records excluded)
    and whether it is a sign-disagreement cell."""
    k = k or infer_k(df)
    c = stats.common_set(stats.exclude_not_exact(df)[0])
    values = np.linspace(-1, 1, 2 * k + 1)
    ix = np.round((c["A_exact1"].to_numpy(float) + 1) * k).astype(int)
    out = []
    for comparison, pass_ in (("refeed", "refeed"), ("replica", "exact2")):
        iy = np.round((c[f"A_{pass_}"].to_numpy(float) + 1) * k).astype(int)
        grid = np.zeros((2 * k + 1, 2 * k + 1), dtype=int)
        np.add.at(grid, (iy, ix), 1)
        for j, y in enumerate(values):
            for i, x in enumerate(values):
                out.append({"comparison": comparison, "A_exact1": x, "A_other": y, "count": int(grid[j, i]),
                            "sign_disagreement": bool(np.sign(x) != np.sign(y))})
    return pd.DataFrame(out)


def fig1_quadrants(df, k: int | None = None, label: str = "Pooled main configuration"):
    """Figure 1: count heatmaps (log colour, one colour bar) of A_exact1 (x) against
    A_refeed and against A_exact2 (y) over the common set, on the grid of steps 1/K;
    every sign-disagreement cell outlined, counts in the cells (K <= 4); titles carry the
    disagreement counts, the suptitle the set and n. Returns (fig, axes)."""
    k = k or infer_k(df)
    data = fig1_data(df, k)
    c = stats.common_set(stats.exclude_not_exact(df)[0])
    n = len(c)
    values = np.linspace(-1, 1, 2 * k + 1)
    grids = {comp: sub.pivot(index="A_other", columns="A_exact1", values="count").iloc[::-1]
             for comp, sub in data.groupby("comparison", sort=False)}
    vmax = max(1, int(data["count"].max()))
    norm = LogNorm(vmin=1, vmax=vmax)
    cmap = mpl.colormaps["viridis"]
    step = max(1, k // 4)
    with mpl.rc_context(_RC):
        fig = Figure(figsize=(DOUBLE, 3.4), layout="constrained")
        axes = fig.subplots(1, 2, sharey=True)
        for ax, comp, title in zip(axes, ("refeed", "replica"),
                                   ("re-feed vs exact resume", "exact replica vs exact resume (floor)")):
            grid = grids[comp]
            flips = int(data.loc[(data.comparison == comp) & data.sign_disagreement, "count"].sum())
            sns.heatmap(grid, ax=ax, mask=grid.to_numpy() == 0, norm=norm, cmap=cmap, cbar=False,
                        annot=k <= 4, fmt="d", annot_kws={"fontsize": 6}, square=True)
            for j, y in enumerate(grid.index):  # rows top (A = 1) to bottom (A = -1)
                for i, x in enumerate(grid.columns):
                    if np.sign(x) != np.sign(y):
                        ax.add_patch(Rectangle((i, j), 1, 1, fill=False, edgecolor="crimson", lw=0.5))
            ticks = np.arange(0, 2 * k + 1, step)
            ax.set_xticks(ticks + 0.5, [f"{values[i]:g}" for i in ticks], rotation=0)
            ax.set_yticks(ticks + 0.5, [f"{values[::-1][i]:g}" for i in ticks], rotation=0)
            ax.set_xlabel(r"$\hat{A}_t$ (exact resume, pass 1)")
            ax.set_ylabel("")
            ax.set_title(f"{title}\ndisagreements: {flips}/{n} = {100 * flips / n if n else 0:.1f}%")
            for side in ax.spines.values():
                side.set_visible(True)
        axes[0].set_ylabel(r"$\hat{A}_t$ (comparison pass)")
        cb = fig.colorbar(mpl.cm.ScalarMappable(norm=norm, cmap=cmap), ax=list(axes), shrink=0.8, pad=0.02)
        cb.set_label("pivots per cell (log scale)")
        cb.ax.yaxis.set_major_formatter(mpl.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
        problems = c["problem_id"].nunique()
        fig.suptitle(f"{label} ({problems} problems, common eligible set n={n}); red boxes = sign disagreement")
    return fig, axes


# ------------------------------------------------------------------ Figure 2

def _short_model(model) -> str:
    name = str(model).split("/")[-1]
    for suffix in ("-Instruct", "-instruct"):
        name = name.removesuffix(suffix)
    return name


def fig2_data(rows: dict) -> pd.DataFrame:
    """Figure 2's bars: per configuration its model and settings (``stats.row_meta``),
    common-set n, refeed and floor flips and rates (%), the excess (pp), whether all passes
    were identical on every channel, and the tick label drawn."""
    out = []
    for label, df in rows.items():
        meta = stats.row_meta(label, df)
        df = stats.exclude_not_exact(df)[0]
        r = stats.rates(df, "common")
        temp = meta["cont_temp"]
        settings = f"t={temp:g} K={meta['k']}" if isinstance(temp, (int, float)) else f"K={meta['k']}"
        model = _short_model(meta["model"])
        model = "" if model in label else textwrap.fill(model, 14, break_on_hyphens=True) + "\n"
        out.append({"configuration": label, "model": meta["model"], "k": meta["k"], "cont_temp": temp,
                    "n": r["n"], "refeed_flips": r["refeed"]["flips"], "floor_flips": r["floor"]["flips"],
                    "refeed_rate_pct": 100 * (r["refeed"]["rate"] or 0.0),
                    "floor_rate_pct": 100 * (r["floor"]["rate"] or 0.0),
                    "excess_pp": stats.excess_pp(r), "bitwise_identical": stats.passes_identical(df),
                    "tick_label": f"{textwrap.fill(label, 14)}\n{model}{settings}\nn={r['n']}"})
    return pd.DataFrame(out)


def fig2_configs(rows: dict):
    """Figure 2: refeed vs floor (replica) disagreement on the common set, grouped bars per
    configuration, the excess in pp above each pair; a run whose passes were identical on
    every channel is marked "0: bitwise identical". ``rows``: {label: record frame}.
    Returns (fig, ax)."""
    data = fig2_data(rows)
    long = data.melt(id_vars=["tick_label"], value_vars=["refeed_rate_pct", "floor_rate_pct"],
                     var_name="series", value_name="rate")
    long["series"] = long["series"].map({"refeed_rate_pct": "re-feed vs exact resume",
                                         "floor_rate_pct": "replica floor"})
    top = max(1.0, float(long["rate"].max()))
    with mpl.rc_context(_RC):
        fig = Figure(figsize=(DOUBLE, 3.0), layout="constrained")
        ax = fig.subplots()
        sns.barplot(long, x="tick_label", y="rate", hue="series", ax=ax, width=0.7,
                    palette=[REFEED_COLOR, FLOOR_COLOR], saturation=1)
        for i, row in data.iterrows():
            if row["bitwise_identical"]:
                text = "0: bitwise\nidentical"
            elif row["excess_pp"] is None or pd.isna(row["excess_pp"]):
                text = "-"
            else:
                text = "0 pp" if row["refeed_flips"] == row["floor_flips"] == 0 else f"{row['excess_pp']:+.1f}pp"
            ax.text(i, max(row["refeed_rate_pct"], row["floor_rate_pct"]) + 0.02 * top, text,
                    ha="center", va="bottom", fontsize=8, fontweight="bold")
        ax.set_xlabel("")
        ax.set_ylabel("estimate disagreement rate (%)")
        ax.tick_params(axis="x", labelsize=6.5, length=0)
        ax.set_ylim(0, top * 1.15)
        ax.legend(loc="upper left", frameon=False, title=None)
    return fig, ax


# ------------------------------------------------------------------ Figure 3

def fig3_data(df, invariant=None) -> pd.DataFrame:
    """Figure 3's series, one row each: the replica and refeed per-pivot max |first-token
    logprob delta| over the probe records of ``df`` (flagged records excluded), and the same
    for ``invariant`` (the batch-invariant run) if given: the runs pooled (``sources``), n,
    how many and what share are exactly 0, median, p90 and max."""
    out = []
    for prefix, frame in (("", df), ("batch-invariant ", invariant)):
        if frame is None:
            continue
        frame = stats.exclude_not_exact(frame)[0]
        sources = "+".join(dict.fromkeys(frame["source"])) if "source" in frame.columns else ""
        for series, pass_ in (("replica", "exact2"), ("refeed", "refeed")):
            d = np.sort(np.abs(stats.probe_deltas(frame, pass_)))
            zero = int(np.sum(d == 0))
            out.append({"series": prefix + series, "pass": pass_, "sources": sources, "n": len(d),
                        "exactly_zero": zero, "exactly_zero_share": zero / len(d) if len(d) else None,
                        "median": float(np.median(d)) if len(d) else None,
                        "p90": float(d[int(0.9 * len(d))]) if len(d) else None,
                        "max": float(d[-1]) if len(d) else None})
    return pd.DataFrame(out)


def fig3_logprob_ecdf(df, invariant=None, xlim=FIG3_XLIM):
    """Figure 3: ECDF (log x, % of pivots) of the per-pivot max |first-token logprob delta|
    of the greedy probes vs exact1, replica and refeed, over the records of ``df`` (the
    paper pools four runs without deduplication: pass them concatenated). Exact zeros are
    drawn at the left edge and marked with a dot, their share in the legend; ``invariant``
    (a batch-invariant run) adds a dashed line at its share exactly 0. The x range is the
    paper's (the largest deltas may lie past its right edge, as in the paper) unless the
    non-zero deltas reach below it or their 99th percentile beyond it. Returns (fig, ax)."""
    data = fig3_data(df, invariant)
    main = data[~data["series"].str.startswith("batch-invariant")]
    if not main["n"].min():
        raise ValueError("fig3_logprob_ecdf: the records carry no probe fields")
    frame = stats.exclude_not_exact(df)[0]
    deltas = {p: np.abs(stats.probe_deltas(frame, p)) for p in ("exact2", "refeed")}
    nonzero = np.concatenate([d[d > 0] for d in deltas.values()])
    lo, hi = xlim
    if len(nonzero):  # widen only for data the paper's range would hide (the top 1% may pass the edge)
        lo, hi = min(lo, nonzero.min() / 2), max(hi, float(np.quantile(nonzero, 0.99)))
    names = {"exact2": "exact replica", "refeed": "re-feed"}
    labels, long = {}, []
    for _, row in main.iterrows():
        labels[row["pass"]] = f"{names[row['pass']]} (exactly 0 at {100 * row['exactly_zero_share']:.1f}%)"
        d = deltas[row["pass"]]
        long.append(pd.DataFrame({"series": labels[row["pass"]], "delta": np.where(d == 0, lo, d)}))
    long = pd.concat(long, ignore_index=True)
    with mpl.rc_context(_RC):
        fig = Figure(figsize=(4.8, 2.9), layout="constrained")
        ax = fig.subplots()
        sns.ecdfplot(long, x="delta", hue="series", stat="percent", log_scale=True, ax=ax,
                     hue_order=[labels["exact2"], labels["refeed"]], palette=[FLOOR_COLOR, REFEED_COLOR], lw=1.5)
        for _, row in main.iterrows():
            ax.plot([lo], [100 * row["exactly_zero_share"]], "o", ms=4, clip_on=False,
                    color=FLOOR_COLOR if row["pass"] == "exact2" else REFEED_COLOR)
        inv = data[data["series"].str.startswith("batch-invariant") & (data["n"] > 0)]
        if len(inv):
            shares = sorted({round(100 * s, 1) for s in inv["exactly_zero_share"]})
            for s in shares:
                ax.axhline(s, ls="--", lw=0.8, color=INVARIANT_COLOR)
            what = f"both at {shares[0]:g}%" if len(shares) == 1 else " and ".join(f"{s:g}%" for s in shares)
            ax.text(lo * 3, shares[-1] - 1.5, f"batch-invariant kernels: {what} exactly 0",
                    color=INVARIANT_COLOR, fontsize=7, va="top")
        ax.set_xlim(lo, hi)
        ax.set_ylim(0, 102)
        ax.set_xlabel("per-pivot max |first-token logprob delta| vs exact pass 1")
        ax.set_ylabel("cumulative % of pivots")
        legend = ax.get_legend()
        legend.set_title(None)
        legend.set_frame_on(False)
        sns.move_legend(ax, "lower right", title=None, frameon=False)
    return fig, ax


# ------------------------------------------------------------------ saving and comparing

def save_figure(fig, name: str, figures_dir, data: pd.DataFrame | None = None) -> list[Path]:
    """Write ``name.pdf``, ``name.png`` (200 dpi) and, with ``data``, ``name.csv`` (the data
    the figure plots) under ``figures_dir``; returns the paths."""
    figures_dir = Path(figures_dir)
    figures_dir.mkdir(parents=True, exist_ok=True)
    paths = [figures_dir / f"{name}.pdf", figures_dir / f"{name}.png"]
    atomic_save(paths[0], lambda tmp: fig.savefig(tmp, format="pdf"))
    atomic_save(paths[1], lambda tmp: fig.savefig(tmp, format="png", dpi=200))
    if data is not None:
        paths.append(figures_dir / f"{name}.csv")
        atomic_save(paths[2], lambda tmp: data.to_csv(tmp, index=False))
    return paths


def paper_figure(name: str, dpi: int = 150):
    """The paper's own figure ``name`` (``fig1_quadrants``, ``fig2_configs`` or
    ``fig3_logprob_ecdf``), rendered from its vendored PDF with pypdfium2, as a PIL image."""
    import pypdfium2 as pdfium

    if name not in PAPER_FILES:
        raise ValueError(f"no paper figure {name!r} (one of: {', '.join(PAPER_FILES)})")
    pdf = pdfium.PdfDocument(str(PAPER_FIGURES / PAPER_FILES[name]))
    try:
        return pdf[0].render(scale=dpi / 72).to_pil()
    finally:
        pdf.close()


def side_by_side(ours_png, paper_image, width: float = 14.0):
    """A regenerated figure (PNG path) beside the paper's (``paper_figure``), for looking
    at both at once. Returns (fig, axes)."""
    from PIL import Image as PILImage

    images = [np.asarray(PILImage.open(ours_png).convert("RGB")), np.asarray(paper_image.convert("RGB"))]
    height = width / 2 * max(im.shape[0] / im.shape[1] for im in images)
    fig = Figure(figsize=(width, height + 0.4), layout="constrained")
    axes = fig.subplots(1, 2)
    for ax, im, title in zip(axes, images, ("regenerated by this package", "the paper")):
        ax.imshow(im)
        ax.set_title(title, fontsize=10)
        ax.axis("off")
    return fig, axes


def to_png(fig, dpi: int = 110) -> bytes:
    """A figure as PNG bytes, for ``IPython.display.Image`` (a bare ``Figure`` made without
    pyplot does not render in a notebook)."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    return buf.getvalue()


# ------------------------------------------------------------------ other figures

def _margin_bins(values) -> np.ndarray:
    return np.linspace(0, max(8.0, float(np.nanmax(values)) if values.size else 8.0), 60)


def margin_histogram_data(margins, threshold: float) -> pd.DataFrame:
    """Supplementary figure's bars: token counts per margin bin, and whether the bin lies
    below the pivot threshold."""
    values = np.asarray(margins, dtype=float)
    counts, edges = np.histogram(values, bins=_margin_bins(values))
    return pd.DataFrame({"bin_left": edges[:-1], "bin_right": edges[1:], "tokens": counts,
                         "below_threshold": edges[1:] <= threshold})


def margin_histogram(margins, threshold: float):
    """Supplementary: histogram of the raw top-1 minus top-2 logprob gap of every generated
    token, with the pivot threshold marked (stage 2)."""
    with mpl.rc_context(_RC):
        fig = Figure(figsize=(SINGLE, 2.2), layout="constrained")
        ax = fig.add_subplot()
        values = np.asarray(margins, dtype=float)
        sns.histplot(x=values, bins=_margin_bins(values), color=FLOOR_COLOR, ax=ax, alpha=1, linewidth=0)
        ax.axvline(threshold, color=REFEED_COLOR, lw=1)
        share = float(np.mean(values < threshold)) if values.size else 0.0
        ax.set_title(f"{share:.1%} of {values.size} tokens below the pivot threshold {threshold:g}")
        ax.set_xlabel("top-1 minus top-2 logprob")
        ax.set_ylabel("tokens")
        ax.set_yscale("log")
    return fig, ax


def fig4_passes(comparisons):
    """[ours] Figure 4: sign disagreement of every pass with exact1 (and of each replica with its
    pass), from ``stats_extras.pass_comparisons``; replicas in the floor's colour."""
    with mpl.rc_context(_RC):
        fig = Figure(figsize=(SINGLE, 2.4), layout="constrained")
        ax = fig.add_subplot()
        data = comparisons.assign(rate_pct=[100 * (r or 0.0) for r in comparisons["rate"]],
                                  label=[textwrap.fill(c, 10) for c in comparisons["comparison"]])
        colors = [FLOOR_COLOR if passes.PASSES[c.split(" vs ")[0]].group == "replica" else REFEED_COLOR
                  for c in data["comparison"]]
        sns.barplot(data, x="label", y="rate_pct", hue="label", palette=colors, legend=False, ax=ax, saturation=1)
        ax.set_xlabel("")
        ax.set_ylabel("sign disagreement (%)")
        n = int(comparisons["n"].iloc[0]) if len(comparisons) else 0
        ax.set_title(f"common set n = {n}")
    return fig, ax


# ------------------------------------------------------------------ [ours] transplants, layer profile

def fig5_transplant(table: pd.DataFrame):
    """[ours] Figure 5: sign disagreement with exact1 of the replica, refeed and the two cache
    transplants (``stats_extras.transplant``), left; right, the share of pivots whose greedy-probe
    first-token logprobs are bit-identical to exact1's and to refeed's. If the change follows
    the cache, the re-fed-KV transplant sits with refeed and the decode-KV one with exact1."""
    with mpl.rc_context(_RC):
        fig = Figure(figsize=(DOUBLE, 2.6), layout="constrained")
        left, right = fig.subplots(1, 2)
        data = table.assign(label=[passes.PASSES[p].label for p in table["pass"]],
                            rate_pct=[100 * (r or 0.0) for r in table["rate"]])
        colors = [GROUP_COLOR.get(passes.PASSES[p].group, INVARIANT_COLOR) for p in data["pass"]]
        sns.barplot(data, x="label", y="rate_pct", hue="label", palette=colors, legend=False, ax=left, saturation=1)
        left.set_xlabel("")
        left.set_ylabel("sign disagreement with exact1 (%)")
        n = int(table["n"].iloc[0]) if len(table) else 0
        left.set_title(f"common set n = {n}")
        long = pd.concat([data.assign(against="= exact1", share=[100 * (v or 0.0) for v in data["probe_equal_exact1"]]),
                          data.assign(against="= refeed", share=[100 * (v or 0.0) for v in data["probe_equal_refeed"]])])
        sns.barplot(long, x="label", y="share", hue="against", palette=[FLOOR_COLOR, REFEED_COLOR], ax=right,
                    saturation=1)
        right.set_xlabel("")
        right.set_ylabel("probe logprobs bit-identical (%)")
        right.set_ylim(0, 105)
        pivots = int(table["pivots"].iloc[0]) if len(table) else 0
        right.set_title(f"all pivots n = {pivots}")
        right.legend(title=None, frameon=False)
    return fig, (left, right)


def fig6_layer_profile(profile: pd.DataFrame):
    """[ours] Figure 6: max |decode-time - re-fed| of K (left) and V (right) per layer, median
    over pivots with the range between the 10th and 90th percentiles, at prompt positions,
    generated positions before the last, and the last prefix position (log y; zeros drawn
    at the bottom). Data: the per-pivot rows of layer_profile.parquet."""
    with mpl.rc_context(_RC):
        fig = Figure(figsize=(DOUBLE, 2.6), layout="constrained")
        axes = fig.subplots(1, 2, sharey=True)
        where = {"max_abs_diff_prompt": ("prompt positions", FLOOR_COLOR),
                 "max_abs_diff_generated": ("generated positions", INVARIANT_COLOR),
                 "max_abs_diff_last": ("last prefix position", REFEED_COLOR)}
        positive = profile[list(where)].to_numpy(float) if len(profile) else np.zeros((0, 3))
        positive = positive[positive > 0]
        floor = float(positive.min()) / 2 if len(positive) else 1e-6
        for ax, tensor in zip(axes, ("k", "v")):
            sub = profile[profile["tensor"] == tensor]
            for col, (label, color) in where.items():
                g = sub.groupby("layer")[col]
                med, lo, hi = (g.median().clip(lower=floor), g.quantile(0.1).clip(lower=floor),
                               g.quantile(0.9).clip(lower=floor))
                ax.plot(med.index, med.to_numpy(), marker="o", ms=2.5, color=color, label=label)
                ax.fill_between(med.index, lo.to_numpy(), hi.to_numpy(), color=color, alpha=0.15, lw=0)
            ax.set_yscale("log")
            ax.set_xlabel("layer")
            n = sub.groupby(["problem_id", "pivot_id"]).ngroups if len(sub) else 0
            ax.set_title(f"{tensor.upper()}: decode-time vs re-fed, n = {n} pivots")
        axes[0].set_ylabel("max |difference| (median, p10-p90)")
        axes[1].legend(frameon=False)
    return fig, axes
