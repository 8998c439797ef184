"""Mining pivots."""
from __future__ import annotations

import pandas as pd


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
