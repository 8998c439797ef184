"""Credit inside a TRL training loop: every N steps, the rollouts of a GRPO step that fit a time budget go through
the credit estimator on the trainer's own model, as the trainer sampled them and before its optimizer step moves
the policy, and the credit metrics join that step's logs (``trainer.state.log_history`` and every ``report_to``).

    trainer = GRPOTrainer(model=model, reward_funcs=[correct], args=args, train_dataset=dataset,
                          processing_class=tokenizer)
    CreditCallback(every=10, k=2).attach(trainer)
    trainer.train()

The rollouts are read where TRL has them as token ids, its tensors ``prompt_ids``/``prompt_mask`` (left
padded) and ``completion_ids``/``completion_mask`` (right padded), from the method that samples and scores
a step (``GRPOTrainer._generate_and_score_completions``, wrapped). The grader is the trainer's first reward
function unless one is given, and it is called as the trainer calls it (``TrainerReward``). The rollouts are
forced through the engine that sampled them: TRL's colocated vLLM engine when the trainer was built inside
``trl_vllm.vllm_for_credit()`` (its sampled tokens' raw logprobs recorded while it samples), else the policy in
transformers, as generate batched them (their logprobs at the trainer's temperature recorded). On TRL's engine,
while the blocks its decode wrote are still in its prefix cache, the first group measured resumes them unforced
(trl_vllm.SampledBlocks). Certificates
compare with those, never with ``old_per_token_logps``, which a training forward recomputes (another
computation than the decode's, so no evidence about the decode-time state).

Credit never stops training: a failure is one warning (once per message) and ``credit/skipped`` 1 for that
step (``strict=True`` raises it instead). Credit has a budget: a share of the training's own time so far (each
step's, measured between on_step_begin and on_step_end, credit's left out; the first step's sampling for the
first), less what credit already spent, so seconds a measured step leaves unspent carry over; or seconds per
measured step. The rollouts it measures are those the estimated cost fits. Rates pooled over the run, with their
intervals and the verdict, are logged beside each step's numbers; every pivot is a row of
``<output_dir>/credit/pivots.jsonl``."""
from __future__ import annotations

import collections
import contextlib
import dataclasses
import json
import logging
import math
import time
from pathlib import Path

import torch
from transformers import LogitsProcessor, StoppingCriteria, TrainerCallback

from .estimator import Once, checked
from .inputs import ALIASES, BadInput
from .running import Pooled
from .tool import Settings
from .trl_vllm import SampledBlocks, SamplerTap, colocated_llm, model_runner, per_position, raw_logprobs

SAMPLER_LOGPROBS = "sampling_per_token_logps"  # the sampler's own; not old_per_token_logps (a training forward's)
TENSORS = ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask")
ROW = "credit_row"  # the batch column that tells TrainerReward which dataset row a rollout came from
log = logging.getLogger("replaylib")


def rollout_ids(rows: list[dict], step: int) -> list[str]:
    """Unique ids for a step's rollouts: GRPO repeats each dataset row once per generation, so the row's id (or,
    without an id column, the prompt's number in the step) gets the rollout's number among its repeats:
    'problem-0#2'."""
    prompts, repeats, ids = {}, {}, []
    for row in rows:
        base = row.get("id")
        if base is None:
            key = json.dumps(row["prompt"], sort_keys=True, default=str)
            base = f"step{step}-{prompts.setdefault(key, len(prompts))}"
        repeats[str(base)] = n = repeats.get(str(base), -1) + 1
        ids.append(f"{base}#{n}")
    return ids


def _ignored(*args, **kwargs) -> None:
    """log_extra and log_metric for credit's grading: its thousands of grades are not the training's."""


class TrainerReward:
    """A TRL reward function called on one graded completion with what GRPOTrainer gives it: the row's prompt
    and columns as the dataset holds them (an int answer stays an int), the completion in the trainer's format
    (a message list where the prompt is a conversation, else text), its token ids, and TRL's trainer_state,
    log_extra and log_metric (those two take nothing: see _ignored)."""

    def __init__(self, fn, trainer):
        self.fn, self.trainer = fn, trainer
        self.__name__ = getattr(fn, "__name__", type(fn).__name__)  # what a grading error names
        self.rows: list[dict] = []  # this step's dataset rows, as GRPO repeated them
        self.decoded: dict = {}  # text -> token ids, as the engine decoded them this step (the graded texts')

    def __call__(self, prompts, completions, credit_row, **_):
        from trl.data_utils import is_conversational
        row, text = self.rows[credit_row[0]], completions[0]
        ids = self.decoded.get(text)
        if ids is None:  # not a text the engine decoded (never, as the estimator grades): its tokens again
            ids = self.trainer.processing_class(text, add_special_tokens=False)["input_ids"]
        # as GRPOTrainer._generate decodes a completion (without a tokenizer's response schema)
        conversational = is_conversational({"prompt": row["prompt"]})
        completion = [{"role": "assistant", "content": text}] if conversational else text
        columns = {k: [v] for k, v in row.items() if k not in ("prompt", "completion", "completion_ids")}
        return self.fn(prompts=[row["prompt"]], completions=[completion], completion_ids=[ids],
                       trainer_state=self.trainer.state, log_extra=_ignored, log_metric=_ignored, **columns)


class SampledLogprobs:
    """What TRL keeps of vLLM's sampling (sampling_per_token_logps) but not of transformers' generate: each sampled
    token's logprob at the trainer's temperature, log softmax(logits / T), from the logits generate sampled it
    from. A logits processor takes those logits (the model's own, unless a processor generate adds before a
    caller's, such as a repetition penalty, changed them; temperature, top-k and top-p come after it), and a
    stopping criterion, called once the token is appended, takes the token."""

    def __init__(self, temperature: float):
        self.temperature = temperature
        self.calls, self.steps, self.pending = 0, [], None
        recorder = self

        class Logits(LogitsProcessor):
            def __call__(self, input_ids, scores):
                recorder.pending = torch.log_softmax(scores / recorder.temperature, dim=-1)
                return scores

        class Sampled(StoppingCriteria):
            def __call__(self, input_ids, scores, **kwargs):
                recorder.steps.append(recorder.pending.gather(1, input_ids[:, -1:])[:, 0].float().cpu())
                return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)

        self.processor, self.criterion = Logits(), Sampled()

    @contextlib.contextmanager
    def around(self, model):
        """model.generate records while in this block (its class's method again after)."""
        from transformers import LogitsProcessorList, StoppingCriteriaList
        own = model.__dict__.get("generate")
        generate = model.generate

        def recording(*args, logits_processor=None, stopping_criteria=None, **kwargs):
            self.calls += 1
            self.steps = []
            return generate(*args, logits_processor=LogitsProcessorList([self.processor, *(logits_processor or [])]),
                            stopping_criteria=StoppingCriteriaList([*(stopping_criteria or []), self.criterion]),
                            **kwargs)

        model.generate = recording
        try:
            yield self
        finally:
            if own is None:
                del model.generate
            else:
                model.generate = own

    def per_token(self, completion_ids):
        """Rows x completion positions, as TRL's sampling_per_token_logps (0 past a row's end), when one generate
        call sampled these completions; else None (nothing recorded to certify)."""
        rows, width = completion_ids.shape
        if self.calls != 1 or not self.steps or self.steps[0].shape[0] != rows:
            return None
        found = torch.stack(self.steps, dim=1)[:, :width]
        return torch.nn.functional.pad(found, (0, width - found.shape[1]))


class CreditCallback(TrainerCallback):
    """every: measure every N optimizer steps. sample: at most this many of a step's rollouts (None: all that fit
    the budget). budget_share: credit's seconds at most this share of the training's own time so far, less
    credit's seconds so far (unspent seconds carry over; None: no budget); budget_s: seconds per measured step
    instead. ground_truth: the dataset column of the answer, for a grader that is not a TRL reward function
    (gsm8k, math, verl's compute_score). strict: a failure in credit stops training. settings: those of
    replaylib.credit.tool.Settings (k, margin, max_cont_tokens, forcing, ...)."""

    clock = staticmethod(time.perf_counter)

    def __init__(self, every: int = 10, sample: int | None = None, ground_truth: str = "answer", grader=None,
                 prefix: str = "credit/", strict: bool = False, budget_share: float | None = 0.1,
                 budget_s: float | None = None, **settings):
        if every < 1 or (sample is not None and sample < 1):
            raise BadInput(f"CreditCallback: every ({every}) and sample ({sample}) must be at least 1")
        for name, value in (("budget_share", budget_share), ("budget_s", budget_s)):
            if value is not None and not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise BadInput(f"CreditCallback: {name} {value!r}: give a number above 0 (budget_share: of the "
                               f"step's time, 0.1 a tenth; budget_s: seconds), or None for no budget")
        check_settings(settings)
        self.every, self.sample, self.ground_truth, self.grader = every, sample, ground_truth, grader
        self.prefix, self.strict, self.settings = prefix, strict, settings
        self.budget_share, self.budget_s = budget_share, budget_s
        self.estimator, self.trainer, self.reward = None, None, None
        self.measured: set = set()  # the steps credit ran at (a step's sampling may be called more than once)
        self.pooled = Pooled()
        self.warn = Once(lambda line: log.warning("warning: %s", line))
        self.waiting = Once(log.info)
        self.step_began = None  # when this step began
        self.own_s = 0.0  # the training's own seconds so far (credit's left out)
        self.sampled_logps = None  # this step's sampled tokens' logprobs, as the sampler computed them
        self.sampled_top = None  # and their raw top-k, per rollout and position (TRL's vLLM engine)
        self.spent = 0.0  # credit's seconds in this step
        self.spent_total = 0.0  # credit's seconds so far
        self.llm, self.tap = None, None  # TRL's colocated vLLM engine, when credit forces through it
        self.blocks = None  # whether the blocks its sampling wrote are still in its prefix cache
        self.first_prices = collections.deque(maxlen=8)  # recent batches' first rollouts, priced
        self.overhead_s = 0.0  # the last measured step's seconds besides computing
        self.verdict = None

    def attach(self, trainer) -> "CreditCallback":
        """Wrap the trainer's sampling of a step and add this callback; returns it."""
        self.trainer = trainer
        sample_and_score = trainer._generate_and_score_completions

        def wrapped(inputs):
            began = self.clock()
            step = trainer.state.global_step + 1  # the optimizer step these rollouts are for
            due = trainer.model.training and (step - 1) % self.every == 0 and step not in self.measured
            measuring = due and self.affordable()
            with self.recording(measuring) as recorder:
                out = sample_and_score(inputs)
            if due:
                self.measured.add(step)
            if measuring:
                sampled_s, tapped_s = self.clock() - began, getattr(recorder, "seconds", 0.0)
                self.log(self.run(out, inputs, step, self.budget(sampled_s, tapped_s), recorder))
            elif due:  # nothing read, recorded or run: the account grows by the step's share
                self.log({"bank_s": self.bank()})
            return out

        trainer._generate_and_score_completions = wrapped
        trainer.add_callback(self)
        self.llm, why = colocated_llm(trainer)
        if self.llm is not None:
            self.tap, self.blocks = SamplerTap(model_runner(self.llm)), SampledBlocks(self.llm)
        elif getattr(trainer, "use_vllm", False):
            self.warn(f"CreditCallback: this trainer samples with vLLM, but credit cannot force through its engine "
                      f"({why}); it forces the rollouts through the policy in transformers instead, so each "
                      f"certificate compares two engines' arithmetic and reads 'differs' (docs/credit.md, TRL)")
        return self

    def recording(self, measuring: bool):
        """While TRL samples a measured step: the sampler's logprobs of the sampled tokens recorded (vLLM's raw
        ones on TRL's engine; generate's at the trainer's temperature)."""
        if measuring and self.tap is not None:
            return self.sampling()
        if measuring and self.generates():
            return SampledLogprobs(float(self.trainer.args.temperature)).around(
                self.trainer.accelerator.unwrap_model(self.trainer.model))
        return contextlib.nullcontext()

    @contextlib.contextmanager
    def sampling(self):
        """TRL's engine while it samples a measured step: its sampler tapped, its prefix cache watched."""
        with self.blocks.sampling(), self.tap.recording() as tap:
            yield tap

    def recorded(self, recorder, out: dict):
        """The step's recorded logprobs as rows x positions, or None (certificates 'not recorded'); on TRL's
        engine, their raw top-k too (sampled_top)."""
        if isinstance(recorder, SamplerTap):
            rows = recorder.matched(out["completion_ids"], out["completion_mask"])
            self.sampled_top = None if rows is None else [top for _, top in rows]
            found = per_position(rows, out["completion_ids"].shape)
            if found is None:
                self.warn("CreditCallback: the raw logprobs vLLM computed while sampling this step could not be "
                          "matched to its rollouts; its certificates read 'not recorded'")
            return found
        return recorder.per_token(out["completion_ids"]) if recorder is not None else None

    def generates(self) -> bool:
        """Whether the trainer samples with transformers' generate, in a padded batch this package can rebuild
        (not with vLLM, nor with transformers' continuous batching)."""
        trainer = self.trainer
        return not (getattr(trainer, "use_vllm", False) or getattr(trainer, "use_transformers_continuous_batching",
                                                                    False))

    def budget(self, sampled_s: float, tapped_s: float = 0.0) -> float | None:
        """This step's seconds for credit: budget_s, or budget_share of the training's own time so far (this
        step's sampling included) less what credit spent so far; either less what the tap already took of it while
        the sampler ran (tapped_s, inside sampled_s)."""
        if self.bank() is None:
            return None if self.budget_s is None else max(0.0, self.budget_s - tapped_s)
        return max(0.0, self.bank() + self.budget_share * (sampled_s - tapped_s) - tapped_s)

    def bank(self) -> float | None:
        """Credit's account with a budget_share: that share of the training's own time so far, less every second
        credit spent (its calibration included); below zero while it pays that back."""
        if self.budget_s is not None or self.budget_share is None:
            return None
        return self.budget_share * self.own_s - self.spent_total

    def least(self) -> float | None:
        """What a step that measures anything costs, at most: a batch's first rollout, at the dearest a recent
        batch priced it, and what the last step spent besides computing (the tap, reading and pricing the batch,
        summing up). None before the first batch."""
        if not self.first_prices:
            return None
        return max(self.first_prices) + self.overhead_s

    def affordable(self) -> bool:
        """Whether credit's account holds what a step that measures a rollout costs (least). Before its first
        batch (its calibration), and without a budget_share, it does. A step that cannot afford it costs nothing:
        the sampler is not tapped, the batch not read; one that can measures a rollout, the dearest first
        rollout of recent batches allowing."""
        least = self.least()
        return self.bank() is None or least is None or self.bank() >= least

    def run(self, out: dict, inputs: list[dict], step: int, budget_s: float | None, recorder=None) -> dict:
        """This step's credit metrics; a failure is one warning and credit/skipped (strict: raised). Credit's
        seconds: these, and those the tap took inside the sampling."""
        started = self.clock()
        try:
            self.sampled_logps = self.recorded(recorder, out)
            with raw_logprobs(self.tap.runner) if self.tap is not None else contextlib.nullcontext():
                metrics = {**self.measure(out, inputs, step, budget_s), "skipped": 0.0}
        except Exception as e:  # noqa: BLE001 - credit is a measurement: training goes on without it
            if self.strict:
                raise
            text = " ".join(str(e).split())
            self.warn(f"CreditCallback: no credit at this step, training goes on ({e.__class__.__name__}: "
                      f"{text[:300]}); CreditCallback(strict=True) raises it")
            metrics = {"skipped": 1.0}
        self.spent = self.clock() - started + getattr(recorder, "seconds", 0.0)
        self.spent_total += self.spent
        if getattr(self.estimator, "first_s", None) is not None and not metrics["skipped"]:
            self.first_prices.append(self.estimator.first_s)
            self.overhead_s = self.spent - self.estimator.computing_s - self.estimator.calibrating_s
        least = self.least()
        if metrics.get("rollouts") == 0 and self.bank() is not None and least is not None:
            self.waiting(f"credit: no rollout fitted its account ({self.bank():+.2f} s: budget_share "
                         f"{self.budget_share} of the training's own time so far, less the {self.spent_total:.2f} s "
                         f"credit spent, its calibration included); it measures again once the account holds what a "
                         f"step measuring one rollout costs ({least:.2f} s)")
        return {**metrics, "seconds": self.spent, "budget_s": budget_s, "bank_s": self.bank()}

    def log(self, metrics: dict) -> None:
        """Into the trainer's metrics of this step: numbers only (a logger takes no None, TensorBoard no NaN)."""
        for name, value in metrics.items():
            if value is not None and math.isfinite(value):
                self.trainer._metrics["train"][f"{self.prefix}{name}"].append(float(value))

    def start(self) -> None:
        from .estimator import Estimator
        from .grader_calls import kind_of
        trainer = self.trainer
        grader = self.grader or trainer.reward_funcs[0]
        if callable(grader) and not isinstance(grader, str) and kind_of(grader) == "trl":
            self.reward = grader = TrainerReward(grader, trainer)
        # the step's rows forced as the sampler batched them: generate's left-padded batch, or vLLM's one call
        forcing = "batch" if (self.llm is not None or self.generates()) and not self.settings.get("invariant") \
            else "groups"
        # continuations as long as the trainer lets a completion run, so a continuation ends where a rollout could
        length = getattr(trainer.args, "max_completion_length", None)
        defaults = {"forcing": forcing, **({"max_cont_tokens": int(length)} if length else {})}
        if self.llm is not None:  # TRL's engine, its sampler switched to raw logprobs while credit runs
            from ..measure.vllm_given import engine_around
            engine = engine_around(self.llm, self.settings.get("invariant", False), raw_switched=True)
            self.estimator = Estimator(engine=engine, grader=grader, **{**defaults, **self.settings,
                                                                        "logprobs_temperature": 1.0})
        else:
            settings = {"logprobs_temperature": float(trainer.args.temperature), **defaults, **self.settings}
            self.estimator = Estimator(model=trainer.accelerator.unwrap_model(trainer.model),
                                       tokenizer=trainer.processing_class, grader=grader, **settings)
        self.estimator.waits = self.bank() is not None  # for its account to grow
        self.estimator.prudent = True  # a step's budget overrun by one rollout at most
        if self.reward is not None:  # the graded text's token ids, for the reward's completion_ids
            engine = self.estimator.executor.engine
            decode = engine.decode

            def remembered(ids):
                text = decode(ids)
                self.reward.decoded[text] = list(ids)
                return text

            engine.decode = remembered

    def batch(self, out: dict, inputs: list[dict], step: int) -> dict:
        """A step's rollouts as the estimator reads a TRL batch (all of them: the estimator measures the first
        ``sample``, and forces the batch whole): its tensors, unique ids, the sampler's logprobs of the sampled
        tokens where TRL kept them (vLLM's) or they were recorded (generate's), and what the grader reads: for a TRL
        reward the row's number (it reads the row itself), else the answer column and the dataset's other
        columns."""
        rows = inputs
        n = len(rows)
        batch = {k: out[k][:n] for k in TENSORS}
        if self.reward is None:
            for name in rows[0]:
                if name not in ("prompt", "id"):  # the other columns reach a TRL-style grader as its arguments
                    batch[name] = [row[name] for row in rows]
            if self.ground_truth not in rows[0]:
                raise BadInput(f"CreditCallback: the dataset has no column {self.ground_truth!r}; give "
                               f"ground_truth= the column holding the reference answer")
            truth = self.ground_truth if self.ground_truth in ALIASES["ground_truth"] else "ground_truth"
            batch[truth] = [str(row[self.ground_truth]) for row in rows]
        else:
            self.reward.rows, self.reward.decoded = rows, {}
            batch[ROW] = list(range(n))
            # the reader wants a reference answer; a TRL reward reads the row's own columns instead
            batch["ground_truth"] = [str(row.get(self.ground_truth, "")) or "-" for row in rows]
        batch["id"] = rollout_ids(rows, step)
        # on TRL's engine, the raw ones recorded (TRL keeps processed ones, which a forced decode cannot compare)
        logprobs = self.sampled_logps if self.tap is not None else out.get(SAMPLER_LOGPROBS)
        if logprobs is None:
            logprobs = self.sampled_logps
        if logprobs is not None:  # the sampled tokens' logprobs, at the trainer's temperature (the estimator's)
            batch["logprobs"] = logprobs[:n]
        if self.tap is not None and self.sampled_top is not None:  # the pivots' margins as the sampler saw them
            batch["top_logprobs"] = self.sampled_top[:n]
        return batch

    def measure(self, out: dict, inputs: list[dict], step: int, budget_s: float | None) -> dict:
        """The credit metrics of one step (names without the prefix): the estimator's, and the pooled ones."""
        if self.estimator is None:
            self.start()
        # on TRL's engine, the blocks its sampling wrote are resumed while they are still cached
        resident = self.blocks.gone if self.tap is not None and self.estimator.settings.forcing == "batch" else None
        frame = self.estimator(self.batch(out, inputs, step), budget_s=budget_s, first=self.sample,
                               resident=resident)
        self.pooled.add(frame)
        self.write_pivots(frame, step)
        if self.pooled.verdict is not None and self.pooled.verdict.verdict != getattr(self.verdict, "verdict", None):
            self.verdict = self.pooled.verdict
            log.info(self.pooled.line())
        found = {**self.estimator.metrics(""), **self.pooled.metrics("")}
        found.pop("seconds"), found.pop("budget_s", None)  # the callback's own: all it spent, the whole budget
        return found

    def write_pivots(self, frame, step: int) -> None:
        """Every pivot of the step as a row of <output_dir>/credit/pivots.jsonl: step, rollout id, prompt,
        position, tokens, margin, A per pass with its interval, certificate (the graded continuations left
        out)."""
        if not len(frame):
            return
        index = self.trainer.accelerator.process_index
        path = Path(self.trainer.args.output_dir) / "credit" / ("pivots.jsonl" if index == 0 else
                                                                f"pivots.{index}.jsonl")
        path.parent.mkdir(parents=True, exist_ok=True)
        kept = frame.drop(columns=[c for c in frame.columns if c == "line" or c.startswith(("continuations_",
                                                                                                "grades_"))])
        kept.insert(0, "step", step)
        text = kept.to_json(orient="records", lines=True)
        with open(path, "a") as f:
            f.write(text if text.endswith("\n") else text + "\n")

    def on_step_begin(self, args, state, control, **kwargs):
        self.step_began, self.spent = self.clock(), 0.0

    def on_step_end(self, args, state, control, **kwargs):
        """The step's own seconds (credit's left out), added to the budget's base; credit's share of them, and of
        the training's time so far."""
        if self.step_began is None:
            return
        own = self.clock() - self.step_began - self.spent
        if own > 0:
            self.own_s += own
            if self.spent:
                self.log({"share": self.spent / own})
            self.log({"share_total": self.spent_total / self.own_s})

    def on_train_end(self, args, state, control, **kwargs):
        if self.estimator is not None:
            self.estimator.close()
            self.estimator = None


def check_settings(settings: dict) -> None:
    """The estimator's settings checked before training starts (BadInput: one line naming the setting)."""
    known = {f.name for f in dataclasses.fields(Settings)} - {"model", "grader"} | {"max_batch_rows"}
    unknown = sorted(set(settings) - known)
    if unknown:
        raise BadInput(f"CreditCallback: unknown setting {unknown[0]!r}; give those of replaylib.credit.tool.Settings "
                       f"(k, margin, max_pivots_per_rollout, max_cont_tokens, temperature, ...)")
    checked(Settings(model="-", grader="gsm8k", **{k: v for k, v in settings.items() if k != "max_batch_rows"}),
            "CreditCallback")
