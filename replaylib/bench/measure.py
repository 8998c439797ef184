"""Measuring a benchmark phase: wall-clock splits, peak memory, decode traffic against the memory
bandwidth bound, and the report table (replaylib.bench)."""
from __future__ import annotations

import os
import resource
import time
from dataclasses import dataclass
from pathlib import Path

import torch


def weight_bytes_per_step(config: dict, itemsize: int = 2) -> int:
    """Bytes of weights one decode step reads (every parameter once; the input embedding table is
    a lookup, so it counts only when it is tied to the output layer), from a Qwen2 config."""
    h, inter, layers = config["hidden_size"], config["intermediate_size"], config["num_hidden_layers"]
    heads, kv_heads, vocab = config["num_attention_heads"], config["num_key_value_heads"], config["vocab_size"]
    head_dim = config.get("head_dim") or h // heads
    q, kv = heads * head_dim, kv_heads * head_dim
    per_layer = (h * q + q) + 2 * (h * kv + kv) + q * h + 3 * h * inter + 2 * h  # qkv (+bias), o, mlp, 2 norms
    return itemsize * (layers * per_layer + h + vocab * h)  # final norm, output layer


def kv_bytes_per_token(config: dict, itemsize: int = 2) -> int:
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    return 2 * config["num_hidden_layers"] * config["num_key_value_heads"] * head_dim * itemsize


# ---------------------------------------------------------------- measurement helpers
class Clock:
    """Accumulating wall-clock timers; on CUDA every reading is synchronized."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.t: dict[str, float] = {}

    def now(self) -> float:
        if self.cuda:
            torch.cuda.synchronize()
        return time.perf_counter()

    def add(self, key: str, seconds: float):
        self.t[key] = self.t.get(key, 0.0) + seconds

    def wrap(self, obj, name: str, key: str):
        """Time every call of obj.name (an instance attribute shadows the method); returns an undo."""
        orig = getattr(obj, name)

        def timed(*args, **kwargs):
            t0 = self.now()
            try:
                return orig(*args, **kwargs)
            finally:
                self.add(key, self.now() - t0)
        setattr(obj, name, timed)
        return lambda: delattr(obj, name)

class PeakMemory:
    """Peak memory of one phase. CUDA: max_memory_allocated. CPU: the process's peak RSS
    (VmHWM) after resetting it through /proc/self/clear_refs; where that is impossible, the
    process-lifetime peak from getrusage (then labelled so)."""

    def __init__(self, device: torch.device):
        self.device, self.peak_bytes, self.start_bytes, self.label = device, 0, 0, ""

    def __enter__(self):
        if self.device.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            self.start_bytes = torch.cuda.memory_allocated()
            self.label = "GPU max_memory_allocated"
        else:
            self.start_bytes = _proc_status("VmRSS")
            try:
                Path("/proc/self/clear_refs").write_text("5")
                self.label = "CPU peak RSS"
            except OSError:
                self.label = "CPU peak RSS of the process so far"
        return self

    def __exit__(self, *exc):
        if self.device.type == "cuda":
            torch.cuda.synchronize()
            self.peak_bytes = torch.cuda.max_memory_allocated()
        elif self.label == "CPU peak RSS":
            self.peak_bytes = _proc_status("VmHWM")
        else:
            self.peak_bytes = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        return False

def _proc_status(field: str) -> int:
    """A memory field of /proc/self/status in bytes (VmRSS: now, VmHWM: peak); getrusage's peak elsewhere."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024

@dataclass
class PhaseResult:
    name: str
    pivots: int
    requests: int
    tokens: int
    seconds: float
    split: dict
    peak_bytes: int
    start_bytes: int
    peak_label: str
    traffic: "DecodeTraffic | None" = None

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0

    @property
    def pivots_per_min(self) -> float:
        return 60.0 * self.pivots / self.seconds if self.seconds > 0 else 0.0

def generated_tokens(out) -> int:
    """Tokens a pivot's replay generated: its continuations and greedy probes, both arms."""
    return (sum(len(cont) for conts in out.continuations.values() for cont in conts)
            + sum(len(probe) for probe in out.probe_ids.values()))

def speedup(fast: PhaseResult, naive: PhaseResult) -> float:
    """Tokens per second of a phase over the naive baseline's (inf when the baseline timed nothing)."""
    return fast.tokens_per_s / naive.tokens_per_s if naive.tokens_per_s > 0 else float("inf")

# ---------------------------------------------------------------- (a) this package's engine
class DecodeTraffic:
    """Bytes a decode step must read at least: the weights once, and every row's KV context.

    Counted on the engine's own forward calls of one token per row: rows and the cache
    length before the step (left padding included: the attention reads it too)."""

    def __init__(self, model):
        seen, self.weight_bytes = set(), 0
        # the fp32-accumulate linears keep their fp32 weights as plain attributes: those are what a step reads
        copies = [getattr(m, name) for m in model.modules() for name in ("weight32", "bias32")
                  if isinstance(getattr(m, name, None), torch.Tensor)]
        for t in [*model.parameters(), *model.buffers(), *copies]:
            if t.data_ptr() not in seen:
                seen.add(t.data_ptr())
                self.weight_bytes += t.numel() * t.element_size()
        emb, head = model.get_input_embeddings(), model.get_output_embeddings()
        head_weight = getattr(head, "weight", None)
        if head is not None and (head_weight is None or head_weight.data_ptr() != emb.weight.data_ptr()):
            # an untied (or fp32-copied) output layer: the input table is a lookup, not a full read
            self.weight_bytes -= emb.weight.numel() * emb.weight.element_size()
        cfg = model.config
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        kv_dtype = next(model.parameters()).dtype
        itemsize = torch.finfo(kv_dtype).bits // 8 if kv_dtype.is_floating_point else 2
        self.kv_bytes_per_token = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * head_dim * itemsize
        self.steps, self.rows, self.context = 0, 0, 0

    def add_step(self, rows: int, context: int):
        self.steps += 1
        self.rows += rows
        self.context += rows * context

    def bytes_read(self) -> int:
        return self.steps * self.weight_bytes + self.context * self.kv_bytes_per_token

    def ideal_seconds(self, bytes_per_s: float) -> float:
        return self.bytes_read() / bytes_per_s

    def describe(self, measured_s: float, bytes_per_s: float | None, what: str) -> str:
        if not self.steps:
            return f"decode traffic ({what}): no decode steps counted"
        per_step = self.bytes_read() / self.steps
        line = (f"decode traffic ({what}): {self.steps} steps, {self.rows / self.steps:.1f} rows and "
                f"{self.context / max(1, self.rows):.0f} context tokens per row on average; weights "
                f"{self.weight_bytes / 1e9:.3f} GB + KV {self.kv_bytes_per_token / 1024:.1f} KiB per context token "
                f"= {per_step / 1e9:.3f} GB read per step")
        if bytes_per_s:
            ideal = self.ideal_seconds(bytes_per_s)
            line += (f"; at {bytes_per_s / 1e12:.2f} TB/s that is {ideal:.3f} s against {measured_s:.2f} s measured: "
                     f"{100 * ideal / measured_s:.2f}% of the memory-bandwidth bound")
        return line

# ---------------------------------------------------------------- report
def _fmt_split(r: PhaseResult) -> list[str]:
    return [f"{r.split[key]:8.2f} s {100 * r.split[key] / r.seconds if r.seconds else 0:5.1f}%"
            for key in ("prefill", "decode", "grading", "io", "other")]

def _mib(r: PhaseResult) -> str:
    return f"{r.peak_bytes / 2**20:.0f} MiB (+{max(0, r.peak_bytes - r.start_bytes) / 2**20:.0f})"

def report(phases: list[PhaseResult], bytes_per_s: float | None, log=print):
    w = 26
    rows = [("pivots", lambda r: f"{r.pivots}"), ("requests (K+1 per arm)", lambda r: f"{r.requests}"),
            ("generated tokens", lambda r: f"{r.tokens}"), ("wall time", lambda r: f"{r.seconds:.2f} s"),
            ("continuation tokens/s", lambda r: f"{r.tokens_per_s:.2f}"),
            ("pivots/minute", lambda r: f"{r.pivots_per_min:.2f}"), ("peak memory", _mib)]
    log(f"{'':{w}}" + "".join(f" {r.name:>24}" for r in phases))
    for name, cell in rows:
        log(f"{name:{w}}" + "".join(f" {cell(r):>24}" for r in phases))
    splits = [_fmt_split(r) for r in phases]
    for i, key in enumerate(("prefill", "decode", "grading", "I/O", "other")):
        log(f"{'time: ' + key:{w}}" + "".join(f" {s[i]:>24}" for s in splits))
    log(f"peak memory: the {phases[0].peak_label} during each phase, model weights included "
        f"(in brackets: above what was in use when the phase began)")
    for r in phases:
        if r.traffic is not None:
            what = r.name + (": steps estimated as the longest request, a lower bound, so the fraction is too;"
                             " prefill included in the measured time" if "vLLM" in r.name else "")
            log(r.traffic.describe(r.split["decode"], bytes_per_s, what))
    if any("vLLM" in r.name for r in phases):
        log("vLLM: prefill and decode run in one engine call, shown as decode; its continuations run to EOS or "
            "the length limit (no stop at the answer), so it generates more tokens than the other phases")

def _load() -> str:
    """The 1-minute load average: on a shared machine, other work slows both phases."""
    try:
        return f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs"
    except OSError:
        return "load average unknown"
