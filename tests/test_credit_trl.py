"""Credit in a TRL training step (replaylib.credit.trl): it never stops training (a failure is one warning and
credit/skipped; strict raises it), rewards get what GRPOTrainer gives them, GRPO's repeated rows get unique ids,
a budget (a share of the training's own time so far less credit's, from an injected clock here), the rates pooled over the
run with their intervals and the statistics stage's verdict, nothing logged that is not a number, every pivot a
row of <output_dir>/credit/pivots.jsonl; a step of two prompts sampled in one padded generate batch certified
bit-exact; and the two examples on the CPU."""
import json
import logging
import math
import subprocess
import sys
from collections import defaultdict
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest

from replaylib.analysis import claims, stats
from replaylib.credit.calibration import Cost
from replaylib.credit.inputs import BadInput
from replaylib.credit.kernel import groups_of
from replaylib.credit.running import VERDICT_VALUE, Pooled, wilson
from replaylib.credit.tool import Settings, records_of
from replaylib.credit.trl import CreditCallback, rollout_ids

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "examples"))


def test_grpo_s_repeated_rows_get_unique_ids_derived_from_the_row_s():
    chat = [{"role": "user", "content": "What is 1 + 2?"}]
    rows = [{"id": "problem-0", "prompt": chat}] * 3 + [{"id": "problem-1", "prompt": chat}] * 2
    assert rollout_ids(rows, step=4) == ["problem-0#0", "problem-0#1", "problem-0#2", "problem-1#0", "problem-1#1"]
    plain = [{"prompt": "a"}, {"prompt": "a"}, {"prompt": "b"}, {"prompt": "a"}]  # no id column
    assert rollout_ids(plain, step=4) == ["step4-0#0", "step4-0#1", "step4-1#0", "step4-0#2"]


def test_the_cost_fits_rollouts_to_a_budget_and_follows_what_the_groups_measured_took():
    settings = Settings(model="m", grader="gsm8k", max_pivots_per_rollout=2)
    # a fake calibration: no forcing cost, 1 s a pass per pivot; 3 passes x 2 pivots = 6 s a rollout
    cost = Cost(settings, {"forced": (0.0, 0.0), "pass": (1.0, 0.0), "pivots": 1})
    rollouts = [SimpleNamespace(prompt_ids=[1, p], response_ids=[5, 6, 7], positions=None) for p in (0, 0, 1, 1)]
    assert cost.fitting(rollouts, 13.0) == 2 and cost.fitting(rollouts, 5.9) == 0 and cost.fitting(rollouts, 99) == 4
    cost.update([rollouts[:2]], seconds=6.0)  # the group took half its estimate
    assert cost.scale() == 0.5 and cost.fitting(rollouts, 13.0) == 4 and cost.basis() == "from the groups measured so far (1)"


def test_under_forcing_batch_each_group_is_priced_with_its_whole_batch_forced():
    """A group forced with its batch (forcing "batch") costs the batch's decode, however few of its rollouts are
    measured: one rollout of a 32-row batch was estimated at 0.88 s and took 7.0 s on lease 17."""
    settings = Settings(model="m", grader="gsm8k", max_pivots_per_rollout=1)
    cost = Cost(settings, {"forced": (0.5, 0.01), "pass": None, "pivots": 0})  # forced decoding: 0.5 s + 10 ms a step
    batch = SimpleNamespace(responses=[[5] * 4, [5] * 4, [6] * 200])
    rows = [SimpleNamespace(prompt_ids=[1, p], response_ids=r, positions=None, batch=batch)
            for p, r in zip((0, 0, 1), batch.responses)]
    assert cost(groups_of(rows[:1])) == pytest.approx(0.5 + 0.01 * 200)  # the batch's longest response
    assert cost(groups_of(rows)) == pytest.approx(2 * (0.5 + 0.01 * 200))  # forced again for the second group
    alone = [SimpleNamespace(prompt_ids=[1, 0], response_ids=[5] * 4, positions=None, batch=None)]
    assert cost(groups_of(alone)) == pytest.approx(0.5 + 0.01 * 4)
    # the blocks its sampler wrote still cached (with its top-k recorded): the first group is not forced
    batch.resident = lambda: None
    for r in rows:
        r.top_logprobs, r.logprobs = [[[5, -0.1], [6, -2.0]]] * len(r.response_ids), [-0.1] * len(r.response_ids)
    assert cost(groups_of(rows[:1])) == 0.0 and cost(groups_of(rows)) == pytest.approx(0.5 + 0.01 * 200)
    batch.resident = lambda: "the prefix cache was reset since the sampling"
    assert cost(groups_of(rows[:1])) == pytest.approx(0.5 + 0.01 * 200)


class FakeTrainer(SimpleNamespace):
    """What the callback reads of a GRPOTrainer: its sampling method, state, model mode and metrics."""

    def __init__(self, clock: list, sampling_s: float):
        def sample_and_score(inputs):
            clock[0] += sampling_s
            return {}
        super().__init__(state=SimpleNamespace(global_step=0), model=SimpleNamespace(training=True),
                         _metrics={"train": defaultdict(list)}, _generate_and_score_completions=sample_and_score,
                         add_callback=lambda callback: None, use_vllm=True)  # (no generate to record)

    def step(self, callback, rest_s: float, clock: list) -> None:
        """One optimizer step: sampling (credit runs after it), then the rest of the step."""
        callback.on_step_begin(None, self.state, None)
        self._generate_and_score_completions([{"prompt": "p"}])
        clock[0] += rest_s
        self.state.global_step += 1
        callback.on_step_end(None, self.state, None)


def test_credit_s_budget_is_a_share_of_the_training_s_time_so_far_less_what_credit_spent():
    """Seconds a measured step leaves unspent carry over: over a run, credit stays within its share."""
    now = [100.0]
    callback = CreditCallback(every=1, budget_share=0.1)
    callback.clock = lambda: now[0]
    budgets = []

    def measure(out, inputs, step, budget_s):  # credit's work: half its budget
        budgets.append(budget_s)
        now[0] += budget_s / 2
        return {"pivots": 3.0}

    callback.measure = measure
    trainer = FakeTrainer(now, sampling_s=3.0)
    callback.attach(trainer)
    trainer.step(callback, rest_s=7.0, clock=now)  # 3 s sampling, credit, 7 s: 10 s of its own
    trainer.step(callback, rest_s=17.0, clock=now)  # 20 s of its own
    trainer.step(callback, rest_s=7.0, clock=now)  # 10 s
    # the first: a tenth of its sampling (0.3 s, 0.15 spent); then a tenth of the training's own seconds so far,
    # this step's sampling included, less credit's so far: 0.1 * 13 - 0.15, then 0.1 * 33 - 0.725
    assert budgets == pytest.approx([0.3, 1.15, 2.575])
    logged = trainer._metrics["train"]
    assert logged["credit/budget_s"] == pytest.approx([0.3, 1.15, 2.575])
    assert logged["credit/seconds"] == pytest.approx([0.15, 0.575, 1.2875])
    assert logged["credit/share"] == pytest.approx([0.015, 0.02875, 0.12875]) and logged["credit/skipped"] == [0.0] * 3
    assert logged["credit/share_total"] == pytest.approx([0.015, 0.725 / 30, 2.0125 / 40])
    assert CreditCallback(budget_s=5.0).budget(3.0) == 5.0 and CreditCallback(budget_share=None).budget(3.0) is None


def test_credit_s_account_pays_back_its_calibration_then_measures_within_its_share(caplog):
    """As on the GPU: a calibration of 5.4 s on step 1, steps of 1.5 s of the training's own, a rollout estimated at
    0.66 s, and 0.15 s of reading a batch wherever credit runs. A step whose account cannot pay for one rollout
    runs nothing (were it to read its batch, those 0.15 s would outgrow the 0.15 s a step earns, and credit would
    never measure again); once the calibration is paid back, it measures, and stays within its share."""
    now = [0.0]
    callback = CreditCallback(every=1, budget_share=0.1)
    callback.clock = lambda: now[0]
    callback.estimator = estimator = SimpleNamespace(first_s=None, close=lambda: None)
    calls = []

    def measure(out, inputs, step, budget_s):
        calls.append(step)
        if len(calls) == 1:  # the calibration: afterwards, a rollout is priced
            now[0] += 5.4
            estimator.first_s, estimator.calibrating_s, estimator.computing_s = 0.66, 5.4, 0.0
            return {"rollouts": 0.0}
        measures = budget_s >= 0.66
        estimator.calibrating_s, estimator.computing_s = 0.0, 0.66 * measures
        now[0] += 0.15 + estimator.computing_s
        return {"rollouts": float(measures)}

    callback.measure = measure
    trainer = FakeTrainer(now, sampling_s=0.5)
    callback.attach(trainer)
    with caplog.at_level(logging.INFO, logger="replaylib"):
        for _ in range(100):
            trainer.step(callback, rest_s=1.0, clock=now)
    logged = trainer._metrics["train"]
    assert calls[0] == 1 and 35 < calls[1] < 50  # the steps between paid the calibration back, running nothing
    assert sum(logged["credit/rollouts"]) >= 8 and len(calls) == len(logged["credit/rollouts"]) < 20
    assert len(logged["credit/bank_s"]) == 100 and min(logged["credit/bank_s"]) < -5
    assert logged["credit/share_total"][-1] <= 0.1 + 0.81 / 150  # within its share, but for the last rollout's cost
    said = [r.getMessage() for r in caplog.records if "no rollout fitted its account" in r.getMessage()]
    assert len(said) == 1 and "its calibration included" in said[0]


def test_a_step_credit_can_afford_measures_a_rollout_though_batches_price_their_first_differently():
    """As on the GPU at the default budget (lease 19): steps of 1.5 s of the training's own, the tap and reading a
    batch 0.3 s, a batch's first rollout priced 0.39 to 0.49 s. Were a step measured once the account held the last
    batch's first rollout, a dearer first rollout would not fit, and the 0.3 s would buy nothing (14 of 42
    measured steps there). The account waits for the dearest first rollout of recent batches and the reading."""
    now = [0.0]
    callback = CreditCallback(every=1, budget_share=0.1)
    callback.clock = lambda: now[0]
    callback.estimator = estimator = SimpleNamespace(first_s=None, calibrating_s=0.0, computing_s=0.0,
                                                     close=lambda: None)
    prices = [0.39, 0.49, 0.41, 0.47, 0.44, 0.49, 0.39, 0.45]  # each batch's first rollout
    measured = []

    def measure(out, inputs, step, budget_s):
        estimator.first_s = prices[len(measured) % len(prices)]
        budget_s -= 0.3  # reading and pricing the batch
        estimator.computing_s = estimator.first_s if estimator.first_s <= budget_s else 0.0
        now[0] += 0.3 + estimator.computing_s
        measured.append(bool(estimator.computing_s))
        return {"rollouts": float(measured[-1])}

    callback.measure = measure
    trainer = FakeTrainer(now, sampling_s=0.5)
    callback.attach(trainer)
    for _ in range(300):
        trainer.step(callback, rest_s=1.0, clock=now)
    assert len(measured) > 20 and all(measured[1:])  # the first: nothing priced yet, a budget of 0.15 s
    assert trainer._metrics["train"]["credit/share_total"][-1] <= 0.1 + 0.8 / 450


def test_a_failure_reading_what_the_sampler_recorded_is_a_skipped_step_too(caplog):
    now = [0.0]
    callback = CreditCallback(every=1, budget_share=None)
    callback.clock = lambda: now[0]

    def recorded(recorder, out):
        raise IndexError("the tap's rows do not match the batch")

    callback.recorded = recorded
    callback.measure = lambda out, inputs, step, budget_s: {"pivots": 1.0}
    trainer = FakeTrainer(now, sampling_s=1.0)
    callback.attach(trainer)
    with caplog.at_level(logging.WARNING, logger="replaylib"):
        trainer.step(callback, rest_s=1.0, clock=now)
    assert trainer.state.global_step == 1 and trainer._metrics["train"]["credit/skipped"] == [1.0]
    assert any("IndexError" in r.getMessage() for r in caplog.records)


def test_a_failure_in_credit_is_one_warning_and_a_skipped_step_and_strict_raises_it(caplog):
    now = [0.0]
    callback = CreditCallback(every=1)
    callback.clock = lambda: now[0]

    def measure(out, inputs, step, budget_s):
        raise KeyError(f"'answer' at step {step}")

    callback.measure = measure
    trainer = FakeTrainer(now, sampling_s=1.0)
    callback.attach(trainer)
    with caplog.at_level(logging.WARNING, logger="replaylib"):
        for _ in range(3):
            trainer.step(callback, rest_s=1.0, clock=now)
    assert trainer.state.global_step == 3 and trainer._metrics["train"]["credit/skipped"] == [1.0] * 3
    said = [r.getMessage() for r in caplog.records if "no credit at this step" in r.getMessage()]
    assert len(said) == 1 and "KeyError" in said[0] and "strict=True" in said[0] and "\n" not in said[0]
    strict = CreditCallback(every=1, strict=True)
    strict.measure = measure
    trainer = FakeTrainer(now, sampling_s=1.0)
    strict.attach(trainer)
    with pytest.raises(KeyError):
        trainer.step(strict, rest_s=1.0, clock=now)


def test_a_trainer_sampling_with_vllm_is_told_once_that_its_certificates_compare_two_engines(caplog):
    """On TRL's vLLM path the rollouts are forced through the policy in transformers: a certificate there compares
    two engines, which the callback says when it is attached (and nowhere on the generate path)."""
    for use_vllm in (True, False):
        trainer = FakeTrainer([0.0], sampling_s=1.0)
        trainer.use_vllm = use_vllm
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="replaylib"):
            CreditCallback(every=1).attach(trainer)
        said = [r.getMessage() for r in caplog.records if "compares two engines" in r.getMessage()]
        assert len(said) == (1 if use_vllm else 0)


def test_bad_settings_are_refused_before_training_in_one_line():
    with pytest.raises(BadInput, match="unknown setting 'kk'"):
        CreditCallback(kk=2)
    with pytest.raises(BadInput, match="budget_share 0: give a number above 0"):
        CreditCallback(budget_share=0)
    with pytest.raises(BadInput, match="^CreditCallback: k=0: must be at least 1$"):
        CreditCallback(k=0)  # as its caller names it, not as the command's flag (--k)
    with pytest.raises(BadInput, match="^CreditCallback: margin=inf; give a finite number$"):
        CreditCallback(margin=float("inf"))


def pivot_frame(problems: range, refeed_flips: tuple = (1, 2), per_problem: int = 3) -> pd.DataFrame:
    """Pivots as the estimator returns them: per problem, per_problem pivots where resume and the replica agree
    (A 0.5) and re-feed's sign differs at refeed_flips[problem % their number] of them."""
    rows = []
    for p in problems:
        for i in range(per_problem):
            rows.append({"prompt": f"p{p}", "A_resume": 0.5, "A_replica": 0.5,
                         "A_refeed": -0.5 if i < refeed_flips[p % len(refeed_flips)] else 0.5,
                         "verified_resume": True, "verified_replica": True})
    return pd.DataFrame(rows)


def test_pooled_rates_have_wilson_intervals_and_the_statistics_stage_s_verdict():
    assert wilson(0, 10)[1] == pytest.approx(0.2775, abs=1e-4)
    assert wilson(5, 10) == pytest.approx((0.2366, 0.7634), abs=1e-4)
    pooled = Pooled()
    assert pooled.metrics() == {"credit/pooled_common_pivots": 0.0}  # nothing else: no value, no metric
    # 2 problems a step, 24 in all; the first step's re-feed differs little
    steps = [pivot_frame(range(2), (0, 1))] + [pivot_frame(range(2 * i, 2 * i + 2)) for i in range(1, 12)]
    pooled.add(steps[0])
    assert pooled.verdict.verdict == "underpowered" and pooled.metrics()["credit/refeed_above_floor"] == 0.0
    for frame in steps[1:]:
        pooled.add(frame)
    found = pooled.metrics()
    assert found["credit/pooled_common_pivots"] == 72 and found["credit/pooled_problems"] == 24
    assert found["credit/pooled_floor"] == 0.0 and found["credit/pooled_floor_hi"] == pytest.approx(wilson(0, 72)[1])
    assert found["credit/pooled_refeed"] == pytest.approx(34 / 72)  # 0 + 1 flips, then 1 + 2 a step
    assert (found["credit/pooled_refeed_lo"], found["credit/pooled_refeed_hi"]) == pytest.approx(wilson(34, 72))
    judged = claims.excess_above_floor(stats.exclude_not_exact(records_of(pd.concat(steps)))[0])
    assert pooled.verdict == judged and found["credit/refeed_above_floor"] == VERDICT_VALUE[judged.verdict]
    assert judged.verdict == "holds"  # 24 problems: the run now has the power to say
    assert all(isinstance(v, float) and math.isfinite(v) for v in found.values())


def recording_reward(calls: list):
    """A reward written for TRL's conversational data with an id column and integer answers, using TRL's extra
    arguments; it records what each call got."""
    def exact_answer(prompts, completions, answer, id, trainer_state, log_metric, log_extra, completion_ids,
                     **kwargs):
        calls.append({"n": len(completions), "completion": completions[0], "prompt": prompts[0], "answer": answer[0],
                      "id": id[0], "step": trainer_state.global_step, "ids": completion_ids[0],
                      "logs": callable(log_metric) and callable(log_extra)})
        log_metric("reward/calls", 1.0)
        return [float(str(gold) in c[0]["content"]) for c, gold in zip(completions, answer)]
    return exact_answer


def test_rewards_get_what_grpo_gives_them_and_credit_logs_numbers_pooled_and_per_pivot(tmp_path):
    """A conversational reward reading completion[0]["content"], an id column (repeated by GRPO), integer
    answers and TRL's trainer_state/log_metric/log_extra/completion_ids: two GRPO steps, credit measured at
    each, the reward called by credit with the trainer's types; no None or NaN logged; every pivot a row of
    pivots.jsonl."""
    import trl_grpo_credit as example
    calls = []
    trainer = example.trainer_with_credit(recording_reward(calls), example.rows(typed=True), str(tmp_path))
    trainer.train()
    credit_calls = [c for c in calls if c["n"] == 1]  # the trainer's calls grade a step's 4 completions
    assert credit_calls and len(credit_calls) < len(calls)
    for call in calls:
        assert isinstance(call["completion"], list) and call["completion"][0]["role"] == "assistant"
        assert isinstance(call["prompt"], list) and call["prompt"][0]["role"] == "user"
        assert type(call["answer"]) is int and call["id"].startswith("problem-") and "#" not in call["id"]
        assert call["ids"] and all(type(t) is int for t in call["ids"]) and call["logs"]
    assert {c["step"] for c in credit_calls} == {0, 1}
    decode = trainer.processing_class.decode
    assert all(decode(c["ids"], skip_special_tokens=True) == c["completion"][0]["content"] for c in credit_calls)
    logged = [e for e in trainer.state.log_history if any(k.startswith("credit/") for k in e)]
    assert [e["step"] for e in logged] == [1, 2]
    for entry in logged:
        values = {k: v for k, v in entry.items() if k.startswith("credit/")}
        assert all(isinstance(v, float) and math.isfinite(v) for v in values.values()), values
        assert values["credit/skipped"] == 0.0 and values["credit/pivots"] > 0
        assert {"credit/pooled_common_pivots", "credit/seconds", "credit/share"} <= set(values)
    pivots = [json.loads(line) for line in (tmp_path / "credit" / "pivots.jsonl").read_text().splitlines()]
    assert len(pivots) == sum(e["credit/pivots"] for e in logged)
    assert {p["step"] for p in pivots} == {1, 2} and all("#" in p["id"] for p in pivots)
    assert {"prompt", "position", "A_resume", "A_replica", "A_refeed", "certificate"} <= set(pivots[0])
    assert not any(k.startswith(("continuations_", "grades_")) for k in pivots[0])


def test_a_grpo_run_whose_credit_fails_trains_on_with_one_warning(tmp_path, caplog):
    """A grader that fails on every text credit grades: both GRPO steps train, each logs credit/skipped 1 and
    nothing else of credit's but its seconds and its shares of the step and of the run; one warning."""
    import trl_grpo_credit as example

    def wrong_format(prompts, completions, answer, **kwargs):
        return [float(a in c["content"]) for c, a in zip(completions, answer)]  # a list, not a message dict

    trainer = example.trainer_with_credit(example.correct, example.rows(typed=False), str(tmp_path),
                                          grader=wrong_format)
    with caplog.at_level(logging.WARNING, logger="replaylib"):
        trainer.train()
    logged = [e for e in trainer.state.log_history if any(k.startswith("credit/") for k in e)]
    assert trainer.state.global_step == 2 and [e["step"] for e in logged] == [1, 2]
    for entry in logged:
        assert {k for k in entry if k.startswith("credit/")} == {"credit/skipped", "credit/seconds",
                                                                "credit/share", "credit/share_total"}
        assert entry["credit/skipped"] == 1.0
    said = [r.getMessage() for r in caplog.records if "no credit at this step" in r.getMessage()]
    assert len(said) == 1 and "wrong_format" in said[0]


def test_a_grpo_step_sampling_two_prompts_in_one_padded_generate_batch_is_certified_bit_exact(tmp_path):
    """TRL's transformers path samples a step's 2 prompts x 4 generations in one left-padded generate call and
    keeps no logprobs of it: the callback records the sampled tokens' logprobs as generate samples them, and
    forces the batch as generate batched it; every rollout of both prompts is bit-exact. Its continuations are as
    long as the trainer's completions may be."""
    import torch
    import trl_grpo_credit as example
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer
    dataset = [{"prompt": [{"role": "user", "content": "What is 2 + 3?"}], "answer": "5"},
               {"prompt": [{"role": "user", "content": "Tom has 12 apples and buys 30 more: how many now?"}],
                "answer": "42"}]
    torch.manual_seed(0)
    model, tokenizer = example.tiny_model_and_tokenizer()
    lengths = {len(tokenizer.apply_chat_template(row["prompt"], add_generation_prompt=True, tokenize=True,
                                                 return_dict=True)["input_ids"]) for row in dataset}
    assert len(lengths) == 2  # the shorter prompt is padded
    args = GRPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, fp16=False, activation_checkpointing=False,
                      per_device_train_batch_size=8, gradient_accumulation_steps=1, num_generations=4,
                      max_completion_length=8, max_steps=1, logging_steps=1, report_to="none", save_strategy="no",
                      use_vllm=False, beta=0.0, temperature=1.0, seed=0, dataloader_num_workers=0, disable_tqdm=True)
    trainer = GRPOTrainer(model=model, reward_funcs=[example.correct], args=args,
                          train_dataset=Dataset.from_list(dataset), processing_class=tokenizer)
    callback = CreditCallback(every=1, budget_share=None, strict=True, k=1, margin=50.0,
                              max_pivots_per_rollout=1).attach(trainer)
    started, start = [], callback.start
    callback.start = lambda: (start(), started.append((callback.estimator.settings.max_cont_tokens,
                                                       callback.estimator.prudent)))
    trainer.train()
    assert started == [(8, True)]  # the trainer's max_completion_length; a budget overrun by one rollout at most
    pivots = [json.loads(line) for line in (tmp_path / "credit" / "pivots.jsonl").read_text().splitlines()]
    assert len({p["id"] for p in pivots}) == 8 and len({p["prompt"] for p in pivots}) == 2
    assert {p["certificate"] for p in pivots} == {"bit-exact"}, [(p["id"], p["certificate"]) for p in pivots]
    logged = next(e for e in trainer.state.log_history if "credit/certified" in e)
    assert logged["credit/certified"] == logged["credit/pivots"] == 8


@pytest.mark.parametrize("flags", [[], ["--typed-rows"]])
def test_the_trl_examples_run_two_steps_with_credit_on_the_cpu(flags):
    """examples/trl_grpo_credit.py, and its variant with an id column, integer answers and a conversational
    reward using TRL's extra arguments: TRL's GRPOTrainer on the CPU, credit measured at both steps."""
    done = subprocess.run([sys.executable, str(REPO / "examples" / "trl_grpo_credit.py"), *flags], cwd=REPO,
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    logged = json.loads(done.stdout.strip().splitlines()[-1])
    assert [entry["step"] for entry in logged] == [1, 2]
    for entry in logged:
        assert entry["credit/skipped"] == 0 and entry["credit/pivots"] > 0 and entry["credit/seconds"] > 0
        assert {"credit/certified", "credit/passes_agree", "credit/pooled_common_pivots"} <= set(entry)
        assert None not in entry.values()


def test_certificates_take_the_sampler_s_logprobs_never_a_training_forward_s():
    """TRL's old_per_token_logps come from a training forward (num_iterations > 1), not from the decode: the batch
    the estimator certifies holds no logprobs then ('not recorded'); sampling_per_token_logps are taken."""
    import torch
    rows = [{"prompt": "What is 1 + 2?", "answer": "3"}] * 2
    out = {"prompt_ids": torch.tensor([[5, 6], [5, 6]]), "prompt_mask": torch.ones(2, 2, dtype=torch.long),
           "completion_ids": torch.tensor([[7, 8], [9, 8]]), "completion_mask": torch.ones(2, 2, dtype=torch.long),
           "old_per_token_logps": torch.tensor([[-0.5, -0.25], [-1.0, -0.125]])}
    callback = CreditCallback(every=1)
    assert "logprobs" not in callback.batch(out, rows, step=1)
    sampled = torch.tensor([[-0.5, -0.3], [-1.1, -0.2]])
    batch = callback.batch({**out, "sampling_per_token_logps": sampled}, rows, step=1)
    assert torch.equal(batch["logprobs"], sampled)


def test_the_pooled_line_before_any_verified_pivot_says_so():
    assert Pooled().line() == "credit: re-feed's credit differs above the floor: not measured (no verified pivot " \
                              "pooled yet)"
