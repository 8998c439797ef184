"""Credit for a training step: an engine loaded once (or the trainer's own model, or the vllm.LLM it samples
with), called per batch; the batch in memory (a list of rollout dicts, TRL's tensors with their masks, a verl
DataProto: replaylib.credit.batches), nothing written, a DataFrame back (the rows of credit.parquet) and the
step's summary and metrics beside it.

    estimator = Estimator(model="Qwen/Qwen2.5-0.5B-Instruct", grader="gsm8k", k=4)   # loads once
    frame = estimator(batch)            # every call: this batch's pivots, A per pass, certificates
    trainer_log.update(estimator.metrics())
    estimator.close()

The same code computes a row here as in ``python -m replaylib.credit`` (replaylib.credit.kernel, run by the
stages' runner without shards)."""
from __future__ import annotations

import contextlib
import logging
import re
import time

import pandas as pd

from ..measure.credit import TOOL_PASSES
from .calibration import Cost, calibrate
from .inputs import BadInput
from .kernel import SAMPLER_BLOCKS, groups_of
from .tool import GivenEngine, Settings, compute_groups, context_of, describe, model_files, open_executor, \
    read_checked, results, vocab_of, warn

CERTIFIED = ("bit-exact", "within arithmetic")
log = logging.getLogger("replaylib")


def as_keywords(line: str) -> str:
    """A line naming the command's flags, as the keywords a caller in Python gives: '--k 0' reads 'k=0',
    'raise --max-cont-tokens' 'raise max_cont_tokens'."""
    def keyword(match) -> str:
        name = match.group(1).replace("-", "_")
        return f"{name}={match.group(2)}" if match.group(2) else name
    return re.sub(r"(?<![\w.-])--([a-z][a-z0-9-]*)(?: (-?\d[\w.+-]*|nan|-?inf|'[^']*'))?", keyword, line)


def checked(settings: Settings, who: str) -> Settings:
    """settings.check(), its refusal naming the keywords a caller in Python gives (who: the caller's name)."""
    try:
        settings.check()
    except BadInput as e:
        raise BadInput(f"{who}: {as_keywords(str(e))}") from None
    return settings


class Once:
    """Says each line once: a line that differs from one said before only in its numbers is the same line (a
    warning repeated at every training step says nothing new)."""

    def __init__(self, say):
        self.say, self.seen = say, set()

    def __call__(self, line: str) -> None:
        key = re.sub(r"\d+(\.\d+)?", "#", line)
        if key not in self.seen:
            self.seen.add(key)
            self.say(line)


class Estimator:
    """Counterfactual credit of a trainer's rollouts, batch after batch, on one engine.

    model: a model spec (a hub id or local directory, embedded:NAME, tiny:SEED; loaded once, as the command
    loads it), or a transformers model in memory with its ``tokenizer`` (a trainer's policy, used as it is at
    each call: in eval mode while the estimator runs, its training mode restored after). llm: a vllm.LLM the
    caller built with ``replaylib.credit.llm_settings()`` (left running on close). engine: an engine of this
    package already loaded. grader: gsm8k, math, MODULE:FUNCTION, or a function (verl's compute_score, a TRL
    reward function, an OpenRLHF reward_func). progress: a progress bar per call. settings: those of
    ``tool.Settings`` (k, margin, passes, max_cont_tokens, logprobs_temperature, ...)."""

    def __init__(self, model=None, grader="gsm8k", *, tokenizer=None, llm=None, engine=None, progress: bool = False,
                 **settings):
        given = [x is not None for x in (model, llm, engine)]
        if sum(given) != 1:
            raise BadInput("Estimator: give one of model (a spec or a model in memory), llm or engine")
        self.live = model if model is not None and not isinstance(model, str) else None
        if self.live is not None:
            from ..measure.engine_hf import HFEngine
            if tokenizer is None:
                raise BadInput("Estimator: a model in memory needs its tokenizer (tokenizer=...)")
            engine = HFEngine.around(model, tokenizer, settings.pop("invariant", False),
                                     settings.pop("max_batch_rows", 128))
        elif llm is not None:
            from ..measure.engine import EngineUnavailable
            from ..measure.vllm_given import engine_around
            try:
                engine = engine_around(llm, settings.get("invariant", False))
            except EngineUnavailable as e:
                raise BadInput(str(e)) from None
        if engine is not None:  # what the engine is, as the summary records it
            shown = engine.describe()
            settings.setdefault("engine", shown.get("engine", "hf"))
            settings.setdefault("device", "cuda" if "cuda" in str(shown.get("device", "")) else "cpu")
            settings.setdefault("dtype", shown.get("dtype", "bfloat16"))
        name = model if isinstance(model, str) else shown.get("model", "in memory")
        self.settings = checked(Settings(model=name, grader=grader, **settings), "Estimator")
        if engine is not None:
            self.executor = GivenEngine(engine)
            self.vocab, self.context = vocab_of(engine), context_of(engine)
        else:
            _, self.vocab, self.context = model_files(self.settings)
            self.executor = open_executor(self.settings)
        self.described = self.executor.call(describe)
        self.summary: dict = {}
        self.progress = progress  # a progress bar per call (off: a trainer's loop draws its own)
        self.cost = None  # what a batch will take: calibrated on the first batch, then from the groups measured
        self.first_s = None  # the last batch's first rollout, priced: the least a call measures
        self.computing_s = 0.0  # the last call's seconds computing its groups
        self.calibrating_s = 0.0  # and calibrating (the rest: reading, pricing, summing up)
        self.waits = False  # its caller waits for its budget to grow (CreditCallback's account): no fit, no warning
        # while only the calibration prices a rollout, a call with a budget measures one: a price far off then
        # overruns the budget by one rollout at most (CreditCallback's)
        self.prudent = False
        self.warn = Once(lambda line: warn(as_keywords(line)))

    @contextlib.contextmanager
    def _evaluating(self):
        """A trainer's model in eval mode (no dropout) while the engine runs it, its mode restored after."""
        if self.live is None:
            yield
            return
        training = self.live.training
        self.live.eval()
        try:
            yield
        finally:
            self.live.train(training)

    def __call__(self, batch, budget_s: float | None = None, first: int | None = None,
                 resident=None) -> pd.DataFrame:
        """This batch's credit: one row per pivot (the columns of credit.parquet); its summary in ``summary``.
        budget_s: the seconds this call may take; the rollouts are taken in order while their estimated cost
        fits (a calibration on the first call's first group, then what the groups measured took). first: at most
        the batch's first this many rollouts (with forcing "batch" the whole batch is still forced, as sampled).
        resident (forcing "batch" on a vLLM engine that sampled the batch in one call, its top-k and logprobs
        recorded): a function returning None while the blocks that sampling wrote are in the engine's prefix cache
        as it wrote them, else why not (trl_vllm.SampledBlocks.gone); the first group then resumes them unforced."""
        started = time.perf_counter()
        if first is not None and (isinstance(first, bool) or not isinstance(first, int) or first < 1):
            raise BadInput(f"Estimator: first {first!r}: give a number of rollouts, at least 1, or None for all")
        if resident is not None and (self.settings.forcing != "batch" or not callable(resident)
                                     or getattr(getattr(self.executor, "engine", None), "name", None) != "vllm"):
            raise BadInput(f"Estimator: resident {resident!r}: give a function (None while the sampled blocks are "
                           f"cached), with forcing 'batch' on the vLLM engine that sampled the batch (llm= or "
                           f"engine=), or leave it out")
        try:
            source, rollouts, inputs = read_checked(batch, self.settings, self.vocab, self.context)
        except BadInput as e:
            raise BadInput(as_keywords(str(e))) from None
        if resident is not None and rollouts:
            rollouts[0].batch.resident = resident
        if first is not None and first < len(rollouts):
            rollouts = rollouts[:first]
            inputs = {"groups": groups_of(rollouts), "path": source}
        with self._evaluating():
            self.computing_s = self.calibrating_s = 0.0
            if self.cost is None:
                calibrating = time.perf_counter()
                self.cost = Cost(self.settings, self.executor.call(calibrate, self.settings, inputs["groups"][0]))
                self.calibrating_s = time.perf_counter() - calibrating
            chosen = rollouts
            self.first_s = self.cost(groups_of(rollouts[:1])) if rollouts else None
            if budget_s is not None:
                budget_s = max(0.0, budget_s - (time.perf_counter() - started))  # the calibration spent some
                chosen = rollouts[:self.cost.fitting(rollouts, budget_s)]
                if self.prudent and not self.cost.groups:
                    chosen = chosen[:1]
                inputs = {"groups": groups_of(chosen), "path": source}
            estimated = self.cost(inputs["groups"])
            log.info(as_keywords(self.estimate_line(len(chosen), len(rollouts), inputs["groups"], estimated,
                                                    budget_s)))
            if chosen:
                computing = time.perf_counter()
                computed = compute_groups(self.settings, inputs, self.executor, show=self.progress)
                self.computing_s = time.perf_counter() - computing
                self.cost.update(inputs["groups"], self.computing_s)
        if chosen:
            frame, _, self.summary = results(self.settings, inputs, computed, len(chosen), self.described,
                                             say=self.warn)
            self.summary["warnings"] = [as_keywords(line) for line in self.summary["warnings"]]
        else:
            if rollouts and not self.waits:
                self.warn(f"a budget of {budget_s:.2f} s fits no rollout of this batch (its first would take about "
                          f"{self.first_s:.2f} s); give a larger one (budget_s; CreditCallback's budget_share)")
            frame, self.summary = pd.DataFrame(), {"rollouts": 0, "pivots": 0}
        self.summary.update(rollouts_given=len(rollouts), estimated_s=round(estimated, 3),
                            seconds=round(time.perf_counter() - started, 3))
        if budget_s is not None:
            self.summary["budget_s"] = round(budget_s, 3)
        return frame

    def estimate_line(self, chosen: int, given: int, groups: list, estimated: float, budget_s) -> str:
        taken = f"{chosen} of {given} rollouts" if chosen < given else f"{given} rollouts"
        budget = "" if budget_s is None else f" in a budget of {budget_s:.2f} s"
        calibrated = f"; the calibration took {self.calibrating_s:.2f} s" if self.calibrating_s else ""
        return (f"credit: {taken} ({len(groups)} prompt groups){budget}: about {estimated:.2f} s "
                f"({self.cost.basis()}{calibrated})")

    estimate = __call__

    def metrics(self, prefix: str = "credit/") -> dict:
        """The last batch's numbers as floats, for a trainer's logs: rollouts measured, pivots, common pivots,
        the replica floor and re-feed's share of sign changes (left out where no common pivot: a logger takes no
        None or NaN), certificates passed, failed and not recorded (rollouts without logprobs), pivots whose
        passes resumed the sampler's own blocks unforced (on_sampler_blocks), pivots whose
        resume was not verified, passes agreeing, the share of continuations cut at max_cont_tokens (graded
        unfinished; where most are, most A are 0), the seconds estimated and taken, and the budget if one was
        given."""
        s = self.summary
        certs = s.get("certificates", {})
        found = {"rollouts": s.get("rollouts", 0), "pivots": s.get("pivots", 0),
                 "common_pivots": s.get("common_pivots", 0), "floor": s.get("floor"), "refeed": s.get("refeed"),
                 "certified": sum(certs.get(c, 0) for c in CERTIFIED), "certificates_differ": certs.get("differs", 0),
                 "certificates_not_recorded": certs.get("not recorded", 0),
                 "on_sampler_blocks": certs.get(SAMPLER_BLOCKS, 0), "not_verified": s.get("not_verified", 0),
                 "passes_agree": s.get("passes_agree", 0),
                 "continuations_cut": s["continuations_cut"] / s["continuations"] if s.get("continuations") else None,
                 "estimated_s": s.get("estimated_s"),
                 "seconds": s.get("seconds", 0.0), "budget_s": s.get("budget_s")}
        if not set(TOOL_PASSES) <= set(self.settings.passes):
            found.pop("floor"), found.pop("refeed")
        return {f"{prefix}{k}": float(v) for k, v in found.items() if v is not None}

    def close(self) -> None:
        """Stop the engine this estimator loaded (a model or LLM given to it stays as it was); a call after
        this is one line."""
        self.executor.close()
        self.executor = Closed()

    def __enter__(self) -> "Estimator":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class Closed:
    """The engine of an Estimator that was closed: any use of it is one line."""

    def __getattr__(self, name):
        raise BadInput("this Estimator was closed; make a new one")

    def close(self) -> None:
        pass
