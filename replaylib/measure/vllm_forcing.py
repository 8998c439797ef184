"""Forced decoding on vLLM 0.22.1: a logits processor that makes a request decode given tokens.

A request whose ``SamplingParams.extra_args`` holds ``{FORCE_KEY: [token ids]}`` samples exactly those
tokens, one decode step each: before sampling its i-th output token every other logit is set to -inf.
The forward passes, and so the KV blocks they write, are those of decoding the response; the logprobs
vLLM returns are still the model's own (logprobs_mode "raw_logprobs" computes them before any logits
processor, vllm/v1/sample/sampler.py). Requests without the key are untouched.

vLLM loads the class by name in its engine core (``LLM(logits_processors=[FORCING_PROCESSOR])``,
vllm/v1/sample/logits_processor/__init__.py), so this module imports vllm only there.
"""
from __future__ import annotations

FORCE_KEY = "replaylib_forced_tokens"
FORCING_PROCESSOR = "replaylib.measure.vllm_forcing:ForcedTokens"


def force_row(logits, tokens: list[int], produced: int):
    """One request's logits before sampling its output token number `produced`: only tokens[produced]
    stays possible (in place); past the end of tokens the row is left alone."""
    if produced < len(tokens):
        keep = int(tokens[produced])
        value = logits[keep].clone()
        logits.fill_(float("-inf"))
        logits[keep] = value
    return logits


def forced_params(sampling_params, prompt: list[int], resp: list[int], top_logprobs: int, stop_ids: set,
                  context: int | None, sampler_max: int | None):
    """A forced request that ends as its sampler's did. vLLM's async scheduler decodes a request that stopped at
    a token one step more than it needed (it learns of the stop a step late), but never one past its max_tokens:
    forced to its length, a response that stopped at a token would leave the next step's batch a row short of the
    sampler's, and every row decoded after it would be computed in another batch. So it stops at its last token
    (stop_token_ids), with the sampler's max_tokens where the call shows it (sampler_max_tokens), else room to the
    context's end; one that ended without a stop token, or holds one earlier (its sampler ignored EOS), is forced
    to its length."""
    forced = {FORCE_KEY: resp}
    if not (resp and resp[-1] in stop_ids and not stop_ids & set(resp[:-1])):
        return sampling_params(temperature=0.0, max_tokens=len(resp), logprobs=top_logprobs, ignore_eos=True,
                               detokenize=False, extra_args=forced)
    room = context - len(prompt) if isinstance(context, int) else len(resp) + 1
    max_tokens = sampler_max if sampler_max is not None and sampler_max >= len(resp) else max(room, len(resp))
    return sampling_params(temperature=0.0, max_tokens=max_tokens, logprobs=top_logprobs, stop_token_ids=[resp[-1]],
                           detokenize=False, extra_args=forced)


def sampler_max_tokens(responses: list[list[int]], stop_ids: set) -> int | None:
    """The max_tokens a batch was sampled with, where it shows: the length of a response that ended without a
    stop token (it ran out of tokens); None where every response stopped at one."""
    ran_out = [len(r) for r in responses if r and r[-1] not in stop_ids]
    return max(ran_out) if ran_out else None


def _processor_class():
    from vllm.v1.sample.logits_processor import AdapterLogitsProcessor

    class ForcedTokens(AdapterLogitsProcessor):
        """Per request: force the tokens in extra_args[FORCE_KEY] (output_ids: the request's output so far,
        a live list vLLM keeps current, so its length is the index of the token being sampled)."""

        def is_argmax_invariant(self) -> bool:
            return False  # it changes which token wins, for greedy requests too

        def new_req_logits_processor(self, params):
            tokens = (params.extra_args or {}).get(FORCE_KEY)
            if not tokens:
                return None
            tokens = [int(t) for t in tokens]
            return lambda output_ids, logits: force_row(logits, tokens, len(output_ids))

    return ForcedTokens


def __getattr__(name):  # the class exists only where vllm does (its engine core loads it by name)
    if name == "ForcedTokens":
        cls = _processor_class()
        globals()[name] = cls
        return cls
    raise AttributeError(name)
