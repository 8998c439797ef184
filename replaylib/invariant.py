"""Stage 5: batch-invariant confirmation (docs/protocol.md section 3.5).

Sampling and the three passes rerun with the engine in an invariant mode, in which
prefill and decode compute each token identically (transformers engine: every forward
pass is one token of one sequence; vLLM: VLLM_BATCH_INVARIANT=1 with an invariant
attention backend). Prediction, met exactly in the paper: all passes agree on every
channel (estimates, probe tokens, probe logprobs). The stage writes its records and
report, then fails if any pivot disagrees.
"""
from __future__ import annotations

import logging
import time

import pandas as pd

from . import pivots as pivot_stage
from . import progress
from . import sampling
from .data import load_problems
from .engine import trunk_seed
from .executor import lease_record, make_executor
from .grading import grade
from .params import Params
from .replay import build_jobs, replay_problem, typed
from .rundir import StageDir, atomic_save, atomic_write_json

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


def invariant_unit(engine, params: Params, chosen: list[tuple], stage_dir=None) -> tuple[dict, list[dict]]:
    """Stage 05's one unit: sample the chosen problems (pid, question, gold) in invariant mode,
    mine their pivots and run every pass; returns (engine description, records). Progress goes
    to stage_dir's progress file (the runner's terminal line)."""
    log.info("config %s, stage %s, engine %s", params.config, STAGE, engine.describe())
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
    pivots = pivot_stage.mine(trunks_df, params, engine.special_ids)
    pivots = pivots.groupby("problem_id").head(params.invariant_pivots).reset_index(drop=True)
    if pivots.empty:
        raise pivot_stage.NoPivots(pivot_stage.no_pivot_message(params, STAGE) + " (or raise invariant_problems, "
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


def run(params: Params, out_dir=None) -> dict:
    stage = StageDir(params, STAGE, out_dir).begin()
    _, _, problem_info = sampling.load(params, out_dir)
    chosen = problem_info["kept"][:params.invariant_problems]
    problems = {p.problem_id: p for p in load_problems(params.task)}
    started = time.perf_counter()
    ex = make_executor(params, invariant=True, workers=1, stage=STAGE)
    seconds = {"engine start": round(time.perf_counter() - started, 2)}
    try:  # one unit: the chosen problems are sampled as one batch, and replayed on the engine that holds them
        started = time.perf_counter()
        described, records = ex.call(invariant_unit, params, [(pid, problems[pid].question, problems[pid].gold)
                                                              for pid in chosen], stage.path)
        seconds["sample, mine and replay"] = round(time.perf_counter() - started, 2)
    finally:
        started = time.perf_counter()
        ex.close()
        seconds["engine stop"] = round(time.perf_counter() - started, 2)
    records = pd.DataFrame(records)
    records["config"] = f"{params.config} (invariant)"
    records = typed(records)
    report = {"engine": described, **agreement(records, params.passes)}
    atomic_save(stage.file("records.parquet"), lambda tmp: records.to_parquet(tmp, index=False))
    atomic_write_json(stage.file("invariant.json"), report)
    if not report["all_identical"]:
        raise AssertionError(f"{STAGE}: passes disagree in invariant mode ({report}); see "
                             f"{stage.file('records.parquet')}")
    stage.finish(["records.parquet", "invariant.json"], {"report": report, "seconds": seconds, **lease_record(ex)})
    return report


def load(params: Params, out_dir=None) -> pd.DataFrame:
    from .records import load_records
    return load_records(StageDir(params, STAGE, out_dir).path / "records.parquet")

