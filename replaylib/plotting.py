"""Figures of the paper (PROTOCOL.md section 5), drawn with matplotlib.

Figures are plain ``matplotlib.figure.Figure`` objects (no pyplot state, never shown),
sized for a two-column paper: 7 in wide (double column) or 3.4 in (single column),
fonts 7-8 pt. ``save_figure`` writes PDF and PNG.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import matplotlib as mpl
import numpy as np
from matplotlib.colors import LogNorm
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from replaylib import stats

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
FLOOR_COLOR = "#5d6d7e"


def infer_k(df) -> int:
    """K of a run: the published config's ``k`` when the records carry one, else the
    smallest K <= 64 that puts every A on the grid of steps 1/K."""
    ks = {c.get("k") for c in df.attrs.get("configs", {}).values() if c and c.get("k")}
    if len(ks) == 1:
        return int(ks.pop())
    a = np.concatenate([df[f"A_{p}"].to_numpy(float) for p in ("exact1", "exact2", "refeed")])
    for k in range(1, 65):
        if np.all(np.abs(a * k - np.round(a * k)) < 1e-6):
            return k
    raise ValueError("cannot infer K from the A values; pass k= explicitly")


def _counts(x, y, k):
    ix = np.round((np.asarray(x) + 1) * k).astype(int)
    iy = np.round((np.asarray(y) + 1) * k).astype(int)
    grid = np.zeros((2 * k + 1, 2 * k + 1), dtype=int)
    np.add.at(grid, (iy, ix), 1)
    return grid


def fig1_quadrants(df, k: int | None = None):
    """Figure 1: count heatmaps (log colour) of A_exact1 (x) against A_refeed and against
    A_exact2 (y) over the common set, on the (2K+1) x (2K+1) grid of values -1..1 in
    steps 1/K; non-empty sign-disagreement cells outlined. Returns (fig, axes)."""
    k = k or infer_k(df)
    c = stats.common_set(stats.exclude_not_exact(df)[0])
    grids = [_counts(c["A_exact1"], c["A_refeed"], k), _counts(c["A_exact1"], c["A_exact2"], k)]
    vmax = max(1, max(int(g.max()) for g in grids))
    norm = LogNorm(vmin=1, vmax=vmax)
    cmap = mpl.colormaps["Blues"].with_extremes(bad="white")
    values = np.linspace(-1, 1, 2 * k + 1)
    signs = np.sign(values)
    step = max(1, k // 2)
    with mpl.rc_context(_RC):
        fig = Figure(figsize=(DOUBLE, 3.3), layout="constrained")
        axes = fig.subplots(1, 2)
        for ax, grid, ylabel, title in zip(
            axes, grids, ["$A_{refeed}$", "$A_{exact2}$ (replica)"],
            ["re-fed prefix vs exact resume", "replica vs exact resume (noise floor)"],
        ):
            img = ax.imshow(np.ma.masked_equal(grid, 0), origin="lower", cmap=cmap, norm=norm,
                            extent=(-0.5, 2 * k + 0.5, -0.5, 2 * k + 0.5))
            for iy in range(2 * k + 1):
                for ix in range(2 * k + 1):
                    n = grid[iy, ix]
                    if n and signs[ix] != signs[iy]:
                        ax.add_patch(Rectangle((ix - 0.44, iy - 0.44), 0.88, 0.88, fill=False,
                                               edgecolor=REFEED_COLOR, linewidth=1.0))
                    if n and k <= 4:
                        dark = norm(n) > 0.6
                        ax.text(ix, iy, str(n), ha="center", va="center", fontsize=7,
                                color="white" if dark else "black")
            ticks = np.arange(0, 2 * k + 1, step)
            ax.set_xticks(ticks, [f"{values[i]:g}" for i in ticks])
            ax.set_yticks(ticks, [f"{values[i]:g}" for i in ticks])
            ax.set_xlabel("$A_{exact1}$ (resumed decode-time state)")
            ax.set_ylabel(ylabel)
            ax.set_title(title)
            ax.axhline(k, color="0.6", lw=0.5, zorder=0)
            ax.axvline(k, color="0.6", lw=0.5, zorder=0)
            ax.spines[["top", "right"]].set_visible(True)
        cb = fig.colorbar(img, ax=list(axes), shrink=0.85, pad=0.02)
        cb.set_label(f"pivots (common set, n = {len(c)}; log scale)")
        cb.ax.yaxis.set_major_formatter(mpl.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
        axes[0].text(0.98, 0.03, "outlined: sign differs\nfrom $A_{exact1}$", transform=axes[0].transAxes,
                     ha="right", va="bottom", fontsize=7, color=REFEED_COLOR)
    return fig, axes


def fig2_configs(rows: dict):
    """Figure 2: refeed vs floor (replica) disagreement on the common set, one bar pair per
    configuration, annotated with the excess in pp (a batch-invariant run shows zero
    bars). ``rows``: {label: record frame}. Returns (fig, ax)."""
    labels, ref, flo, exc = [], [], [], []
    for label, df in rows.items():
        r = stats.rates(stats.exclude_not_exact(df)[0], "common")
        labels.append(label)
        ref.append(100 * (r["refeed"]["rate"] or 0.0))
        flo.append(100 * (r["floor"]["rate"] or 0.0))
        exc.append(stats.excess_pp(r))
    x = np.arange(len(labels))
    w = 0.38
    with mpl.rc_context(_RC):
        fig = Figure(figsize=(DOUBLE, 2.6), layout="constrained")
        ax = fig.subplots()
        ax.bar(x - w / 2, ref, w, color=REFEED_COLOR, label="refeed vs exact1")
        ax.bar(x + w / 2, flo, w, color=FLOOR_COLOR, label="replica vs exact1 (floor)")
        top = max(ref + flo + [1.0])
        for xi, r_, f_, e in zip(x, ref, flo, exc):
            text = "-" if e is None else ("0 pp" if r_ == f_ == 0 else f"{e:+.1f} pp")
            ax.text(xi, max(r_, f_) + 0.03 * top, text, ha="center", va="bottom", fontsize=7)
        ax.set_xticks(x, [textwrap.fill(lab, 12, break_long_words=False) for lab in labels])
        ax.set_ylabel("sign disagreement (%)")
        ax.set_ylim(0, top * 1.18)
        ax.legend(loc="upper left", frameon=False, ncols=2)
    return fig, ax


def fig3_logprob_ecdf(df):
    """Figure 3: ECDF (log x) of the per-pivot max first-token logprob delta of the greedy
    probes vs exact1, replica and refeed; the share exactly zero (bit-exact) is where each
    curve starts at the left edge and is given in the legend. Returns (fig, ax)."""
    df = stats.exclude_not_exact(df)[0]
    sides = [("replica", "exact2", FLOOR_COLOR), ("refeed", "refeed", REFEED_COLOR)]
    deltas = {name: np.sort(np.abs(stats.probe_deltas(df, p))) for name, p, _ in sides}
    if not len(deltas["refeed"]):
        raise ValueError("fig3_logprob_ecdf: the records carry no probe fields")
    nonzero = np.concatenate([d[d > 0] for d in deltas.values()])
    lo = nonzero.min() / 2 if len(nonzero) else 1e-6
    hi = nonzero.max() * 2 if len(nonzero) else 1.0
    with mpl.rc_context(_RC):
        fig = Figure(figsize=(SINGLE, 2.5), layout="constrained")
        ax = fig.subplots()
        for name, _, color in sides:
            d = deltas[name]
            n = len(d)
            zero = int(np.sum(d == 0))
            nz = d[d > 0]
            xs = np.concatenate([[lo], nz, [hi]])
            ys = np.concatenate([[zero / n], (zero + np.arange(1, len(nz) + 1)) / n, [1.0]])
            ax.step(xs, ys, where="post", color=color, lw=1.2,
                    label=f"{name}: {100 * zero / n:.1f}% exactly 0")
            ax.plot([lo], [zero / n], marker="o", ms=4, color=color, clip_on=False)
        ax.set_xscale("log")
        ax.set_xlim(lo, hi)
        ax.set_ylim(0, 1.02)
        ax.set_xlabel("max |first-token logprob delta| vs exact1")
        ax.set_ylabel("share of pivots (ECDF)")
        ax.legend(loc="lower right", frameon=False)
        ax.text(0.02, 0.98, "dots: share bit-exact (delta = 0)", transform=ax.transAxes,
                ha="left", va="top", fontsize=7, color="0.3")
    return fig, ax


def save_figure(fig, name: str, figures_dir) -> list[Path]:
    """Write ``name.pdf`` and ``name.png`` (200 dpi) under ``figures_dir``; returns paths."""
    figures_dir = Path(figures_dir)
    figures_dir.mkdir(parents=True, exist_ok=True)
    paths = [figures_dir / f"{name}.pdf", figures_dir / f"{name}.png"]
    fig.savefig(paths[0])
    fig.savefig(paths[1], dpi=200)
    return paths


def margin_histogram(margins, threshold: float):
    """Supplementary: histogram of the raw top-1 minus top-2 logprob gap of every generated
    token, with the pivot threshold marked (stage 2)."""
    with mpl.rc_context(_RC):
        fig = Figure(figsize=(SINGLE, 2.2), layout="constrained")
        ax = fig.add_subplot()
        values = np.asarray(margins, dtype=float)
        ax.hist(values, bins=np.linspace(0, max(8.0, float(np.nanmax(values)) if values.size else 8.0), 60),
                color=FLOOR_COLOR)
        ax.axvline(threshold, color=REFEED_COLOR, lw=1)
        share = float(np.mean(values < threshold)) if values.size else 0.0
        ax.set_title(f"{share:.1%} of {values.size} tokens below the pivot threshold {threshold:g}")
        ax.set_xlabel("top-1 minus top-2 logprob")
        ax.set_ylabel("tokens")
        ax.set_yscale("log")
    return fig, ax


def fig4_passes(comparisons):
    """[ours] Figure 4: sign disagreement of every pass with exact1 (and of refeed with its
    replica refeed2), from ``stats.pass_comparisons``."""
    with mpl.rc_context(_RC):
        fig = Figure(figsize=(SINGLE, 2.4), layout="constrained")
        ax = fig.add_subplot()
        rates = [100 * (r or 0.0) for r in comparisons["rate"]]
        colors = [FLOOR_COLOR if c.startswith(("exact2", "refeed2")) else REFEED_COLOR for c in comparisons["comparison"]]
        ax.bar(range(len(rates)), rates, color=colors)
        ax.set_xticks(range(len(rates)), [textwrap.fill(c, 10) for c in comparisons["comparison"]])
        ax.set_ylabel("sign disagreement (%)")
        n = int(comparisons["n"].iloc[0]) if len(comparisons) else 0
        ax.set_title(f"common set n = {n}")
    return fig, ax
