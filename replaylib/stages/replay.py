"""Stage 3: three-pass replay (docs/protocol.md section 3.3).

For every pivot and both arms (actual, alt) the prompt is the token ids
`prompt + generated[:i] + [forced]`; K seeded continuations (seed = hash(problem, rollout,
abs_pos, arm, k)) and one greedy probe per arm, in each pass:
  exact1  resume the trunk's decode-time state
  exact2  the identical work again (replica: the noise floor)
  refeed  a fresh prefill of the same ids, as published credit pipelines do
and optionally [ours] refeed2 (refeed's own replica), serial (refeed one request at a
time) and block16 (the paper's block-granular resume), in a fixed or shuffled order.
A = mean(R | actual) - mean(R | alt) per pass. Records follow the published schema
(docs/protocol.md section 6) plus exactness columns. Each problem is written as its own shard
(atomically), so a rerun after a crash redoes only unfinished problems.
"""
from __future__ import annotations

import logging
import time

import pandas as pd

from ..core import progress
from ..core.files import atomic_save
from ..measure.data import load_problems
from ..measure.mining import NoPivots, no_pivot_message
from ..measure.replay import by_problem, replay_unit, stage_records
from ..runtime import outputs
from ..runtime.executor import lease_record, make_executor
from ..runtime.params import Params
from ..runtime.rundir import StageDir, rerun_command

log = logging.getLogger("replaylib")
STAGE = "03_three_pass_replay"


def run(params: Params, out_dir=None) -> pd.DataFrame:
    """Replay every pivot; writes shards/problem_*.parquet, then records.parquet.

    A shard is reused only when it was written under the same resume key (parameters,
    upstream files and code: rundir.StageDir) and its bytes are unchanged."""
    stage = StageDir(params, STAGE, out_dir).begin()
    trunks, _, _ = outputs.load_sampling(params, out_dir)
    pivots = outputs.load_pivots(params, out_dir)
    if pivots.empty:
        raise NoPivots(no_pivot_message(params, STAGE))
    digests = outputs.state_digests(params, out_dir)
    gold = {p.problem_id: p.gold for p in load_problems(params.task)}
    shard = {pid: f"shards/problem_{pid:05d}.parquet" for pid in pivots.problem_id.unique()}
    profile_shard = {pid: f"shards/layer_profile_{pid:05d}.parquet" for pid in shard} if params.layer_profile else {}
    todo = [pid for pid in shard if not stage.has_shard(shard[pid])
            or (pid in profile_shard and not stage.has_shard(profile_shard[pid]))]
    seconds = {}  # of this run's units (problems replayed earlier and kept are not in it)
    lease = {}
    if todo:
        started = time.perf_counter()
        ex = make_executor(params, stage=STAGE)
        seconds["engine start"] = round(time.perf_counter() - started, 2)
        log.info("config %s, stage %s, executor %s: %d problems to replay", params.config, STAGE, ex.name, len(todo))
        units = [(f"{STAGE} problem {pid}",
                  (params, int(pid), pivots[pivots.problem_id == pid], trunks[trunks.problem_id == pid],
                   stage.upstream(outputs.SAMPLING), digests.get(int(pid)), gold[pid])) for pid in todo]
        try:
            n_jobs = {pid: int((pivots.problem_id == pid).sum()) * len(params.passes) for pid in todo}
            bar = progress.bar(stage.path, "replay", sum(n_jobs.values()), "pivot-pass")
            pid_of = {label: pid for (label, _), pid in zip(units, todo)}
            for label, (frame, profile, spent) in ex.map(replay_unit, units, ordered=False):  # as they finish
                pid = pid_of[label]
                for what, secs in spent.items():
                    seconds[what] = round(seconds.get(what, 0.0) + secs, 2)
                if profile is not None:  # [ours] where decode-time and re-fed K, V differ, per layer
                    atomic_save(stage.file(profile_shard[pid]), lambda tmp: profile.to_parquet(tmp, index=False))
                    stage.add_shard(profile_shard[pid])
                atomic_save(stage.file(shard[pid]), lambda tmp: frame.to_parquet(tmp, index=False))
                stage.add_shard(shard[pid])
                if not ex.reports_progress:  # a local engine counts its passes as it runs them (replay_problem)
                    bar.update(n_jobs[pid])
            bar.close()
        finally:
            started = time.perf_counter()
            ex.close()
            seconds["engine stop"] = round(time.perf_counter() - started, 2)
            lease = lease_record(ex)
    for rel in list(shard.values()) + list(profile_shard.values()):  # only bytes this run wrote and recorded
        if not stage.has_shard(rel):
            raise RuntimeError(f"{stage.path / rel}: not the shard this run recorded (missing, changed or written "
                               f"by another run); rerun the stage: {rerun_command(params, STAGE, out_dir)}")
    records = stage_records(pivots, lambda pid: pd.read_parquet(stage.file(shard[pid])), params.config)
    atomic_save(stage.file("records.parquet"), lambda tmp: records.to_parquet(tmp, index=False))
    written = ["records.parquet"] + sorted(shard.values())
    if profile_shard:
        profile = by_problem(pivots, lambda pid: pd.read_parquet(stage.file(profile_shard[pid])))
        atomic_save(stage.file("layer_profile.parquet"), lambda tmp: profile.to_parquet(tmp, index=False))
        written += ["layer_profile.parquet"] + sorted(profile_shard.values())
    flagged = int((~records["exact_ok"]).sum())
    if flagged:
        log.warning("%d of %d pivots did not resume the saved state exactly; they are flagged (exact_ok False) "
                    "and excluded from the statistics by default", flagged, len(records))
    stage.finish(written, {"n_records": len(records), "flagged_not_exact": flagged,
                           "state_established": records["state_established"].value_counts().to_dict()
                           if "state_established" in records else {},
                           "seconds": seconds, **lease})
    return records

