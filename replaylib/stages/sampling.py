"""Stage 1: sampling trunks (docs/protocol.md section 3.1).

Per problem, N rollouts with per-rollout seeds hashed from (problem, "trunk", rollout),
raw top-k logprobs of every generated token, grading, and an optional difficulty screen
that keeps a problem only if its trunk accuracy is neither 0 nor 1. The transformers
engine's decode-time KV of every kept trunk is saved (safetensors per problem) so that
the replay stage, in another process, can resume it.
"""
from __future__ import annotations

import logging
import time

from ..core import progress
from ..core.files import atomic_save, atomic_write_json
from ..measure.data import load_problems
from ..measure.sampling import (
    Screen,
    batch_wave,
    engine_info,
    engine_record,
    sample_batch,
    screen_batches,
)
from ..measure.state import save_state
from ..runtime.executor import lease_record, make_executor
from ..runtime.params import Params
from ..runtime.rundir import StageDir

log = logging.getLogger("replaylib")
STAGE = "01_sampling"


def run(params: Params, out_dir=None) -> dict:
    """Sample, grade and screen trunks; write problems.json, trunks.parquet, state/, accuracy.csv."""
    problems = load_problems(params.task)  # problem_start and n_problems are within it (params.make)
    stage = StageDir(params, STAGE, out_dir).begin()
    started = time.perf_counter()
    ex = make_executor(params, stage=STAGE)
    seconds = {"engine start": round(time.perf_counter() - started, 2)}
    started = time.perf_counter()
    try:
        info = ex.call(engine_info)
        log.info("config %s, stage %s, engine %s (executor %s)", params.config, STAGE, info["engine"], ex.name)
        take = screen_batches(params, len(problems))
        screen, digests = Screen(params, problems), {}
        # a local engine advances the line as its trunks finish; Ray actors' trunks are counted as batches return
        bar = progress.bar(stage.path, "trunks", 0, "trunk", count_rows=ex.reports_progress)
        while len(screen.kept) < params.n_problems:
            wave = batch_wave(params, take, params.n_problems - len(screen.kept))
            if not wave:
                break
            units = [(f"{STAGE} batch of problems {b[0]}-{b[-1]}",
                      (params, [(pid, problems[pid].question, problems[pid].gold) for pid in b])) for b in wave]
            bar.add_total(sum(len(b) for b in wave) * params.n_rollouts)
            for _, (sampled, state) in ex.map(sample_batch, units):
                if not ex.reports_progress:
                    bar.update(sum(len(got["trunks"]) for got in sampled.values()))
                for pid in screen.add(sampled):
                    if state is not None:  # the transformers engine's decode-time KV, for the replay stage
                        save_state(state[pid], stage.file(f"state/problem_{pid:05d}.safetensors"))
                        digests[str(pid)] = {str(r): d for r, d in state[pid].expected.items()}
        seconds["trunks"] = round(time.perf_counter() - started, 2)
        started = time.perf_counter()
    finally:
        ex.close()
    seconds["engine stop"] = round(time.perf_counter() - started, 2)
    bar.close()
    if len(screen.kept) < params.n_problems:
        log.warning("kept %d of %d problems after scanning %d (scan_limit %d)", len(screen.kept), params.n_problems,
                    len(screen.scanned), params.scan_limit)
    if not screen.kept:
        raise RuntimeError(f"{STAGE}: no problem passed the screen in {len(screen.scanned)} scanned; raise "
                           f"scan_limit or set screen_mixed: false")
    trunks_df, accuracy = screen.trunks(), screen.accuracy()
    atomic_save(stage.file("trunks.parquet"), lambda tmp: trunks_df.to_parquet(tmp, index=False))
    atomic_save(stage.file("accuracy.csv"), lambda tmp: accuracy.to_csv(tmp, index=False))
    atomic_write_json(stage.file("engine.json"), engine_record(info))
    atomic_write_json(stage.file("problems.json"), screen.problem_list())
    outputs = ["trunks.parquet", "accuracy.csv", "engine.json", "problems.json"]
    outputs += sorted(str(p.relative_to(stage.path)) for p in (stage.path / "state").glob("*.safetensors"))
    # the digest of every decode-time state, taken when it was produced: the replay stage checks the
    # tensors it resumes against these, not against the saved file's own metadata
    stage.finish(outputs, {"engine": info["engine"], "state_digests": digests, "seconds": seconds,
                           **lease_record(ex)})
    return {"kept": screen.kept, "scanned": len(screen.scanned), "trunk_accuracy": float(trunks_df["correct"].mean()),
            "kept_accuracy": float(trunks_df[trunks_df.kept]["correct"].mean())}

