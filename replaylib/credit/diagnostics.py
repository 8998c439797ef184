"""What the credit tool says beside its numbers: the plan before the first group (what will be computed) and
warnings where the results cannot say much, each with what to change."""
from __future__ import annotations

import json

import pandas as pd

from ..measure.engine import ARMS


def planned_pivots(rollouts: list, settings) -> int:
    """The pivots of these rollouts at most: their given positions, else --max-pivots-per-rollout (the margin
    rule may find fewer)."""
    return sum(len(r.positions) if r.positions is not None else min(settings.max_pivots_per_rollout,
                                                                     len(r.response_ids)) for r in rollouts)


def plan_line(groups: list[list], todo: list[int], settings) -> str:
    """Rollouts, pivots, passes x arms x K and continuation tokens of what is to be computed (pivots at most:
    the margin rule may find fewer)."""
    rollouts = [r for i in todo for r in groups[i]]
    pivots = planned_pivots(rollouts, settings)
    runs = len(settings.passes) * len(ARMS) * settings.k
    reused = len(groups) - len(todo)
    return (f"plan: {sum(map(len, groups))} rollouts in {len(groups)} prompt groups"
            + (f" ({reused} reused from shards)" if reused else "")
            + f"; to compute: {len(todo)} groups, {sum(len(r.response_ids) for r in rollouts)} tokens forced, "
              f"up to {pivots} pivots x {len(settings.passes)} passes x {len(ARMS)} arms x K {settings.k} = "
              f"{pivots * runs} continuations of at most {settings.max_cont_tokens} tokens "
              f"({pivots * runs * settings.max_cont_tokens} tokens at most)")


def _lengths(frame: pd.DataFrame, passes: list[str]) -> list[int]:
    return [len(c) for name in passes if f"continuations_{name}" in frame
            for text in frame[f"continuations_{name}"] for arm in ARMS for c in json.loads(text)[arm]]


def unfinished(frame: pd.DataFrame, settings) -> tuple[int, int]:
    """(continuations that reached --max-cont-tokens before they ended, continuations): a cut one is graded
    unfinished, so where most are cut, most A are 0 whatever the prefix state."""
    lengths = _lengths(frame, settings.passes)
    return sum(n >= settings.max_cont_tokens for n in lengths), len(lengths)


def warnings(frame: pd.DataFrame, settings) -> list[str]:
    """Lines saying where the results are empty or uninformative and what to change."""
    if not len(frame):
        return [f"no pivot: no response position had a margin below --margin {settings.margin:g}; raise --margin "
                f"or give the positions as 'positions'"]
    found = []
    capped, total = unfinished(frame, settings)
    if total and capped > total / 2:
        found.append(f"{capped} of {total} continuations ({100 * capped / total:.0f}%) reached "
                     f"--max-cont-tokens {settings.max_cont_tokens} before they ended, and were graded unfinished; "
                     f"raise --max-cont-tokens")
    if all((frame[f"A_{p}"] == 0).all() for p in settings.passes):
        wins = sum(int(frame[f"wins_{p}_{arm}"].sum()) for p in settings.passes for arm in ARMS)
        total = len(frame) * len(settings.passes) * len(ARMS) * settings.k
        if wins == 0:
            why = ("no continuation was graded a success; check --grader and the ground truths"
                   + (", and raise --max-cont-tokens" if capped else ""))
        elif wins == total:
            why = "every continuation was graded a success, so the arms cannot differ; give harder problems"
        else:
            why = "at every pivot both arms succeeded equally often; raise --k"
        found.append(f"every A is 0 ({len(frame)} pivots, {len(settings.passes)} passes): {why}")
    return found
