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

from ..core.files import atomic_save, atomic_write_json
from ..measure.data import load_problems
from ..measure.invariant import invariant_unit, stage_outputs
from ..runtime.executor import lease_record, make_executor
from ..runtime.outputs import load_sampling
from ..runtime.params import Params
from ..runtime.rundir import StageDir

log = logging.getLogger("replaylib")
STAGE = "05_batch_invariant"


def run(params: Params, out_dir=None) -> dict:
    stage = StageDir(params, STAGE, out_dir).begin()
    _, _, problem_info = load_sampling(params, out_dir)
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
    records, report = stage_outputs(described, records, params)
    atomic_save(stage.file("records.parquet"), lambda tmp: records.to_parquet(tmp, index=False))
    atomic_write_json(stage.file("invariant.json"), report)
    if not report["all_identical"]:
        raise AssertionError(f"{STAGE}: passes disagree in invariant mode ({report}); see "
                             f"{stage.file('records.parquet')}")
    stage.finish(["records.parquet", "invariant.json"], {"report": report, "seconds": seconds, **lease_record(ex)})
    return report

