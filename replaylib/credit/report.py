"""The credit tool's report page: plain HTML, every value escaped (the texts are model output), no script
and nothing loaded from elsewhere. Per pivot: the decoded text before it, both arms' tokens, and each
pass's continuations with their grades."""
from __future__ import annotations

import html
import json

import pandas as pd

from ..display.site import page, table_html
from ..measure.engine import ARMS

SHOWN = ["id", "position", "token_id", "alt_token_id", "margin", "margin_source", "certificate", "within_floor"]
DETAILED = 50  # pivots shown with their texts
PREFIX_CHARS, CONTINUATION_CHARS = 400, 300
STYLE = (".text{white-space:pre-wrap;font-family:monospace;background:#f6f6f6;padding:2px 4px}"
         ".pivot{border-top:1px solid #ccc;margin-top:1em}.ok{color:#060}.no{color:#a00}")


def _share(x) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def _text(s: str, limit: int, tail: bool = False) -> str:
    """Model output, cut to limit characters (its end where tail), escaped."""
    if len(s) > limit:
        s = "…" + s[-limit:] if tail else s[:limit] + "…"
    return f'<span class="text">{html.escape(s)}</span>'


def pivot_html(row: dict, rollout, decode, passes: list[str]) -> str:
    """One pivot: the decoded prefix, the two arms' tokens, each pass's continuations and grades."""
    where = int(row["position"])
    prefix = decode(list(rollout.prompt_ids) + list(rollout.response_ids[:where]))
    arms = {"actual": int(row["token_id"]), "alt": int(row["alt_token_id"])}
    parts = [f'<div class="pivot"><h3>{html.escape(str(row["id"]))}, position {where}</h3>',
             f"<p>before the pivot: {_text(prefix, PREFIX_CHARS, tail=True)}</p>",
             "<p>" + "; ".join(f"{arm}: {_text(decode([tok]), 40)} (id {tok})" for arm, tok in arms.items()) + "</p>"]
    for name in passes:
        if f"continuations_{name}" not in row:
            continue
        conts = json.loads(row[f"continuations_{name}"])
        grades = json.loads(row[f"grades_{name}"]) if isinstance(row.get(f"grades_{name}"), str) else {}
        cells = []
        for arm in ARMS:
            for j, cont in enumerate(conts[arm]):
                grade = grades.get(arm, [None] * len(conts[arm]))[j]
                mark = {1: '<span class="ok">success</span>', 0: '<span class="no">failure</span>'}.get(grade, "-")
                cells.append(f"<tr><td>{arm}</td><td>{j}</td><td>{mark}</td>"
                             f"<td>{_text(decode([arms[arm]] + cont), CONTINUATION_CHARS)}</td></tr>")
        parts.append(f"<p>{html.escape(name)}: A = {row.get(f'A_{name}')}</p><table><tr><th>arm</th><th>k</th>"
                     f"<th>grade</th><th>forced token + continuation</th></tr>{''.join(cells)}</table>")
    return "\n".join(parts) + "</div>"


def report_html(frame: pd.DataFrame, summary: dict, rollouts: dict | None = None, decode=None) -> str:
    """The page; with rollouts (id -> rollout) and decode (ids -> text), each pivot's texts."""
    passes = summary["settings"]["passes"]
    cols = [c for c in SHOWN if c in frame.columns] + [f"A_{p}" for p in passes if f"A_{p}" in frame.columns]
    detail = []
    if rollouts is not None and decode is not None and len(frame):
        rows = frame.to_dict("records")
        detail = [f"<h2>Pivots in detail</h2><p>The first {min(DETAILED, len(rows))} of {len(rows)} pivots: the "
                  f"text before each (its last {PREFIX_CHARS} characters), both arms' tokens and every pass's "
                  f"continuations with their grades.</p>"]
        detail += [pivot_html(r, rollouts[str(r["id"])], decode, passes) for r in rows[:DETAILED]]
    body = [
        "<h1>Counterfactual token credit</h1>",
        f"<p>{summary['pivots']} pivots in {summary['rollouts']} rollouts; {summary['common_pivots']} common "
        f"(some pass's A &ne; 0).</p>",
        "".join(f"<p><b>warning</b>: {html.escape(w)}</p>" for w in summary.get("warnings", [])),
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
        *detail,
        "<h2>Settings</h2>",
        f"<pre>{html.escape(json.dumps({k: summary[k] for k in ('settings', 'engine', 'versions')}, indent=2))}</pre>",
    ]
    return page("Counterfactual token credit", "\n".join(body), STYLE)
