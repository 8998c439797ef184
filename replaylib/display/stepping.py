"""Stepping through a stage in its notebook: its plan as a table, what a preview of one unit computed, and
whether the full run wrote the same rows for that unit. Nothing here is kept: a preview writes nothing
under the output root, and these functions only show frames (HTML strings for marked-up text)."""
from __future__ import annotations

import html

import pandas as pd

from . import worked_examples

SKIPPED = ("<p><i>No preview: <code>preview</code> is False (the runner sets it so unless it is given "
           "<code>--preview</code>); set it to True to run the first unit on its own first.</i></p>")


def plan_table(units: list, first: int = 5) -> pd.DataFrame:
    """The first units of a stage's plan: name, what it holds, its share of the progress total."""
    return pd.DataFrame([{"unit": u.name, "what": u.label, "size": u.size} for u in units[:first]],
                        columns=["unit", "what", "size"])


def plan_summary(units: list, stage: str) -> str:
    grows = " (the first batch: the screen decides the next one from what this one keeps)" \
        if stage == "01_sampling" else ""
    return f"{stage}: {len(units)} unit(s){grows}, {sum(u.size for u in units)} in all"


def _plain(value):
    """A cell as plain Python (arrays as lists, missing values as None), so that a frame in memory and the
    same frame read back from Parquet compare equal."""
    if hasattr(value, "tolist"):
        value = value.tolist()
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if value is None or value is pd.NA or (isinstance(value, float) and value != value):
        return None
    return value


def rows_of(frame: pd.DataFrame) -> list[list]:
    return [[_plain(v) for v in row] for row in frame.itertuples(index=False)]


def same_rows(preview: pd.DataFrame | None, full: pd.DataFrame, keys: list[str]) -> bool | None:
    """Whether the full run's rows for the previewed unit (matched on ``keys``, in the preview's columns and
    order) equal the preview's, value for value; None without a preview."""
    if preview is None:
        return None
    chosen = full.merge(preview[keys].drop_duplicates(), on=keys)[list(preview.columns)]
    return len(chosen) == len(preview) and rows_of(chosen) == rows_of(preview)


def agreement(preview: pd.DataFrame | None, full: pd.DataFrame, keys: list[str]) -> str:
    """same_rows, as a sentence."""
    same = same_rows(preview, full, keys)
    if same is None:
        return "No preview to compare (preview = False)."
    return ("The full run's rows for the previewed unit equal the preview's, value for value." if same else
            "The full run's rows for the previewed unit DIFFER from the preview's.")


def trunks_preview(first: pd.DataFrame | None) -> str:
    """A sampling preview: each trunk's problem, rollout, length, grade, how it ended and its text's start."""
    if first is None:
        return SKIPPED
    shown = first[["problem_id", "rollout", "n_tokens", "correct", "finish_reason"]].copy()
    shown["text"] = [t[:120] + ("…" if len(t) > 120 else "") for t in first["text"]]
    return shown.to_html(index=False)


def table_preview(first: pd.DataFrame | None, rows: int = 10) -> str:
    """The first rows of a preview's frame (HTML)."""
    return SKIPPED if first is None else first.head(rows).to_html(index=False)


def replay_preview(first: pd.DataFrame | None, params, trunks: pd.DataFrame, out_dir=None) -> str:
    """A replay preview's first pivot: its prefix and both arms, each pass's wins, A and probes, and each pass's
    continuations with their grades (HTML)."""
    if first is None:
        return SKIPPED
    pieces = worked_examples.token_pieces(params.model)
    pivot = first.iloc[0]
    passes = worked_examples.passes_of(first)
    parts = [worked_examples.pivot_prefix_html(pivot, trunks, pieces),
             worked_examples.pass_table(pivot, passes, params.k, pieces).to_html(index=False)]
    texts = worked_examples.continuations(pivot, passes, trunks, params, out_dir)
    if texts is not None:
        parts += ["<p>" + html.escape("Each pass's continuations, with their grade R:") + "</p>",
                  texts.to_html(index=False)]
    return "\n".join(parts)
