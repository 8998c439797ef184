"""Stage 2: pivot mining (docs/protocol.md section 3.2).

A generated token is a pivot when its raw top-1 minus top-2 logprob is below the margin
threshold. The paper's paged-cache engine also needs the pivot's absolute position within
`boundary_slack` tokens past a multiple of the block size (16); block_size 1 lifts that
filter, since this package's engine resumes at any token. The alternative is the most
likely top-k token other than the sampled one; pivots whose alternative (or sampled
token) is EOS or special are skipped; at most P per rollout, earliest first.
`pivot_window` (not in the paper) keeps only pivots among a trunk's last N generated tokens, so that
short continuations of a scaled-down run can still reach the answer.
"""
from __future__ import annotations

import pandas as pd

from .sampling import kept_trunks
from .units import Kernel, Outputs, Unit


class NoPivots(RuntimeError):
    """No trunk has a pivot: nothing to measure."""


def no_pivot_message(params, where: str) -> str:
    """One line: no pivot, and which parameters widen the search."""
    wider = [f"raise margin_threshold (now {params.margin_threshold:g})"]
    if params.pivot_window:
        wider.append(f"set pivot_window: 0 (now {params.pivot_window})")
    if params.block_size > 1:
        wider.append(f"set block_size: 1 (now {params.block_size})")
    if params.min_rollout_tokens > 1:
        wider.append(f"lower min_rollout_tokens (now {params.min_rollout_tokens})")
    wider.append("or sample more trunks (n_problems, n_rollouts, max_trunk_tokens)")
    return f"config '{params.config}', {where}: no pivot found in the trunks; widen the search: {', '.join(wider)}"


def token_margins(trunk) -> list[float]:
    """Raw top-1 minus top-2 logprob at every generated step of one trunk."""
    return [lps[0] - lps[1] for lps in trunk["topk_logprobs"] if len(lps) >= 2]


def mine(trunks: pd.DataFrame, params, special_ids: set[int]) -> pd.DataFrame:
    """Pivots of every trunk, in the order (problem, rollout, position)."""
    rows = []
    for trunk in trunks.itertuples(index=False):
        gen, prompt_len = list(trunk.gen_ids), len(trunk.prompt_ids)
        if len(gen) < params.min_rollout_tokens:
            continue
        found = 0
        for i, (ids, lps) in enumerate(zip(trunk.topk_ids, trunk.topk_logprobs)):
            ids, lps = list(ids), list(lps)
            if len(lps) < 2 or lps[0] - lps[1] >= params.margin_threshold:
                continue
            if params.pivot_window and i < len(gen) - params.pivot_window:
                continue
            abs_pos = prompt_len + i
            if params.block_size > 1 and abs_pos % params.block_size > params.boundary_slack:
                continue
            alt = next((t for t in ids if t != gen[i]), None)
            if alt is None or alt in special_ids or gen[i] in special_ids:
                continue
            rows.append({"pivot_id": len(rows), "problem_id": trunk.problem_id, "rollout": trunk.rollout,
                         "gen_index": i, "abs_pos": abs_pos, "margin": lps[0] - lps[1], "actual": gen[i], "alt": alt,
                         "rollout_correct": int(trunk.correct)})
            found += 1
            if found >= params.max_pivots_per_rollout:
                break
    return pd.DataFrame(rows, columns=["pivot_id", "problem_id", "rollout", "gen_index", "abs_pos", "margin",
                                       "actual", "alt", "rollout_correct"])


def plan(params, inputs, done: dict) -> list[Unit]:
    """One unit: every kept trunk (pivot ids count across the whole table)."""
    trunks = kept_trunks(inputs["trunks"])
    return [Unit("pivots", "pivot mining", (trunks, sorted(inputs["engine"]["special_ids"])), size=len(trunks))]


def mine_unit(engine, params, trunks: pd.DataFrame, special_ids: list) -> dict:
    """The pivots of the kept trunks, and the margin of every generated token (margins.parquet)."""
    margins = pd.DataFrame([{"problem_id": t.problem_id, "rollout": t.rollout, "margin": m}
                            for t in trunks.itertuples(index=False) for m in token_margins(t._asdict())])
    return {"pivots": mine(trunks, params, set(special_ids)), "margins": margins}


def assemble(params, inputs, done: dict) -> Outputs:
    pivots, margins = done["pivots"]["pivots"], done["pivots"]["margins"]
    if pivots.empty:  # a confident model: nothing to replay, and the later stages would measure nothing
        raise NoPivots(no_pivot_message(params, "02_pivot_mining"))
    return Outputs({"pivots.parquet": pivots, "margins.parquet": margins}, {"n_pivots": len(pivots)}, result=pivots)


KERNEL = Kernel(plan=plan, unit=mine_unit, assemble=assemble, progress=("pivots", "trunk"))
