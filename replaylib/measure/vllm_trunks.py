"""What the vLLM engine keeps of one problem's trunks (their blocks live in its prefix cache), and the
small helpers on token ids, blocks and vLLM's logprobs that its passes share."""
from __future__ import annotations

import math
from dataclasses import dataclass, field


def blocks(n_tokens: int, block_size: int) -> int:
    return -(-n_tokens // block_size)


def cache_floor(abs_pos: int, block_size: int) -> int:
    """Tokens an exact resume must find cached: the full blocks before the pivot's block."""
    return (abs_pos // block_size) * block_size


def topk_of(step_logprobs: dict, k: int) -> tuple[list[int], list[float]]:
    """The top-k (ids, logprobs) of one step, best first, without vLLM's extra sampled-token entry.

    vLLM 0.22.1 returns {sampled token, top-1..top-k} (vllm/logprobs.py
    append_logprobs_for_next_position): the top-k carry ranks 1..k; the sampled token,
    when outside the top-k, carries its vocabulary rank, counted with >= (ties included,
    vllm/v1/sample/ops/logprobs.py), so it is always above k.
    """
    entries = sorted(step_logprobs.items(),
                     key=lambda kv: (kv[1].rank if kv[1].rank is not None else math.inf, -kv[1].logprob))
    entries = entries[:k]
    return [int(t) for t, _ in entries], [float(lp.logprob) for _, lp in entries]


def preemption_count(llm) -> int | None:
    """The engine's preemptions so far (its stats), or None where it cannot say (stats off, a stand-in)."""
    try:
        metrics = llm.get_metrics()
    except (AttributeError, AssertionError):
        return None
    return int(sum(getattr(m, "value", 0) for m in metrics if m.name == "vllm:num_preemptions"))


def ints(x) -> list[int]:
    return [int(v) for v in x]


def common_prefix(a: list[int], b: list[int]) -> int:
    """How many leading tokens two sequences share."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


@dataclass
class ResidentTrunks:
    """One problem's trunks as this engine keeps them resident for the exact passes (problem_state): the
    saved trunks, and what their regeneration in the prefix cache gave."""
    problem_id: int
    prompt_ids: list
    saved: dict  # rollout -> the saved trunk (seed, prompt and generated ids, raw top-k)
    clean: bool = False  # the regeneration ran without preemption
    identical: dict = field(default_factory=dict)  # rollout -> regenerated bit for bit (tokens and logprobs)
    agree: dict = field(default_factory=dict)  # rollout -> generated tokens the regeneration shares with the saved
    regenerated: list = field(default_factory=list)  # every regenerated sequence: prompt + generated ids
    trunk_blocks: int = 0  # KV blocks the regenerated trunks hold
    epoch: int = 0  # the engine's reset count when they were regenerated
    allocated: int = 0  # blocks the exact passes' requests took since
    established: int = 0  # regenerations so far
    forced: int = 0  # forced decoding (VLLMEngine.force_trunks): the top-k width it records; 0: sampled trunks
    batch: object = None  # its rows of a batch forced whole (vllm_batch_forcing.GroupOfBatch), else None
    # first resident as a sampler left them in the prefix cache (vllm_batch_forcing.sampled_state): nothing forced
    from_sampler: bool = False

    @classmethod
    def of_forced(cls, prompt: list, trunks: list, top_logprobs: int, batch=None) -> "ResidentTrunks":
        """One prompt's forced trunks (VLLMEngine.force_trunks, or its rows of a batch), saved as forced."""
        saved = {t.rollout: {"seed": 0, "prompt_ids": prompt, "gen_ids": t.gen_ids, "topk_ids": t.topk_ids,
                             "topk_logprobs": t.topk_logprobs} for t in trunks}
        return cls(0, prompt, saved, forced=top_logprobs, batch=batch)
