"""A vLLM engine with a fixed KV cache asks for the memory it needs (weights, cache, headroom) as its share of the
card, and waits a bounded time for it to be free; no GPU here: the memory readings and the vLLM module are
stand-ins."""
import sys
from types import SimpleNamespace

import numpy as np
import pytest
from safetensors.numpy import save_file

from replaylib.measure import engine_vllm, gpu_memory
from replaylib.measure.engine import EngineUnavailable
from replaylib.measure.vllm_setup import memory_share
from replaylib.runtime import params

GIB = 2**30


@pytest.fixture
def model_dir(tmp_path):
    save_file({"a": np.zeros((1000, 300), np.float32), "b": np.zeros(7, np.float32)}, str(tmp_path / "m-1.safetensors"))
    save_file({"c": np.zeros((10, 10), np.float16)}, str(tmp_path / "m-2.safetensors"))
    (tmp_path / "config.json").write_text('{"vocab_size": 49152}')
    return tmp_path


def test_the_headroom_grows_with_the_vocabulary_as_the_engines_on_the_h100_did(model_dir):
    """Lease 14 (an H100, 4 GiB caches): SmolLM2 (49,152 tokens) used 2.0 GiB beyond weights and cache, Gemma 3
    (262,144) 4.8-4.9 GiB: the automatic headroom covers both, and a given one is taken as it is."""
    assert 2.0 * GIB < gpu_memory.headroom_bytes(model_dir) < 2.5 * GIB
    (model_dir / "config.json").write_text('{"text_config": {"vocab_size": 262144}}')
    assert 4.95 * GIB < gpu_memory.headroom_bytes(model_dir) < 5.5 * GIB
    assert gpu_memory.headroom_bytes(model_dir, 3.0) == 3 * GIB
    (model_dir / "config.json").write_text("{}")
    with pytest.raises(EngineUnavailable, match="no vocab_size"):
        gpu_memory.headroom_bytes(model_dir)


class Clock:
    """A clock that moves only when slept on."""

    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now

    def sleep(self, s):
        self.now += s


def test_the_weights_are_counted_from_every_file_and_sized_at_the_engine_s_dtype(model_dir):
    assert gpu_memory.weight_count(model_dir) == 300_000 + 7 + 100
    assert gpu_memory.weights_bytes(model_dir, "bfloat16") == 2 * 300_107
    assert gpu_memory.weights_bytes(model_dir, "float32") == 4 * 300_107
    with pytest.raises(EngineUnavailable, match="no \\*.safetensors"):
        gpu_memory.weight_count(model_dir / "nothing")


def test_the_share_is_what_the_engine_needs_of_this_card_not_a_share_for_an_idle_one(model_dir):
    p = params.make({"engine": "vllm", "config": "c", "stop_at_answer": False, "kv_cache_gib": 4, "vllm_headroom_gib": 2,
                     "gpu_memory_utilization": 0.2})
    needed = 2 * 300_107 + 6 * GIB
    for total in (80 * GIB, 141 * GIB):  # an H100 and an H200: the same bytes, another share
        share = memory_share(p, str(model_dir), lambda: (total, total))
        assert share * total >= needed and (share - 0.001) * total < needed
    with pytest.raises(EngineUnavailable, match="needs 6.0 GiB .* 5.0 GiB in all"):
        gpu_memory.share_of_card(needed, 5 * GIB)


def test_a_start_waits_for_the_memory_it_needs_then_goes_on():
    clock = Clock()
    readings = iter([(1 * GIB, 80 * GIB), (3 * GIB, 80 * GIB), (7 * GIB, 80 * GIB)])
    free, total = gpu_memory.wait_for_memory(6 * GIB, "c", 60, "w", lambda: next(readings), clock, clock.sleep)
    assert (free, total) == (7 * GIB, 80 * GIB) and 0 < clock.now < 60


def test_a_start_that_does_not_fit_refuses_in_one_line_after_its_bound():
    clock = Clock()
    with pytest.raises(EngineUnavailable) as e:
        gpu_memory.wait_for_memory(6 * GIB, "gpu-x", 30, "weights 1.0 GiB + KV cache 4 GiB + headroom 1 GiB",
                                   lambda: (int(0.72 * GIB), 80 * GIB), clock, clock.sleep)
    msg = str(e.value)
    assert "\n" not in msg and clock.now == pytest.approx(30)
    assert "config gpu-x" in msg and "needs 6.0 GiB" in msg and "0.7 GiB of 80.0 are free" in msg
    assert "kv_cache_gib" in msg and "vllm_memory_wait_s" in msg


def test_the_engine_asks_vllm_for_its_share(model_dir, monkeypatch):
    """from_params passes the computed share (not gpu_memory_utilization's 0.9) with the fixed cache."""
    import torch
    asked = {}

    class Stop(Exception):
        pass

    def llm(**kwargs):
        asked.update(kwargs)
        raise Stop

    monkeypatch.setattr(engine_vllm.importlib.util, "find_spec", lambda name: object())
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda: (40 * GIB, 80 * GIB))
    monkeypatch.setitem(sys.modules, "vllm", SimpleNamespace(LLM=llm, SamplingParams=object, __version__="0.22.1"))
    monkeypatch.setattr("replaylib.measure.models.resolve_model", lambda spec: str(model_dir))
    monkeypatch.setattr(engine_vllm, "prepare_environment", lambda *a: None)
    p = params.make({"engine": "vllm", "device": "cuda", "config": "c", "stop_at_answer": False, "kv_cache_gib": 4, "vllm_headroom_gib": 2,
                     "gpu_memory_utilization": 0.9})
    with pytest.raises(Stop):
        engine_vllm.VLLMEngine.from_params(p)
    assert asked["kv_cache_memory_bytes"] == 4 * GIB
    assert asked["gpu_memory_utilization"] == pytest.approx(0.076)  # (0.6 MB + 6 GiB) / 80 GiB, rounded up
    asked.clear()
    with pytest.raises(Stop):  # the automatic headroom: 1.5 GiB + the sampler's buffers (0.66 GiB here)
        engine_vllm.VLLMEngine.from_params(params.make({**p.__dict__, "vllm_headroom_gib": 0}))
    assert asked["gpu_memory_utilization"] == pytest.approx(0.077)  # (0.6 MB + 4 + 1.5 + 0.66 GiB) / 80 GiB
    asked.clear()
    with pytest.raises(Stop):  # no fixed cache: vLLM sizes it from the share, which is the user's
        engine_vllm.VLLMEngine.from_params(params.make({**p.__dict__, "kv_cache_gib": 0}))
    assert asked["gpu_memory_utilization"] == 0.9 and "kv_cache_memory_bytes" not in asked


def test_free_memory_is_read_from_the_driver_for_the_first_visible_gpu(monkeypatch):
    import subprocess
    asked = []

    def run(cmd, **kw):
        asked.append(cmd)
        return subprocess.CompletedProcess(cmd, 0, stdout="2048\n")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,1")
    assert gpu_memory.free_bytes_now(run) == 2 * GIB and asked[0][-2:] == ["-i", "3"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-5d1c")  # a UUID: not an index to ask for
    assert gpu_memory.free_bytes_now(run) is None
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert gpu_memory.free_bytes_now(lambda cmd, **kw: subprocess.CompletedProcess(cmd, 9, stdout="")) is None

    def missing(cmd, **kw):
        raise FileNotFoundError("nvidia-smi")
    assert gpu_memory.free_bytes_now(missing) is None


def test_a_new_engine_counts_the_engines_still_starting_as_taken():
    """room_to_start: the idle engines to stop, least recently used first, for a need that must fit the free
    memory less what the starting engines will take; None where even stopping every idle one would not do; none
    where the free memory or the need is unknown."""
    need = {"a": 2, "b": 3, "s": 4}.get
    assert gpu_memory.room_to_start(5, 10, ["a", "b"], [], need) == []  # fits as it is
    assert gpu_memory.room_to_start(5, 8, ["a", "b"], ["s"], need) == ["a"]  # 8 - 4 = 4, + 2 = 6
    assert gpu_memory.room_to_start(5, 6, ["a", "b"], ["s"], need) == ["a", "b"]  # 6 - 4 = 2, + 2 + 3 = 7
    assert gpu_memory.room_to_start(9, 6, ["a", "b"], ["s"], need) is None  # 7 at most: wait for the start
    assert gpu_memory.room_to_start(None, 6, ["a"], ["s"], need) == []
    assert gpu_memory.room_to_start(5, None, ["a"], ["s"], need) == []
    assert gpu_memory.start_raced("ValueError: Free memory on device cuda:0 (4.29/79.18 GiB) on startup is less "
                                  "than desired GPU memory utilization (0.095, 7.52 GiB).")
    assert not gpu_memory.start_raced("CUDA out of memory. Tried to allocate 1.00 GiB")
