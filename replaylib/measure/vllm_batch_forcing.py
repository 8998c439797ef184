"""Forced decoding of a batch as vLLM sampled it (the credit tool's forcing="batch" on a vLLM engine): every row
in one call, in the batch's order, on a freshly reset prefix cache. The engine then schedules the forced requests
as it scheduled the sampled ones (the same prompts and lengths in the same order: the same prefill chunks, the
same decode batches, each request ending where its response ends), so a row's logits are computed in the batches
they were sampled in, where forcing one prompt's rollouts alone would change the batches around them.

Each prompt's group keeps its own state (its rows' trunks); when the exact passes need its blocks again (a pass
reset the prefix cache), the whole batch is forced again, so the blocks they resume are always the batch's."""
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

    def force(self, engine):
        """The whole batch forced again; (this group's trunks numbered as its rollouts, preemptions)."""
        trunks, preempted = force_batch(engine, self.prompts, self.responses, self.top_logprobs)
        return self.mine(trunks), preempted

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
