"""What a run will cost, before its first group: a short calibration on the engine (the first group's responses
forced for a few tokens, then one pass of a few continuation tokens at the first group's pivots, in the batch
shape the passes use) scaled to the plan, with every continuation running to --max-cont-tokens (those that end
early cost less; a longer cache costs more per token, and so does a busy machine). Nothing computed here is
kept."""
from __future__ import annotations

import math
import time

from ..measure.engine import ARMS, PassSettings, PivotJob

FORCED_STEPS = 16  # tokens of each response forced in the calibration
DECODE_STEPS = 8  # continuation tokens of the calibration's pass


def calibrate(engine, settings, group: list) -> dict:
    """Seconds per forced decoding step of a group's responses, and per continuation token of one pass at up to
    max_pivots_per_rollout pivots per rollout (the group's shape), on this engine."""
    responses = [r.response_ids[:FORCED_STEPS] for r in group]
    started = time.perf_counter()
    _, state = engine.force_trunks(group[0].prompt_ids, responses, 5)
    forced_s = (time.perf_counter() - started) / max(1, max(len(r) for r in responses))
    jobs = []
    for rollout, response in enumerate(responses):
        for i in range(min(settings.max_pivots_per_rollout, len(response) - 1)):
            at = len(response) - 1 - i
            jobs.append(PivotJob(pivot_id=len(jobs), problem_id=0, rollout=rollout, gen_index=at,
                                 prompt_ids=list(group[0].prompt_ids), gen_prefix=list(response[:at]),
                                 forced={arm: int(response[at]) for arm in ARMS},
                                 seeds={arm: list(range(settings.k)) for arm in ARMS}))
    if not jobs:
        return {"forced_step_s": forced_s, "pivot_token_s": None, "pivots": 0}
    steps = min(DECODE_STEPS, settings.max_cont_tokens)
    one = PassSettings(k=settings.k, temperature=settings.temperature, top_p=settings.top_p, max_tokens=steps,
                       probe_tokens=1, stop_at_answer=False, task="credit")
    started = time.perf_counter()
    engine.run_pass(jobs, "exact1", one, state)
    return {"forced_step_s": forced_s, "pivot_token_s": (time.perf_counter() - started) / steps / len(jobs),
            "pivots": len(jobs)}


def estimate_line(groups: list[list], todo: list[int], settings, measured: dict) -> str:
    """The plan's cost from a calibration: each group's longest response forced, and every pivot's passes at
    the full continuation length, at the calibration's rates."""
    forced = sum(max(len(r.response_ids) for r in groups[i]) for i in todo) * measured["forced_step_s"]
    pivots = sum(len(r.positions) if r.positions is not None else min(settings.max_pivots_per_rollout,
                                                                        len(r.response_ids))
                 for i in todo for r in groups[i])
    per_pivot = (measured["pivot_token_s"] or 0.0) * settings.max_cont_tokens * len(settings.passes)
    total = forced + pivots * per_pivot
    return (f"estimate: about {_duration(total)} for {len(todo)} groups with every continuation at "
            f"--max-cont-tokens ({per_pivot:.2f} s a pivot; from a calibration of {measured['pivots']} pivots x "
            f"{DECODE_STEPS} continuation tokens and {FORCED_STEPS} forced tokens a response)")


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{math.ceil(seconds)} s"
    return f"{seconds / 60:.1f} min" if seconds < 5400 else f"{seconds / 3600:.1f} h"
