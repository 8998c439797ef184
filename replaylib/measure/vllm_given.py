"""A vLLM engine over a vllm.LLM its caller built and keeps (a trainer's rollout engine), for the credit tool's
estimator: the LLM must be able to force a response through its decode, so it is built with ``llm_settings()``
(the forcing logits processor, prefix caching, the raw logprobs the certificates compare, the stats whose
preemption count verifies each resume); closing the engine
leaves the LLM running."""
from __future__ import annotations

import os

from .engine import EngineUnavailable
from .engine_vllm import LOGPROBS_MODE, VLLMEngine
from .vllm_forcing import FORCING_PROCESSOR


def llm_settings() -> dict:
    """What to pass to vllm.LLM(...) besides the model, so that the credit tool can use it."""
    # stats on: a resume is verified only when the engine's preemption count says nothing was evicted
    return {"enable_prefix_caching": True, "logprobs_mode": LOGPROBS_MODE, "logits_processors": [FORCING_PROCESSOR],
            "disable_log_stats": False}


def missing_settings(llm, raw_switched: bool = False) -> list[str]:
    """The settings of llm_settings() the LLM was built without, as name=value (raw_switched: not logprobs_mode,
    which its caller switches while the engine runs: replaylib.credit.trl_vllm.raw_logprobs)."""
    model_config = llm.llm_engine.model_config
    processors = [p if isinstance(p, str) else f"{p.__module__}:{p.__qualname__}"
                  for p in getattr(model_config, "logits_processors", None) or []]
    found = {"logits_processors": FORCING_PROCESSOR in processors,
             "enable_prefix_caching": bool(llm.llm_engine.vllm_config.cache_config.enable_prefix_caching),
             "logprobs_mode": str(getattr(model_config, "logprobs_mode", "")).endswith(LOGPROBS_MODE),
             "disable_log_stats": bool(getattr(llm.llm_engine, "log_stats", False))}
    wanted = llm_settings()
    return [f"{name}={wanted[name]!r}" for name, ok in found.items()
            if not ok and not (raw_switched and name == "logprobs_mode")]


def engine_around(llm, invariant: bool = False, config: str = "credit", raw_switched: bool = False) -> VLLMEngine:
    """The engine over a caller's LLM; one built without llm_settings() is refused in one line. raw_switched: its
    caller switches the sampler to raw logprobs while the engine runs (replaylib.credit.trl_vllm.raw_logprobs),
    so the LLM's own logprobs_mode does not matter."""
    missing = missing_settings(llm, raw_switched)
    if missing:
        raise EngineUnavailable(f"the vllm.LLM given was built without {', '.join(missing)}: build it with "
                                f"LLM(model, ..., **replaylib.credit.llm_settings()) so that responses can be "
                                f"forced through its decode and each resume verified")
    import vllm
    model_config = llm.llm_engine.model_config
    serving = "inprocess" if os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING") == "0" else "multiprocess"
    engine = VLLMEngine(llm, vllm.SamplingParams, model=f"{model_config.model} (in memory)",
                        dtype=str(model_config.dtype).removeprefix("torch."), invariant=invariant,
                        version=vllm.__version__, config=config, serving=serving, forcing=True)
    engine.owned = False
    return engine
