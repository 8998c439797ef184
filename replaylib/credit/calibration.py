"""What a run will cost, before its first group: a short calibration on the engine, scaled to the plan. On the
first group, after a warm-up call of each kind (an engine's first calls compile and allocate), its responses
are forced for two lengths and one pass runs two continuation lengths at its pivots, in the batch shape the
passes use; each kind of call is then a fixed cost (reset, prefill, scheduling) plus a cost per step, and the
plan is priced with every continuation running to --max-cont-tokens (those that end early cost less; a longer
cache costs more per token, and so does a busy machine). Nothing computed here is kept."""
from __future__ import annotations

import math
import time

from ..measure.engine import ARMS, PassSettings, PivotJob
from .diagnostics import planned_pivots
from .kernel import groups_of, sampler_blocks_resident

FORCED_STEPS = (4, 16)  # tokens of each response forced, the two calls
DECODE_STEPS = (2, 8)  # continuation tokens of the two passes (the longer lengthened while SIGNAL is not met)
SIGNAL = 2.0  # the longer pass takes at least this many times the shorter: its extra steps outweigh the jitter


def fit(steps: tuple[int, int], seconds: tuple[float, float]) -> tuple[float, float]:
    """(fixed, per step) of a call from two timings at two step counts; neither below zero."""
    (short, long), (t_short, t_long) = steps, seconds
    if long <= short:
        return 0.0, t_long / max(1, long)
    if t_long <= t_short:  # noise larger than the steps' cost: the later (warmer) call is all fixed cost
        return t_long, 0.0
    per_step = (t_long - t_short) / (long - short)
    return max(0.0, t_short - per_step * short), per_step


def calibrate(engine, settings, group: list, clock=time.perf_counter) -> dict:
    """A group's forced decoding and one pass at up to max_pivots_per_rollout pivots per rollout, each as
    (fixed seconds, seconds per step), on this engine."""
    def timed(call):
        started = clock()
        out = call()
        return clock() - started, out

    def cut(n: int) -> list[list[int]]:  # the group's responses, their first n tokens
        return [r.response_ids[:n] for r in group]

    prompt = list(group[0].prompt_ids)
    forced_steps = tuple(max(len(r) for r in cut(n)) for n in FORCED_STEPS)
    engine.force_trunks(prompt, cut(2), 5)  # warm-up
    t_short, _ = timed(lambda: engine.force_trunks(prompt, cut(FORCED_STEPS[0]), 5))
    t_long, (_, state) = timed(lambda: engine.force_trunks(prompt, cut(FORCED_STEPS[1]), 5))
    forced = fit(forced_steps, (t_short, t_long))
    jobs = []
    for rollout, response in enumerate(cut(FORCED_STEPS[1])):
        for i in range(min(settings.max_pivots_per_rollout, len(response) - 1)):
            at = len(response) - 1 - i
            jobs.append(PivotJob(pivot_id=len(jobs), problem_id=0, rollout=rollout, gen_index=at, prompt_ids=prompt,
                                 gen_prefix=list(response[:at]), forced={arm: int(response[at]) for arm in ARMS},
                                 seeds={arm: list(range(settings.k)) for arm in ARMS}))
    if not jobs:
        return {"forced": forced, "pass": None, "pivots": 0}

    def one_pass(steps: int):
        one = PassSettings(k=settings.k, temperature=settings.temperature, top_p=settings.top_p, max_tokens=steps,
                           probe_tokens=1, stop_at_answer=False, task="credit")
        return timed(lambda: engine.run_pass(jobs, "exact1", one, state))[0]

    one_pass(1)  # warm-up
    cap = settings.max_cont_tokens
    short, long = (min(n, cap) for n in DECODE_STEPS)
    t_short, t_long = one_pass(short), one_pass(long)
    # where a call's fixed cost hides its steps' (a GPU: a few steps cost less than the call's jitter), the longer
    # pass is lengthened until its steps show, or it runs the whole continuation length (whose cost it then is)
    while t_long < SIGNAL * t_short and long < cap:
        long = min(4 * long, cap)
        t_long = one_pass(long)
    return {"forced": forced, "pass": fit((short, long), (t_short, t_long)), "pivots": len(jobs),
            "pass_steps": (short, long)}


def forced_length(group: list) -> int:
    """The decode steps a group's forced decoding takes: its longest response; forced with its whole batch
    (forcing "batch": the batch is forced for each group whose passes need it), the batch's longest."""
    batch = getattr(group[0], "batch", None)
    responses = batch.responses if batch is not None else [r.response_ids for r in group]
    return max(len(r) for r in responses)


def estimate(groups: list[list], todo: list[int], settings, measured: dict) -> tuple[float, float]:
    """(seconds for the plan, seconds of passes a pivot): each group's forced decoding (forced_length; none for a
    first group that resumes the blocks its sampler left cached), and each pass over its pivots at the full
    continuation length, scaled from the calibration's pivots."""
    fixed, per_step = measured["forced"]
    batch = getattr(groups[0][0], "batch", None) if groups else None
    unforced = batch is not None and sampler_blocks_resident(batch, groups[0], say=False)
    total = sum(fixed + per_step * forced_length(groups[i]) for i in todo if not (i == 0 and unforced))
    if not measured["pass"]:
        return total, 0.0
    fixed, per_step = measured["pass"]
    per_pivot = len(settings.passes) * (fixed + per_step * settings.max_cont_tokens) / measured["pivots"]
    return total + per_pivot * sum(planned_pivots(groups[i], settings) for i in todo), per_pivot


def estimate_line(groups: list[list], todo: list[int], settings, measured: dict) -> str:
    total, per_pivot = estimate(groups, todo, settings, measured)
    return (f"estimate: about {_duration(total)} for {len(todo)} groups with every continuation at "
            f"--max-cont-tokens ({per_pivot:.2f} s of passes a pivot; from a calibration on the first group: "
            f"{measured['pivots']} pivots at {' and '.join(map(str, measured.get('pass_steps', DECODE_STEPS)))} "
            f"continuation tokens, its "
            f"responses forced {' and '.join(map(str, FORCED_STEPS))} tokens, after a warm-up)")


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{math.ceil(seconds)} s"
    return f"{seconds / 60:.1f} min" if seconds < 5400 else f"{seconds / 3600:.1f} h"


class Cost:
    """What a plan will take on this engine: the calibration's estimate (every continuation at --max-cont-tokens),
    scaled by what the groups measured so far took against their own estimates, so that the estimate follows the
    continuations' real lengths and the machine's load."""

    def __init__(self, settings, measured: dict):
        self.settings, self.measured = settings, measured
        self.estimated = self.took = 0.0  # over the groups measured so far
        self.groups = 0

    def calibrated(self, groups: list[list]) -> float:
        return estimate(groups, list(range(len(groups))), self.settings, self.measured)[0]

    def scale(self) -> float:
        return self.took / self.estimated if self.estimated > 0 else 1.0

    def __call__(self, groups: list[list]) -> float:
        """Seconds for these groups (each a prompt's rollouts)."""
        return self.calibrated(groups) * self.scale()

    def update(self, groups: list[list], seconds: float) -> None:
        """These groups took these seconds."""
        self.estimated += self.calibrated(groups)
        self.took += seconds
        self.groups += len(groups)

    def fitting(self, rollouts: list, budget_s: float) -> int:
        """How many of the rollouts, taken in order, fit the budget."""
        fits = 0
        while fits < len(rollouts) and self(groups_of(rollouts[:fits + 1])) <= budget_s:
            fits += 1
        return fits

    def basis(self) -> str:
        if self.groups:
            return f"from the groups measured so far ({self.groups})"
        return "from a calibration on the first group, every continuation at --max-cont-tokens"
