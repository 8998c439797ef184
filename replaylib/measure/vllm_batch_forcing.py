"""Forced decoding of a batch as vLLM sampled it (the credit tool's forcing="batch" on a vLLM engine): every row
in one call, in the batch's order, on a freshly reset prefix cache. The engine then schedules the forced requests
as it scheduled the sampled ones (the same prompts and lengths in the same order: the same prefill chunks, the
same decode batches, each request ending where its response ends), so a row's logits are computed in the batches
they were sampled in, where forcing one prompt's rollouts alone would change the batches around them.

Each prompt's group keeps its own state (its rows' trunks); when the exact passes need its blocks again (a pass
reset the prefix cache), the whole batch is forced again, so the blocks they resume are always the batch's.

While the blocks the sampler itself wrote are still in the prefix cache (the caller can tell: no reset since it
sampled, no preemption while it did), a group's state is those blocks (sampled_state): nothing is forced until a
pass resets the cache."""
from __future__ import annotations

import dataclasses

from .vllm_trunks import ResidentTrunks, ints


@dataclasses.dataclass
class GroupOfBatch:
    """One group's rows (their numbers in the batch) of a batch of prompts and responses forced whole."""
    prompts: list
    responses: list
    rows: list
    top_logprobs: int
    last: list | None = None  # this group's trunks as the latest forcing gave them (None: not forced since)

    def force(self, engine):
        """The whole batch forced again; (this group's trunks numbered as its rollouts, preemptions)."""
        trunks, preempted = force_batch(engine, self.prompts, self.responses, self.top_logprobs)
        self.last = self.mine(trunks)
        return self.last, preempted

    def mine(self, trunks: list) -> list:
        return [dataclasses.replace(trunks[b], rollout=i) for i, b in enumerate(self.rows)]


def force_batch(engine, prompts: list[list[int]], responses: list[list[int]], top_logprobs: int):
    """Every row forced in one call, in the batch's order; (a trunk per row, preemptions during the call)."""
    return engine._forced_requests(0, [ints(p) for p in prompts], [ints(r) for r in responses], top_logprobs)


def group_state(engine, group: GroupOfBatch, trunks: list, preempted, epoch: int) -> ResidentTrunks:
    """A group's state out of its batch's forcing (trunks: the batch's, forced at the engine's reset count
    `epoch`): its rows' trunks saved as forced; resident while no reset came since, else forced again (whole)
    when an exact pass needs them."""
    mine = group.mine(trunks)
    state = ResidentTrunks.of_forced(mine[0].prompt_ids, mine, group.top_logprobs, batch=group)
    engine._record(state, mine, preempted)
    state.epoch = epoch  # a reset since the forcing leaves the blocks to be forced again
    return state


def sampled_state(engine, group: GroupOfBatch, trunks: list, epoch: int) -> ResidentTrunks | None:
    """A group's state on the blocks its sampler wrote, in the prefix cache at the engine's reset count `epoch`
    (trunks: the group's rollouts as sampled, their recorded top-k and logprobs): nothing forced. The exact passes
    resume those blocks while no reset came since, each resume verified by its cache hit; after a reset the whole
    batch is forced (group.force) and compared with what was recorded, as group_state's are. None when some of
    the blocks are gone (evicted): then the batch must be forced."""
    state = ResidentTrunks.of_forced(trunks[0].prompt_ids, trunks, group.top_logprobs, batch=group)
    engine._record(state, trunks, 0)  # recorded as a regeneration is: clean, each trunk identical to itself
    state.from_sampler, state.epoch, state.established = True, epoch, 0  # no regeneration: the sampler's own blocks
    if engine.epoch == epoch and not all_cached(engine, state.regenerated):
        return None
    return state


def all_cached(engine, sequences: list[list[int]]) -> bool:
    """Whether every full block of these sequences (the last token left out: a decode computes no KV for it) is
    in the prefix cache, before any pass runs: were one gone, a pass's first request would prefill it and the
    others would resume that prefill as if it were the sampler's. One request a sequence, cut one token past its
    last full block and sampling one token, so that it fills no new block."""
    size = engine.kv_block_size
    cut = [list(seq[:(len(seq) - 1) // size * size + 1]) for seq in sequences]
    params = [engine.SamplingParams(temperature=0.0, max_tokens=1, detokenize=False) for _ in cut]
    outs, preempted = engine._generate(cut, params, "the check of the sampler's blocks")
    return preempted == 0 and all(int(o.num_cached_tokens or 0) >= len(c) - 1 for o, c in zip(outs, cut))
