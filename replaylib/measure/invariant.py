"""Stage 5: batch-invariant confirmation (docs/protocol.md section 3.5).

Sampling and the three passes rerun with the engine in an invariant mode, in which prefill and decode
compute each token identically (transformers engine: every forward pass is one token of one sequence;
vLLM: VLLM_BATCH_INVARIANT=1 with an invariant attention backend). Prediction, met exactly in the paper:
all passes agree on every channel (estimates, probe tokens, probe logprobs). The stage writes its records
and report, then fails if any pivot disagrees. One unit: the chosen problems are sampled as one batch and
replayed on the engine that holds them.
"""
from __future__ import annotations

import logging

import pandas as pd

from ..core import progress
from . import mining, sampling
from .data import load_problems
from .grading import grade
from .replay import build_jobs, replay_problem, typed
from .seeds import trunk_seed
from .units import Kernel, Outputs, Unit

log = logging.getLogger("replaylib")
STAGE = "05_batch_invariant"


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


def plan(params, inputs, done: dict) -> list[Unit]:
    """One unit: the first ``invariant_problems`` problems the sampling stage kept."""
    problems = load_problems(params.task)
    chosen = inputs["problems"]["kept"][:params.invariant_problems]
    return [Unit("invariant", f"batch-invariant problems {', '.join(map(str, chosen))}",
                 ([(pid, problems[pid].question, problems[pid].gold) for pid in chosen],),
                 size=len(chosen) * params.invariant_rollouts)]


def invariant_unit(engine, params, chosen: list[tuple]) -> dict:
    """The one unit: sample the chosen problems (pid, question, gold) in invariant mode, mine their
    pivots and run every pass; its records and the engine's description."""
    log.info("config %s, batch-invariant unit, engine %s", params.config, engine.describe())
    gold = {pid: g for pid, _, g in chosen}
    prompts = {pid: engine.prompt_ids(question, params.instruction, params.task) for pid, question, _ in chosen}
    seeds = {(pid, r): trunk_seed(pid, r) for pid in prompts for r in range(params.invariant_rollouts)}
    progress.phase("trunks (invariant)", len(seeds), "trunk", count_rows=True)
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
    progress.phase("replay (invariant)", len(pivots) * len(params.passes), "pivot-pass")
    for pid in prompts:
        group = pivots[pivots.problem_id == pid]
        if group.empty:
            continue
        jobs = build_jobs(group, trunks_df[trunks_df.problem_id == pid], params.k)
        resident, verified = engine.resident_state(pid, trunks_df, state)
        records += replay_problem(engine, jobs, group, resident, verified, gold[pid], params,
                                  max_tokens=params.invariant_max_cont_tokens)
    return {"records": pd.DataFrame(records), "engine": engine.describe()}


def assemble(params, inputs, done: dict) -> Outputs:
    """records.parquet (typed, naming the configuration in invariant mode) and invariant.json (the engine
    and the passes' agreement); the stage fails, its evidence written, if any pivot disagrees."""
    frame = done["invariant"]["records"].copy()
    frame["config"] = f"{params.config} (invariant)"
    frame = typed(frame)
    report = {"engine": done["invariant"]["engine"], **agreement(frame, params.passes)}
    failure = None if report["all_identical"] else AssertionError(
        f"{STAGE}: passes disagree in invariant mode ({report}); see its records.parquet")
    return Outputs({"records.parquet": frame, "invariant.json": report}, {"report": report}, failure=failure,
                   result=report)


KERNEL = Kernel(plan=plan, unit=invariant_unit, assemble=assemble, invariant=True,
                preview=lambda parts: parts["records"], progress=("invariant", "trunk"))
