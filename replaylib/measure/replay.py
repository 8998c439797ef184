"""Stage 3: three-pass replay (docs/protocol.md section 3.3).

For every pivot and both arms (actual, alt) the prompt is the token ids
`prompt + generated[:i] + [forced]`; K seeded continuations (seed = hash(problem, rollout,
abs_pos, arm, k)) and one greedy probe per arm, in each pass:
  exact1  resume the trunk's decode-time state
  exact2  the identical work again (replica: the noise floor)
  refeed  a fresh prefill of the same ids, as published credit pipelines do
and optionally [ours] refeed2 (refeed's own replica), serial (refeed one request at a
time), block16 (the paper's block-granular resume) and the cache transplants, in a fixed or
shuffled order. A = mean(R | actual) - mean(R | alt) per pass. Records follow the published
schema (docs/protocol.md section 6) plus exactness columns. A unit is one problem: its shard
is written as it finishes, so a rerun after a crash redoes only unfinished problems.
"""
from __future__ import annotations

import json
import logging
import random
import time

import pandas as pd

from ..core import progress
from .data import load_problems
from .engine import ARMS, PassSettings, PivotJob
from .grading import grade
from .mining import NoPivots, no_pivot_message
from .passes import is_exact
from .sampling import kept_trunks
from .seeds import continuation_seed, stable_seed
from .units import Kernel, Outputs, Unit

log = logging.getLogger("replaylib")
STAGE = "03_three_pass_replay"


def settings(params, max_tokens: int | None = None) -> PassSettings:
    return PassSettings(k=params.k, temperature=params.cont_temperature, top_p=params.cont_top_p,
                        max_tokens=max_tokens or params.max_cont_tokens, probe_tokens=params.probe_tokens,
                        stop_at_answer=params.stop_at_answer, task=params.task,
                        verify_regeneration=params.verify_regeneration, trunk_temperature=params.temperature,
                        trunk_top_p=params.top_p, submission=params.pass_submission)


def pass_order(params, problem_id: int) -> list[str]:
    """The order passes run in for one problem: as configured, or shuffled with a seed per problem."""
    if params.pass_order == "fixed":
        return list(params.passes)
    order = list(params.passes)
    random.Random(stable_seed(problem_id, "pass-order")).shuffle(order)
    return order


def build_jobs(pivots: pd.DataFrame, trunks: pd.DataFrame, k: int) -> list[PivotJob]:
    """Pivot jobs of one problem, from the pivot table and its trunks."""
    by_rollout = {t.rollout: t for t in trunks.itertuples(index=False)}
    jobs = []
    for p in pivots.itertuples(index=False):
        trunk = by_rollout[p.rollout]
        gen, i = list(trunk.gen_ids), int(p.gen_index)
        nxt = (list(trunk.topk_ids[i + 1]), list(trunk.topk_logprobs[i + 1])) if i + 1 < len(gen) else None
        jobs.append(PivotJob(
            pivot_id=int(p.pivot_id), problem_id=int(p.problem_id), rollout=int(p.rollout), gen_index=i,
            prompt_ids=list(trunk.prompt_ids), gen_prefix=gen[:i], forced={"actual": int(p.actual), "alt": int(p.alt)},
            seeds={arm: [continuation_seed(int(p.problem_id), int(p.rollout), int(p.abs_pos), arm, j) for j in range(k)]
                   for arm in ARMS},
            trunk_next=nxt,
            # the regeneration check needs the trunk's own seed (absent from tables without one)
            trunk_rest=gen[i + 1:] if hasattr(trunk, "seed") else None,
            trunk_seed=int(trunk.seed) if hasattr(trunk, "seed") else None))
    return jobs


def estimate(job: PivotJob, out, gold: str, task: str, decode, grader=None) -> tuple[float, dict]:
    """A = mean(R | actual) - mean(R | alt), grading prefix + forced token + continuation
    (grader(text, gold) -> 0 or 1; the task's rule by default)."""
    grader = grader or (lambda text, g: grade(text, g, task))
    wins = {}
    for arm in ARMS:
        head = job.gen_prefix + [job.forced[arm]]
        wins[arm] = [grader(decode(head + c), gold) for c in out.continuations[arm]]
    a = sum(wins["actual"]) / len(wins["actual"]) - sum(wins["alt"]) / len(wins["alt"])
    return a, wins


# how a pivot's decode-time state was established for its exact passes (the record's state_established)
STATE_SAVED = "saved"  # transformers: the sampling stage's tensors, digest-checked as placed


STATE_IDENTICAL = "regenerated, identical"  # vLLM: a regeneration equal to the saved trunk in tokens and logprobs


STATE_TOKENS = "regenerated, same tokens"  # vLLM: one regeneration with the saved tokens over the resumed blocks


NOT_ESTABLISHED = ("not established",  # no regeneration reached the pivot's blocks, or the engine could not say
                   "regenerated, differs between passes")  # exact passes resumed different, non-identical states


def state_established(resumes: list) -> str:
    """One pivot's state source from its exact passes' resume reports (``ResumeReport``)."""
    states = [r.state for r in resumes]
    if any(s is None or s == "not established" for s in states):
        return "not established"
    if all(s == "saved" for s in states):
        return STATE_SAVED
    if all(s == "identical" for s in states):
        return STATE_IDENTICAL
    # a regeneration that only agrees in tokens is its own state: the exact passes must share it
    if len({r.establishment for r in resumes}) == 1:
        return STATE_TOKENS
    return "regenerated, differs between passes"


def pivot_record(job: PivotJob, pivot, outs: dict, wins: dict, estimates: dict, state_ok: bool,
                 passes: list[str], order: list[str], regenerates: bool | None = None) -> dict:
    """One record in the published schema, plus this package's exactness and diagnostics columns."""
    rec = {"problem_id": job.problem_id, "rollout": job.rollout, "abs_pos": job.abs_pos,
           "gen_index": job.gen_index, "margin": float(pivot.margin), "rollout_correct": int(pivot.rollout_correct)}
    for name in passes:
        rec[f"A_{name}"] = estimates[name]
        out = outs[name]
        # JSON text: Parquet would coerce [token id, logprob] pairs to one type
        rec[f"greedy_first_{name}"] = json.dumps({arm: [int(out.probe_ids[arm][0]), float(out.probe_first_logprob[arm])]
                                                  for arm in ARMS})
        for arm in ARMS:
            rec[f"wins_{name}_{arm}"] = int(sum(wins[name][arm]))
        rec[f"cont_tokens_{name}"] = sum(len(c) for arm in ARMS for c in out.continuations[arm])
        # what estimate() graded, per arm: the K continuations' token ids (JSON text, as above)
        rec[f"continuations_{name}"] = json.dumps({arm: [[int(t) for t in c] for c in out.continuations[arm]]
                                                   for arm in ARMS})
    for name in passes[1:]:
        base, other = outs["exact1"], outs[name]
        rec[f"greedy_divergence_{name}"] = any(base.probe_ids[a] != other.probe_ids[a] for a in ARMS)
        rec[f"greedy_first_logprob_delta_{name}"] = max(
            abs(base.probe_first_logprob[a] - other.probe_first_logprob[a]) for a in ARMS)
        rec[f"cont_diff_{name}"] = sum(x != y for a in ARMS
                                       for x, y in zip(base.continuations[a], other.continuations[a]))
    # cache_ok: this exact pass really resumed the decode-time state, as the engine observed it
    # during the pass (transformers: digest of the tensors placed in the cache = digest taken when
    # the state was produced; vLLM: every request hit the cache, no preemption, trunks regenerated);
    # an engine that cannot say counts as not verified
    for name in [p for p in passes if is_exact(p)]:
        rec[f"cache_ok_{name}"] = bool(state_ok and outs[name].resume.state_ok)
    for name in passes:  # the numbers behind cache_ok, per pass (preemptions: None where unknown)
        rec[f"min_cached_tokens_{name}"] = outs[name].resume.min_cached_tokens
        rec[f"preemptions_{name}"] = outs[name].resume.preemptions
    rec["first_step_exact"] = outs["exact1"].resume.first_step_exact
    rec["regenerates_trunk"] = regenerates
    rec["state_established"] = state_established([outs[p].resume for p in passes if is_exact(p)])
    rec["exact_ok"] = bool(all(rec[f"cache_ok_{p}"] for p in passes if is_exact(p))
                           and rec["state_established"] not in NOT_ESTABLISHED)
    rec["pass_order"] = ",".join(order)
    return rec


def replay_problem(engine, jobs, pivots, state, state_ok: dict, gold, params, max_tokens=None,
                   seconds: dict | None = None) -> list[dict]:
    """All passes for one problem's pivots, in the configured order; state_ok: rollout -> state verified.
    seconds: filled with each pass's wall time (added to what it holds)."""
    cfg = settings(params, max_tokens)
    outs = {}
    order = pass_order(params, int(pivots.problem_id.iloc[0])) if len(pivots) else list(params.passes)
    for name in order:
        started = time.perf_counter()
        outs[name] = {o.pivot_id: o for o in engine.run_pass(jobs, name, cfg, state)}
        if seconds is not None:
            seconds[name] = seconds.get(name, 0.0) + time.perf_counter() - started
        progress.update(len(jobs))
    # a diagnostic, after the passes and in batches of its own: it must not change what they compute
    regenerates = engine.check_regeneration(jobs, cfg, state) if params.verify_regeneration else {}
    records = []
    for job, pivot in zip(jobs, pivots.itertuples(index=False)):
        per = {name: outs[name][job.pivot_id] for name in params.passes}
        estimates, wins = {}, {}
        for name in params.passes:
            estimates[name], wins[name] = estimate(job, per[name], gold, params.task, engine.decode)
        records.append(pivot_record(job, pivot, per, wins, estimates, state_ok.get(job.rollout, False),
                                    params.passes, order, regenerates.get(job.pivot_id)))
    return records


def typed(records: pd.DataFrame) -> pd.DataFrame:
    """Integer columns stay integers where some values are unknown (None)."""
    for col in records.columns:
        if col.startswith(("min_cached_tokens_", "preemptions_")):
            records[col] = records[col].astype("Int64")
    return records


def plan(params, inputs, done: dict) -> list[Unit]:
    """One unit per problem with pivots, in the pivot table's order."""
    trunks, pivots = kept_trunks(inputs["trunks"]), inputs["pivots"]
    if pivots.empty:
        raise NoPivots(no_pivot_message(params, STAGE))
    gold = {p.problem_id: p.gold for p in load_problems(params.task)}
    digests = inputs["digests"]
    return [Unit(f"problem_{pid:05d}", f"problem {pid}",
                 (int(pid), pivots[pivots.problem_id == pid], trunks[trunks.problem_id == pid], inputs["sampling_dir"],
                  digests.get(int(pid)), gold[pid]), size=int((pivots.problem_id == pid).sum()) * len(params.passes))
            for pid in pivots.problem_id.unique()]


def replay_unit(engine, params, pid: int, group: pd.DataFrame, trunks: pd.DataFrame, sampling_dir,
                digests: dict | None, gold: str) -> dict:
    """One unit: every pass over one problem's pivots, on the engine that loads its trunks; its records,
    with layer_profile its per-layer K/V differences, and the seconds spent establishing the decode-time
    state and in each pass."""
    jobs = build_jobs(group, trunks, params.k)
    started = time.perf_counter()
    state, verified = engine.problem_state(sampling_dir, pid, trunks, digests)
    seconds = {"establish state": time.perf_counter() - started}
    parts = {"records": typed(pd.DataFrame(replay_problem(engine, jobs, group, state, verified, gold, params,
                                                          seconds=seconds)))}
    if params.layer_profile:  # [ours] where decode-time and re-fed K, V differ, per layer
        parts["layer_profile"] = pd.DataFrame(engine.layer_profile(jobs, state))
    return {**parts, "seconds": seconds}


def shard_path(unit: Unit, part: str, value) -> str:
    """shards/problem_<id>.parquet, and shards/layer_profile_<id>.parquet."""
    return f"shards/{unit.name}.parquet" if part == "records" else f"shards/{unit.name.replace('problem', part)}.parquet"


def assemble(params, inputs, done: dict) -> Outputs:
    """records.parquet (the problems' records in pivot order, each naming the configuration) and, with
    layer_profile, layer_profile.parquet."""
    pivots = inputs["pivots"]
    parts = {int(u.args[0]): done[u.name] for u in plan(params, inputs, done)}
    records = stage_records(pivots, lambda pid: parts[int(pid)]["records"], params.config)
    files = {"records.parquet": records}
    if params.layer_profile:
        files["layer_profile.parquet"] = by_problem(pivots, lambda pid: parts[int(pid)]["layer_profile"])
    flagged = int((~records["exact_ok"]).sum())
    if flagged:
        log.warning("%d of %d pivots did not resume the saved state exactly; they are flagged (exact_ok False) "
                    "and excluded from the statistics by default", flagged, len(records))
    return Outputs(files, {"n_records": len(records), "flagged_not_exact": flagged,
                           "state_established": records["state_established"].value_counts().to_dict()
                           if "state_established" in records else {}}, result=records)


def by_problem(pivots: pd.DataFrame, read) -> pd.DataFrame:
    """The per-problem frames ``read(problem_id)`` stacked in the order the problems first appear among the
    pivots."""
    return pd.concat([read(pid) for pid in pivots.problem_id.unique()], ignore_index=True)


def stage_records(pivots: pd.DataFrame, read, config: str) -> pd.DataFrame:
    """The replay stage's records: its problems' shards (``read(problem_id)``) in pivot order, each record
    naming the configuration."""
    records = by_problem(pivots, read)
    records["config"] = config
    return records


KERNEL = Kernel(plan=plan, unit=replay_unit, assemble=assemble, shard=shard_path,
                preview=lambda parts: parts["records"], progress=("replay", "pivot-pass"))
