"""What a vLLM engine with a fixed KV cache needs of the GPU, asked for as such, so that it starts beside other
work on one card: its weights at the engine's dtype, its KV cache, and a headroom for what vLLM allocates besides
(the CUDA context, activations of its largest batch, CUDA graphs, the sampler's buffers). vLLM 0.22.1 checks at
start that the free memory covers ``gpu_memory_utilization`` x the card (vllm/v1/worker/utils.py,
request_memory); with ``kv_cache_memory_bytes`` set, that share sizes nothing else. So the engine asks for the
share its need is of the card, and waits a bounded time for that much to be free instead of failing at once."""
from __future__ import annotations

import json
import logging
import math
import os
import subprocess
import time
from pathlib import Path

from safetensors import safe_open

from .engine import EngineUnavailable

log = logging.getLogger("replaylib")
GIB = 2**30
BYTES_OF = {"bfloat16": 2, "float16": 2, "half": 2, "float32": 4, "float": 4}


def weight_count(model_dir: str | Path) -> int:
    """The number of weights in a model directory's safetensors files (read from their headers)."""
    count = 0
    files = sorted(Path(model_dir).glob("*.safetensors"))
    if not files:
        raise EngineUnavailable(f"{model_dir}: no *.safetensors file to size the engine's weights from")
    for path in files:
        with safe_open(path, framework="numpy") as f:
            count += sum(math.prod(f.get_slice(name).get_shape()) for name in f.keys())
    return count


def weights_bytes(model_dir: str | Path, dtype: str) -> int:
    """The weights' bytes at the engine's dtype (a checkpoint's own dtype may differ)."""
    if dtype not in BYTES_OF:
        raise EngineUnavailable(f"dtype {dtype!r}: choose one of {', '.join(BYTES_OF)}")
    return weight_count(model_dir) * BYTES_OF[dtype]


# What a vLLM 0.22.1 engine allocates beyond its weights and KV cache, fitted to lease 14's H100 (engines of a
# 4 GiB cache: SmolLM2-135M, vocabulary 49,152, used 2.0 GiB more; Gemma 3 270M, 262,144, 4.8-4.9 GiB more): a
# fixed part (the CUDA context, activations, CUDA graphs) and the sampler's buffers, which vLLM warms with 1,024
# dummy requests over the whole vocabulary in float32, about 3.5 such buffers at once.
HEADROOM_FIXED_GIB = 1.5
SAMPLER_ROWS, SAMPLER_BUFFERS = 1024, 3.5


def vocab_size(model_dir: str | Path) -> int:
    """The model's vocabulary (its config's, or its text config's for a multimodal one)."""
    config = json.loads((Path(model_dir) / "config.json").read_text())
    size = config.get("vocab_size") or (config.get("text_config") or {}).get("vocab_size")
    if not isinstance(size, int):
        raise EngineUnavailable(f"{model_dir}/config.json: no vocab_size to size the engine's sampler buffers from")
    return size


def headroom_bytes(model_dir: str | Path, headroom_gib: float = 0.0) -> int:
    """What an engine needs beyond weights and cache: headroom_gib where given (above 0), else the fixed part and
    the sampler's buffers for this model's vocabulary."""
    if headroom_gib > 0:
        return int(headroom_gib * GIB)
    return int(HEADROOM_FIXED_GIB * GIB + SAMPLER_BUFFERS * SAMPLER_ROWS * vocab_size(model_dir) * 4)


def share_of_card(needed: int, total: int) -> float:
    """``gpu_memory_utilization`` for a need: its share of the card, rounded up (vLLM rounds the request up)."""
    if needed > total:
        raise EngineUnavailable(f"the engine needs {needed / GIB:.1f} GiB and the GPU has {total / GIB:.1f} GiB in "
                                f"all; lower kv_cache_gib or use a larger GPU")
    return min(1.0, math.ceil(needed / total * 1000) / 1000)


def wait_for_memory(needed: int, config: str, wait_s: float, what: str, mem_get_info=None, clock=time.monotonic,
                    sleep=time.sleep, poll_s: float = 2.0) -> tuple[int, int]:
    """Wait until ``needed`` bytes are free on the GPU, at most ``wait_s`` seconds; returns (free, total).
    Saying once what it waits for; past the bound, one line naming what is free and needed (EngineUnavailable)."""
    if mem_get_info is None:
        import torch
        mem_get_info = torch.cuda.mem_get_info
    deadline, said = clock() + wait_s, False
    while True:
        free, total = mem_get_info()
        if free >= needed:
            return free, total
        if clock() >= deadline:
            raise EngineUnavailable(
                f"config {config}: vLLM needs {needed / GIB:.1f} GiB of GPU memory ({what}) and {free / GIB:.1f} GiB "
                f"of {total / GIB:.1f} are free after waiting {wait_s:g} s; stop other work on the GPU, lower "
                f"kv_cache_gib, or raise vllm_memory_wait_s")
        if not said:
            log.info("config %s: waiting up to %g s for %.1f GiB of GPU memory (%s; %.1f GiB free now)", config,
                     wait_s, needed / GIB, what, free / GIB)
            said = True
        sleep(min(poll_s, max(0.0, deadline - clock())))


def free_bytes_now(run=subprocess.run) -> int | None:
    """The free memory of the GPU this process's CUDA would use first, as the driver reports it (nvidia-smi, so
    that asking makes no CUDA context); None where it cannot say (no NVIDIA driver, a device named by UUID)."""
    first = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0].strip() or "0"
    if not first.isdigit():
        return None
    try:
        out = run(["nvidia-smi", "--query-gpu=memory.free", "--format=csv,noheader,nounits", "-i", first],
                  capture_output=True, text=True, timeout=30)
        return int(out.stdout.strip()) * 2**20 if out.returncode == 0 else None
    except (OSError, ValueError, subprocess.TimeoutExpired):
        return None


def room_to_start(needed: int | None, free: int | None, idle: list, starting: list, need_of) -> list | None:
    """The idle engines to stop, in the order given (least recently used first), until a new engine's ``needed``
    bytes fit the ``free`` ones less what the engines still ``starting`` will take (vLLM checks the free memory as
    it starts, so two starts must not count on the same memory), with what each stopped engine frees
    (``need_of``); None where stopping every idle one would not do (engines starting, busy or stopping hold the
    memory: wait for them); none where either amount is unknown (the start then waits in its own process)."""
    if needed is None or free is None:
        return []
    free -= sum(need_of(engine) or 0 for engine in starting)
    stop = []
    for engine in idle:
        if free >= needed:
            break
        stop.append(engine)
        free += need_of(engine) or 0
    return stop if free >= needed else None


def start_raced(message: str) -> bool:
    """Whether an engine's start failed at vLLM's own check of the free memory ("Free memory on device ... on
    startup is less than desired GPU memory utilization"): another process took it between the wait for it and
    the check, and a later start can pass."""
    return "on startup is less than desired GPU memory utilization" in message
