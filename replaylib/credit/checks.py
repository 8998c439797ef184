"""The credit tool's checks before anything is loaded or written: its settings within the bounds the runner's
parameters have (replaylib.runtime.params), and every rollout within those token bounds and the model's
context. Each failure is one line (BadInput) naming the flag or the rollout and the fix."""
from __future__ import annotations

import dataclasses
import math

from ..runtime import params as schema
from .inputs import BadInput

# the tool's setting -> the runner's parameter whose bounds it has (and whose meaning)
BOUNDED = {"k": "k", "max_cont_tokens": "max_cont_tokens", "probe_tokens": "probe_tokens",
           "temperature": "cont_temperature", "top_p": "cont_top_p", "margin": "margin_threshold",
           "max_pivots_per_rollout": "max_pivots_per_rollout", "workers": "ray_workers",
           "gpu_memory_utilization": "gpu_memory_utilization", "kv_cache_gib": "kv_cache_gib",
           "max_model_len": "max_model_len"}
# no runner parameter has them: finite, the timeout positive, the logprobs' temperature a sampling one
FINITE = ("success_above", "grader_timeout", "logprobs_temperature")
MAX_GRADER_TIMEOUT = 86400.0  # seconds: a day per call
TOKEN_BOUND = next(f.metadata["hi"] for f in dataclasses.fields(schema.Params) if f.name == "max_trunk_tokens")


def flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def check_bounds(settings) -> None:
    """Each bounded setting through the runner's own check of its parameter (type, range, finiteness)."""
    for name, param in BOUNDED.items():
        value = getattr(settings, name)
        try:
            schema.make({param: value}, where=flag(name), scope=[])
        except ValueError as e:
            # "--k: parameter 'k' is 1000000; it must be at most 256 (...)" -> "--k 1000000; it must be ..."
            raise BadInput(str(e).replace(f": parameter '{param}' is ", " ", 1)) from None
    for name in FINITE:
        value = getattr(settings, name, None)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise BadInput(f"{flag(name)} {value!r}: give a finite number")
    if settings.grader_timeout <= 0:
        raise BadInput(f"--grader-timeout {settings.grader_timeout:g}: give a positive number of seconds")
    if settings.grader_timeout > MAX_GRADER_TIMEOUT:  # past what a wait on a process or thread can take
        raise BadInput(f"--grader-timeout {settings.grader_timeout:g}: give at most {MAX_GRADER_TIMEOUT:g} seconds "
                       f"(a day)")
    if settings.logprobs_temperature < schema.MIN_TEMPERATURE:
        raise BadInput(f"--logprobs-temperature {settings.logprobs_temperature:g}: give the temperature the "
                       f"logprobs were sampled at, at least {schema.MIN_TEMPERATURE:g} (greedy decoding keeps no "
                       f"distribution to certify; leave the logprobs out)")


def check_lengths(rollouts, context: int | None, settings, where: str) -> None:
    """Every rollout within the runner's token bound, and with its continuations inside the model's context:
    prompt + response + the longer of --max-cont-tokens and --probe-tokens, or with given positions
    prompt + last position + 1 + that (a pivot continues from there)."""
    extra = max(settings.max_cont_tokens, settings.probe_tokens)
    for r in rollouts:
        at = f"{where}:{r.line} (id {r.id!r})"
        for name, ids in (("prompt_ids", r.prompt_ids), ("response_ids", r.response_ids)):
            if len(ids) > TOKEN_BOUND:
                raise BadInput(f"{at}: field '{name}' has {len(ids)} tokens, more than {TOKEN_BOUND} (the runner's "
                               f"bound on a sequence: {schema.TOKENS_WHY}); leave the rollout out")
        if context is None:
            continue
        end = len(r.response_ids) if r.positions is None else max(r.positions) + 1
        needed = len(r.prompt_ids) + end + extra
        if needed > context:
            what = "response" if r.positions is None else f"last position ({max(r.positions)})"
            fix = (f"lower --max-cont-tokens/--probe-tokens to at most {context - len(r.prompt_ids) - end}"
                   if context > len(r.prompt_ids) + end else "leave the rollout out")
            raise BadInput(f"{at}: prompt ({len(r.prompt_ids)} tokens) + {what} + {extra} continuation tokens = "
                           f"{needed}, past the model's context of {context} positions; {fix}"
                           + (", or give its pivots as 'positions'" if r.positions is None else ""))


def model_context(config, max_model_len: int | None = None) -> int | None:
    """The positions a model can attend to (its config's), capped by vLLM's --max-model-len where given."""
    found = next((getattr(config, name) for name in ("max_position_embeddings", "n_positions", "max_sequence_length")
                  if isinstance(getattr(config, name, None), int)), None)
    if max_model_len is not None:
        return max_model_len if found is None else min(found, max_model_len)
    return found
