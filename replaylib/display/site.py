"""A run's report as a static site: python -m replaylib.report --html runs/<config>.

Writes site/<config>/ beside runs/ (under the same output root):
  index.html            the headline, Table 1 beside the paper's, the worked examples
                        (replaylib.display.worked_examples), the figures, each stage's key numbers, the
                        parameters and the manifests (commit, versions, device)
  figures/*.png         copies of the figures the statistics stage's manifest lists, and the
                        margin histogram the pivot stage's notebook draws
  notebooks/<stage>.html each executed stage notebook, rendered by nbconvert's basic template
                        inside a page of our own
Only these files are written, each replacing the file of its name; anything else in site/<config>/
stays. The page shows exactly the tables and figures the finished statistics stage's manifest lists
(those changed since are named), and says which stages are unfinished.

Every page carries a Content-Security-Policy that forbids script and any load from outside the
site. Every value read from a run is type-checked and escaped, and notebooks are rendered sanitized
and without their output metadata, so a run directory received from someone else can neither run
script in the page nor make it fetch anything; its tokenizer is loaded only from local files. The site
reads only plain files of the run (a symbolic link, which could show a file from outside the run, or a
pipe or device is refused in one line naming it, unread) and bounds what it reads and copies: a table
or figure above its limit (MAX_TABLE_BYTES, MAX_FIGURE_BYTES) is left out with a note, a notebook
above MAX_NOTEBOOK_BYTES is not rendered, a JSON file above MAX_JSON_BYTES is refused.
"""
from __future__ import annotations

import contextlib
import html
import json
import numbers
import os
import re
import shutil
import stat
import tempfile
import warnings
from pathlib import Path

import pandas as pd

from ..analysis.records import check_columns
from ..core.paths import PARAMS, config_dir, figures_dir, out_root, tables_dir
from ..core.text import short
from ..runtime import outputs
from ..runtime.params import make
from ..runtime.registry import CAMPAIGN, RUN_ORDER
from ..runtime.registry import stage as stage_entry
from ..runtime.provenance import changed_outputs
from . import headline, worked_examples

STYLE = """
body { font-family: system-ui, sans-serif; max-width: 72rem; margin: 2rem auto; padding: 0 1rem; color: #222; }
h1 { font-size: 1.6rem; } h2 { margin-top: 2.2rem; border-bottom: 1px solid #ccc; }
table { border-collapse: collapse; margin: .6rem 0; font-size: .9rem; }
th, td { border: 1px solid #ccc; padding: .2rem .5rem; text-align: left; vertical-align: top; }
th { background: #f3f3f3; } td { font-variant-numeric: tabular-nums; }
figure { display: inline-block; margin: .5rem 1rem .5rem 0; } figure img { max-width: 34rem; border: 1px solid #ddd; }
mark { background: #ffe08a; } .headline { font-size: 1.15rem; background: #eef5ff; padding: .7rem 1rem; }
.note { color: #666; } .warning { background: #fff1e0; padding: .5rem 1rem; }
pre, .trunk { background: #f8f8f8; padding: .5rem; overflow-x: auto; }
"""
# what the site reads of a run and copies beside its page, at most (a received run's files can be any size)
MAX_TABLE_BYTES = 2 << 20      # a table shown in the page
MAX_FIGURE_BYTES = 16 << 20    # a figure copied beside it
MAX_NOTEBOOK_BYTES = 64 << 20  # an executed notebook rendered as a page of its own
MAX_JSON_BYTES = 16 << 20      # a stage's manifest, parameters, summary and the like

# no script at all, images from the site's folder or embedded, styles only inline: nothing from elsewhere
CSP = "default-src 'none'; img-src 'self' data:; style-src 'unsafe-inline'; base-uri 'none'; form-action 'none'"


def page(title: str, body: str, extra_style: str = "") -> str:
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
            f'<meta http-equiv="Content-Security-Policy" content="{CSP}"><title>{html.escape(title)}</title>'
            f"<style>{STYLE}{extra_style}</style></head><body>\n{body}\n</body></html>\n")


def note(text: str) -> str:
    return f'<p class="note">{html.escape(text)}.</p>'


def table_html(df: pd.DataFrame, **kw) -> str:
    return df.to_html(index=False, border=0, na_rep="-", float_format=lambda x: f"{x:.6g}", **kw)


@contextlib.contextmanager
def reading(path: Path):
    """A run file not shaped as its stage writes it (a received run's can hold anything): one line naming it."""
    try:
        yield
    except (KeyError, TypeError, AttributeError, IndexError, ValueError) as e:
        if isinstance(e, ValueError) and (str(path) in str(e) or Path(str(e).split(":", 1)[0]).is_absolute()):
            raise  # its message names its file already
        raise ValueError(f"{path}: not as its stage writes it ({type(e).__name__}: {short(str(e))}); rerun the "
                         f"stage, or leave this run out") from None


def read_notebook(path: Path):
    """An executed notebook, valid against the notebook schema, keeping only what the page shows: cell
    and output metadata go (nbconvert's template writes some of it into HTML attributes unquoted, and
    ``filenames`` would make an image load from anywhere)."""
    import nbformat
    try:
        with warnings.catch_warnings():  # a notebook without cell ids is still one (nbformat warns)
            warnings.simplefilter("ignore")
            nb = nbformat.reads(path.read_text(encoding="utf-8"), as_version=4, capture_validation_error={})
            nbformat.validate(nb)
    except (ValueError, RecursionError, UnicodeDecodeError, nbformat.ValidationError) as e:
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise ValueError(f"{path}: not a valid notebook ({short(first)}); rerun the stage, or remove the notebook "
                         f"to report the run without it") from None
    nb.metadata = nbformat.from_dict({"language_info": {"name": "python", "pygments_lexer": "ipython3"}})
    for cell in nb.cells:
        cell.metadata = nbformat.from_dict({})
        for output in cell.get("outputs", []):
            if "metadata" in output:
                output.metadata = nbformat.from_dict({})
    return nb


def render_notebook(path: Path, title: str) -> str:
    """An executed notebook as a self-contained page (code, text, tables and embedded images)."""
    from nbconvert import HTMLExporter
    from pygments.formatters import HtmlFormatter
    # sanitized: a received run's notebook outputs and Markdown can hold script; rendered here they stay inert
    exporter = HTMLExporter(template_name="basic", sanitize_html=True)
    body, _ = exporter.from_notebook_node(read_notebook(path))
    css = HtmlFormatter().get_style_defs(".highlight") + "\n.jp-OutputArea-output pre { margin: 0; }"
    back = '<p><a href="../index.html">back to the report</a></p>'
    return page(title, back + body + back, css)


def check_run_files(base: Path) -> None:
    """Refuse, in one line naming it and never reading it, an entry at or below base (one of the run's
    directories) that the site must not read: anything but a plain file or directory (a symbolic link could
    put a file from outside the run in the page; a pipe or a device reads forever), or a JSON file above
    MAX_JSON_BYTES (a stage's manifest, parameters or summary is small)."""
    entries = [base] if base.is_symlink() else \
        [Path(top, name) for top, dirs, files in os.walk(base) for name in sorted(dirs + files)]
    for path in entries:
        try:
            mode = path.lstat().st_mode
        except FileNotFoundError:
            continue  # a running stage's temporary file, renamed since it was listed
        if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
            what = "a symbolic link" if stat.S_ISLNK(mode) else "not a plain file"
            raise ValueError(f"{path}: {what}; the report site reads only the run's own plain files (stages write "
                             f"no links): replace it with the file it stands for, or remove it")
        if path.suffix == ".json" and (big := too_large(path, MAX_JSON_BYTES, "a JSON file")):
            raise ValueError(f"{big}; not what its stage writes: rerun the stage, or leave this run out")


def too_large(path: Path, limit: int, what: str = "a file") -> str | None:
    """Why a file the site would read is left out (above the limit for its kind), or None."""
    size = path.stat().st_size
    if size <= limit:
        return None
    return (f"{path}: {size / 2**20:.1f} MiB, above the report site's limit of {limit / 2**20:g} MiB for "
            f"{what}")


def _read_json(path: Path) -> dict:
    """A run's JSON file as the mapping its stage writes ({} when it is absent); otherwise one line."""
    if not path.exists():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, RecursionError) as e:
        raise ValueError(f"{path}: not readable JSON ({type(e).__name__}); rerun the stage, or leave this run "
                         f"out") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: holds a {type(data).__name__}, not the mapping its stage writes; rerun the stage")
    return data


def _value(data: dict, key: str, kinds, path: Path, default=None):
    """data[key] when it has one of the kinds (absent: default); otherwise one line naming the file and key."""
    v = data.get(key, default)
    if v is not default and (not isinstance(v, kinds) or (isinstance(v, bool) and bool not in kinds)):
        raise ValueError(f"{path}: '{key}' is {short(v)} ({type(v).__name__}), not what its stage writes; rerun "
                         f"the stage")
    return v


COUNT = (numbers.Integral,)
ACCURACY_COLUMNS = {"problem_id": "id", "trunk_accuracy": "number"}


def stage_numbers(stage: str, d: Path, summary: dict | None) -> str:
    """A line of the numbers that say what a stage did, from its files."""
    m = _read_json(d / "manifest.json")
    if stage == "01_sampling":
        p = _read_json(d / "problems.json")
        kept, scanned = (_value(p, key, (list,), d / "problems.json", []) for key in ("kept", "scanned"))
        accuracy = "-"
        if (d / "accuracy.csv").exists():
            acc = check_columns(pd.read_csv(d / "accuracy.csv"), d / "accuracy.csv", ACCURACY_COLUMNS)
            accuracy = ", ".join(f"{r.problem_id}: {r.trunk_accuracy:.2f}" for r in acc.itertuples())
        trunks = len(pd.read_parquet(d / "trunks.parquet", columns=["kept"])) if (d / "trunks.parquet").exists() else 0
        return (f"{len(kept)} problems kept of {len(scanned)} scanned, {trunks} trunks; trunk accuracy per scanned "
                f"problem: {accuracy}")
    if stage == "02_pivot_mining":
        return f"{_value(m, 'n_pivots', COUNT, d / 'manifest.json', '-')} pivots"
    if stage == "03_three_pass_replay":
        return (f"{_value(m, 'n_records', COUNT, d / 'manifest.json', '-')} pivot records, "
                f"{_value(m, 'flagged_not_exact', COUNT, d / 'manifest.json', '-')} flagged as not exact")
    if stage == "05_batch_invariant":
        r = _read_json(d / "invariant.json")
        return (f"{_value(r, 'pivots', COUNT, d / 'invariant.json', '-')} pivots; all passes identical on every "
                f"channel: {_value(r, 'all_identical', (bool,), d / 'invariant.json', '-')}" if r else "-")
    if stage == "04_statistics" and summary:
        with reading(d / "summary.json"):
            return headline.headline_sentence(summary["main"])
    return "-"


def products(runs: Path, root: Path, config: str) -> tuple[list[Path], list[Path], list[str]]:
    """The finished statistics stage's tables (tab*.csv, in their numbers' order) and figures (*.png), as its
    manifest lists them, and those of its products changed or missing since; none when it has not finished."""
    d = runs / "04_statistics"
    if not (d / "DONE").exists():
        return [], [], []
    listed = _value(_read_json(d / "manifest.json"), "products", (dict,), d / "manifest.json", {})
    own = re.compile(rf"(tables|figures)/{re.escape(config)}/\w+\.\w+")  # a forged path names nothing else
    mine = {rel: digest for rel, digest in listed.items() if own.fullmatch(rel)}
    tables = {int(m[1]): rel for rel in mine if (m := re.fullmatch(r"tables/[^/]+/tab(\d+)_\w+\.csv", rel))}
    figures = sorted(rel for rel in mine if rel.startswith("figures/") and rel.endswith(".png"))
    # a product too large to show is left out with a note, and not read to check it either
    limit = {"tables": MAX_TABLE_BYTES, "figures": MAX_FIGURE_BYTES}
    shown = {rel: digest for rel, digest in mine.items()
             if not ((root / rel).is_file() and too_large(root / rel, limit[rel.split("/")[0]]))}
    return [root / tables[n] for n in sorted(tables)], [root / rel for rel in figures], changed_outputs(root, shown)


def build(config: str, out_dir=None, example_pivot: int | None = None) -> Path:
    """Build site/<config>/ from runs/<config>/ and the products its statistics stage lists; returns index.html."""
    root = out_root(out_dir)
    runs = config_dir(config, root)
    done = [s for s in RUN_ORDER if (runs / s / "DONE").exists()]
    if not done:
        if (runs / CAMPAIGN.name).is_dir():
            raise FileNotFoundError(f"{runs}: a campaign's statistics, not a configuration's run: its tables are in "
                                    f"{tables_dir(config, root)}/ (live_vs_published.md, tab1_main.md), its figures "
                                    f"in {figures_dir(config, root)}/; the report site shows one of its "
                                    f"configurations: python -m replaylib.report --html {runs.parent}/<config>")
        params_file = f"params/{config}.yaml" if (PARAMS / f"{config}.yaml").is_file() else \
            "PARAMS.yaml (the file of this configuration)"
        raise FileNotFoundError(f"{runs}: no finished stage; run the stages first: "
                                f"python -m replaylib.run {params_file} --out {root}")
    # nothing of the run is read before its directories are known to hold only plain files
    for base in (runs, tables_dir(config, root), figures_dir(config, root), tables_dir(headline.PAPER, root)):
        check_run_files(base)
    site = root / "site" / config
    for d in (site, site / "figures", site / "notebooks"):
        if d.is_symlink():
            raise ValueError(f"{d}: a symbolic link; the report site writes only into directories of its own: "
                             f"remove the link")
    unfinished = [s for s in RUN_ORDER if (runs / s).is_dir() and s not in done]
    params = {}
    for s in done:
        recorded = _read_json(runs / s / "params.json")
        params.update(_value(recorded, "params", (dict,), runs / s / "params.json", {}))
    P = make({**params, "config": config}, where=f"{runs}/*/params.json")
    if example_pivot is None:  # what the executed notebooks used (papermill records it)
        nb = runs / "03_three_pass_replay" / "03_three_pass_replay.ipynb"
        readable = nb.exists() and not too_large(nb, MAX_NOTEBOOK_BYTES)
        with reading(nb):
            injected = json.loads(nb.read_text()).get("metadata", {}).get("papermill", {}).get("parameters", {}) \
                if readable else {}
            example_pivot = injected.get("example_pivot", -1)
        if not isinstance(example_pivot, int):
            raise ValueError(f"{nb}: parameter 'example_pivot' is {short(example_pivot)}, not an integer; rerun the "
                             f"stage")
    tables, figures, changed = products(runs, root, config)

    parts = [f"<h1>replaylib report: configuration <code>{html.escape(config)}</code></h1>",
             f'<p class="note">Built from <code>{html.escape(str(runs))}</code>. Every number below is read from '
             f"the files the stages wrote; the tables and figures are those the statistics stage's manifest "
             f"lists.</p>"]
    for s in unfinished:
        parts.append(f'<p class="warning">Stage {s} is unfinished (no DONE: interrupted, failed or running): '
                     f"nothing it wrote is shown"
                     + (", and the statistics below come from its previous run" if "04_statistics" in done else "")
                     + ".</p>")
    if changed:
        parts.append('<p class="warning">Changed since the statistics stage wrote them (their sha256 differ from '
                     "its manifest): " + ", ".join(f"<code>{html.escape(c)}</code>" for c in changed)
                     + "; rerun the stage.</p>")
    summary = None
    if "04_statistics" in done:
        summary_path = runs / "04_statistics" / "summary.json"
        summary = _read_json(summary_path)
        for t in (tables_dir(config, root) / "tab1_main.csv", tables_dir(config, root) / "tab21_claims.csv",
                  tables_dir(headline.PAPER, root) / "tab1_main.csv"):
            if t.is_file() and (big := too_large(t, MAX_TABLE_BYTES, "a table")):
                raise ValueError(f"{big}; not the table its stage writes: rerun the statistics stage, or leave this "
                                 f"run out")
        with reading(summary_path):
            parts.append(f'<p class="headline">{html.escape(headline.headline_sentence(summary["main"]))}</p>')
        parts.append("<h2>Table 1</h2>")
        if config != headline.PAPER and headline.paper_row(root) is None:
            parts.append('<p class="note">The paper\'s row appears here once the published records are '
                         "recomputed: <code>python -m replaylib.run params/paper.yaml</code>.</p>")
        with reading(runs / "04_statistics"):
            parts.append(table_html(headline.table1_beside_paper(config, root), classes="table1"))
            parts.append(f"<p>Batch-invariant: {html.escape(headline.invariant_verdict(config, root))}</p>")
            claims = headline.claims_table(config, root)
        if claims is not None:
            parts.append("<h2>The paper's claims, on this run's records</h2>")
            parts.append(table_html(claims, classes="claims"))
    with reading(runs):
        parts += worked_examples_html(P, root, runs, done, example_pivot)

    site.parent.mkdir(parents=True, exist_ok=True)
    build_dir = Path(tempfile.mkdtemp(dir=site.parent, prefix=f".{config}."))
    try:
        (build_dir / "figures").mkdir()
        (build_dir / "notebooks").mkdir()
        # the pivot stage's notebook draws the margin histogram for display (no manifest lists it)
        drawn = [root / "figures" / config / f"{name}.png" for s in done for name in stage_entry(s).figures]
        figs = sorted((f for f in drawn + figures if f.is_file()), key=lambda f: f.name)  # plain files (checked)
        parts.append("<h2>Figures</h2>")
        for f in figs:
            if big := too_large(f, MAX_FIGURE_BYTES, "a figure"):
                parts.append(note(f"{big}: not copied nor shown"))
                continue
            shutil.copyfile(f, build_dir / "figures" / f.name)
            parts.append(f'<figure><img src="figures/{html.escape(f.name)}" alt="{html.escape(f.stem)}">'
                         f"<figcaption>{html.escape(f.stem)} (<code>figures/{html.escape(config)}/"
                         f"{html.escape(f.name)}</code>)</figcaption></figure>")
        if not figs:
            parts.append('<p class="note">No figure yet (the statistics stage draws them).</p>')

        rows = []
        for s in done:
            d = runs / s
            nb = d / f"{s}.ipynb"
            link = "-"
            if nb.exists() and (big := too_large(nb, MAX_NOTEBOOK_BYTES, "a notebook")):
                link = html.escape(f"{big}: not rendered")
            elif nb.exists():
                (build_dir / "notebooks" / f"{s}.html").write_text(render_notebook(nb, f"{config}: {s}"))
                link = f'<a href="notebooks/{s}.html">{s}.ipynb</a>'
            manifest = _read_json(d / "manifest.json")
            seconds = _value(_read_json(d / "runner.json"), "seconds", (numbers.Real,), d / "runner.json",
                             _value(manifest, "elapsed_s", (numbers.Real,), d / "manifest.json", "-"))
            rows.append(f"<tr><td>{s}</td><td>{html.escape(str(seconds))}</td>"
                        f"<td>{html.escape(stage_numbers(s, d, summary))}</td><td>{link}</td></tr>")
        parts.append("<h2>Stages</h2><table><tr><th>stage</th><th>seconds</th><th>what it did</th>"
                     "<th>executed notebook</th></tr>" + "".join(rows) + "</table>")

        if tables:
            parts.append("<h2>All tables</h2>")
            for t in tables:
                if t.is_file():
                    big = too_large(t, MAX_TABLE_BYTES, "a table")
                    parts.append(f"<h3>{html.escape(t.stem)}</h3>" +
                                 (note(f"{big}: not shown") if big else table_html(headline.read_table(t))))

        parts.append("<h2>Parameters</h2>")
        parts.append(table_html(pd.DataFrame([{"parameter": k, "value": repr(v)} for k, v in sorted(params.items())])))
        parts.append("<h2>Manifests</h2>")
        parts.append(table_html(pd.DataFrame([manifest_row(s, runs / s / "manifest.json") for s in done])))
        (build_dir / "index.html").write_text(page(f"replaylib: {config}", "\n".join(parts)))
        install(build_dir, site)
    finally:
        shutil.rmtree(build_dir, ignore_errors=True)
    return site / "index.html"


def manifest_row(stage: str, path: Path) -> dict:
    """A stage's manifest as a row of the page's table (commit, dirty flag, start, versions, device)."""
    m = _read_json(path)
    git = _value(m, "git", (dict,), path, {})
    versions, device = (_value(m, key, (dict,), path, {}) for key in ("versions", "device"))
    return {"stage": stage, "commit": git.get("commit"), "dirty": git.get("dirty"), "started": m.get("started"),
            "versions": ", ".join(f"{k} {v}" for k, v in versions.items()),
            "device": ", ".join(f"{k} {v}" for k, v in device.items())}


def install(build_dir: Path, site: Path) -> None:
    """Move the built files into site/, each replacing the file of its name (a link there is replaced, not
    followed); whatever else is in site/ stays."""
    for f in sorted(build_dir.rglob("*")):
        if f.is_file():
            dest = site / f.relative_to(build_dir)
            dest.parent.mkdir(parents=True, exist_ok=True)
            os.replace(f, dest)


def worked_examples_html(P, root: Path, runs: Path, done: list[str], example_pivot: int) -> list[str]:
    """The notebooks' worked examples, for the stages this run has."""
    if "01_sampling" not in done:
        return []
    out = ["<h2>Worked examples</h2>"]
    pieces = worked_examples.token_pieces(P.model)
    trunks, _, _ = outputs.load_sampling(P, root)
    trunk = worked_examples.example_trunk(trunks, P.margin_threshold)
    out += ["<h3>One trunk and its margins (stage 1)</h3>", worked_examples.trunk_html(trunk, pieces, P.margin_threshold)]
    if "02_pivot_mining" in done:
        pivots = outputs.load_pivots(P, root)
        out += ["<h3>Every pivot in context (stage 2)</h3>",
                table_html(worked_examples.pivots_in_context(pivots, trunks, pieces))]
    if "03_three_pass_replay" not in done:
        return out
    records = outputs.load_replay(P, root)
    if not len(records):
        return out + ["<p>The replay stage found no pivot to replay.</p>"]
    passes = worked_examples.passes_of(records)
    chosen = records.iloc[worked_examples.choose_pivot(records, example_pivot)]
    out += ["<h3>One pivot through the passes (stage 3)</h3>", worked_examples.pivot_prefix_html(chosen, trunks, pieces),
            table_html(worked_examples.pass_table(chosen, passes, P.k, pieces))]
    texts = worked_examples.continuations(chosen, passes, trunks, P, root)
    out.append(table_html(texts) if texts is not None else
               '<p class="note">These records keep each arm\'s number of correct continuations, not the '
               "continuations' tokens, so their text cannot be shown.</p>")
    flips = worked_examples.sign_changes(records)
    out += ["<h4>Where re-feed changed the sign of A and the replica did not</h4>",
            table_html(flips) if len(flips) else "<p>None in this run.</p>",
            "<h4>First-token logprob deltas of the greedy probes, against exact1</h4>",
            table_html(worked_examples.first_token_deltas(records))]
    if "05_batch_invariant" in done:
        inv = outputs.load_invariant(P, root)
        if len(inv):
            row = inv.iloc[worked_examples.invariant_example(inv, chosen)]
            same = worked_examples.identical_in_every_pass(row, worked_examples.passes_of(inv))
            out += ["<h3>The same pivot, batch-invariant (stage 5)</h3>",
                    html.escape(f"problem {row.problem_id}, rollout {row.rollout}, position {row.abs_pos}: identical "
                                f"in every pass: {same}").join(("<p>", "</p>")),
                    table_html(worked_examples.pass_table(row, worked_examples.passes_of(inv), P.k, pieces))]
    return out
