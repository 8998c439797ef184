"""Worked examples: what each stage measured, on one trunk and one pivot, read from the stage files.

The stage notebooks show them near their top and the report page (replaylib.display.site) embeds the
same functions' output. Tables come back as DataFrames, marked-up text as HTML strings
(`display(HTML(...))` in a notebook). Nothing here computes a statistic: every number is read
from files the stages wrote (trunks, pivots, records, summary.json, tab1_main.csv).
"""
from __future__ import annotations

import html
import json
from pathlib import Path

import pandas as pd


CONTINUATIONS = "continuations_{}"  # optional records column: JSON {arm: [[token ids] x K]} per pass


# ---------------------------------------------------------------- headline (stage 4, runner, report)


TABLE1_SHORT = ["configuration", "n (common)", "refeed (polarity)", "floor (polarity)", "excess pp", "t_clust"]


# ---------------------------------------------------------------- tokens as text
def _local_model_dir(model: str) -> Path | None:
    """The run's model directory on this machine (the embedded or tiny model, a local directory), or None: a
    hub id in a run's parameters (perhaps a run received from someone else) is never fetched."""
    try:
        from ..measure.models import resolve_model
        if not (model.startswith(("embedded:", "tiny")) or Path(model).is_dir()):
            return None
        path = Path(resolve_model(model))
        return path if path.is_dir() else None
    except Exception:  # the page shows token ids instead
        return None


def tokenizer(model: str, path: Path | None = None):
    """The run's tokenizer from files on this machine (``_local_model_dir``, or ``path`` already found), or
    None: the page shows token ids instead."""
    path = path or _local_model_dir(model)
    if path is None:
        return None
    try:
        from transformers import AutoTokenizer
        return AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    except Exception:  # the page shows token ids instead
        return None


def token_pieces(model: str):
    """A function ids -> list of token texts, from the run's tokenizer; token ids as <id> when it is unavailable."""
    path = _local_model_dir(model)
    light = _tokenizer_file(path) if path is not None else None
    if light is not None:
        return lambda ids: [light.decode([int(i)], skip_special_tokens=False) for i in ids]
    tok = tokenizer(model, path) if path is not None else None
    if tok is None:
        return lambda ids: [f"<{int(i)}>" for i in ids]
    return lambda ids: [tok.decode([int(i)]) for i in ids]


def _tokenizer_file(path: Path):
    """The model directory's tokenizer.json read by the tokenizers library, which decodes a token as
    transformers' fast tokenizer does where that one cleans up no spaces; None otherwise (transformers then,
    whose import a notebook that shows token pieces and computes nothing need not pay)."""
    try:
        from tokenizers import Tokenizer
        config = json.loads((path / "tokenizer_config.json").read_text())
        if config.get("clean_up_tokenization_spaces", False) is not False:
            return None
        return Tokenizer.from_file(str(path / "tokenizer.json"))
    except Exception:  # transformers' tokenizer, or token ids
        return None


def _json(value):
    """A JSON-text column as stored in Parquet, or already parsed (replaylib.analysis.records.load_records)."""
    return json.loads(value) if isinstance(value, (str, bytes)) else value


def _trunk_of(record, trunks: pd.DataFrame) -> pd.Series:
    return trunks[(trunks.problem_id == record.problem_id) & (trunks.rollout == record.rollout)].iloc[0]


def _forced(trunk: pd.Series, i: int) -> dict:
    """The two arms' tokens at generated index i: the sampled one and the most likely other (stage 2's rule)."""
    return {"actual": int(trunk.gen_ids[i]), "alt": int(next(x for x in trunk.topk_ids[i] if x != trunk.gen_ids[i]))}


def _with_logprob(text: str, token: int, logprobs: dict) -> str:
    return f"{text!r} ({logprobs[token]:.3f})" if token in logprobs else f"{text!r} (not in the top-{len(logprobs)})"


def _sign(x: float) -> int:
    return int(x > 0) - int(x < 0)


# ---------------------------------------------------------------- stage 1: one trunk
def example_trunk(trunks: pd.DataFrame, threshold: float) -> pd.Series:
    """The first kept trunk with a token below the margin threshold (else the first trunk)."""
    for _, t in trunks.iterrows():
        if any(len(lp) >= 2 and lp[0] - lp[1] < threshold for lp in t.topk_logprobs):
            return t
    return trunks.iloc[0]


def trunk_margins(trunk: pd.Series, pieces) -> pd.DataFrame:
    """Per generated token: its text, the raw top-1 and top-2 tokens with logprobs, and their margin."""
    gen = list(trunk.gen_ids)
    text = pieces(gen)
    rows = []
    for i, (ids, lps) in enumerate(zip(trunk.topk_ids, trunk.topk_logprobs)):
        if len(lps) < 2:
            continue
        top = pieces([ids[0], ids[1]])
        rows.append({"gen_index": i, "token": text[i], "top1": top[0], "top1_logprob": lps[0],
                     "top2": top[1], "top2_logprob": lps[1], "margin": lps[0] - lps[1]})
    return pd.DataFrame(rows)


def trunk_html(trunk: pd.Series, pieces, threshold: float) -> str:
    """The trunk's text, each token below the margin threshold marked (hover: top-1/top-2 and margin)."""
    margins = trunk_margins(trunk, pieces).set_index("gen_index")
    out = []
    for i, piece in enumerate(pieces(list(trunk.gen_ids))):
        if i in margins.index and margins.at[i, "margin"] < threshold:
            m = margins.loc[i]
            tip = (f"top-1 {m.top1!r} {m.top1_logprob:.3f}, top-2 {m.top2!r} {m.top2_logprob:.3f}, "
                   f"margin {m.margin:.3f}")
            out.append(f'<mark title="{html.escape(tip)}">{html.escape(piece)}</mark>')
        else:
            out.append(html.escape(piece))
    n_low = int((margins.margin < threshold).sum()) if len(margins) else 0
    head = "<p>" + html.escape(f"problem {trunk.problem_id}, rollout {trunk.rollout}, {len(trunk.gen_ids)} tokens, "
                               f"{'correct' if trunk.correct else 'wrong'}; {n_low} tokens with a top-1/top-2 "
                               f"margin below {threshold} are marked.") + "</p>"
    return head + '<div class="trunk" style="white-space: pre-wrap; font-family: monospace">' + "".join(out) + "</div>"


# ---------------------------------------------------------------- stage 2: pivots in context
def pivots_in_context(pivots: pd.DataFrame, trunks: pd.DataFrame, pieces, before: int = 12,
                      after: int = 6) -> pd.DataFrame:
    """Each pivot with the text around it and both arms' tokens and raw logprobs."""
    by = {(t.problem_id, t.rollout): t for t in trunks.itertuples(index=False)}
    rows = []
    for p in pivots.itertuples(index=False):
        t = by[(p.problem_id, p.rollout)]
        gen, i = list(t.gen_ids), int(p.gen_index)
        lp = dict(zip(list(t.topk_ids[i]), list(t.topk_logprobs[i])))
        actual, alt = pieces([p.actual, p.alt])
        rows.append({"problem_id": p.problem_id, "rollout": p.rollout, "gen_index": i, "margin": p.margin,
                     "before": "".join(pieces((list(t.prompt_ids) + gen[:i])[-before:])),
                     "actual": _with_logprob(actual, p.actual, lp), "alternative": _with_logprob(alt, p.alt, lp),
                     "after (as sampled)": "".join(pieces(gen[i + 1:i + 1 + after]))})
    return pd.DataFrame(rows)


# ---------------------------------------------------------------- stage 3: one pivot through the passes
def passes_of(records: pd.DataFrame) -> list[str]:
    return [c[2:] for c in records.columns if c.startswith("A_")]


def choose_pivot(records: pd.DataFrame, example_pivot: int = -1) -> int:
    """Row of the records to show: example_pivot when it is one, else the first where re-feed
    changed the sign of A (exact1 vs refeed), else the first."""
    if 0 <= example_pivot < len(records):
        return example_pivot
    flips = [i for i, r in enumerate(records.itertuples(index=False)) if _sign(r.A_refeed) != _sign(r.A_exact1)]
    return flips[0] if flips else 0


def pass_table(record: pd.Series, passes: list[str], k: int, pieces) -> pd.DataFrame:
    """One pivot in every pass: wins of each arm out of K, A, its sign against exact1, the probes' first tokens."""
    rows = []
    for name in passes:
        probe = _json(record[f"greedy_first_{name}"])
        a_tok, alt_tok = pieces([probe["actual"][0], probe["alt"][0]])
        rows.append({"pass": name, "wins actual": f"{record[f'wins_{name}_actual']}/{k}",
                     "wins alt": f"{record[f'wins_{name}_alt']}/{k}", "A": record[f"A_{name}"],
                     "sign as exact1": _sign(record[f"A_{name}"]) == _sign(record["A_exact1"]),
                     "probe 1st token, actual arm": f"{a_tok!r} ({probe['actual'][1]:.6f})",
                     "probe 1st token, alt arm": f"{alt_tok!r} ({probe['alt'][1]:.6f})"})
    return pd.DataFrame(rows)


def pivot_prefix_html(record: pd.Series, trunks: pd.DataFrame, pieces, context: int = 40) -> str:
    """The last tokens of the prefix, then the actual and the alternative token at the pivot with their logprobs."""
    t = _trunk_of(record, trunks)
    i, gen = int(record.gen_index), list(t.gen_ids)
    lp = dict(zip(list(t.topk_ids[i]), list(t.topk_logprobs[i])))
    forced = _forced(t, i)
    a_text, alt_text = pieces([forced["actual"], forced["alt"]])
    prefix = "".join(pieces((list(t.prompt_ids) + gen[:i])[-context:]))
    return ("<p>" + html.escape(f"problem {record.problem_id}, rollout {record.rollout}, generated token {i} "
                                f"(absolute position {record.abs_pos}), margin {record.margin:.3f}; the prefix "
                                f"ends:") + "</p>"
            f'<div class="trunk" style="white-space: pre-wrap; font-family: monospace">…{html.escape(prefix)}'
            f"<mark>[actual {html.escape(_with_logprob(a_text, forced['actual'], lp))} | alternative "
            f"{html.escape(_with_logprob(alt_text, forced['alt'], lp))}]</mark></div>")


def continuations(record: pd.Series, passes: list[str], trunks: pd.DataFrame, params, out_dir=None
                  ) -> pd.DataFrame | None:
    """Each pass's K continuations per arm as text with their grades, when the records keep their token
    ids (column continuations_<pass>: JSON {arm: [[ids] x K]}); None when they do not."""
    if not all(CONTINUATIONS.format(p) in record.index for p in passes):
        return None
    from ..measure.grading import grade
    tok = tokenizer(params.model)
    decode = (lambda ids: tok.decode(ids, skip_special_tokens=True)) if tok else (lambda ids: str(list(ids)))
    gold = gold_of(params, out_dir, int(record.problem_id))
    t = _trunk_of(record, trunks)
    gen, i = list(t.gen_ids), int(record.gen_index)
    forced = _forced(t, i)
    rows = []
    for name in passes:
        conts = _json(record[CONTINUATIONS.format(name)])
        for arm in ("actual", "alt"):
            for k, cont in enumerate(conts[arm]):
                rows.append({"pass": name, "arm": arm, "k": k, "continuation": decode([forced[arm]] + cont),
                             "R": int(grade(decode(gen[:i] + [forced[arm]] + cont), gold, params.task))})
    return pd.DataFrame(rows)


def sign_changes(records: pd.DataFrame) -> pd.DataFrame:
    """Pivots where re-feed changed the sign of A and the replica (exact2) did not."""
    keep = [(_sign(r.A_refeed) != _sign(r.A_exact1)) and (_sign(r.A_exact2) == _sign(r.A_exact1))
            for r in records.itertuples(index=False)]
    cols = ["problem_id", "rollout", "abs_pos", "margin", "A_exact1", "A_exact2", "A_refeed"]
    return records.loc[keep, cols].reset_index(drop=True)


def first_token_deltas(records: pd.DataFrame) -> pd.DataFrame:
    """Per pass against exact1: the largest |first-token logprob delta| of the greedy probes, per pivot."""
    cols = [c for c in records.columns if c.startswith("greedy_first_logprob_delta_")]
    out = records[["problem_id", "rollout", "abs_pos"] + cols].copy()
    return out.rename(columns={c: c.replace("greedy_first_logprob_delta_", "delta ") for c in cols})


def replay_records(params, out_dir=None) -> pd.DataFrame | None:
    """Stage 3's records when it has finished, else None (the batch-invariant stage can run beside it)."""
    from ..runtime import outputs
    return outputs.load_replay(params, out_dir) if outputs.replay_finished(params, out_dir) else None


def invariant_example(inv: pd.DataFrame, chosen: pd.Series | None) -> int:
    """Row of the invariant records at the same pivot as `chosen` (problem, rollout, position), else 0."""
    if chosen is not None:
        same = inv.index[(inv.problem_id == chosen.problem_id) & (inv.rollout == chosen.rollout)
                         & (inv.abs_pos == chosen.abs_pos)]
        if len(same):
            return int(inv.index.get_loc(same[0]))
    return 0


def identical_in_every_pass(record: pd.Series, passes: list[str]) -> bool:
    """Estimates, probe tokens, probe logprobs and continuations all equal to exact1's."""
    return all(record[f"A_{p}"] == record["A_exact1"] and not record[f"greedy_divergence_{p}"]
               and record[f"greedy_first_logprob_delta_{p}"] == 0 and record[f"cont_diff_{p}"] == 0
               for p in passes if p != "exact1")


def gold_of(params, out_dir, problem_id: int) -> str:
    """A problem's gold answer as the sampling stage recorded it (problems.json)."""
    from ..runtime.outputs import sampling_dir
    scanned = json.loads((sampling_dir(params, out_dir) / "problems.json").read_text())["scanned"]
    return next(str(p["gold"]) for p in scanned if p["problem_id"] == problem_id)


def pivots_per_problem(pivots: pd.DataFrame, trunks: pd.DataFrame) -> pd.DataFrame:
    """Pivots per problem: trunks, trunk accuracy, pivots, mean margin."""
    per = trunks.groupby("problem_id").agg(trunks=("rollout", "size"), trunk_accuracy=("correct", "mean"))
    piv = pivots.groupby("problem_id").agg(pivots=("pivot_id", "size"), mean_margin=("margin", "mean"))
    return per.join(piv).fillna({"pivots": 0}).astype({"pivots": int})
