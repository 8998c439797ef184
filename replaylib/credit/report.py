"""The credit tool's report page: plain HTML, every value escaped, no script and nothing loaded from elsewhere."""
from __future__ import annotations

import html
import json

import pandas as pd

from ..display.site import page, table_html

SHOWN = ["id", "position", "token_id", "alt_token_id", "margin", "margin_source", "certificate", "within_floor"]


def _share(x) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def report_html(frame: pd.DataFrame, summary: dict) -> str:
    passes = summary["settings"]["passes"]
    cols = [c for c in SHOWN if c in frame.columns] + [f"A_{p}" for p in passes if f"A_{p}" in frame.columns]
    body = [
        "<h1>Counterfactual token credit</h1>",
        f"<p>{summary['pivots']} pivots in {summary['rollouts']} rollouts; {summary['common_pivots']} common "
        f"(some pass's A &ne; 0).</p>",
        "<table><tr><th>comparison</th><th>share of common pivots whose sign of A differs from resume's</th></tr>"
        f"<tr><td>replica (the floor)</td><td>{_share(summary['floor'])}</td></tr>"
        f"<tr><td>refeed</td><td>{_share(summary['refeed'])}</td></tr></table>",
        f"<p>{summary['not_verified']} pivots whose resume could not be verified are left out.</p>"
        if summary.get("not_verified") else "",
        "<h2>The paper's claims on these pivots</h2><table><tr><th>claim</th><th>verdict</th><th>n</th>"
        "<th>number</th><th>why</th></tr>" + "".join(
            f"<tr><td>{html.escape(c)}</td><td>{html.escape(v['verdict'])}</td><td>{v['n']}</td>"
            f"<td>{html.escape(v['value'])}</td><td>{html.escape(v['why'])}</td></tr>"
            for c, v in summary["claims"].items()) + "</table>" if summary.get("claims") else "",
        "<h2>Pivots</h2>",
        table_html(frame[cols]) if len(frame) else "<p>No pivot was found.</p>",
        "<h2>Settings</h2>",
        f"<pre>{html.escape(json.dumps({k: summary[k] for k in ('settings', 'engine', 'versions')}, indent=2))}</pre>",
    ]
    return page("Counterfactual token credit", "\n".join(body))
