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
