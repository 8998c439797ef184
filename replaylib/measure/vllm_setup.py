"""What a vLLM engine is started with: the environment vLLM reads at import and engine start (the
serving mode, batch invariance, the compile cache) and the engine's identity (the stages whose
identities are equal can share one engine).

Serving modes (``vllm_serving``, a keyed parameter: it changes the numerics): multiprocess (the
paper's: the engine core runs in a child process, spawned, and starts stepping while a call's
requests are still arriving, so identical calls can run in different batches) or inprocess
(VLLM_ENABLE_V1_MULTIPROCESSING=0: one process, every request of a call is in before the first
step). prepare_environment sets the mode before vLLM is imported and refuses a process or an
environment set for the other one. VLLM_USE_FLASHINFER_SAMPLER=0 avoids a sampler kernel build that
needs nvcc. Batch-invariant mode needs VLLM_BATCH_INVARIANT=1 before vLLM is imported.
"""
from __future__ import annotations

import os
import sys


def unavailable_message(config: str, what: str) -> str:
    return (f"config '{config}': engine 'vllm' needs {what}; on a CUDA machine install it "
            f"(pip install -e '.[vllm]'), or set engine: hf")


SERVING_ENV = "VLLM_ENABLE_V1_MULTIPROCESSING"
SERVING_VALUE = {"multiprocess": "1", "inprocess": "0"}
VLLM_UNSET_SERVING = "multiprocess"  # what vLLM 0.22.1 runs when SERVING_ENV is unset


def serving_in_env() -> str | None:
    """The serving mode this environment sets for vLLM, or None where it sets none."""
    value = os.environ.get(SERVING_ENV, "").strip()
    if not value:
        return None
    if value not in SERVING_VALUE.values():
        raise RuntimeError(f"{SERVING_ENV}={value!r} is set in this environment; vLLM reads 0 or 1. Unset it: the "
                           f"configuration's vllm_serving chooses the serving mode")
    return "multiprocess" if value == "1" else "inprocess"


def prepare_environment(invariant: bool, config: str, serving: str) -> None:
    """Environment vLLM reads at import and engine start; refuses a process whose vLLM has the other mode.

    serving: multiprocess or inprocess (the configuration's vllm_serving). The parameter decides, so a value of
    VLLM_ENABLE_V1_MULTIPROCESSING that says otherwise is refused rather than silently measured."""
    if serving not in SERVING_VALUE:
        raise ValueError(f"config '{config}': vllm_serving must be one of {sorted(SERVING_VALUE)}, not {serving!r}")
    have = serving_in_env()
    if "vllm" in sys.modules:
        effective = have or VLLM_UNSET_SERVING
        if effective != serving:
            raise RuntimeError(f"config '{config}': vllm_serving is {serving}, but this process imported vLLM for the "
                               f"{effective} mode; run the stage in a fresh process (its own notebook kernel)")
    elif have is not None and have != serving:
        raise RuntimeError(f"config '{config}': {SERVING_ENV}={os.environ[SERVING_ENV]} is set in this environment, "
                           f"but the configuration asks vllm_serving: {serving} (the parameter decides: it is in the "
                           f"stage key); unset {SERVING_ENV}")
    os.environ[SERVING_ENV] = SERVING_VALUE[serving]
    if serving == "multiprocess":
        # the engine core is a child process; fork cannot carry a CUDA context the stage may already hold
        os.environ.setdefault("VLLM_WORKER_MULTIPROC_METHOD", "spawn")
    os.environ.setdefault("VLLM_USE_FLASHINFER_SAMPLER", "0")
    os.environ.setdefault("VLLM_CACHE_ROOT", str(compile_cache_dir()))  # a value set by the user wins
    flag = os.environ.get("VLLM_BATCH_INVARIANT", "0") not in ("", "0")
    if invariant and not flag:
        if "vllm" in sys.modules:
            raise RuntimeError(f"config '{config}': batch-invariant mode needs VLLM_BATCH_INVARIANT=1 before vLLM is "
                               f"imported, and this process imported vLLM without it; run the stage in a fresh "
                               f"process (its own notebook kernel)")
        os.environ["VLLM_BATCH_INVARIANT"] = "1"
    elif not invariant and flag:
        raise RuntimeError(f"config '{config}': VLLM_BATCH_INVARIANT=1 is set in this process, but this stage "
                           f"measures the stock engine; unset it (only the batch-invariant stage sets it)")


def engine_identity(params, invariant: bool = False) -> dict:
    """Everything a vLLM engine is built with (the LLM's arguments and the environment vLLM reads at
    start): stages whose identities are equal can share one engine (replaylib.runtime.engine_service)."""
    return {"engine": "vllm", "model": params.model, "dtype": params.dtype, "device": params.device,
            "serving": params.vllm_serving, "batch_invariant": invariant,
            "attention_backend": (params.invariant_attention_backend if invariant else params.attention_backend)
            or "default", "enforce_eager": bool(params.enforce_eager and not invariant),
            "gpu_memory_utilization": params.gpu_memory_utilization, "max_model_len": params.max_model_len,
            "kv_cache_gib": params.kv_cache_gib}


def memory_need(params, model_dir: str) -> tuple[int, str]:
    """What an engine with a fixed KV cache needs of the GPU (weights, cache, headroom) in bytes, and the sum
    in words."""
    from . import gpu_memory
    weights = gpu_memory.weights_bytes(model_dir, params.dtype)
    headroom = gpu_memory.headroom_bytes(model_dir, params.vllm_headroom_gib)
    needed = weights + int(params.kv_cache_gib * gpu_memory.GIB) + headroom
    return needed, (f"weights {weights / gpu_memory.GIB:.1f} GiB + KV cache {params.kv_cache_gib:g} GiB + headroom "
                    f"{headroom / gpu_memory.GIB:.1f} GiB")


def engine_need(params) -> int | None:
    """memory_need for these parameters' model; None where it cannot be told here (a cache sized by profiling, a
    model not set up)."""
    if not params.kv_cache_gib:
        return None
    from .models import resolve_model
    try:
        return memory_need(params, resolve_model(params.model))[0]
    except (OSError, ValueError, RuntimeError):
        return None


def memory_share(params, model_dir: str, mem_get_info=None) -> float:
    """The share of the card an engine with a fixed KV cache asks vLLM for: what it needs (weights, cache,
    headroom), once that much is free (replaylib.measure.gpu_memory), never a share sized for an idle card."""
    from . import gpu_memory
    needed, what = memory_need(params, model_dir)
    _, total = gpu_memory.wait_for_memory(needed, params.config, params.vllm_memory_wait_s, what, mem_get_info)
    return gpu_memory.share_of_card(needed, total)


def trunk_settings(params) -> dict:
    """The trunks' sampling settings, which problem_state's regeneration must repeat."""
    return {"temperature": params.temperature, "top_p": params.top_p, "max_new_tokens": params.max_trunk_tokens,
            "top_logprobs": params.top_logprobs}


def compile_cache_dir():
    """vLLM's cache root (torch.compile artefacts, CUDA-graph-ready code) under the run directory, so
    that later stages and reruns start warm (docs/gpu-h200.md)."""
    from ..core.paths import out_root
    return out_root() / "runs" / ".vllm-cache"


class NoLifecycle:
    """An engine's start and stop with nothing around them: no process is looked for, registered or
    waited for. The run layer passes one that is (replaylib.runtime.vllm_processes.EngineProcesses)."""

    def start(self, build, config: str, exclusive: bool) -> tuple:
        """build() starts the LLM; returns (LLM, its engine-core processes, their registry files).
        exclusive: the start measures the free GPU memory (no other start or stop may run meanwhile)."""
        return build(), [], []

    def stop(self, shutdown, config: str, processes: list, registered: list, timeout_s: float) -> list:
        """shutdown() stops the LLM; returns the engine-core processes that exited with it."""
        shutdown()
        return []
