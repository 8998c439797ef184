"""Credit through TRL's colocated vLLM engine: the rollouts forced through the engine that sampled them, in the
trainer's process, with the weights it sampled them with (before the optimizer step), and no second copy of the
policy on the GPU.

    with vllm_for_credit():                 # TRL's LLM built able to force (the forcing logits processor, stats)
        trainer = GRPOTrainer(..., args=GRPOConfig(use_vllm=True, vllm_mode="colocate", ...))
    CreditCallback(every=1).attach(trainer)   # forces through trainer.vllm_generation.llm

TRL builds its LLM with ``logprobs_mode="processed_logprobs"``: the logprobs it returns are taken after the logits
processors, so a forced token's would be 0. Two things keep the certificates raw against raw, as the stages
compare them: while TRL samples a measured step, ``SamplerTap`` keeps each sampled token's raw logprob (the
model's log softmax, before any processor or temperature, as vLLM's raw mode computes it) beside what TRL keeps;
while credit runs, ``raw_logprobs`` switches the engine's sampler to raw mode (TRL's own sampling is untouched).

The step's rollouts need not be forced at all while the blocks TRL's decode wrote are still in the engine's prefix
cache: ``SampledBlocks`` says whether they are (no reset of the prefix cache since the sampling ended, no
preemption during it), and the exact passes of the first group measured resume them, each resume verified by its
cache hit as the stages verify theirs. Once a pass resets the cache (re-feed's does), the batch is forced as
sampled again, and certified against what the tap recorded.
"""
from __future__ import annotations

import contextlib
import time

import torch

from ..measure.vllm_forcing import FORCING_PROCESSOR
from ..measure.vllm_trunks import preemption_count
from .inputs import BadInput
from .kernel import TOP_K

RAW = "raw_logprobs"


@contextlib.contextmanager
def vllm_for_credit():
    """TRL's colocated LLM, built in this block, gets what forcing needs: the forcing logits processor (inert for
    requests that do not ask for it), prefix caching and stats on (a resume is verified by the preemption count).
    Its sampling is otherwise TRL's."""
    try:
        from trl.generation import vllm_generation as module
    except ImportError as e:
        raise BadInput(f"vllm_for_credit: TRL's vLLM generation cannot be imported ({e}); install trl and "
                       f"vllm==0.22.1") from None
    built = getattr(module, "LLM", None)
    if built is None:
        raise BadInput("vllm_for_credit: vLLM is not installed (TRL has no LLM to build); pip install vllm==0.22.1")

    from ..measure.vllm_given import llm_settings
    # what llm_settings() asks, but TRL's logprobs_mode (raw_logprobs switches it while credit runs)
    wanted = {k: v for k, v in llm_settings().items() if k not in ("logprobs_mode", "logits_processors")}

    def LLM(*args, **kwargs):  # noqa: N802 - stands where TRL calls vllm.LLM
        processors = list(kwargs.get("logits_processors") or [])
        if FORCING_PROCESSOR not in processors:
            processors.append(FORCING_PROCESSOR)
        return built(*args, **{**kwargs, "logits_processors": processors, **wanted})

    module.LLM = LLM
    try:
        yield
    finally:
        module.LLM = built


def colocated_llm(trainer):
    """(TRL's colocated LLM, None) when credit can force through it, else (None, why not)."""
    if not getattr(trainer, "use_vllm", False):
        return None, "the trainer samples with transformers"
    generation = getattr(trainer, "vllm_generation", None)
    llm = getattr(generation, "llm", None)
    if llm is None:
        return None, "TRL's vLLM runs as a server (vllm_mode='server'), outside the trainer's process"
    if getattr(generation, "enable_sleep_mode", False):
        return None, ("TRL's vLLM sleeps after sampling (vllm_enable_sleep_mode=True drops its weights), so it "
                      "cannot force a step's rollouts; turn sleep mode off")
    if getattr(generation, "tensor_parallel_size", 1) != 1:
        return None, "TRL's vLLM is split over GPUs (vllm_tensor_parallel_size > 1)"
    from ..measure.vllm_given import missing_settings
    missing = missing_settings(llm, raw_switched=True)
    if missing:
        return None, (f"TRL's LLM was built without {', '.join(missing)}: build the trainer inside `with "
                      f"replaylib.credit.trl_vllm.vllm_for_credit():`")
    return llm, None


def model_runner(llm):
    """The engine's model runner, in this process (TRL's colocated engine is: external_launcher)."""
    try:
        return llm.llm_engine.model_executor.driver_worker.model_runner
    except AttributeError:
        raise BadInput("this vllm.LLM's model runner is not in this process (vLLM's multi-process engine): its "
                       "sampler's logprobs cannot be recorded or switched to raw") from None


@contextlib.contextmanager
def raw_logprobs(runner):
    """The sampler returns raw logprobs in this block (the model's, before the forcing processor): vLLM keeps the
    mode in the sampler and in its top-k/top-p sampler, whose processed value would replace the raw one."""
    sampler = runner.sampler
    modes = sampler.logprobs_mode, sampler.topk_topp_sampler.logprobs_mode
    sampler.logprobs_mode = sampler.topk_topp_sampler.logprobs_mode = RAW
    try:
        yield
    finally:
        sampler.logprobs_mode, sampler.topk_topp_sampler.logprobs_mode = modes


def request_number(req_id: str) -> int | None:
    """LLM.generate numbers its requests 0, 1, ... and returns them in that order; the engine core's id adds a
    suffix ('12-3f9a1c2b')."""
    head = str(req_id).split("-", 1)[0]
    return int(head) if head.isdigit() else None


class SampledBlocks:
    """Whether the blocks TRL's engine wrote into its prefix cache while sampling a step are still those its decode
    wrote: no preemption during the sampling (a preempted request's blocks are computed again by a prefill), and no
    reset of the prefix cache since it ended (TRL resets it after loading new weights; credit's forcing and re-feed
    passes reset it). Every reset of the LLM's prefix cache is counted, whoever asks for it."""

    def __init__(self, llm):
        self.llm, self.resets, self.ended, self.preempted = llm, 0, None, None
        reset = llm.reset_prefix_cache

        def counted(*args, **kwargs):
            self.resets += 1
            return reset(*args, **kwargs)

        llm.reset_prefix_cache = counted

    @contextlib.contextmanager
    def sampling(self):
        """Around TRL's sampling of a step: the preemptions during it, and the reset count when it ended."""
        self.ended = None
        before = preemption_count(self.llm)
        yield self
        after = preemption_count(self.llm)
        self.preempted = None if before is None or after is None else after - before
        self.ended = self.resets

    def gone(self) -> str | None:
        """None while the step's sampled blocks are resident as its decode wrote them, else why they are not."""
        if self.ended is None:
            return "no sampling was recorded"
        if self.preempted is None:
            return "the engine's preemption count could not be read"
        if self.preempted:
            return f"vLLM preempted {self.preempted} requests while sampling"
        if self.resets != self.ended:
            return "the prefix cache was reset since the sampling"
        return None


class SamplerTap:
    """While recording: every sampled token of every request, with its raw logprob and the raw top-k (log softmax
    of the logits the sampler was given, computed as vLLM's raw mode computes it, before the sampler changes
    them)."""

    def __init__(self, runner, width: int = TOP_K):
        self.runner, self.width = runner, width
        self.calls: list = []  # per sampler call: (request ids, sampled tokens, their raw logprobs, raw top-k)
        self.seconds = 0.0  # the tap's own, while the sampler ran: credit's, not the training's

    @contextlib.contextmanager
    def recording(self):
        sampler = self.runner.sampler
        self.calls, self.seconds = [], 0.0
        forward = sampler.forward

        def tapped(logits, sampling_metadata, *args, **kwargs):
            started = time.perf_counter()
            raw = sampler.compute_logprobs(logits)
            sampling = time.perf_counter()
            out = forward(logits, sampling_metadata, *args, **kwargs)
            sampled = time.perf_counter()
            tokens = out.sampled_token_ids[:, 0].long()
            rows = len(tokens)
            top = raw[:rows].topk(min(self.width, raw.shape[-1]), dim=-1)
            self.calls.append((list(self.runner.input_batch.req_ids[:rows]), tokens.clone(),
                               raw[:rows].gather(1, tokens[:, None])[:, 0].clone(), top.indices, top.values))
            self.seconds += (sampling - started) + (time.perf_counter() - sampled)
            return out

        sampler.forward = tapped
        try:
            yield self
        finally:
            del sampler.forward  # the class's method again

    def by_request(self) -> dict[str, tuple[list[int], list[float], list[list]]]:
        """Per request: its sampled tokens, their raw logprobs and the raw top-k of each step ([[id, logprob], ...])."""
        found: dict = {}
        for ids, tokens, logprobs, top_ids, top_values in self.calls:
            # float32's values, exactly
            for req, token, lp, t_ids, t_values in zip(ids, tokens.tolist(), logprobs.tolist(), top_ids.tolist(),
                                                       top_values.tolist()):
                got = found.setdefault(req, ([], [], []))
                got[0].append(token)
                got[1].append(lp)
                got[2].append([[t, v] for t, v in zip(t_ids, t_values)])
        return found

    def matched(self, completion_ids, completion_mask):
        """Per rollout (LLM.generate's order): (its raw logprobs, its raw top-k), one per response token; None when
        what was recorded is not one generate call of these rollouts."""
        found = self.by_request()
        numbered = [(request_number(r), r) for r in found]
        if len(numbered) != completion_ids.shape[0] or any(n is None for n, _ in numbered):
            return None
        rows = []
        for i, (_, req) in enumerate(sorted(numbered)):
            tokens, logprobs, top = found[req]
            want = completion_ids[i][completion_mask[i].bool()].tolist()
            at = aligned(tokens, want)
            if at is None:
                return None
            rows.append((logprobs[at:at + len(want)], top[at:at + len(want)]))
        return rows


def per_position(rows: list | None, shape) -> torch.Tensor | None:
    """SamplerTap.matched's rows as rows x positions of raw logprobs (0 past a rollout's end), the rollouts in
    LLM.generate's order; None when nothing matched (then no certificate: 'not recorded')."""
    if rows is None:
        return None
    values = torch.zeros(shape, dtype=torch.float64)  # holds any float32 exactly
    for i, (logprobs, _) in enumerate(rows):
        values[i, :len(logprobs)] = torch.tensor(logprobs, dtype=torch.float64)
    return values


def aligned(sampled: list[int], completion: list[int]) -> int | None:
    """Where the completion starts among a request's sampled tokens: rows sampled while its prompt was still
    being prefilled in chunks come first and are discarded by vLLM, as is a row sampled after it finished
    (asynchronous scheduling); None if it is not there."""
    n = len(completion)
    for at in range(len(sampled) - n + 1):
        if sampled[at:at + n] == completion:
            return at
    return None
