"""Stepping through a stage in its notebook: its plan as a table, what a preview of one unit computed, whether
the full run wrote the same rows for that unit, and where the results are and which notebook comes next.
Nothing here is kept: a preview writes nothing under the output root, and these functions only show frames
(HTML or Markdown strings for marked-up text)."""
from __future__ import annotations

import html
import json
from pathlib import Path

import pandas as pd

from ..core.paths import REPO, figures_dir, stage_dir, tables_dir
from ..runtime.registry import RUN_ORDER
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
    """A cell as plain Python (arrays as lists, missing values as None, JSON text as its value), so that a frame
    in memory and the same rows read back through the notebooks' loaders compare equal: Parquet gives arrays,
    and replaylib.analysis.records parses the JSON text the stages write (the greedy probes) into objects."""
    if isinstance(value, str) and value[:1] in ("{", "["):
        try:
            value = json.loads(value)
        except ValueError:
            pass
    if hasattr(value, "tolist"):
        value = value.tolist()
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
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


def stale(preview: pd.DataFrame | None, params) -> str | None:
    """Why a preview cannot be compared with the records of ``params``: it was made with other values (the
    parameters cell changed after the preview cell ran), as a sentence naming them; None when it can."""
    made = None if preview is None else preview.attrs.get("preview")
    if not made or made["key"] == params.stage_key(made["stage"]):
        return None
    values = made.get("values", {})
    differ = [k for k, v in values.items() if getattr(params, k, None) != v]
    if not differ:  # the same values over other inputs (the task's data file)
        return "The preview was made from other inputs than these records: run the preview cell again to compare."
    return (f"The preview was made with {', '.join(f'{k} = {values[k]!r}' for k in differ)}; these records with "
            f"{', '.join(f'{k} = {getattr(params, k, None)!r}' for k in differ)}: run the preview cell again to "
            f"compare.")


def agreement(preview: pd.DataFrame | None, full: pd.DataFrame, keys: list[str], params) -> str:
    """same_rows, as a sentence; a preview made with other values than ``params`` is named stale instead."""
    same = same_rows(preview, full, keys)
    if same is None:
        return "No preview to compare (preview = False)."
    why = stale(preview, params)
    if why:
        return why
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


def pivots_preview(first: pd.DataFrame | None, params, trunks: pd.DataFrame, rows: int = 10) -> str:
    """A mining preview's first pivots: the text just before each, the actual and the alternative token decoded
    with their raw logprobs, and the margin (HTML)."""
    if first is None:
        return SKIPPED
    shown = worked_examples.pivots_in_context(first.head(rows), trunks, worked_examples.token_pieces(params.model))
    shown = shown.drop(columns="after (as sampled)").to_html(index=False)
    return shown + (f"<p>The first {rows} of {len(first)} pivots.</p>" if len(first) > rows else "")


# what the passes of the batch-invariant stage are compared on beside A, per pass against exact1 (records
# columns of replaylib.measure.replay.pivot_record)
CHANNELS = {"probe tokens differ": "greedy_divergence_{}", "probe 1st logprob delta": "greedy_first_logprob_delta_{}",
            "continuations differing": "cont_diff_{}"}


def invariant_preview(first: pd.DataFrame | None) -> str:
    """A batch-invariant preview, per pivot: problem, rollout, position, each pass's A, and only the channels on
    which some pass differs from exact1; led by a line saying whether every pass was identical (HTML)."""
    if first is None:
        return SKIPPED
    passes = worked_examples.passes_of(first)
    others = [p for p in passes if p != "exact1"]
    shown = first[["problem_id", "rollout", "abs_pos"] + [f"A_{p}" for p in passes]].rename(
        columns={"abs_pos": "position"})
    differ = []
    for label, column in CHANNELS.items():
        values = {p: first[column.format(p)] for p in others}
        if any(v.astype(float).fillna(0).ne(0).any() for v in values.values()):
            differ.append(label)
            shown = shown.assign(**{f"{label}, {p}": v for p, v in values.items()})
    identical = sum(worked_examples.identical_in_every_pass(r, passes) for _, r in first.iterrows())
    line = (f"All passes identical at every pivot ({identical} of {len(first)}): estimates, probe tokens, probe "
            f"logprobs and continuations." if identical == len(first) else
            f"Passes differ at {len(first) - identical} of {len(first)} pivots"
            + (f", on: {', '.join(differ)}." if differ else ", on the estimates A."))
    return f"<p>{html.escape(line)}</p>" + shown.to_html(index=False)


def replay_preview(first: pd.DataFrame | None, params, trunks: pd.DataFrame, out_dir=None, pivot: int = 0) -> str:
    """A replay preview's pivot (``pivot``: a row of its records): its prefix and both arms, each pass's wins, A
    and probes, and each pass's continuations with their grades (HTML)."""
    if first is None:
        return SKIPPED
    if not 0 <= pivot < len(first):
        raise ValueError(f"pivot {pivot} is not a row of the preview's records (0 to {len(first) - 1}); pick one "
                         f"in that range")
    pieces = worked_examples.token_pieces(params.model)
    record = first.iloc[pivot]
    passes = worked_examples.passes_of(first)
    parts = [worked_examples.pivot_prefix_html(record, trunks, pieces),
             worked_examples.pass_table(record, passes, params.k, pieces).to_html(index=False)]
    texts = worked_examples.continuations(record, passes, trunks, params, out_dir)
    if texts is not None:
        parts += ["<p>" + html.escape("Each pass's continuations, with their grade R:") + "</p>",
                  texts.to_html(index=False)]
    return "\n".join(parts)


def _where(path: Path) -> str:
    """A path as the notebook's reader finds it: from the repository root when inside it."""
    return str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(path)


def next_step(params, stage: str, out_dir=None) -> str:
    """Where this stage's results are and which notebook comes next, with the config to give it (Markdown)."""
    where = f"This stage's results are in `{_where(stage_dir(params.config, stage, out_dir))}/`"
    if stage == "04_statistics":
        where += (f", its tables in `{_where(tables_dir(params.config, out_dir))}/` and its figures in "
                  f"`{_where(figures_dir(params.config, out_dir))}/`")
    later = RUN_ORDER[RUN_ORDER.index(stage) + 1:]
    if not later:
        run = _where(stage_dir(params.config, stage, out_dir).parent)
        return where + f". This is the last stage; the run's report site: `python -m replaylib.report --html {run}`."
    return (where + f". Next: `notebooks/{later[0]}.ipynb`, with `config = '{params.config}'` in its parameters "
                    f"cell.")
