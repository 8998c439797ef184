"""Forced decoding of a batch as transformers' generate sampled it (the credit tool's forcing="batch")."""
from __future__ import annotations

from .engine import Trunk
from .engine_hf import _Rows
from .state import ResidentState


def force_batch(engine, prompts: list[list[int]], responses: list[list[int]], width: int, top_logprobs: int,
                observe=None):
    """Forced decoding of a batch as transformers' generate sampled it: the rows in the batch's order, every
    prompt left-padded to `width` (the sampler's padded width: at least the longest prompt) and masked, the
    positions counted over each row's own tokens, then every row fed its response one decode step at a time.
    A row whose response has ended is fed the pad token and kept in the batch, as generate keeps a finished
    sequence, until the longest has ended. Returns (trunks, state), row b the state's rollout b: its
    decode-time KV of prompt + response[:-1], its trunk's top-k and `observed` those of its own steps
    (force_trunks' meaning). One batch however many rows: max_batch_rows does not split what the sampler
    decoded together."""
    if engine.invariant:
        raise ValueError("invariant mode decodes one sequence per forward pass, not the sampler's batch: force "
                         "each prompt's rollouts instead (forcing groups)")
    if width < max(len(p) for p in prompts):
        raise ValueError(f"the batch's prompts were padded to {width} tokens, fewer than its longest prompt "
                         f"({max(len(p) for p in prompts)})")
    # left-padded and masked, a pad position at 0, as generate counts them; no mask where nothing is padded
    logits, cache, mask, pads = engine._prefill([list(p) for p in prompts], width=width)
    steps = max(len(r) for r in responses)
    rows = _Rows(seeds=[0] * len(prompts), temperature=[0.0] * len(prompts), top_p=[1.0] * len(prompts),
                 max_new=[steps] * len(prompts), topk=top_logprobs,
                 forced=[list(r) + [engine.pad_id] * (steps - len(r)) for r in responses], observe=observe,
                 observed=[[] for _ in prompts] if observe else None)
    _, top_ids, top_lps, _, states = engine._decode(logits, cache, mask, [len(p) for p in prompts], rows,
                                                  keep_state=True)
    trunks, kv = [], {}
    for b, (prompt, response) in enumerate(zip(prompts, responses)):
        n = len(response)
        finish = "eos" if response[-1] in engine.stop_ids else "length"
        trunks.append(Trunk(0, b, 0, list(prompt), list(response), top_ids[b][:n], top_lps[b][:n], finish,
                            rows.observed[b][:n] if observe else None))
        fed = len(prompt) + n - 1  # the last token is never fed back
        k, v = states[b]
        kv[b] = (k[:, :, pads[b]:pads[b] + fed].clone(), v[:, :, pads[b]:pads[b] + fed].clone())
    return trunks, ResidentState.produced(kv)
