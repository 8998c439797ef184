"""Counterfactual token credit on rollouts from elsewhere: what decides the bytes of the credit tool's
records (replaylib.credit). The rollouts of one prompt are a group: their decode-time states are rebuilt
by forced decoding (the engines' ``force_trunks``, the group in one batch as it was sampled), their pivots
are chosen by the pivot rule's margin, and each pass is the replay kernel's over the group's pivots
(``PivotJob``, ``Engine.run_pass``, ``replay.estimate``): the tool's ``resume`` is exact1, ``replica``
exact2 and ``refeed`` refeed.
"""
from __future__ import annotations

import json
import math
import time

from .engine import ARMS, PassSettings, PivotJob
from .replay import estimate
from .seeds import continuation_seed, stable_seed

PASS_OF = {"resume": "exact1", "replica": "exact2", "refeed": "refeed"}
TOOL_PASSES = tuple(PASS_OF)
EXACT = ("resume", "replica")  # the passes that resume the forced decode's state


def margin_and_alt(topk: list, token: int) -> tuple[float, int | None]:
    """Top-1 minus top-2 logprob of one step's top-k ([[token id, logprob], ...]) and the best token
    other than the one decoded (None where the top-k holds no other)."""
    ranked = sorted(topk, key=lambda pair: -pair[1])
    margin = ranked[0][1] - ranked[1][1] if len(ranked) >= 2 else math.inf
    alt = next((int(t) for t, _ in ranked if int(t) != token), None)
    return float(margin), alt


def select_pivots(response: list[int], topk: list, margin: float, max_pivots: int, special_ids: set,
                  positions: list[int] | None = None) -> list[dict]:
    """The pivots of one response: the given positions, or the positions whose margin is below `margin`,
    lowest margins first (ties by position), at most max_pivots; a pivot's alternative is the best other
    token. Special tokens are never forced (the pivot rule's exclusion)."""
    found = []
    for i in (positions if positions is not None else range(len(response))):
        m, alt = margin_and_alt(topk[i], response[i])
        if alt is None or (positions is None and (m >= margin or alt in special_ids or response[i] in special_ids)):
            continue
        found.append({"position": int(i), "token_id": int(response[i]), "alt_token_id": alt, "margin": m})
    if positions is None:
        found = sorted(found, key=lambda p: (p["margin"], p["position"]))[:max_pivots]
    return sorted(found, key=lambda p: p["position"])


def seeds_for(rollout_id, prompt_len: int, position: int, k: int, seed: int, scheme: str) -> dict:
    """Arm -> K continuation seeds. "hash": hashed from (id, position, arm, k, seed); "replay": stage 03's
    continuation_seed(problem_id, rollout, abs_pos, arm, k), the id being "<problem_id>:<rollout>"."""
    if scheme == "replay":
        problem_id, rollout = (int(x) for x in str(rollout_id).split(":"))
        return {arm: [continuation_seed(problem_id, rollout, prompt_len + position, arm, j) for j in range(k)]
                for arm in ARMS}
    return {arm: [stable_seed("credit", rollout_id, position, arm, j, seed) for j in range(k)] for arm in ARMS}


def jobs_for(prompt: list[int], responses: list[list[int]], pivots: list[list[dict]],
             seeds: list[list[dict]]) -> list[PivotJob]:
    """A group's pivot jobs: rollout r of one problem is the r-th response (as force_trunks keeps its state)."""
    jobs = []
    for r, (response, found, arms) in enumerate(zip(responses, pivots, seeds)):
        for p, s in zip(found, arms):
            jobs.append(PivotJob(pivot_id=len(jobs), problem_id=0, rollout=r, gen_index=p["position"],
                                 prompt_ids=list(prompt), gen_prefix=list(response[:p["position"]]),
                                 forced={"actual": p["token_id"], "alt": p["alt_token_id"]}, seeds=s))
    return jobs


def interval(wins: dict, z: float = 1.96) -> tuple[float, float]:
    """A normal-approximation 95% interval for A from the K Bernoulli samples of each arm (crude at small K)."""
    p = {arm: sum(w) / len(w) for arm, w in wins.items()}
    se = math.sqrt(sum(p[a] * (1 - p[a]) / len(wins[a]) for a in ARMS))
    a = p["actual"] - p["alt"]
    return max(-1.0, a - z * se), min(1.0, a + z * se)


def sign(x: float) -> int:
    return (x > 0) - (x < 0)


def within_floor(row: dict) -> bool | None:
    """Refeed's sign agrees with resume's, or the replica's also differs at this pivot; None without all three
    passes or where every A is 0 (no pass told the arms apart: nothing to compare)."""
    if not all(f"A_{p}" in row for p in TOOL_PASSES) or all(row[f"A_{p}"] == 0 for p in TOOL_PASSES):
        return None
    base = sign(row["A_resume"])
    return sign(row["A_refeed"]) == base or sign(row["A_replica"]) != base


def credit_group(engine, prompt: list[int], responses: list[list[int]], pivots: list[list[dict]],
                 seeds: list[list[dict]], passes: list[str], settings: PassSettings, state, grade_text,
                 timing: dict | None = None) -> list[list[dict]]:
    """Every pass over one group's pivots, estimated as the replay stage estimates: per rollout, a row per
    pivot with A_<pass>, its interval, wins per arm, and whether all passes' continuations agree token for
    token. grade_text(r, text) -> 0 or 1 for rollout r; state: the group's decode-time states
    (force_trunks); timing: receives each pass's seconds and decoded tokens."""
    jobs = jobs_for(prompt, responses, pivots, seeds)
    outs = {}
    for name in passes:
        started = time.perf_counter()
        outs[name] = {o.pivot_id: o for o in engine.run_pass(jobs, PASS_OF[name], settings, state)}
        if timing is not None:
            tokens = sum(len(c) for o in outs[name].values() for arm in ARMS for c in o.continuations[arm])
            tokens += sum(len(ids) for o in outs[name].values() for ids in o.probe_ids.values())
            timing[name] = {"seconds": time.perf_counter() - started, "tokens": tokens}
    rows = [[] for _ in responses]
    for job in jobs:
        row = {}
        for name in passes:
            out = outs[name][job.pivot_id]
            a, wins = estimate(job, out, "", settings.task, engine.decode,
                               lambda text, _gold, r=job.rollout: grade_text(r, text))
            row[f"A_{name}"] = a
            row[f"A_{name}_lo"], row[f"A_{name}_hi"] = interval(wins)
            for arm in ARMS:
                row[f"wins_{name}_{arm}"] = int(sum(wins[arm]))
            row[f"grades_{name}"] = json.dumps({arm: [int(w) for w in wins[arm]] for arm in ARMS})
            # what was graded, per arm: the K continuations' token ids (JSON text, as the replay records hold them)
            row[f"continuations_{name}"] = json.dumps({arm: [[int(t) for t in c] for c in out.continuations[arm]]
                                                       for arm in ARMS})
        conts = [outs[name][job.pivot_id].continuations for name in passes]
        row["passes_agree"] = all(c == conts[0] for c in conts)
        row["within_floor"] = within_floor(row)
        for name in passes:  # an exact pass that could not show it resumed the decode-time state is flagged
            if name in EXACT:
                row[f"verified_{name}"] = bool(outs[name][job.pivot_id].resume.state_ok)
        rows[job.rollout].append(row)
    return rows


def verified(row: dict) -> bool:
    """Every exact pass of this pivot resumed the decode-time state as it was produced."""
    return all(row.get(f"verified_{p}", True) for p in EXACT)


def common(rows: list[dict]) -> list[dict]:
    """The verified common pivots: some pass's A != 0 (the paper's reporting denominator)."""
    return [r for r in rows if verified(r) and any(r[f"A_{p}"] != 0 for p in TOOL_PASSES if f"A_{p}" in r)]


def share_differing(rows: list[dict], other: str) -> float | None:
    """Among verified common pivots, the share where `other`'s sign of A differs from resume's."""
    shared = common(rows)
    if not shared or f"A_{other}" not in shared[0] or "A_resume" not in shared[0]:
        return None
    return sum(sign(r[f"A_{other}"]) != sign(r["A_resume"]) for r in shared) / len(shared)
