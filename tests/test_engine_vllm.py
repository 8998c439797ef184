"""The vLLM engine's logic against a stand-in LLM (no GPU, no vLLM): requests, cache checks,
trunk identity, refeed resets, pass orchestration, and the errors when vLLM cannot run."""
import dataclasses
import importlib.util
import os
import sys
from types import SimpleNamespace

import pandas as pd
import pytest
from vllm_standin import (  # noqa: F401
    EOS,
    STOP2,
    VOCAB,
    FakeLLM,
    FakeSP,
    FakeTokenizer,
    Logprob,
    complete,
)

from replaylib.measure import engine_vllm
from replaylib.measure.engine import (
    ARMS,
    EngineUnavailable,
    PassSettings,
    PivotJob,
)
from replaylib.measure.engine_vllm import (
    VLLMEngine,
    cache_floor,
    topk_of,
)
from replaylib.measure.engines import make_engine
from replaylib.measure.seeds import continuation_seed, trunk_seed
from replaylib.measure.vllm_setup import prepare_environment
from replaylib.runtime import params

TRUNK = {"temperature": 0.7, "top_p": 0.95, "max_new_tokens": 24, "top_logprobs": 3}


# ---------------------------------------------------------------- helpers
def make(fake=None, serving="inprocess"):
    fake = fake or FakeLLM()
    return VLLMEngine(fake, FakeSP, model="fake", config="test", trunk_settings=dict(TRUNK), serving=serving), fake


def sample(engine, pids=(0, 1), n=3):
    prompts = {pid: engine.prompt_ids(f"question {pid} with some words", "\ninstruction") for pid in pids}
    seeds = {(pid, r): trunk_seed(pid, r) for pid in pids for r in range(n)}
    trunks, state = engine.sample_trunks(prompts, n, seeds, TRUNK["temperature"], TRUNK["top_p"],
                                         TRUNK["max_new_tokens"], TRUNK["top_logprobs"])
    return trunks, state, prompts, seeds


def table(trunks):
    return pd.DataFrame([{"problem_id": t.problem_id, "rollout": t.rollout, "seed": t.seed, "prompt_ids": t.prompt_ids,
                          "gen_ids": t.gen_ids, "topk_ids": t.topk_ids, "topk_logprobs": t.topk_logprobs}
                         for ts in trunks.values() for t in ts])


def jobs_for(trunks, pid, k, positions=(5, 9)):
    jobs = []
    for t in trunks[pid]:
        for i in positions:
            if i >= len(t.gen_ids):
                continue
            alt = next(x for x in t.topk_ids[i] if x != t.gen_ids[i])
            abs_pos = len(t.prompt_ids) + i
            jobs.append(PivotJob(len(jobs), pid, t.rollout, i, t.prompt_ids, t.gen_ids[:i],
                                 {"actual": t.gen_ids[i], "alt": alt},
                                 {a: [continuation_seed(pid, t.rollout, abs_pos, a, j) for j in range(k)]
                                  for a in ARMS}))
    assert jobs
    return jobs


SETTINGS = PassSettings(k=2, temperature=0.7, top_p=0.95, max_tokens=10, probe_tokens=4, stop_at_answer=False,
                        task="gsm8k")


@pytest.fixture
def replay_setup():
    engine, fake = make()
    trunks, _, _, _ = sample(engine)
    df = table(trunks)
    state, identical = engine.problem_state(None, 0, df)
    return engine, fake, trunks, df, state, identical


# ---------------------------------------------------------------- tests
def test_topk_drops_the_extra_sampled_entry_and_sorts_best_first():
    step = {9: Logprob(logprob=-3.0, rank=7), 4: Logprob(logprob=-0.5, rank=2), 5: Logprob(logprob=-0.1, rank=1),
            6: Logprob(logprob=-0.9, rank=3)}
    assert topk_of(step, 3) == ([5, 4, 6], [-0.1, -0.5, -0.9])
    assert topk_of(step, 2) == ([5, 4], [-0.1, -0.5])


def test_trunk_requests_are_token_ids_with_per_rollout_seeds_on_a_fresh_cache():
    engine, fake = make()
    trunks, state, prompts, seeds = sample(engine)
    assert state is None  # the KV never leaves the process
    assert fake.events == ["reset", "generate", "reset", "generate"]  # one call per problem, fresh cache each
    for (reqs, sps), pid in zip(fake.calls, prompts):
        assert reqs == [{"prompt_token_ids": prompts[pid]}] * 3
        assert [sp.seed for sp in sps] == [seeds[(pid, r)] for r in range(3)]
        assert {(sp.temperature, sp.top_p, sp.max_tokens, sp.logprobs) for sp in sps} == {(0.7, 0.95, 24, 3)}
    for pid, ts in trunks.items():
        for t in ts:
            ref, _, finish = complete(prompts[pid], FakeSP(0.7, 0.95, 24, 3, t.seed))
            assert t.gen_ids == ref and t.prompt_ids == prompts[pid]
            assert t.finish_reason == {"stop": "eos", "length": "length"}[finish]
            assert all(len(ids) == 3 and lps == sorted(lps, reverse=True)
                       for ids, lps in zip(t.topk_ids, t.topk_logprobs))
    assert engine.stop_ids == {EOS, STOP2} and {0, 1} <= engine.special_ids
    info = engine.describe()
    assert info["engine"] == "vllm" and info["kv_block_size"] == 4 and info["batch_invariant"] is False


def test_trunk_identity_identical_one_token_differs_one_logprob_differs():
    engine, fake = make()
    trunks, _, _, _ = sample(engine)
    df = table(trunks)
    state, clean = engine.problem_state(None, 1, df)
    assert state.identical == {0: True, 1: True, 2: True} and all(clean.values())
    assert fake.events[-2:] == ["reset", "generate"]  # regenerated on a fresh cache: the blocks are resident
    token = df.copy()
    row = token.index[(token.problem_id == 1) & (token.rollout == 1)][0]
    gen = list(token.at[row, "gen_ids"])
    gen[3] = gen[3] + 1
    token.at[row, "gen_ids"] = gen
    state, clean = engine.problem_state(None, 1, token)
    assert state.identical == {0: True, 1: False, 2: True} and state.agree[1] == 3
    assert all(clean.values())  # the regeneration itself ran clean: pivots are judged one by one
    logp = df.copy()
    row = logp.index[(logp.problem_id == 1) & (logp.rollout == 2)][0]
    lps = [list(s) for s in logp.at[row, "topk_logprobs"]]
    lps[4][1] = lps[4][1] + 1e-7
    logp.at[row, "topk_logprobs"] = lps
    state, _ = engine.problem_state(None, 1, logp)
    assert state.identical == {0: True, 1: True, 2: False}
    assert state.agree[2] == len(trunks[1][2].gen_ids)  # same tokens: its pivots resume with state 'tokens'
    no_seed = df.drop(columns=["seed"])  # the invariant stage's table: seeds are the trunk hash
    assert all(engine.problem_state(None, 0, no_seed)[0].identical.values())


def test_exact_pass_builds_one_call_of_token_id_requests_and_maps_outputs_back(replay_setup):
    engine, fake, trunks, _, state, _ = replay_setup
    jobs = jobs_for(trunks, 0, SETTINGS.k)
    n_calls = len(fake.calls)
    outs = engine.run_pass(jobs, "exact1", SETTINGS, state)
    assert len(fake.calls) == n_calls + 1  # every job of the call in one generate
    reqs, sps = fake.calls[-1]
    assert len(reqs) == len(jobs) * 2 * (SETTINGS.k + 1)
    i = 0
    for job, out in zip(jobs, outs):
        assert out.pivot_id == job.pivot_id
        for arm in ARMS:
            for k in range(SETTINGS.k):
                assert reqs[i] == {"prompt_token_ids": job.prefix_ids(arm)}
                sp = sps[i]
                assert (sp.seed, sp.temperature, sp.top_p, sp.max_tokens) == (job.seeds[arm][k], 0.7, 0.95, 10)
                assert out.continuations[arm][k] == complete(job.prefix_ids(arm), sp)[0]
                i += 1
            probe = sps[i]
            assert reqs[i] == {"prompt_token_ids": job.prefix_ids(arm)}
            assert (probe.temperature, probe.max_tokens, probe.logprobs) == (0.0, 4, 1)
            tokens, lps, _ = complete(job.prefix_ids(arm), probe)
            assert out.probe_ids[arm] == tokens
            assert out.probe_first_logprob[arm] == lps[0][tokens[0]].logprob
            i += 1
        assert out.resume.state_ok is True and out.resume.first_step_exact is None
        assert out.resume.min_cached_tokens >= cache_floor(job.abs_pos, 4)
    again = engine.run_pass(jobs, "exact2", SETTINGS, state)
    assert [(o.continuations, o.probe_ids, o.probe_first_logprob) for o in again] == \
           [(o.continuations, o.probe_ids, o.probe_first_logprob) for o in outs]


class BaseModelTokenizer(FakeTokenizer):
    """A base model's tokenizer: no chat template (plain prompts), and token BLANK is a blank line."""
    chat_template = None
    BLANK = 7

    def __call__(self, text):
        return {"input_ids": [4 + ord(c) % 30 for c in text[-40:]]}

    def __len__(self):
        return VOCAB

    def batch_decode(self, sequences, skip_special_tokens=False):
        return ["\n\n" if ids == [self.BLANK] else "x" for ids in sequences]


def test_a_base_model_s_requests_stop_at_a_blank_line_and_forced_ones_do_not():
    fake = FakeLLM()
    fake.get_tokenizer = BaseModelTokenizer
    engine, _ = make(fake)
    blank = BaseModelTokenizer.BLANK
    assert engine.stop_ids == {EOS, STOP2, blank} and blank in engine.special_ids
    trunks, _, _, _ = sample(engine, n=4)
    assert all(sp.stop_token_ids == [blank] for _, sps in fake.calls for sp in sps)
    ends = [t for ts in trunks.values() for t in ts if t.gen_ids[-1] == blank]
    assert ends and all(t.finish_reason == "eos" for t in ends)
    assert all(blank not in t.gen_ids[:-1] for ts in trunks.values() for t in ts)
    state, _ = engine.problem_state(None, 0, table(trunks))
    engine.run_pass(jobs_for(trunks, 0, SETTINGS.k, positions=(1, 2)), "exact1", SETTINGS, state)
    assert all(sp.stop_token_ids == [blank] for _, sps in fake.calls for sp in sps)  # continuations and probes
    # a forced response (the credit tool's) runs to its end through a blank line, as through EOS
    forcing = FakeLLM(forcing=True)
    forcing.get_tokenizer = BaseModelTokenizer
    engine = VLLMEngine(forcing, FakeSP, serving="inprocess", config="test", forcing=True)
    response = [5, 6, blank, 8, 9]
    forced, _ = engine.force_trunks([4, 5, 6], [response], 3)
    assert forced[0].gen_ids == response
    assert all(sp.ignore_eos and sp.stop_token_ids is None for _, sps in forcing.calls for sp in sps)


def test_greedy_continuations_have_no_seed(replay_setup):
    engine, fake, trunks, _, state, _ = replay_setup
    greedy = PassSettings(k=1, temperature=0.0, top_p=0.95, max_tokens=6, probe_tokens=3, stop_at_answer=False,
                          task="gsm8k")
    engine.run_pass(jobs_for(trunks, 0, 1), "exact1", greedy, state)
    assert {(sp.temperature, sp.seed) for sp in fake.calls[-1][1]} == {(0.0, None)}


def test_cache_check_hit_and_miss_at_the_block_floor(replay_setup):
    engine, fake, trunks, _, state, _ = replay_setup
    assert cache_floor(33, 16) == 32 and cache_floor(32, 16) == 32 and cache_floor(15, 16) == 0
    job = jobs_for(trunks, 0, SETTINGS.k, positions=(9,))[:1]
    floor = cache_floor(job[0].abs_pos, 4)
    fake.force_cached = floor
    hit = engine.run_pass(job, "exact1", SETTINGS, state)[0].resume
    fake.force_cached = floor - 1
    miss = engine.run_pass(job, "exact1", SETTINGS, state)[0].resume
    assert (hit.state_ok, hit.min_cached_tokens) == (True, floor)
    assert (miss.state_ok, miss.cache_hit, miss.min_cached_tokens) == (False, False, floor - 1)
    fake.force_cached = None
    fake.cached.clear()  # the trunk blocks evicted behind the engine's back
    assert not any(o.resume.state_ok for o in engine.run_pass(job, "exact1", SETTINGS, state))


def test_refeed_resets_first_and_aborts_when_the_reset_fails(replay_setup):
    engine, fake, trunks, _, state, _ = replay_setup
    jobs = jobs_for(trunks, 0, SETTINGS.k)
    exact = engine.run_pass(jobs, "exact1", SETTINGS, state)
    fake.events.clear()
    refeed = engine.run_pass(jobs, "refeed", SETTINGS, state)
    assert fake.events == ["reset", "generate"]
    assert refeed[0].resume.state_ok is None
    assert [o.probe_ids for o in refeed] == [o.probe_ids for o in exact]  # the stand-in is deterministic
    # an exact pass after a refeed re-establishes the trunk blocks first
    fake.events.clear()
    after = engine.run_pass(jobs, "exact2", SETTINGS, state)
    assert fake.events == ["reset", "generate", "generate"] and all(o.resume.state_ok for o in after)
    fake.reset_ok = False
    fake.events.clear()
    with pytest.raises(RuntimeError, match="refused to reset its prefix cache"):
        engine.run_pass(jobs, "refeed", SETTINGS, state)
    assert "generate" not in fake.events


def test_serial_pass_sends_every_request_alone_on_a_fresh_cache(replay_setup):
    engine, fake, trunks, _, state, _ = replay_setup
    jobs = jobs_for(trunks, 0, SETTINGS.k)
    refeed = engine.run_pass(jobs, "refeed", SETTINGS, state)
    fake.events.clear()
    fake.calls.clear()
    serial = engine.run_pass(jobs, "serial", SETTINGS, state)
    n_requests = len(jobs) * 2 * (SETTINGS.k + 1)
    assert fake.events == ["reset", "generate"] * n_requests
    assert all(len(prompts) == 1 for prompts, _ in fake.calls)
    assert all(o.resume.min_cached_tokens == 0 and o.resume.state_ok is None for o in serial)
    # the same requests as the batched refeed, mapped back to the same pivots and arms
    assert [(o.pivot_id, o.continuations, o.probe_ids) for o in serial] == \
        [(o.pivot_id, o.continuations, o.probe_ids) for o in refeed]
    fake.force_cached = 16  # a reset that did not take effect: the control stops
    with pytest.raises(RuntimeError, match="cached tokens right after a prefix-cache reset"):
        engine.run_pass(jobs, "serial", SETTINGS, state)
    with pytest.raises(ValueError, match="block16"):
        engine.run_pass(jobs, "block16", SETTINGS, state)


def test_a_pass_outside_the_pass_table_or_of_another_engine_is_refused(replay_setup, monkeypatch):
    """Dispatch comes from the pass table: an unknown name never runs as a re-feed, and a pass whose kind
    has no kernel here is refused, each in one line, before any request."""
    from replaylib.measure import passes
    engine, fake, trunks, _, state, _ = replay_setup
    jobs = jobs_for(trunks, 0, SETTINGS.k)
    fake.events.clear()
    for name, match in (("refeed3", "unknown pass 'refeed3'"), ("xplant_decode_kv", "no kernel for"),
                        ("typo_exact", "unknown pass")):
        with pytest.raises(ValueError, match=match) as e:
            engine.run_pass(jobs, name, SETTINGS, state)
        assert "\n" not in str(e.value)
    monkeypatch.setitem(passes.PASSES, "block8", passes.Pass("block8", "a block resume", "block", "control",
                                                             "block8"))
    with pytest.raises(ValueError, match="kind 'block'.*no kernel") as e:
        engine.run_pass(jobs, "block8", SETTINGS, state)
    assert fake.events == []


def test_work_is_split_to_keep_the_trunk_blocks_from_eviction():
    engine, fake = make(FakeLLM(num_gpu_blocks=10_000))
    trunks, _, _, _ = sample(engine)
    state, _ = engine.problem_state(None, 0, table(trunks))
    jobs = jobs_for(trunks, 0, SETTINGS.k)
    largest = max(engine.job_blocks(j, SETTINGS) for j in jobs)
    engine.num_blocks = state.trunk_blocks + largest + 1  # room for one pivot's work at a time
    fake.events.clear()
    outs = engine.run_pass(jobs, "exact1", SETTINGS, state)
    assert fake.events.count("generate") > 1 and [o.pivot_id for o in outs] == [j.pivot_id for j in jobs]
    assert "reset" in fake.events  # the trunks were re-established between calls
    assert all(o.resume.state_ok for o in outs)
    engine.num_blocks = state.trunk_blocks + largest - 1
    with pytest.raises(RuntimeError, match="raise gpu_memory_utilization"):
        engine.run_pass(jobs, "exact1", SETTINGS, state)


def test_preemptions_flag_the_pass_and_the_regeneration(replay_setup):
    engine, fake, trunks, df, state, _ = replay_setup
    fake.preempt_per_call = 2
    outs = engine.run_pass(jobs_for(trunks, 0, SETTINGS.k), "exact1", SETTINGS, state)
    assert all(o.resume.preemptions == 2 and o.resume.state_ok is False for o in outs)
    state, clean = engine.problem_state(None, 0, df)
    assert not any(clean.values()) and not any(state.identical.values())
    assert all(o.resume.state == "not established"
               for o in engine.run_pass(jobs_for(trunks, 0, SETTINGS.k), "exact1", SETTINGS, state))
    assert engine.preemptions["exact1 pass"] == 4  # two exact1 passes, 2 each


def test_an_unreadable_preemption_counter_verifies_nothing(replay_setup):
    """No metrics (stats logging off, or an engine without them): unknown is not zero."""
    engine, fake, trunks, df, state, identical = replay_setup
    assert all(identical.values())

    def no_stats():
        raise AttributeError("stats logging is off")
    fake.get_metrics = no_stats
    outs = engine.run_pass(jobs_for(trunks, 0, SETTINGS.k), "exact1", SETTINGS, state)
    regenerated = engine.problem_state(None, 0, df)[1]
    assert all(o.resume.preemptions is None and o.resume.state_ok is False for o in outs)
    assert all(o.resume.min_cached_tokens >= cache_floor(j.abs_pos, 4)
               for o, j in zip(outs, jobs_for(trunks, 0, SETTINGS.k)))  # the cache was hit all the same
    assert not any(regenerated.values())


def test_make_engine_without_vllm_is_a_one_line_error():
    if "vllm" in sys.modules or importlib.util.find_spec("vllm") is not None:
        pytest.skip("vLLM is installed here")
    p = params.make({"engine": "vllm", "config": "gpu-test", "stop_at_answer": False})
    with pytest.raises(EngineUnavailable) as e:
        make_engine(p)
    msg = str(e.value)
    assert "\n" not in msg and "gpu-test" in msg and "pip install -e '.[vllm]'" in msg and "engine: hf" in msg
    with pytest.raises(EngineUnavailable, match="vLLM 0.22.1"):
        VLLMEngine.from_params(p)


def test_no_cuda_gpu_is_a_one_line_error(monkeypatch):
    import torch
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    monkeypatch.setattr(engine_vllm.importlib.util, "find_spec", lambda name: object())
    with pytest.raises(EngineUnavailable) as e:
        VLLMEngine.from_params(params.make({"engine": "vllm", "config": "gpu-test", "stop_at_answer": False}))
    assert "\n" not in str(e.value) and "CUDA GPU" in str(e.value) and "engine: hf" in str(e.value)


def test_batch_invariant_flag_must_precede_the_vllm_import(monkeypatch):
    monkeypatch.delenv("VLLM_BATCH_INVARIANT", raising=False)
    monkeypatch.delenv("VLLM_ENABLE_V1_MULTIPROCESSING", raising=False)
    monkeypatch.setitem(sys.modules, "vllm", SimpleNamespace())
    with pytest.raises(RuntimeError, match="before vLLM is imported"):
        prepare_environment(True, "c", "multiprocess")
    monkeypatch.delitem(sys.modules, "vllm")
    for name in ("VLLM_USE_FLASHINFER_SAMPLER", "VLLM_WORKER_MULTIPROC_METHOD"):
        monkeypatch.delenv(name, raising=False)
    prepare_environment(True, "c", "multiprocess")
    assert os.environ["VLLM_BATCH_INVARIANT"] == "1"
    assert os.environ["VLLM_USE_FLASHINFER_SAMPLER"] == "0"
    with pytest.raises(RuntimeError, match="stock engine"):
        prepare_environment(False, "c", "multiprocess")


@pytest.mark.parametrize("serving, value", [("multiprocess", "1"), ("inprocess", "0")])
def test_the_serving_mode_is_set_before_vllm_is_imported(monkeypatch, serving, value):
    for name in ("VLLM_BATCH_INVARIANT", "VLLM_ENABLE_V1_MULTIPROCESSING", "VLLM_WORKER_MULTIPROC_METHOD"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delitem(sys.modules, "vllm", raising=False)
    prepare_environment(False, "c", serving)
    assert os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] == value
    # the engine core is spawned: a forked child cannot use the CUDA context its parent may hold
    assert os.environ.get("VLLM_WORKER_MULTIPROC_METHOD") == ("spawn" if serving == "multiprocess" else None)
    prepare_environment(False, "c", serving)  # the same mode again in the same process: fine


@pytest.mark.parametrize("serving, other", [("multiprocess", "0"), ("inprocess", "1")])
def test_a_process_or_environment_set_for_the_other_mode_is_refused(monkeypatch, serving, other):
    monkeypatch.delenv("VLLM_BATCH_INVARIANT", raising=False)
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", other)
    monkeypatch.delitem(sys.modules, "vllm", raising=False)
    with pytest.raises(RuntimeError, match=f"asks vllm_serving: {serving}") as e:
        prepare_environment(False, "cfg", serving)
    assert "\n" not in str(e.value) and "cfg" in str(e.value) and "unset VLLM_ENABLE_V1_MULTIPROCESSING" in str(e.value)
    monkeypatch.setitem(sys.modules, "vllm", SimpleNamespace())  # vLLM already imported in the other mode
    with pytest.raises(RuntimeError, match="imported vLLM for the .* mode; run the stage in a fresh process"):
        prepare_environment(False, "cfg", serving)
    if serving == "inprocess":  # unset: vLLM's own default, the multi-process mode
        monkeypatch.delenv("VLLM_ENABLE_V1_MULTIPROCESSING")
        with pytest.raises(RuntimeError, match="imported vLLM for the multiprocess mode"):
            prepare_environment(False, "cfg", serving)
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "yes")
    monkeypatch.delitem(sys.modules, "vllm")
    with pytest.raises(RuntimeError, match="reads 0 or 1"):
        prepare_environment(False, "cfg", serving)


def test_the_serving_mode_is_in_every_stage_key():
    base = params.make({"engine": "vllm", "device": "cuda", "stop_at_answer": False})
    other = params.make({"engine": "vllm", "device": "cuda", "stop_at_answer": False, "vllm_serving": "inprocess"})
    assert all(base.stage_key(s) != other.stage_key(s) for s in params.STAGES)
    sync = params.make({"engine": "vllm", "device": "cuda", "stop_at_answer": False,
                        "pass_submission": "synchronized"})
    assert {s for s in params.STAGES if sync.stage_key(s) != base.stage_key(s)} == \
        {"03_three_pass_replay", "04_statistics", "05_batch_invariant"}
    for bad in ({"vllm_serving": "inprocess"}, {"engine": "hf"}):
        with pytest.raises(ValueError, match="pass_submission") as e:
            params.make({"engine": "vllm", "device": "cuda", "stop_at_answer": False,
                         "pass_submission": "synchronized", **bad}, where="p.yaml")
        assert "\n" not in str(e.value) and str(e.value).startswith("p.yaml: parameter 'pass_submission'")


def _racy_jobs(serving):
    engine, fake = make(FakeLLM(racy=True), serving=serving)
    trunks, _, _, _ = sample(engine)
    state, clean = engine.problem_state(None, 0, table(trunks))
    return engine, fake, trunks, state, clean


def test_multiprocess_trunks_are_submitted_synchronized_and_regenerate_bit_for_bit():
    engine, fake, trunks, state, clean = _racy_jobs("multiprocess")
    # sampling and the regeneration: pause, queue, resume, collect; never a racing generate
    assert "generate" not in fake.events
    assert fake.events[:5] == ["reset", "sleep", "enqueue", "wake_up", "wait"]
    assert all(clean.values()) and all(state.identical.values())
    assert engine.describe()["serving"] == "multiprocess"
    assert engine.describe()["trunk_submission"] == "synchronized"


def test_multiprocess_stock_passes_race_and_synchronized_passes_do_not():
    engine, fake, trunks, state, _ = _racy_jobs("multiprocess")
    jobs = jobs_for(trunks, 0, SETTINGS.k)
    e1, e2 = (engine.run_pass(jobs, name, SETTINGS, state) for name in ("exact1", "exact2"))
    assert fake.events.count("generate") == 2  # the passes as the paper's harness sends them
    assert [o.probe_first_logprob for o in e1] != [o.probe_first_logprob for o in e2]  # a replica floor
    assert all(o.resume.state_ok and o.resume.state == "identical" for o in e1 + e2)
    sync = dataclasses.replace(SETTINGS, submission="synchronized")
    s1, s2 = (engine.run_pass(jobs, name, sync, state) for name in ("exact1", "exact2"))
    assert fake.events.count("generate") == 2 and fake.events[-4:] == ["sleep", "enqueue", "wake_up", "wait"]
    assert [(o.continuations, o.probe_ids, o.probe_first_logprob) for o in s1] == \
        [(o.continuations, o.probe_ids, o.probe_first_logprob) for o in s2]
    # the in-process engine has nothing to synchronize: every request is in before its first step
    engine, fake, trunks, state, _ = _racy_jobs("inprocess")
    engine.run_pass(jobs_for(trunks, 0, SETTINGS.k), "exact1", sync, state)
    assert "sleep" not in fake.events


def test_a_regeneration_that_diverges_keeps_the_pivots_before_it_and_flags_those_after():
    """A rollout whose regeneration differs from generated index 12 on: a pivot whose resumed blocks
    lie within the agreeing tokens is kept (state 'tokens', verified), one past them is flagged, and
    none is dropped: every pivot has its record."""
    from replaylib.measure import replay
    engine, fake = make()
    fake.diverge = {trunk_seed(0, 1): 12}  # the sampling is the first trunk request, every later one a regeneration
    trunks, _, prompts, seeds = sample(engine, pids=(0,))
    plen = len(prompts[0])
    df = table(trunks)
    state, clean = engine.problem_state(None, 0, df)
    assert state.identical == {0: True, 1: False, 2: True} and all(clean.values())
    assert state.agree[1] == 12
    positions = [i for i in (5, 9, 14, 20) if i < len(trunks[0][1].gen_ids)]
    jobs = [j for j in jobs_for(trunks, 0, SETTINGS.k, positions=positions) if j.rollout == 1]
    outs = engine.run_pass(jobs, "exact1", SETTINGS, state)
    for job, out in zip(jobs, outs):
        within = cache_floor(job.abs_pos, 4) <= plen + 12
        assert out.resume.state == ("tokens" if within else "not established")
        assert out.resume.state_ok is within
    assert {o.resume.state for o in outs} == {"tokens", "not established"}
    # a cache hit alone does not verify a pivot whose blocks no regeneration holds
    fake.force_cached = 10_000
    forced = engine.run_pass(jobs, "exact1", SETTINGS, state)
    assert [o.resume.state_ok for o in forced] == [o.resume.state_ok for o in outs]
    fake.force_cached = None
    # through the records: the kept pivots say how their state came to be, the others are flagged
    p = params.make({"engine": "vllm", "device": "cuda", "stop_at_answer": False, "k": SETTINGS.k,
                     "max_cont_tokens": SETTINGS.max_tokens, "probe_tokens": SETTINGS.probe_tokens})
    pivots = pd.DataFrame([{"pivot_id": j.pivot_id, "problem_id": 0, "rollout": j.rollout, "gen_index": j.gen_index,
                            "abs_pos": j.abs_pos, "margin": 0.1, "rollout_correct": 0} for j in jobs])
    records = pd.DataFrame(replay.replay_problem(engine, jobs, pivots, state, clean, "7", p))
    assert len(records) == len(jobs)
    within = [cache_floor(j.abs_pos, 4) <= plen + 12 for j in jobs]
    assert list(records["state_established"]) == [replay.STATE_TOKENS if w else "not established" for w in within]
    assert list(records["exact_ok"]) == within
    from replaylib.analysis.stats import exclude_not_exact
    assert exclude_not_exact(records)[1] == within.count(False)


def test_exact_passes_that_resume_different_regenerations_are_flagged():
    from replaylib.measure.engine import ResumeReport as R
    from replaylib.measure.replay import (
        STATE_IDENTICAL,
        STATE_TOKENS,
        state_established,
    )
    same = R(state="tokens", establishment=1)
    assert state_established([same, R(state="tokens", establishment=1)]) == STATE_TOKENS
    assert state_established([same, R(state="tokens", establishment=2)]) == "regenerated, differs between passes"
    assert state_established([R(state="identical", establishment=1),
                              R(state="identical", establishment=2)]) == STATE_IDENTICAL
    assert state_established([same, R(state="not established", establishment=1)]) == "not established"
    assert state_established([R(state_ok=True)]) == "not established"  # an engine that cannot say


def test_compile_cache_kept_under_the_run_directory(monkeypatch, tmp_path):
    from replaylib.core.paths import out_root
    monkeypatch.delenv("VLLM_BATCH_INVARIANT", raising=False)
    monkeypatch.delenv("VLLM_CACHE_ROOT", raising=False)
    prepare_environment(False, "c", "multiprocess")
    assert os.environ["VLLM_CACHE_ROOT"] == str(out_root() / "runs" / ".vllm-cache")
    monkeypatch.setenv("VLLM_CACHE_ROOT", str(tmp_path))  # the user's choice wins
    prepare_environment(False, "c", "multiprocess")
    assert os.environ["VLLM_CACHE_ROOT"] == str(tmp_path)
