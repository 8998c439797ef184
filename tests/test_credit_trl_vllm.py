"""Credit through TRL's colocated vLLM engine (replaylib.credit.trl_vllm) without a GPU: TRL's LLM built able to
force, the sampler's raw logprobs recorded while TRL samples and matched to its rollouts, the sampler switched to
raw while credit forces, the cases where the callback cannot use TRL's engine, forcing="batch" on a vLLM engine,
and the whole path of a GRPO step on the stand-in engine (tests/vllm_standin.py, with numbers that depend on the
batch) as TRL's engine: certified bit-exact forced as sampled, differing forced a group at a time."""
import json
import logging
from collections import defaultdict
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from replaylib.credit.inputs import BadInput
from replaylib.credit.trl import CreditCallback
from replaylib.credit.trl_vllm import SamplerTap, aligned, colocated_llm, per_position, raw_logprobs, vllm_for_credit
from replaylib.measure.vllm_forcing import FORCING_PROCESSOR


def test_trl_s_llm_built_in_the_block_can_force_and_is_trl_s_own_after_it(monkeypatch):
    from trl.generation import vllm_generation
    built = []
    monkeypatch.setattr(vllm_generation, "LLM", lambda **kwargs: built.append(kwargs) or "llm", raising=False)
    stock = vllm_generation.LLM
    with vllm_for_credit():
        assert vllm_generation.LLM(model="m", logprobs_mode="processed_logprobs", logits_processors=["mine:P"]) == "llm"
    assert vllm_generation.LLM is stock
    assert built == [{"model": "m", "logprobs_mode": "processed_logprobs", "logits_processors": ["mine:P", FORCING_PROCESSOR],
                      "enable_prefix_caching": True, "disable_log_stats": False}]  # TRL's sampling mode kept


def test_without_vllm_the_block_says_so_in_one_line(monkeypatch):
    from trl.generation import vllm_generation
    monkeypatch.delattr(vllm_generation, "LLM", raising=False)
    with pytest.raises(BadInput, match=r"^vllm_for_credit: vLLM is not installed .*pip install vllm==0.22.1$"):
        with vllm_for_credit():
            pass


class FakeSampler(torch.nn.Module):
    """vLLM's Sampler as the tap sees it: processed mode changes the logits in place (temperature) before it samples
    the argmax here."""

    def __init__(self):
        super().__init__()
        self.logprobs_mode = "processed_logprobs"
        self.topk_topp_sampler = SimpleNamespace(logprobs_mode="processed_logprobs")

    @staticmethod
    def compute_logprobs(logits):
        return logits.log_softmax(dim=-1, dtype=torch.float32)

    def forward(self, logits, sampling_metadata):
        logits.div_(0.5)
        return SimpleNamespace(sampled_token_ids=logits.argmax(-1, keepdim=True).int())


def test_the_tap_keeps_each_sampled_token_s_raw_logprob_by_request_and_matches_them_to_the_rollouts():
    # requests 0 and 1 of one LLM.generate call; 1's prompt prefilled in two chunks (its first row is discarded by
    # vLLM), 0 sampled once more after it finished (asynchronous scheduling)
    batches = [["0-aa11bb22", "1-cc33dd44"], ["0-aa11bb22", "1-cc33dd44"], ["0-aa11bb22", "1-cc33dd44"],
               ["0-aa11bb22"]]
    runner = SimpleNamespace(sampler=FakeSampler(), input_batch=SimpleNamespace(req_ids=[]))
    tap = SamplerTap(runner)
    torch.manual_seed(0)
    given = []
    with tap.recording():
        for ids in batches:
            runner.input_batch.req_ids = ids + ["stale"]  # rows past the batch's are not the step's
            logits = torch.randn(len(ids), 7)
            given.append(logits.clone())
            runner.sampler(logits=logits, sampling_metadata=None)
    assert "forward" not in runner.sampler.__dict__  # the class's method again
    raw = [torch.log_softmax(g, -1) for g in given]
    tokens = [g.argmax(-1).tolist() for g in given]
    completion_ids = torch.tensor([[tokens[0][0], tokens[1][0], tokens[2][0]], [tokens[1][1], tokens[2][1], 0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    found = per_position(tap.matched(completion_ids, mask), completion_ids.shape)
    assert found[0].tolist() == [raw[0][0, tokens[0][0]].item(), raw[1][0, tokens[1][0]].item(),
                                 raw[2][0, tokens[2][0]].item()]  # the raw logprob, not the processed one
    assert found[1].tolist() == [raw[1][1, tokens[1][1]].item(), raw[2][1, tokens[2][1]].item(), 0.0]
    top = [t for _, t in tap.matched(completion_ids, mask)]  # the raw top-k of each position, best first: the pivots' margins
    best = raw[1][1].topk(5)
    assert top[1][0] == [[t, v] for t, v in zip(best.indices.tolist(), best.values.tolist())]
    assert [len(row) for row in top] == [3, 2] and all(len(step) == 5 for row in top for step in row)
    # a rollout whose tokens were not sampled by the recorded requests: nothing to certify with
    other = completion_ids.clone()
    other[1, 0] = (other[1, 0] + 1) % 7
    assert tap.matched(other, mask) is None
    assert tap.matched(completion_ids[:1], mask[:1]) is None  # another number of requests than rollouts
    for ids, *_ in tap.calls:  # a request not numbered as LLM.generate numbers them: nothing to match by
        ids[:] = ["request-of-another-kind" if r.startswith("1-") else r for r in ids]
    assert tap.matched(completion_ids, mask) is None


def test_a_completion_is_found_after_the_rows_vllm_discards():
    assert aligned([9, 4, 5, 6, 2], [4, 5, 6]) == 1 and aligned([4, 5], [4, 5]) == 0 and aligned([4, 5], [5, 4]) is None
    assert aligned([4], [4, 5]) is None


def test_the_sampler_returns_raw_logprobs_while_credit_runs_and_trl_s_mode_after_even_on_failure():
    runner = SimpleNamespace(sampler=FakeSampler())
    with raw_logprobs(runner):
        assert runner.sampler.logprobs_mode == runner.sampler.topk_topp_sampler.logprobs_mode == "raw_logprobs"
    with pytest.raises(KeyError), raw_logprobs(runner):
        raise KeyError("credit failed")
    assert runner.sampler.logprobs_mode == runner.sampler.topk_topp_sampler.logprobs_mode == "processed_logprobs"


def trl_llm(processors=(FORCING_PROCESSOR,), log_stats=True):
    model_config = SimpleNamespace(logits_processors=list(processors), logprobs_mode="processed_logprobs", model="m")
    return SimpleNamespace(reset_prefix_cache=lambda: True, get_metrics=lambda: [], llm_engine=SimpleNamespace(
        model_config=model_config, log_stats=log_stats,
        vllm_config=SimpleNamespace(cache_config=SimpleNamespace(enable_prefix_caching=True)),
        model_executor=SimpleNamespace(driver_worker=SimpleNamespace(model_runner=SimpleNamespace(
            sampler=FakeSampler(), input_batch=SimpleNamespace(req_ids=[]))))))


@pytest.mark.parametrize("case, why", [
    ("transformers", "samples with transformers"), ("server", "vllm_mode='server'"),
    ("sleep", "vllm_enable_sleep_mode=True"), ("tp", "vllm_tensor_parallel_size > 1"),
    ("not built for credit", "vllm_for_credit()"), ("no stats", "disable_log_stats=False")])
def test_where_credit_cannot_force_through_trl_s_engine_it_says_why(case, why):
    generation = SimpleNamespace(llm=trl_llm(), enable_sleep_mode=case == "sleep",
                                 tensor_parallel_size=2 if case == "tp" else 1)
    if case == "server":
        generation.llm = None
    if case == "not built for credit":
        generation.llm = trl_llm(processors=())
    if case == "no stats":
        generation.llm = trl_llm(log_stats=False)
    trainer = SimpleNamespace(use_vllm=case != "transformers", vllm_generation=generation)
    llm, said = colocated_llm(trainer)
    assert llm is None and why in said
    trainer = SimpleNamespace(use_vllm=True, vllm_generation=SimpleNamespace(llm=trl_llm(), enable_sleep_mode=False,
                                                                             tensor_parallel_size=1))
    assert colocated_llm(trainer) == (trainer.vllm_generation.llm, None)  # TRL's logprobs_mode is switched, not asked


def test_the_callback_records_through_trl_s_engine_and_switches_it_to_raw_while_credit_runs(caplog):
    llm = trl_llm()
    runner = llm.llm_engine.model_executor.driver_worker.model_runner
    seen = {}

    def sample_and_score(inputs):  # TRL's sampling: one request, two tokens
        seen["tapped"] = "forward" in runner.sampler.__dict__
        runner.input_batch.req_ids = ["0-aa11bb22"]
        for _ in range(2):
            runner.sampler(logits=torch.tensor([[0.0, 2.0, 1.0]]), sampling_metadata=None)
        return {"completion_ids": torch.tensor([[1, 1]]), "completion_mask": torch.tensor([[1, 1]])}

    trainer = SimpleNamespace(state=SimpleNamespace(global_step=0), model=SimpleNamespace(training=True),
                              _metrics={"train": defaultdict(list)}, _generate_and_score_completions=sample_and_score,
                              add_callback=lambda callback: None, use_vllm=True,
                              vllm_generation=SimpleNamespace(llm=llm, enable_sleep_mode=False, tensor_parallel_size=1))
    callback = CreditCallback(every=1, budget_share=None, strict=True)

    def measure(out, inputs, step, budget_s):
        seen["mode"] = runner.sampler.logprobs_mode, runner.sampler.topk_topp_sampler.logprobs_mode
        seen["logps"] = callback.sampled_logps
        return {}

    callback.measure = measure
    with caplog.at_level(logging.WARNING, logger="replaylib"):
        callback.attach(trainer)
        trainer._generate_and_score_completions([{"prompt": "p"}])
    assert not caplog.records  # no "two engines" warning: credit forces through TRL's engine
    assert seen["tapped"] and "forward" not in runner.sampler.__dict__
    assert seen["mode"] == ("raw_logprobs", "raw_logprobs") and runner.sampler.logprobs_mode == "processed_logprobs"
    assert seen["logps"].tolist() == [[torch.log_softmax(torch.tensor([0.0, 2.0, 1.0]), -1)[1].item()] * 2]


def test_a_batch_vllm_sampled_in_one_call_is_bit_exact_forced_whole_where_forcing_each_group_differs():
    """On an engine whose numbers depend on the batch (the stand-in's batch_dependent), forcing each prompt's rollouts
    alone computes them in other batches than the sampler's; forcing the step's batch whole, in its order, in one
    call (forcing="batch") computes them in the sampler's."""
    from vllm_standin import FakeLLM, FakeSP

    from replaylib.credit.estimator import Estimator
    from replaylib.measure.engine_vllm import VLLMEngine
    llm = FakeLLM(block_size=4, forcing=True, batch_dependent=True)
    prompts = [[0, 5, 9, 14, 22, 31, 7, 1]] * 3 + [[0, 6, 12, 30, 1]] * 3
    params = [FakeSP(temperature=1.0, max_tokens=12, logprobs=1, seed=s) for s in range(len(prompts))]
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params)  # TRL's one call for the step
    width, length = max(map(len, prompts)), max(len(o.outputs[0].token_ids) for o in outs)
    batch = {"prompt_ids": [], "prompt_mask": [], "completion_ids": [], "completion_mask": [], "logprobs": [],
             "ground_truth": ["7"] * len(prompts)}
    for prompt, out in zip(prompts, outs):  # TRL's tensors: prompts padded on the left, completions on the right
        comp = out.outputs[0]
        pad, tail = width - len(prompt), length - len(comp.token_ids)
        batch["prompt_ids"].append([0] * pad + prompt)
        batch["prompt_mask"].append([0] * pad + [1] * len(prompt))
        batch["completion_ids"].append(list(comp.token_ids) + [0] * tail)
        batch["completion_mask"].append([1] * len(comp.token_ids) + [0] * tail)
        batch["logprobs"].append([step[t].logprob for t, step in zip(comp.token_ids, comp.logprobs)] + [0.0] * tail)
    certificates = {}
    for forcing in ("batch", "groups"):
        engine = VLLMEngine(llm, FakeSP, serving="inprocess", config="credit", forcing=True)
        estimator = Estimator(engine=engine, grader="tests.credit_grader:compute_score", forcing=forcing, k=1,
                              max_cont_tokens=4, margin=9.0, max_pivots_per_rollout=1)
        frame = estimator(batch)
        assert len(frame) and frame["verified_resume"].all()
        certificates[forcing] = set(frame["certificate"])
    assert certificates["batch"] == {"bit-exact"} and "differs" in certificates["groups"]


class StandinSampler(FakeSampler):
    """The sampler of TRL's engine on the stand-in: its logprobs are the logits it is given (the stand-in's top
    entries, the rest -1e9), and it samples what the stand-in sampled at this step (``sampled``)."""

    sampled = None

    @staticmethod
    def compute_logprobs(logits):
        return logits.clone()

    def forward(self, logits, sampling_metadata):
        return SimpleNamespace(sampled_token_ids=torch.tensor(self.sampled)[:, None])


class TrlLLM:
    """TRL's colocated LLM as the callback meets it, on the stand-in: vLLM's request numbering, its model runner in
    the process, and a sampler called at every decode step with the requests of that step (whose raw logprobs
    are the stand-in's own: its compute_logprobs hands them through)."""

    def __init__(self, llm):
        from vllm_standin import FakeSP  # noqa: F401 - the stand-in's SamplingParams, for the engine

        self.llm, self.counter = llm, 0
        self.llm_engine = llm.llm_engine
        self.llm_engine.model_config.logits_processors = [FORCING_PROCESSOR]
        self.llm_engine.model_config.logprobs_mode = "processed_logprobs"
        self.llm_engine.model_config.model = "standin"
        self.llm_engine.model_config.dtype = "bfloat16"
        self.llm_engine.vllm_config.cache_config.enable_prefix_caching = True
        self.llm_engine.log_stats = True
        sampler = StandinSampler()
        self.runner = SimpleNamespace(sampler=sampler, input_batch=SimpleNamespace(req_ids=[]))
        self.llm_engine.model_executor = SimpleNamespace(driver_worker=SimpleNamespace(model_runner=self.runner))

    def __getattr__(self, name):
        return getattr(self.llm, name)

    def generate(self, prompts, sampling_params, use_tqdm=True):
        from vllm_standin import VOCAB, decoded_rows
        for sp in sampling_params:  # the stand-in's whole top (6 entries): the logits the sampler is given
            sp.logprobs = 6
        outs = self.llm.generate(prompts, sampling_params, use_tqdm)
        ids = [f"{self.counter + i}-ab12cd34" for i in range(len(outs))]
        self.counter += len(outs)
        rows = decoded_rows(outs)  # a request that stopped at a token is decoded a step more, its row discarded
        for step in range(max(rows)):  # the sampler, once a step, over the requests still decoding
            live = [i for i, n in enumerate(rows) if step < n]
            at = [min(step, len(outs[i].outputs[0].token_ids) - 1) for i in live]
            self.runner.input_batch.req_ids = [ids[i] for i in live]
            self.runner.sampler.sampled = [outs[i].outputs[0].token_ids[s] for i, s in zip(live, at)]
            logits = torch.full((len(live), VOCAB), -1e9, dtype=torch.float64)
            for row, (i, s) in enumerate(zip(live, at)):
                for token, entry in outs[i].outputs[0].logprobs[s].items():
                    logits[row, token] = entry.logprob
            self.runner.sampler(logits=logits, sampling_metadata=None)
        return outs


PROMPTS = [[0, 5, 9, 14, 22, 31, 7, 1], [0, 6, 12, 30, 1]]


def grpo_trainer(out_dir, llm):
    """A GRPO trainer as the callback meets it, sampling with the stand-in as TRL's colocated engine: each step
    loads its weights into the engine (TRL then resets the prefix cache) and samples in one call, 3 generations a
    prompt; its reward holds an uncopyable queue, as vLLM's engine does."""
    import queue

    from vllm_standin import FakeSP

    def sample_and_score(inputs):
        if trainer.state.global_step:  # TRL's weight sync before a later step's sampling
            llm.reset_prefix_cache()
        rows = [PROMPTS[i % 2] for i in range(len(inputs))]
        params = [FakeSP(temperature=1.0, max_tokens=10, logprobs=1, seed=s + 100 * trainer.state.global_step)
                  for s in range(len(rows))]  # as TRL's: a rollout ends at EOS or at max_tokens
        outs = llm.generate([{"prompt_token_ids": p} for p in rows], params)
        width, length = max(map(len, rows)), max(len(o.outputs[0].token_ids) for o in outs)
        pad = lambda seq, n, left: ([0] * (n - len(seq)) + seq) if left else (seq + [0] * (n - len(seq)))  # noqa: E731
        return {"prompt_ids": torch.tensor([pad(p, width, True) for p in rows]),
                "prompt_mask": torch.tensor([pad([1] * len(p), width, True) for p in rows]),
                "completion_ids": torch.tensor([pad(list(o.outputs[0].token_ids), length, False) for o in outs]),
                "completion_mask": torch.tensor([pad([1] * len(o.outputs[0].token_ids), length, False)
                                                 for o in outs])}

    def correct(prompts, completions, answer, **kwargs):  # the trainer's reward, credit's grader
        return [float(a[:1] in c) for c, a in zip(completions, answer)]

    trainer = SimpleNamespace(
        state=SimpleNamespace(global_step=0), model=SimpleNamespace(training=True),
        _metrics={"train": defaultdict(list)}, _generate_and_score_completions=sample_and_score,
        add_callback=lambda callback: None, use_vllm=True, reward_funcs=[correct],
        engine_queue=queue.SimpleQueue(),  # as vLLM's engine holds: the reward holds the trainer, not a copy
        args=SimpleNamespace(temperature=1.0, output_dir=str(out_dir)),
        accelerator=SimpleNamespace(process_index=0),
        vllm_generation=SimpleNamespace(llm=llm, enable_sleep_mode=False, tensor_parallel_size=1))
    return trainer


def grpo_steps(trainer, steps: int) -> list[dict]:
    rows = [{"prompt": f"question {i % 2}", "answer": "7"} for i in range(6)]
    for _ in range(steps):
        trainer._generate_and_score_completions(rows)
        trainer.state.global_step += 1
    path = Path(trainer.args.output_dir) / "credit" / "pivots.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture
def standin_vllm(monkeypatch):
    import sys

    import trl.data_utils  # noqa: F401 - imported before vLLM's stand-in module (TRL asks whether vLLM is installed)
    from vllm_standin import FakeSP
    monkeypatch.setitem(sys.modules, "vllm", SimpleNamespace(SamplingParams=FakeSP, __version__="standin"))
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")


def test_a_grpo_step_sampled_by_trl_s_vllm_engine_is_certified_bit_exact_through_that_engine(tmp_path, standin_vllm):
    """The whole path on the stand-in (numbers that depend on the batch): the callback records what TRL's engine
    sampled, forces the step's batch through that same engine as it sampled it, and certifies every rollout
    bit-exact; its metrics and pivots land where the trainer's do. Forced a group at a time, they differ."""
    from vllm_standin import FakeLLM
    found = {}
    for forcing in ("batch", "groups"):
        llm = TrlLLM(FakeLLM(block_size=4, forcing=True, batch_dependent=True))
        trainer = grpo_trainer(tmp_path / forcing, llm)
        callback = CreditCallback(every=1, budget_share=None, strict=True, k=1, max_cont_tokens=4, margin=9.0,
                                  max_pivots_per_rollout=1, forcing=forcing)
        callback.attach(trainer)
        pivots = grpo_steps(trainer, 1)
        assert llm.runner.sampler.logprobs_mode == "processed_logprobs" and "forward" not in vars(llm.runner.sampler)
        logged = trainer._metrics["train"]
        assert logged["credit/skipped"] == [0.0] and logged["credit/rollouts"] == [6.0]
        assert pivots and all(p["verified_resume"] for p in pivots)
        found[forcing] = {p["certificate"] for p in pivots}
    assert found["batch"] == {"bit-exact"} and "differs" in found["groups"]


def forced_calls(llm) -> int:
    from replaylib.measure.vllm_forcing import FORCE_KEY
    return sum(1 for _, params in llm.llm.calls if (params[0].extra_args or {}).get(FORCE_KEY))


@pytest.mark.parametrize("case", ["resident", "preempted", "evicted"])
def test_a_later_step_resumes_the_blocks_trl_s_sampling_left_in_the_prefix_cache_without_forcing(
        tmp_path, standin_vllm, case):
    """Step 1's calibration resets the prefix cache, so its batch is forced. From step 2 on, the first group's exact
    passes resume the blocks TRL's own decode wrote (certificate "sampler's blocks", every resume a cache hit); once
    re-feed's pass resets the cache, the next group forces the batch as sampled and is certified bit-exact against
    what the tap recorded. A preemption while TRL sampled leaves the batch forced; blocks evicted after it are
    caught by the resumes' cache check."""
    from vllm_standin import FakeLLM
    llm = TrlLLM(FakeLLM(block_size=4, forcing=True, batch_dependent=True))
    trainer = grpo_trainer(tmp_path, llm)
    CreditCallback(every=1, budget_share=None, strict=True, k=1, max_cont_tokens=4, margin=9.0,
                   max_pivots_per_rollout=1).attach(trainer)
    first = grpo_steps(trainer, 1)
    assert {p["certificate"] for p in first} == {"bit-exact"} and all(p["verified_resume"] for p in first)
    forced_before = forced_calls(llm)
    generate = llm.generate

    def sampling_step_2(*args, **kwargs):  # TRL's sampling of step 2 (the engine's next call)
        del llm.generate
        llm.llm.preempt_per_call = int(case == "preempted")
        outs = generate(*args, **kwargs)
        llm.llm.preempt_per_call = 0
        if case == "evicted":  # the blocks gone without a reset (evicted from a full pool)
            llm.llm.cached.clear()
        return outs

    llm.generate = sampling_step_2
    later = [p for p in grpo_steps(trainer, 1) if p["step"] == 2]
    certificates = [p["certificate"] for p in later]
    if case != "resident":  # the batch forced as sampled, the blocks TRL's decode wrote not trusted
        assert set(certificates) == {"bit-exact"} and all(p["verified_resume"] for p in later)
        return
    on_sampled = [p for p in later if p["certificate"] == "sampler's blocks"]
    assert on_sampled and {p["prompt"] for p in on_sampled} != {p["prompt"] for p in later}
    assert {p["certificate"] for p in later if p not in on_sampled} == {"bit-exact"}
    # re-feed's pass reset the cache: the next group forced the batch again
    assert forced_calls(llm) > forced_before
    assert all(p["verified_resume"] and p["verified_replica"] for p in later)


def test_resident_blocks_without_forcing_batch_on_the_vllm_engine_that_sampled_are_refused_in_one_line():
    from vllm_standin import FakeLLM, FakeSP

    from replaylib.credit.estimator import Estimator
    from replaylib.measure.engine_vllm import VLLMEngine
    engine = VLLMEngine(FakeLLM(block_size=4, forcing=True), FakeSP, serving="inprocess", config="credit", forcing=True)
    rollout = [{"prompt_ids": [0, 5, 1], "response_ids": [7, 2], "ground_truth": "7"}]
    why = r"^Estimator: resident .*with forcing 'batch' on the vLLM engine that sampled the batch .*leave it out$"
    with pytest.raises(BadInput, match=why):
        Estimator(engine=engine, grader="gsm8k", forcing="groups")(rollout, resident=lambda: None)
    with pytest.raises(BadInput, match=why):  # a transformers engine keeps no sampler's blocks
        Estimator(model="tiny:0", grader="gsm8k", forcing="batch", device="cpu")(rollout, resident=lambda: None)


def test_lease_19_s_probe_certifies_a_batch_forced_as_sampled_where_forcing_each_to_its_length_differs(
        monkeypatch, tmp_path, capsys):
    """The GPU lease's probe (docs/gpu-h200/scripts/lease19_probe.py) on the stand-in as TRL's engine (a request that
    stopped at EOS decoded a step more): forced as sampled, every rollout bit-exact; each forced to its length, as
    lease 18 forced them, those decoded after the first to stop at EOS differ."""
    import runpy
    import sys

    import trl.data_utils  # noqa: F401 - imported before vLLM's stand-in module (TRL asks whether vLLM is installed)
    from vllm_standin import FakeLLM, FakeSP

    def sampling_params(**kwargs):  # vLLM's takes TRL's n, top_k and min_p; the stand-in's has no use for them
        return FakeSP(**{k: v for k, v in kwargs.items() if k not in ("n", "top_k", "min_p")})

    vllm = SimpleNamespace(SamplingParams=sampling_params, __version__="standin",
                           LLM=lambda **kwargs: TrlLLM(FakeLLM(block_size=4, forcing=True, batch_dependent=True)))
    monkeypatch.setitem(sys.modules, "vllm", vllm)
    for name, value in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1"),
                        ("VLLM_ENABLE_V1_MULTIPROCESSING", "0"), ("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", "29620")):
        monkeypatch.setenv(name, value)  # the probe sets them, as TRL does; undone after the test
    monkeypatch.setattr(sys, "argv", ["probe", "--prompts", "2", "--generations", "4", "--max-tokens", "40",
                                      "--model", str(tmp_path)])
    runpy.run_path(str(Path(__file__).parents[1] / "docs/gpu-h200/scripts/lease19_probe.py"), run_name="__main__")
    sampled, as_sampled, again, to_length = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert set(sampled["ended"]) == {"stop", "length"}  # rollouts that stopped at EOS, and that ran out of tokens
    assert sampled["rows decoded past a request's end, by how it ended"] == {"stop": sampled["ended"]["stop"],
                                                                             "length": 0}
    assert {end: as_sampled[end]["certificates"] for end in sampled["ended"]} == {
        end: {"bit-exact": n} for end, n in sampled["ended"].items()}
    assert as_sampled["schedule first differs at call"] is None  # each sampler call decoded the sampler's rollouts
    assert {k: v for k, v in again.items() if k != "forcing"} == {k: v for k, v in as_sampled.items() if k != "forcing"}
    assert to_length["schedule first differs at call"] > 0
    assert to_length["length"]["certificates"].get("differs") and min(to_length["length"]["first_diff"]) > 0
