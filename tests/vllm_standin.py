"""A stand-in for vLLM's offline LLM (no GPU, no vLLM): token ids in, vLLM-shaped outputs out, with a
prefix cache of full blocks, seeded sampling, preemption counts, the multi-process engine's racing
stock calls and its pause / enqueue / resume. Used by the vLLM engine's tests, and, through
``make_engine`` (REPLAYLIB_TEST_ENGINE_FACTORY=vllm_standin:make_engine), by runs whose engine
server builds it instead of a real vLLM engine."""
import hashlib
import os
import random
from pathlib import Path
from types import SimpleNamespace

from replaylib.measure.vllm_forcing import FORCE_KEY

VOCAB, EOS, STOP2 = 40, 2, 3


# ---------------------------------------------------------------- the stand-in
class FakeSP:
    """Stands in for vllm.SamplingParams: keeps what it was given."""

    def __init__(self, temperature=1.0, top_p=1.0, max_tokens=16, logprobs=None, seed=None, detokenize=True,
                 ignore_eos=False, extra_args=None, stop_token_ids=None):
        self.temperature, self.top_p, self.max_tokens = temperature, top_p, max_tokens
        self.logprobs, self.seed, self.detokenize = logprobs, seed, detokenize
        self.ignore_eos, self.extra_args = ignore_eos, extra_args
        self.stop_token_ids = stop_token_ids


class Logprob(SimpleNamespace):
    pass


def _h(*parts) -> int:
    return int.from_bytes(hashlib.sha256("|".join(map(str, parts)).encode()).digest()[:8], "little")


def complete(ids, sp, forced=None, noise=0, exact=None):
    """The stand-in model: a deterministic function of (context, seed, settings), vLLM-shaped logprobs.
    forced: {generated index: token} placed instead of the sampled one; noise: a batch-dependent
    perturbation (0: none) of the logprobs, that also flips the sampled token now and then; exact: the
    tokens to emit (the forcing logits processor's requests), EOS ignored until they end."""
    ctx, tokens, logprobs, finish = list(ids), [], [], "length"
    for _ in range(sp.max_tokens):
        h = _h(*ctx[-3:])
        top = random.Random(h).sample(range(4, VOCAB), 6)
        if h % 11 == 0:
            top[0] = EOS
        lps = [-0.2 - 0.45 * i - (h % 7) / 100 + noise * 1e-6 for i in range(6)]
        pick = 0 if sp.temperature == 0 else random.Random(_h(sp.seed, len(ctx))).randrange(3)
        if noise and _h(noise, len(ctx), *ctx[-2:]) % 5 == 0:
            pick = (pick + 1) % 3
        t = top[pick]
        if forced and len(tokens) in forced:
            t = 4 + (forced[len(tokens)] - 4) % (VOCAB - 4)
        if exact is not None:
            t = exact[len(tokens)]
            pick = top.index(t) if t in top else None
        tokens.append(t)
        if sp.logprobs and pick is None:  # a forced token outside the top 6
            step = {t: Logprob(logprob=-9.0, rank=VOCAB)}
            step.update({top[i]: Logprob(logprob=lps[i], rank=i + 1) for i in range(min(sp.logprobs, len(top)))})
            logprobs.append(step)
        elif sp.logprobs:
            # as vllm/logprobs.py: the sampled token first (its vocabulary rank), then ranks 1..k
            step = {t: Logprob(logprob=lps[pick], rank=pick + 1)}
            step.update({top[i]: Logprob(logprob=lps[i], rank=i + 1) for i in range(min(sp.logprobs, len(top)))})
            logprobs.append(step)
        ctx.append(t)
        if t in (EOS, STOP2) and not sp.ignore_eos:
            finish = "stop"
            break
        if t in (sp.stop_token_ids or ()):  # as vLLM: a request's stop tokens end it whatever ignore_eos says
            finish = "stop"
            break
        if exact is not None and len(tokens) == len(exact):
            break
    return tokens, (logprobs if sp.logprobs else None), finish


def decoded_rows(outs) -> list[int]:
    """The steps each request is decoded at, as vLLM's async scheduler batches them: a request that stopped at a
    token is decoded one step more (the scheduler learns of the stop a step late), one that reached its max_tokens
    is not."""
    return [len(o.outputs[0].token_ids) + (o.outputs[0].finish_reason == "stop") for o in outs]


def decode_steps(outs) -> None:
    """Each step's numbers perturbed by the rows decoding at that step (decoded_rows)."""
    rows = decoded_rows(outs)
    for o in outs:
        for step, entries in enumerate(o.outputs[0].logprobs or []):
            live = sum(n > step for n in rows)
            for entry in entries.values():
                entry.logprob += live * 1e-7


class FakeTokenizer:
    eos_token_id = EOS
    all_special_ids = [0, 1, EOS]

    def apply_chat_template(self, messages, add_generation_prompt=True, tokenize=True):
        return [0] + [4 + ord(c) % 30 for c in messages[0]["content"][:22]] + [1]

    def decode(self, ids, skip_special_tokens=True):
        return " ".join(str(i) for i in ids if i not in self.all_special_ids)


class FakeLLM:
    """The vllm.LLM methods the engine uses, with a prefix cache of full blocks.

    racy: a multi-process engine whose core steps while a call's requests still arrive: the
    outputs of a stock generate call depend on how the call's requests happened to be batched
    (a different perturbation of the logprobs, and sometimes of the tokens, per call), while a
    call whose requests were all queued before the first step (sleep level 0, enqueue, wake_up,
    wait_for_completion) is computed as an in-process engine computes it.
    diverge: {trunk seed: generated index}: every regeneration of that trunk (a trunk request
    after the first with that seed) samples another token there, and so differs from then on."""

    def __init__(self, block_size=4, num_gpu_blocks=None, reset_ok=True, racy=False, forcing=False,
                 batch_dependent=False):
        cache_config = SimpleNamespace(block_size=block_size, num_gpu_blocks=num_gpu_blocks)
        self.llm_engine = SimpleNamespace(
            vllm_config=SimpleNamespace(cache_config=cache_config),
            model_config=SimpleNamespace(try_get_generation_config=lambda: {"eos_token_id": [EOS, STOP2]},
                                         get_vocab_size=lambda: VOCAB),
            engine_core=SimpleNamespace(shutdown=lambda: self.events.append("shutdown")))
        self.bs, self.reset_ok, self.cached = block_size, reset_ok, set()
        self.events, self.calls = [], []
        self.preempt_per_call, self.preempted = 0, 0
        self.force_cached = None
        self.racy, self.paused, self.queued, self.race = racy, False, [], 0
        self.diverge, self.trunks_seen = {}, set()
        self.forcing = forcing  # started with the forcing logits processor (replaylib.measure.vllm_forcing)
        # a GPU whose kernels depend on the batch: a call's logprobs are perturbed by what the call holds (its
        # prompts' lengths in order), the same for the same batch
        self.batch_dependent = batch_dependent

    def get_tokenizer(self):
        return FakeTokenizer()

    def reset_prefix_cache(self):
        self.events.append("reset")
        if self.reset_ok:
            self.cached.clear()
        return self.reset_ok

    def get_metrics(self):
        return [SimpleNamespace(name="vllm:num_preemptions", labels={}, value=self.preempted)]

    def generate(self, prompts, sampling_params, use_tqdm=True):
        self.events.append("generate")
        self.race += 1  # a stock call on a racy engine: batched as its requests happened to arrive
        return self._call(prompts, sampling_params, self.race if self.racy else 0)

    def sleep(self, level=1, mode="abort"):
        assert (level, mode) == (0, "keep") and not self.paused
        self.events.append("sleep")
        self.paused = True

    def enqueue(self, prompts, sampling_params, use_tqdm=True):
        assert self.paused, "enqueued while the scheduler runs: the call would race"
        self.events.append("enqueue")
        self.queued.append((prompts, sampling_params))

    def wake_up(self, tags=None):
        assert tags == ["scheduling"]
        self.events.append("wake_up")
        self.paused = False

    def wait_for_completion(self, use_tqdm=True):
        self.events.append("wait")
        (prompts, sps), = self.queued
        self.queued = []
        return self._call(prompts, sps, 0)

    def _call(self, prompts, sampling_params, race):
        self.calls.append((prompts, sampling_params))
        if self.batch_dependent:
            race = 1 + _h(*(len(p["prompt_token_ids"]) for p in prompts)) % 997
        self.preempted += self.preempt_per_call
        outs = [self._one(p["prompt_token_ids"], sp, race) for p, sp in zip(prompts, sampling_params)]
        if self.batch_dependent:
            decode_steps(outs)
        return outs

    def _one(self, ids, sp, race):
        n = 0  # cached full blocks; the last prompt token is always computed
        while (n + 1) * self.bs <= len(ids) - 1 and tuple(ids[:(n + 1) * self.bs]) in self.cached:
            n += 1
        exact = (sp.extra_args or {}).get(FORCE_KEY) if self.forcing else None
        tokens, logprobs, finish = complete(ids, sp, exact=exact)
        if sp.logprobs and sp.seed in self.diverge:  # a trunk request
            if sp.seed in self.trunks_seen:
                i = self.diverge[sp.seed]
                tokens, logprobs, finish = complete(ids, sp, forced={i: tokens[i] + 1})
            self.trunks_seen.add(sp.seed)
        if race:
            tokens, logprobs, finish = complete(ids, sp, noise=race, exact=exact)
        fed = list(ids) + tokens[:-1]
        self.cached |= {tuple(fed[:m * self.bs]) for m in range(1, len(fed) // self.bs + 1)}
        comp = SimpleNamespace(token_ids=tokens, logprobs=logprobs, finish_reason=finish)
        cached = n * self.bs if self.force_cached is None else self.force_cached
        return SimpleNamespace(outputs=[comp], num_cached_tokens=cached)


RACED_STARTS_ENV = "REPLAYLIB_STANDIN_RACED_STARTS"  # COUNTER_FILE:N: the first N starts fail as vLLM's would


def _raced_start() -> None:
    """Fail as vLLM 0.22.1's start fails when another process took the memory it checks for (a lease's log)."""
    spec = os.environ.get(RACED_STARTS_ENV)
    if not spec:
        return
    path, limit = spec.rsplit(":", 1)
    counter = Path(path)
    done = int(counter.read_text()) if counter.exists() else 0
    if done < int(limit):
        counter.write_text(str(done + 1))
        raise ValueError("Free memory on device cuda:0 (4.29/79.18 GiB) on startup is less than desired GPU memory "
                         "utilization (0.095, 7.52 GiB). Decrease GPU memory utilization or reduce GPU memory used "
                         "by other processes.")


def make_engine(params, invariant: bool = False, forcing: bool = False):
    """A VLLMEngine on the stand-in, as VLLMEngine.from_params would build the real one (identity,
    configure); its KV blocks are the pivot filter's block_size (4 tokens when that is 1)."""
    from replaylib.measure.engine_vllm import VLLMEngine
    _raced_start()
    from replaylib.measure.vllm_setup import engine_identity
    racy = params.vllm_serving == "multiprocess" and not invariant  # batch-invariant kernels: no race
    block = params.block_size if params.block_size > 1 else 4
    engine = VLLMEngine(FakeLLM(block_size=block, racy=racy, forcing=forcing), FakeSP, model=params.model,
                        dtype=params.dtype, invariant=invariant, config=params.config, serving=params.vllm_serving,
                        forcing=forcing)
    engine.identity = engine_identity(params, invariant)
    engine.configure(params)
    return engine


def echo_unit(engine, x, fail: bool = False):
    """A unit for the engine service's tests: logs, reports progress, and answers (or raises)."""
    import logging
    import os

    from replaylib.core import progress
    logging.getLogger("replaylib").info("unit %s on config %s", x, engine.config)
    progress.update(1)
    if fail:
        raise ValueError(f"unit {x} failed as asked")
    return {"pid": os.getpid(), "x": x, "config": engine.config, "trunk_settings": engine.trunk_settings}


def held_unit(engine, ready_path: str, release_path: str):
    """A unit that says when it has begun and runs until it is released, for the tests that kill its stage
    in the middle of it."""
    import time
    from pathlib import Path
    Path(ready_path).write_text("running")
    while not Path(release_path).exists():
        time.sleep(0.05)
    return "released"
