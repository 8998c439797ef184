"""The batch-invariant unit."""
from __future__ import annotations

import logging

import pandas as pd

from ..core import progress
from . import mining, sampling
from .grading import grade
from .replay import build_jobs, replay_problem, typed
from .seeds import trunk_seed

log = logging.getLogger("replaylib")


def agreement(records: pd.DataFrame, passes: list[str]) -> dict:
    """Per channel, how many pivots agree with exact1 in every other pass."""
    others = [p for p in passes if p != "exact1"]
    n = len(records)
    same_a = sum(all(r[f"A_{p}"] == r["A_exact1"] for p in others) for _, r in records.iterrows())
    same_probe = sum(not any(r[f"greedy_divergence_{p}"] for p in others) for _, r in records.iterrows())
    same_lp = sum(all(r[f"greedy_first_logprob_delta_{p}"] == 0 for p in others) for _, r in records.iterrows())
    same_cont = sum(all(r[f"cont_diff_{p}"] == 0 for p in others) for _, r in records.iterrows())
    return {"pivots": n, "estimates_identical": same_a, "probe_tokens_identical": same_probe,
            "probe_logprobs_bit_exact": same_lp, "continuations_identical": same_cont,
            "all_identical": bool(n and same_a == same_probe == same_lp == same_cont == n)}


def invariant_unit(engine, params, chosen: list[tuple], stage_dir=None) -> tuple[dict, list[dict]]:
    """Stage 05's one unit: sample the chosen problems (pid, question, gold) in invariant mode,
    mine their pivots and run every pass; returns (engine description, records). Progress goes
    to stage_dir's progress file (the runner's terminal line)."""
    log.info("config %s, batch-invariant unit, engine %s", params.config, engine.describe())
    gold = {pid: g for pid, _, g in chosen}
    prompts = {pid: engine.prompt_ids(question, params.instruction) for pid, question, _ in chosen}
    seeds = {(pid, r): trunk_seed(pid, r) for pid in prompts for r in range(params.invariant_rollouts)}
    if stage_dir is not None:
        progress.bar(stage_dir, "trunks (invariant)", len(seeds), "trunk", count_rows=True)
    trunks, state = engine.sample_trunks(prompts, params.invariant_rollouts, seeds, params.temperature,
                                         params.top_p, params.invariant_max_trunk_tokens or params.max_trunk_tokens,
                                         params.top_logprobs)
    trunks_df = pd.DataFrame([sampling.trunk_row(t, correct=grade(engine.decode(t.gen_ids), gold[pid], params.task))
                              for pid in prompts for t in trunks[pid]])
    pivots = mining.mine(trunks_df, params, engine.special_ids)
    pivots = pivots.groupby("problem_id").head(params.invariant_pivots).reset_index(drop=True)
    if pivots.empty:
        raise mining.NoPivots(mining.no_pivot_message(params, "05_batch_invariant") + " (or raise invariant_problems, "
                                   "invariant_rollouts, invariant_max_trunk_tokens)")
    records = []
    bar = progress.bar(stage_dir, "replay (invariant)", len(pivots) * len(params.passes), "pivot-pass") \
        if stage_dir is not None else None
    for pid in prompts:
        group = pivots[pivots.problem_id == pid]
        if group.empty:
            continue
        jobs = build_jobs(group, trunks_df[trunks_df.problem_id == pid], params.k)
        resident, verified = engine.resident_state(pid, trunks_df, state)
        records += replay_problem(engine, jobs, group, resident, verified, gold[pid], params,
                                  max_tokens=params.invariant_max_cont_tokens)
    if bar is not None:
        bar.close()
    return engine.describe(), records


def stage_outputs(described: dict, records: list[dict], params) -> tuple[pd.DataFrame, dict]:
    """The batch-invariant stage's records (typed, naming the configuration in invariant mode) and its
    report (invariant.json: the engine and the passes' agreement)."""
    frame = pd.DataFrame(records)
    frame["config"] = f"{params.config} (invariant)"
    frame = typed(frame)
    return frame, {"engine": described, **agreement(frame, params.passes)}
