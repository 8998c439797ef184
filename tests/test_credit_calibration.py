"""The estimate printed before the first group: on an engine whose calls cost a fixed time plus a time per step
(and whose first call of each kind costs far more: compilation), the calibration recovers both parts and the
estimate equals what the plan costs on that engine. A simulated clock: nothing here depends on machine speed."""
from types import SimpleNamespace

import pytest

from replaylib.credit.calibration import calibrate, estimate, estimate_line, fit
from replaylib.credit.tool import Settings

WARM_UP = 60.0  # an engine's first call of a kind: compiling, capturing, allocating
FORCED = (0.5, 0.02)  # a group's forced decoding: fixed seconds, seconds per step
PASS = (0.2, 0.01)  # one pass, per pivot: fixed seconds, seconds per continuation token


class TimedEngine:
    """Costs on a simulated clock: forced decoding (fixed + per step of the longest response), a pass (per pivot,
    fixed + per continuation token); the first call of each kind also costs WARM_UP."""

    def __init__(self):
        self.now, self.seen = 0.0, set()

    def clock(self) -> float:
        return self.now

    def _first(self, kind: str) -> float:
        first = kind not in self.seen
        self.seen.add(kind)
        return WARM_UP if first else 0.0

    def force_trunks(self, prompt_ids, responses, top_logprobs):
        self.now += self._first("force") + FORCED[0] + FORCED[1] * max(len(r) for r in responses)
        return None, "state"

    def run_pass(self, jobs, pass_name, settings, state):
        self.now += self._first("pass") + len(jobs) * (PASS[0] + PASS[1] * settings.max_tokens)


def group(n: int, length: int, prompt=(1, 2, 3)):
    return [SimpleNamespace(prompt_ids=list(prompt), response_ids=list(range(10, 10 + length)), positions=None)
            for _ in range(n)]


@pytest.mark.parametrize("max_cont_tokens", [64, 256])
def test_the_estimate_is_what_the_plan_costs_on_an_engine_of_fixed_and_per_step_costs(max_cont_tokens):
    settings = Settings(model="m", grader="gsm8k", k=4, max_pivots_per_rollout=3, max_cont_tokens=max_cont_tokens)
    groups = [group(3, 250), group(3, 200, prompt=(4, 5)), group(2, 300, prompt=(6,))]
    engine = TimedEngine()
    measured = calibrate(engine, settings, groups[0], clock=engine.clock)
    assert measured["forced"] == pytest.approx(FORCED) and measured["pivots"] == 9
    assert measured["pass"][0] == pytest.approx(9 * PASS[0]) and measured["pass"][1] == pytest.approx(9 * PASS[1])
    truth = sum(FORCED[0] + FORCED[1] * max(len(r.response_ids) for r in g)
                + len(settings.passes) * 3 * len(g) * (PASS[0] + PASS[1] * max_cont_tokens) for g in groups)
    total, per_pivot = estimate(groups, [0, 1, 2], settings, measured)
    assert total == pytest.approx(truth)
    assert per_pivot == pytest.approx(len(settings.passes) * (PASS[0] + PASS[1] * max_cont_tokens))
    assert estimate_line(groups, [0, 1, 2], settings, measured).startswith("estimate: about ")


class JitteryEngine(TimedEngine):
    """A GPU's passes: one call decodes every pivot at once, 0.3 s of fixed cost with a jitter of up to 0.05 s
    (here the 2-step pass is slower than the 8-step one), 7 ms a step."""

    JITTER = [0.05, 0.0, 0.02, -0.02, 0.01, 0.03]

    def run_pass(self, jobs, pass_name, settings, state):
        self.calls = getattr(self, "calls", -1) + 1
        jitter = self.JITTER[self.calls % len(self.JITTER)]
        self.now += self._first("pass") + 0.3 + jitter + 0.007 * settings.max_tokens


@pytest.mark.parametrize("max_cont_tokens", [16, 256])
def test_the_calibration_lengthens_its_pass_until_the_steps_cost_shows_through_the_jitter(max_cont_tokens):
    """Lease 20 (an H100, 256-token continuations): the first batch was estimated at 1.33 s and took 11.2 s, the
    2- and 8-step passes timing mostly the call's fixed cost. Lengthened until the steps show, the estimate of a
    pass at the continuation length is within 10% of its cost."""
    settings = Settings(model="m", grader="gsm8k", k=4, max_pivots_per_rollout=2, max_cont_tokens=max_cont_tokens)
    engine = JitteryEngine()
    fixed, per_step = calibrate(engine, settings, group(3, 250), clock=engine.clock)["pass"]
    truth = 0.3 + 0.007 * max_cont_tokens
    assert fixed + per_step * max_cont_tokens == pytest.approx(truth, rel=0.1)


def test_a_fit_is_never_below_zero_and_one_length_is_all_per_step():
    assert fit((4, 16), (2.0, 1.0)) == (1.0, 0.0)  # noise: the longer call was faster
    assert fit((4, 16), (0.1, 1.3)) == pytest.approx((0.0, 0.1))
    assert fit((5, 5), (1.0, 1.0)) == (0.0, 0.2)  # responses too short for two lengths
