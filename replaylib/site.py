"""A run's report as a static site: python -m replaylib.report --html runs/<config>.

Writes site/<config>/ beside runs/ (under the same output root):
  index.html            the headline, Table 1 beside the paper's, the worked examples
                        (replaylib.examples), every figure, each stage's key numbers, the
                        parameters and the manifests (commit, versions, device)
  figures/*.png         copies of figures/<config>/*.png
  notebooks/<stage>.html each executed stage notebook, rendered by nbconvert's basic template
                        inside a page of our own
Every asset is in the folder: no script, style sheet or image is fetched from a network. Every
value read from a run (parameters, tables, runner files, notebook outputs) is escaped or
sanitized, so a run directory received from someone else cannot put script in the page; its
tokenizer is loaded only from local files.
"""
from __future__ import annotations

import html
import json
import shutil
from pathlib import Path

import pandas as pd

from . import examples
from .params import make
from .stages import RUN_ORDER
from .rundir import figures_dir, out_root, tables_dir

STYLE = """
body { font-family: system-ui, sans-serif; max-width: 72rem; margin: 2rem auto; padding: 0 1rem; color: #222; }
h1 { font-size: 1.6rem; } h2 { margin-top: 2.2rem; border-bottom: 1px solid #ccc; }
table { border-collapse: collapse; margin: .6rem 0; font-size: .9rem; }
th, td { border: 1px solid #ccc; padding: .2rem .5rem; text-align: left; vertical-align: top; }
th { background: #f3f3f3; } td { font-variant-numeric: tabular-nums; }
figure { display: inline-block; margin: .5rem 1rem .5rem 0; } figure img { max-width: 34rem; border: 1px solid #ddd; }
mark { background: #ffe08a; } .headline { font-size: 1.15rem; background: #eef5ff; padding: .7rem 1rem; }
.note { color: #666; } pre, .trunk { background: #f8f8f8; padding: .5rem; overflow-x: auto; }
"""


def page(title: str, body: str, extra_style: str = "") -> str:
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
            f"<style>{STYLE}{extra_style}</style></head><body>\n{body}\n</body></html>\n")


def table_html(df: pd.DataFrame, **kw) -> str:
    return df.to_html(index=False, border=0, na_rep="-", float_format=lambda x: f"{x:.6g}", **kw)


def render_notebook(path: Path, title: str) -> str:
    """An executed notebook as a self-contained page (code, text, tables and embedded images)."""
    import nbformat
    from nbconvert import HTMLExporter
    from pygments.formatters import HtmlFormatter
    # sanitized: a received run's notebook outputs and Markdown can hold script; rendered here they stay inert
    exporter = HTMLExporter(template_name="basic", sanitize_html=True)
    body, _ = exporter.from_notebook_node(nbformat.read(str(path), as_version=4))
    css = HtmlFormatter().get_style_defs(".highlight") + "\n.jp-OutputArea-output pre { margin: 0; }"
    back = '<p><a href="../index.html">back to the report</a></p>'
    return page(title, back + body + back, css)


def _read_json(path: Path) -> dict:
    return json.loads(path.read_text()) if path.exists() else {}


def stage_numbers(stage: str, d: Path, summary: dict | None) -> str:
    """A line of the numbers that say what a stage did, from its files."""
    m = _read_json(d / "manifest.json")
    if stage == "01_sampling":
        p = _read_json(d / "problems.json")
        acc = pd.read_csv(d / "accuracy.csv") if (d / "accuracy.csv").exists() else None
        trunks = len(pd.read_parquet(d / "trunks.parquet", columns=["kept"])) if (d / "trunks.parquet").exists() else 0
        return (f"{len(p.get('kept', []))} problems kept of {len(p.get('scanned', []))} scanned, {trunks} trunks; "
                f"trunk accuracy per scanned problem: "
                + (", ".join(f"{r.problem_id}: {r.trunk_accuracy:.2f}" for r in acc.itertuples()) if acc is not None else "-"))
    if stage == "02_pivot_mining":
        return f"{m.get('n_pivots', '-')} pivots"
    if stage == "03_three_pass_replay":
        return f"{m.get('n_records', '-')} pivot records, {m.get('flagged_not_exact', '-')} flagged as not exact"
    if stage == "05_batch_invariant":
        r = _read_json(d / "invariant.json")
        return (f"{r.get('pivots', '-')} pivots; all passes identical on every channel: {r.get('all_identical')}"
                if r else "-")
    if stage == "04_statistics" and summary:
        return examples.headline_sentence(summary["main"])
    return "-"


def build(config: str, out_dir=None, example_pivot: int | None = None) -> Path:
    """Build site/<config>/ from runs/<config>/ and the tables and figures; returns index.html."""
    root = out_root(out_dir)
    runs = root / "runs" / config
    done = [s for s in RUN_ORDER if (runs / s / "DONE").exists()]
    if not done:
        raise FileNotFoundError(f"{runs}: no finished stage; run the stages first: "
                                f"python -m replaylib.run params/{config}.yaml")
    site = root / "site" / config
    tmp = site.with_name(f".{config}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    (tmp / "figures").mkdir(parents=True)
    (tmp / "notebooks").mkdir()
    params = {}
    for s in done:
        params.update(_read_json(runs / s / "params.json").get("params", {}))
    P = make({**params, "config": config}, where=f"{runs}/*/params.json")
    if example_pivot is None:  # what the executed notebooks used (papermill records it)
        nb = runs / "03_three_pass_replay" / "03_three_pass_replay.ipynb"
        injected = json.loads(nb.read_text()).get("metadata", {}).get("papermill", {}).get("parameters", {}) \
            if nb.exists() else {}
        example_pivot = int(injected.get("example_pivot", -1))

    parts = [f"<h1>replaylib report: configuration <code>{html.escape(config)}</code></h1>",
             f'<p class="note">Built from <code>{html.escape(str(runs))}</code>. Every number below is read from '
             f"the files the stages wrote.</p>"]
    summary = None
    if "04_statistics" in done:
        summary = examples.summary_json(config, root)
        parts.append(f'<p class="headline">{html.escape(examples.headline_sentence(summary["main"]))}</p>')
        parts.append("<h2>Table 1</h2>")
        if config != examples.PAPER and examples.paper_row(root) is None:
            parts.append('<p class="note">The paper\'s row appears here once the published records are '
                         "recomputed: <code>python -m replaylib.run params/paper.yaml</code>.</p>")
        parts.append(table_html(examples.table1_beside_paper(config, root), classes="table1"))
        parts.append(f"<p>Batch-invariant: {html.escape(examples.invariant_verdict(config, root))}</p>")
        claims = examples.claims_table(config, root)
        if claims is not None:
            parts.append("<h2>The paper's claims, on this run's records</h2>")
            parts.append(table_html(claims, classes="claims"))
    parts += worked_examples(P, root, runs, done, example_pivot)

    figs = sorted(figures_dir(config, root).glob("*.png"))
    parts.append("<h2>Figures</h2>")
    for f in figs:
        shutil.copy2(f, tmp / "figures" / f.name)
        parts.append(f'<figure><img src="figures/{html.escape(f.name)}" alt="{html.escape(f.stem)}">'
                     f"<figcaption>{html.escape(f.stem)} (<code>figures/{html.escape(config)}/{html.escape(f.name)}</code>)"
                     f"</figcaption></figure>")
    if not figs:
        parts.append('<p class="note">No figure yet (the statistics stage draws them).</p>')

    rows = []
    for s in done:
        d = runs / s
        nb = d / f"{s}.ipynb"
        link = "-"
        if nb.exists():
            (tmp / "notebooks" / f"{s}.html").write_text(render_notebook(nb, f"{config}: {s}"))
            link = f'<a href="notebooks/{s}.html">{s}.ipynb</a>'
        seconds = _read_json(d / "runner.json").get("seconds", _read_json(d / "manifest.json").get("elapsed_s", "-"))
        rows.append(f"<tr><td>{s}</td><td>{html.escape(str(seconds))}</td><td>{html.escape(stage_numbers(s, d, summary))}</td>"
                    f"<td>{link}</td></tr>")
    parts.append("<h2>Stages</h2><table><tr><th>stage</th><th>seconds</th><th>what it did</th>"
                 "<th>executed notebook</th></tr>" + "".join(rows) + "</table>")

    tables = sorted(tables_dir(config, root).glob("tab*.csv"), key=lambda p: int(p.stem[3:].split("_")[0]))
    if tables:
        parts.append("<h2>All tables</h2>")
        for t in tables:
            parts.append(f"<h3>{html.escape(t.stem)}</h3>" +
                         table_html(pd.read_csv(t, dtype=str, keep_default_na=False)))

    parts.append("<h2>Parameters</h2>")
    parts.append(table_html(pd.DataFrame([{"parameter": k, "value": repr(v)} for k, v in sorted(params.items())])))
    parts.append("<h2>Manifests</h2>")
    mrows = []
    for s in done:
        m = _read_json(runs / s / "manifest.json")
        git = m.get("git", {})
        mrows.append({"stage": s, "commit": git.get("commit"), "dirty": git.get("dirty"), "started": m.get("started"),
                      "versions": ", ".join(f"{k} {v}" for k, v in m.get("versions", {}).items()),
                      "device": ", ".join(f"{k} {v}" for k, v in m.get("device", {}).items())})
    parts.append(table_html(pd.DataFrame(mrows)))
    (tmp / "index.html").write_text(page(f"replaylib: {config}", "\n".join(parts)))
    shutil.rmtree(site, ignore_errors=True)
    tmp.rename(site)
    return site / "index.html"


def worked_examples(P, root: Path, runs: Path, done: list[str], example_pivot: int) -> list[str]:
    """The notebooks' worked examples, for the stages this run has."""
    if "01_sampling" not in done:
        return []
    from . import replay, sampling
    from . import pivots as pivot_stage
    out = ["<h2>Worked examples</h2>"]
    pieces = examples.token_pieces(P.model)
    trunks, _, _ = sampling.load(P, root)
    trunk = examples.example_trunk(trunks, P.margin_threshold)
    out += ["<h3>One trunk and its margins (stage 1)</h3>", examples.trunk_html(trunk, pieces, P.margin_threshold)]
    if "02_pivot_mining" in done:
        pivots = pivot_stage.load(P, root)
        out += ["<h3>Every pivot in context (stage 2)</h3>",
                table_html(examples.pivots_in_context(pivots, trunks, pieces))]
    if "03_three_pass_replay" not in done:
        return out
    records = replay.load(P, root)
    if not len(records):
        return out + ["<p>The replay stage found no pivot to replay.</p>"]
    passes = examples.passes_of(records)
    chosen = records.iloc[examples.choose_pivot(records, example_pivot)]
    out += ["<h3>One pivot through the passes (stage 3)</h3>", examples.pivot_prefix_html(chosen, trunks, pieces),
            table_html(examples.pass_table(chosen, passes, P.k, pieces))]
    texts = examples.continuations(chosen, passes, trunks, P, root)
    out.append(table_html(texts) if texts is not None else
               '<p class="note">These records keep each arm\'s number of correct continuations, not the '
               "continuations' tokens, so their text cannot be shown.</p>")
    flips = examples.sign_changes(records)
    out += ["<h4>Where re-feed changed the sign of A and the replica did not</h4>",
            table_html(flips) if len(flips) else "<p>None in this run.</p>",
            "<h4>First-token logprob deltas of the greedy probes, against exact1</h4>",
            table_html(examples.first_token_deltas(records))]
    if "05_batch_invariant" in done:
        from . import invariant
        inv = invariant.load(P, root)
        if len(inv):
            row = inv.iloc[examples.invariant_example(inv, chosen)]
            out += ["<h3>The same pivot, batch-invariant (stage 5)</h3>",
                    f"<p>problem {row.problem_id}, rollout {row.rollout}, position {row.abs_pos}: identical in every "
                    f"pass: {examples.identical_in_every_pass(row, examples.passes_of(inv))}</p>",
                    table_html(examples.pass_table(row, examples.passes_of(inv), P.k, pieces))]
    return out

