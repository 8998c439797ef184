"""Where the transformers engine's decode stops being reproducible: a diagnostic.

    python docs/gpu-h200/scripts/hf_determinism.py OUT_DIR [--model PATH_OR_SPEC] [--device cuda] [--budget-s 400]
    python docs/gpu-h200/scripts/hf_determinism.py OUT_DIR --model tiny:0 --device cpu --budget-s 120  # the script's own check

Writes OUT_DIR/determinism.json (every number) and OUT_DIR/determinism.txt (a summary of it).
Both are rewritten after every measurement, so a run cut short leaves what it measured; the
JSON's "status" says whether the run completed. No new measurement starts when it would not
end within --budget-s seconds of wall time (model loads included); what was left out is listed
under "skipped". Defaults: the embedded model (embedded:qwen2.5-coder-0.5b-instruct), cuda.

What it measures, in this order:

1. Localisation ("localisation"). R prompts of different lengths are left-padded into one batch
   by the engine's own prefill (HFEngine._prefill), then decoded greedily for N steps by the
   engine's own forward call (HFEngine._forward: DynamicCache, growing attention mask, per-row
   positions), all in the model's dtype. Per setting ("variant"), in one process:
     run A decodes freely; run B is fed run A's tokens, so that every forward of B has the
     inputs of the same forward of A. Forward hooks on every module (embedding, rotary
     embedding, per decoder layer: norms, q/k/v projections, the attention core output (the
     input of o_proj), o_proj, the attention module, MLP projections and activation, the input
     of down_proj, the MLP, the layer; final norm, lm_head) record a 64-bit fingerprint of each
     batch row of each output. The report gives the first forward where A and B differ
     (forward 0 is the prefill, forward n the n-th decode step), the first module there in
     execution order, its rows, and per differing row where it first differs.
     runs C and D do the same without hooks (only the logits are compared): the answer without
     instrumentation, and the variant's decode tokens/s.
   Variants: default (SDPA, as the engine runs); SDPA restricted to math, flash, efficient,
   cuDNN (torch.nn.attention.sdpa_kernel); the default on equal-length rows (no padding, no
   mask: the case flash can serve; the flash variant runs on these rows); eager attention; the
   default again after all of these (a warm process), its run A also compared with the first
   default's run A.
   In fresh processes (environment set before CUDA starts): the default settings again, fed
   this process's run-A tokens and compared with its fingerprints (the cross-process
   comparison); torch.use_deterministic_algorithms(True) with
   CUBLAS_WORKSPACE_CONFIG=:4096:8; the same with torch.utils.deterministic.
   fill_uninitialized_memory off (deterministic mode fills new tensors with NaN or the largest
   integer: if only the filled variant is reproducible, something reads uninitialized memory).
   Also: the sampler ("sampler": the engine's choose_tokens twice on the same logits and
   uniforms, and once on a CPU copy) and the kernels the default settings run ("kernels":
   torch.profiler's SDPA operators and GPU kernels of one prefill and one decode step).

2. Batch shape ("batch_shape"). One row decoded alone, then in batches of other sizes, with
   other rows, at another index, left-padded, and with rows leaving the batch mid-way (the
   engine's compaction: DynamicCache.batch_select_indices); every batch is fed the alone run's
   tokens for that row. A difference here is not nondeterminism, but it gives the same symptom
   whenever the batch a row runs in changes between runs.

3. End to end ("end_to_end"), through the package's own code: an HFEngine samples trunks
   (sampling.sample_batch), pivots are mined (the pivot-mining module's mine) and made into jobs
   (replay.build_jobs) with the replay stage's PassSettings (replay.settings); run_pass then
   runs exact1, exact1 again and exact2 on the same jobs, per problem as the replay stage does.
   Per setting (the default, then each in-process variant of part 1 that came out reproducible
   on padded rows, then deterministic mode in a fresh process if part 1 found it
   reproducible): the pivots whose continuations are equal between the two exact1 runs and
   between exact1 and exact2, probes, first-token logprobs, tokens/s.

4. Environment ("environment"): versions, GPU, the SDPA and matmul flags.

Reading the output: "equal" means bitwise equal (fingerprints of the bits, logprobs compared as
exact floats); "DIFFER" gives where. On a CPU every comparison of part 1 and part 3 is expected
to come out equal. Batch-shape differences (part 2) can occur on any device (they do on a CPU);
they matter only where a row's batch changes between runs.
"""
from __future__ import annotations

import time

_T0 = time.monotonic()  # the budget counts from here, imports included

import argparse
import contextlib
import hashlib
import importlib
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import traceback
import warnings
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
if (ROOT / "replaylib" / "__init__.py").is_file():
    sys.path.insert(0, str(ROOT))  # this checkout's package, before any installed copy

import numpy as np
import pandas as pd
import torch

import replaylib  # noqa: E402  (this checkout's package, as above)
from replaylib.measure import data as data_mod  # noqa: E402
from replaylib.measure import engine_hf, models, replay, sampling  # noqa: E402
from replaylib.measure import mining as pivot_stage  # noqa: E402
from replaylib.runtime import params as params_mod  # noqa: E402

PACKAGE = Path(replaylib.__file__).resolve().parent


DEFAULT_MODEL = "embedded:qwen2.5-coder-0.5b-instruct"
RESERVE_S = 8.0  # kept for the final write
HARD_STOP_S = 5.0  # past the budget, an alarm interrupts whatever runs
CUBLAS = ":4096:8"

# Part 1, in this process. rows: "padded" (prompts of their own lengths) or "equal" (cut to one length)
VARIANTS = [
    {"name": "default", "rows": "padded"},
    {"name": "sdpa_math", "backend": "MATH", "rows": "padded"},
    {"name": "sdpa_efficient", "backend": "EFFICIENT_ATTENTION", "rows": "padded", "cuda_only": True},
    {"name": "sdpa_cudnn", "backend": "CUDNN_ATTENTION", "rows": "padded", "cuda_only": True},
    {"name": "sdpa_flash", "backend": "FLASH_ATTENTION", "rows": "equal",
     "note": "flash takes no attention mask: equal-length rows (no padding)"},
    {"name": "default_equal_rows", "rows": "equal"},
    {"name": "eager", "attn": "eager", "rows": "padded"},
    {"name": "default_again", "rows": "padded",
     "note": "the default after all the others (warm); its run A also compared with default's run A"},
]
# Part 1, each in a fresh process; reference: whose run-A tokens it is fed and compared with
PROCESS_VARIANTS = [
    {"name": "default_new_process", "rows": "padded", "reference": "default",
     "note": "the default settings in a fresh process: differences from the reference are cross-process"},
    {"name": "deterministic", "rows": "padded", "deterministic": True, "fill": True,
     "env": {"CUBLAS_WORKSPACE_CONFIG": CUBLAS}, "reference": "default",
     "note": "versus the default settings: a difference shows deterministic mode changes the arithmetic"},
    {"name": "deterministic_nofill", "rows": "padded", "deterministic": True, "fill": False,
     "env": {"CUBLAS_WORKSPACE_CONFIG": CUBLAS}, "reference": "deterministic",
     "note": "versus deterministic (another fresh process; only uninitialized memory is left unfilled)"},
]
# Part 3: passes run on the same jobs, and the pairs compared
E2E_PASSES = [("exact1", "exact1"), ("exact1_again", "exact1"), ("exact2", "exact2")]
E2E_PAIRS = [("exact1", "exact1_again"), ("exact1", "exact2")]


def e2e_overrides(spec: str, device: str, small: bool) -> dict:
    """Parameters of the end-to-end part: params/gpu-embedded-hf.yaml scaled to the budget (2 problems,
    K 2, 128-token continuations); small: the tiny CPU check's size."""
    base = {"config": "hf-determinism", "model": spec, "engine": "hf", "device": device, "dtype": "bfloat16",
            "task": "gsm8k", "problem_start": 0, "n_problems": 2, "screen_mixed": False, "n_rollouts": 8,
            "max_trunk_tokens": 384, "block_size": 16, "boundary_slack": 2, "max_pivots_per_rollout": 3,
            "min_rollout_tokens": 16, "pivot_window": 0, "k": 2, "max_cont_tokens": 128, "probe_tokens": 32,
            "stop_at_answer": False, "passes": ["exact1", "exact2", "refeed"], "verify_regeneration": False,
            "max_batch_rows": 320}
    if small:
        base.update({"n_rollouts": 4, "max_trunk_tokens": 48, "block_size": 1, "min_rollout_tokens": 8,
                     "max_cont_tokens": 12, "probe_tokens": 6, "max_batch_rows": 64})
    return base


# ============================================================================ small helpers
def elapsed() -> float:
    return time.monotonic() - _T0


def sync(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def one_line(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}".strip().splitlines()
    return text[0][:300] if text else type(exc).__name__


def error_record(exc: BaseException) -> dict:
    return {"error": one_line(exc), "traceback": traceback.format_exc()[-3000:]}


def atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def sha256_of(path) -> str | None:
    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()
    except OSError:
        return None


def first_index(mask) -> int | None:
    """The first True of a 1-D bool tensor, or None."""
    nz = torch.nonzero(mask).flatten()
    return int(nz[0]) if len(nz) else None


class BudgetExceeded(BaseException):
    """The budget's alarm or SIGTERM: a BaseException, so that no per-measurement handler keeps going."""


class Budget:
    """The run's wall-time budget: a measurement starts only if its estimate fits."""

    def __init__(self, seconds: float, report: "Report"):
        self.seconds, self.report = seconds, report

    def left(self) -> float:
        return self.seconds - RESERVE_S - elapsed()

    def allow(self, estimate_s: float, what: str) -> bool:
        if estimate_s <= self.left():
            return True
        self.report.skip(what, f"estimated {estimate_s:.0f} s, {max(self.left(), 0):.0f} s of budget left")
        return False


# ============================================================================ fingerprints and hooks
class Fingerprint:
    """64-bit fingerprints of a tensor's bits, per batch row: sum over the row of its elements'
    bit patterns (bf16 as int16, fp32 as int32) times fixed odd weights, mod 2**64. Integer sums
    do not depend on reduction order, and one differing element always changes the sum (an odd
    weight times a nonzero difference below 2**33 is not 0 mod 2**64)."""

    def __init__(self):
        self._weights = {}

    def _w(self, n: int, device) -> torch.Tensor:
        key = (n, str(device))
        if key not in self._weights:
            idx = np.arange(n, dtype=np.uint64)
            w = idx * np.uint64(0x9E3779B97F4A7C15) + np.uint64(0xD1B54A32D192ED03)
            w ^= w >> np.uint64(29)
            w |= np.uint64(1)
            self._weights[key] = torch.from_numpy(w.view(np.int64)).to(device)
        return self._weights[key]

    def rows(self, t: torch.Tensor, batch: int | None = None) -> torch.Tensor:
        """[batch] int64 on t's device; a tensor without that batch dimension gets one fingerprint, repeated."""
        t = t.detach()
        as_int = {torch.bfloat16: torch.int16, torch.float16: torch.int16, torch.float32: torch.int32,
                  torch.float64: torch.int64}.get(t.dtype)
        x = t.contiguous()
        x = x.view(as_int) if as_int is not None else x
        if t.dim() >= 1 and (batch is None or t.shape[0] == batch):
            x = x.reshape(t.shape[0], -1).to(torch.int64)
            return (x * self._w(x.shape[1], x.device)).sum(dim=1)
        x = x.reshape(1, -1).to(torch.int64)
        return (x * self._w(x.shape[1], x.device)).sum(dim=1).expand(batch or 1)


def first_tensor(value):
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, (tuple, list)):
        for item in value:
            if isinstance(item, torch.Tensor):
                return item
    return None


class Recorder:
    """Forward hooks that fingerprint every module's output, per batch row and forward call.

    Hooked: every leaf module (embedding, rotary embedding, norms, projections, activation,
    lm_head), every decoder layer, attention and MLP module, and the inputs of o_proj (the
    attention core's output) and down_proj. The fingerprints stay on the device until the run
    ends (no synchronisation inside the forward)."""

    def __init__(self, model, fp: Fingerprint):
        self.fp, self.handles, self.forwards, self.current, self.batch = fp, [], [], None, None
        for name, module in model.named_modules():
            if not name:
                continue
            leaf = next(module.children(), None) is None
            composite = type(module).__name__.endswith(("DecoderLayer", "Attention", "MLP"))
            if name.endswith(("o_proj", "down_proj")):
                self.handles.append(module.register_forward_pre_hook(self._pre_hook(name + ":input")))
            if leaf or composite:
                self.handles.append(module.register_forward_hook(self._hook(name)))

    def _record(self, name, value):
        if self.current is None:
            return
        t = first_tensor(value)
        if t is not None and t.dim() > 0:
            self.current.append((name, self.fp.rows(t, self.batch)))

    def _hook(self, name):
        return lambda module, args, output: self._record(name, output)

    def _pre_hook(self, name):
        return lambda module, args: self._record(name, args)

    def begin(self, batch: int):
        self.current, self.batch = [], batch

    def end(self):
        self.forwards.append(self.current)
        self.current = None

    def close(self):
        for h in self.handles:
            h.remove()
        self.handles = []

    def result(self):
        """(module names in execution order, fingerprints [forwards, modules, rows] on the CPU)."""
        names = [n for n, _ in self.forwards[0]]
        if any([n for n, _ in f] != names for f in self.forwards):
            raise RuntimeError("the hooked modules differ between forward calls")
        return names, torch.stack([torch.stack([v for _, v in f]) for f in self.forwards]).cpu()


# ============================================================================ one decode run
@torch.inference_mode()
def decode_run(engine, seqs, steps, forced=None, hooks=False, store_logits=False, ref_logits=None,
               drop=None, watch=None, watch_ref=None, fp=None):
    """Prefill seqs (left-padded) and run `steps` greedy decode steps, as the engine's _decode does.

    forced: [steps, rows] token ids fed at each step instead of the run's own greedy choice (-1: own)
    hooks: fingerprint every module's output (Recorder)
    store_logits: keep every forward's logits (for magnitudes of later differences)
    ref_logits: another run's kept logits: record max |difference| per forward and row
    drop: (forward, slots): after that forward only those batch slots stay (the engine's compaction)
    watch: one original row to follow through drops: its fingerprints and logits per forward
    """
    fp = fp or Fingerprint()
    dev, n = engine.device, len(seqs)
    recorder = Recorder(engine.model, fp) if hooks else None
    slots = list(range(n))
    out = {"fps": [], "chosen": [], "fed": [], "kept": [], "dmax": [], "watch_fp": [], "watch_logits": [],
           "watch_dmax": []}

    def full(x):  # per original row (rows that left the batch: 0)
        if len(slots) == n:
            return x
        y = torch.zeros(n, dtype=x.dtype, device=x.device)
        y[torch.tensor(slots, device=x.device)] = x
        return y

    try:
        sync(dev)
        t0 = time.perf_counter()
        if recorder:
            recorder.begin(n)
        logits, cache, mask, pads = engine._prefill(seqs)
        if recorder:
            recorder.end()
        sync(dev)
        t1 = time.perf_counter()
        pos = torch.tensor([len(s) for s in seqs])
        for f in range(steps + 1):
            own = logits.argmax(dim=-1)
            out["chosen"].append(full(own))
            out["fps"].append(full(fp.rows(logits)))
            if store_logits:
                out["kept"].append(logits.to(engine.model.dtype) if engine.model.dtype != torch.float32 else logits)
            if ref_logits is not None and f < len(ref_logits):
                out["dmax"].append((logits - ref_logits[f].float()).abs().amax(dim=-1))
            if watch is not None and watch in slots:
                row = logits[slots.index(watch)]
                out["watch_fp"].append(fp.rows(row[None])[0])
                out["watch_logits"].append(row.clone())
                if watch_ref is not None:
                    out["watch_dmax"].append((row - watch_ref[f]).abs().amax())
            if f == steps:
                break
            feed = own
            if forced is not None:
                fc = forced[f, slots].to(dev)
                feed = torch.where(fc >= 0, fc, own)
            out["fed"].append(full(feed))
            if drop is not None and drop[0] == f:
                sel = torch.tensor(drop[1])
                cache.batch_select_indices(sel.to(dev))
                mask = None if mask is None else mask[sel]
                slots = [slots[j] for j in drop[1]]
                feed, pos = feed[sel.to(dev)], pos[sel]
            if mask is not None:
                mask = torch.cat([mask, torch.ones(len(slots), 1, dtype=mask.dtype)], dim=1)
            if recorder:
                recorder.begin(len(slots))
            logits, cache = engine._forward(feed[:, None], pos[:, None], cache, mask)
            if recorder:
                recorder.end()
            pos = pos + 1
        sync(dev)
        t2 = time.perf_counter()
        res = {"prefill_s": t1 - t0, "decode_s": t2 - t1, "steps": steps, "rows": n, "pads": pads,
               "logit_fps": torch.stack(out["fps"]).cpu(), "chosen": torch.stack(out["chosen"]).cpu(),
               "fed": torch.stack(out["fed"]).cpu() if out["fed"] else torch.zeros(0, n, dtype=torch.long),
               "kept": out["kept"] or None,
               "dmax": torch.stack(out["dmax"]).float().cpu() if out["dmax"] else None,
               "watch_fp": torch.stack(out["watch_fp"]).cpu() if out["watch_fp"] else None,
               "watch_logits": out["watch_logits"] or None,
               "watch_dmax": torch.stack(out["watch_dmax"]).float().cpu() if out["watch_dmax"] else None}
        res["decode_tokens_per_s"] = n * steps / res["decode_s"] if steps and res["decode_s"] > 0 else None
        if recorder:
            res["names"], res["module_fps"] = recorder.result()
        return res
    finally:
        if recorder:
            recorder.close()


def compare_runs(a, b, pads, forced=True) -> dict:
    """Where two decode runs differ. forced: b was fed a's tokens (same inputs at every forward)."""
    n_f = min(len(a["logit_fps"]), len(b["logit_fps"]))
    res = {"forwards": n_f}
    if not forced:  # inputs are the same only until the fed tokens part
        fed = (a["fed"][: n_f - 1] != b["fed"][: n_f - 1]).any(dim=1)
        s = first_index(fed)
        res["inputs_equal_until_forward"] = n_f - 1 if s is None else s  # forward s+1 gets a different token
        n_f = n_f if s is None else s + 1
        res["forwards_compared"] = n_f
    lf = a["logit_fps"][:n_f] != b["logit_fps"][:n_f]
    f0 = first_index(lf.any(dim=1))
    res["logits"] = {"forwards_differing": int(lf.any(dim=1).sum()), "row_forwards_differing": int(lf.sum()),
                     "first_forward": f0,
                     "first_rows": [] if f0 is None else torch.nonzero(lf[f0]).flatten().tolist()[:32]}
    flips = a["chosen"][:n_f] != b["chosen"][:n_f]
    res["greedy_flips"] = int(flips.sum())
    res["first_flip_forward"] = first_index(flips.any(dim=1))
    if b.get("dmax") is not None:
        res["max_abs_logit_diff"] = float(b["dmax"][:n_f].max())
    equal = f0 is None and res["greedy_flips"] == 0
    if a.get("module_fps") is not None and b.get("module_fps") is not None:
        if a["names"] != b["names"]:
            res["modules"] = {"error": "the two runs hooked different modules"}
            equal = False
        else:
            names = a["names"]
            d = a["module_fps"][:n_f] != b["module_fps"][:n_f]  # [forwards, modules, rows]
            per_fm = d.any(dim=2)
            m_res = {"modules_hooked": len(names), "entries": int(per_fm.numel()),
                     "entries_differing": int(per_fm.sum()), "forwards_differing": int(per_fm.any(dim=1).sum())}
            fm0 = first_index(per_fm.any(dim=1))
            if fm0 is not None:
                m0 = first_index(per_fm[fm0])
                rows = torch.nonzero(d[fm0, m0]).flatten().tolist()
                m_res.update({"first_forward": fm0, "first_module": names[m0],
                              "first_rows": rows[:32], "first_rows_pads": [int(pads[r]) for r in rows[:32]],
                              "modules_differing_at_first_forward": [names[m] for m in
                                                                     torch.nonzero(per_fm[fm0]).flatten().tolist()][:12]})
                per_row = []  # where each differing row first differs (a later start is a new origin)
                for r in torch.nonzero(d.any(dim=0).any(dim=0)).flatten().tolist()[:16]:
                    fr = first_index(d[:, :, r].any(dim=1))
                    per_row.append({"row": r, "pad": int(pads[r]), "forward": fr,
                                    "module": names[first_index(d[fr, :, r])]})
                m_res["first_difference_per_row"] = per_row
                m_res["rows_differing"] = int(d.any(dim=0).any(dim=0).sum())
            res["modules"] = m_res
            equal = equal and fm0 is None
    res["equal"] = bool(equal)
    return res


# ============================================================================ settings
def set_attention(model, impl: str) -> None:
    try:
        model.set_attn_implementation(impl)
    except (AttributeError, TypeError):
        for m in model.modules():
            if hasattr(m, "config"):
                m.config._attn_implementation = impl


@contextlib.contextmanager
def applied(engine, variant: dict):
    """The variant's attention settings around a block (in this process)."""
    with contextlib.ExitStack() as stack:
        if variant.get("backend"):
            from torch.nn.attention import SDPBackend, sdpa_kernel
            stack.enter_context(sdpa_kernel([getattr(SDPBackend, variant["backend"])]))
        if variant.get("attn"):
            before = engine.model.config._attn_implementation
            set_attention(engine.model, variant["attn"])
            stack.callback(set_attention, engine.model, before)
        yield


def describe_variant(v: dict) -> dict:
    return {k: v[k] for k in ("backend", "attn", "rows", "deterministic", "fill", "env", "note", "reference")
            if k in v}


# ============================================================================ part 1
def measure_variant(engine, variant, seqs, steps, store_cap_bytes) -> tuple[dict, dict]:
    """Runs A, B (hooks; B fed A's tokens) and C, D (no hooks; D fed C's tokens). Returns the
    result and run A (the reference other processes are fed)."""
    res = {"settings": describe_variant(variant), "rows": len(seqs), "steps": steps,
           "lengths": [min(map(len, seqs)), max(map(len, seqs))]}
    vocab = engine.model.config.vocab_size
    store = len(seqs) * vocab * 2 * (steps + 1) <= store_cap_bytes
    res["logit_magnitudes"] = store
    started = time.perf_counter()
    fp = Fingerprint()
    with applied(engine, variant):
        a = decode_run(engine, seqs, steps, hooks=True, store_logits=store, fp=fp)
        pads = a["pads"]
        b = decode_run(engine, seqs, steps, forced=a["fed"], hooks=True, ref_logits=a["kept"], fp=fp)
        res["hooked"] = compare_runs(a, b, pads)
        c = decode_run(engine, seqs, steps, fp=fp)
        d = decode_run(engine, seqs, steps, forced=c["fed"], fp=fp)
        res["hook_free"] = compare_runs(c, d, pads)
        res["attention_in_effect"] = engine.model.config._attn_implementation
        try:  # which attention operators ran (the profiler's CPU side names the SDPA backend)
            ops = profile_kernels(engine, seqs, gpu=False)
            res["sdpa_ops"] = {call: k["sdpa_ops"] for call, k in ops.items()}
        except Exception as exc:  # noqa: BLE001
            res["sdpa_ops"] = error_record(exc)
    res["hooked_vs_hook_free"] = compare_runs(a, c, pads, forced=False)
    res["reproducible"] = res["hooked"]["equal"] and res["hook_free"]["equal"]
    res["decode_tokens_per_s"] = c["decode_tokens_per_s"]
    res["prefill_s"], res["decode_s"] = c["prefill_s"], c["decode_s"]
    res["seconds"] = time.perf_counter() - started
    return res, a


def sampler_test(engine, logits_sets, reps=2) -> dict:
    """choose_tokens (the engine's sampler) on identical logits and uniforms: repeated, and on a CPU copy."""
    choose, uniform = engine_hf.choose_tokens, engine_hf.position_uniform
    cases = {"t0.7_p0.95": (0.7, 0.95, False), "t0.7_p0.95_half_greedy": (0.7, 0.95, True),
             "t2.0_p0.99_wide_nucleus": (2.0, 0.99, False)}
    res = {"calls": 0, "rows": 0, "repeat_equal_rows": 0, "repeat_rows": 0, "cpu_equal_rows": 0, "cpu_rows": 0,
           "cases": {}}
    started = time.perf_counter()
    for i, logits in enumerate(logits_sets):
        logits = logits.float()
        n = logits.shape[0]
        for case, (t, p, half) in cases.items():
            temps = [0.0 if half and b % 2 else t for b in range(n)]
            tops = [p] * n
            us = [uniform(1000 + b, 100 + i + b) for b in range(n)]
            first = choose(logits, temps, tops, us)
            c = res["cases"].setdefault(case, {"repeat_equal": 0, "repeat_rows": 0, "cpu_equal": 0, "cpu_rows": 0})
            for _ in range(reps):
                again = choose(logits, temps, tops, us)
                eq = sum(x == y for x, y in zip(first, again))
                c["repeat_equal"] += eq
                c["repeat_rows"] += n
                res["calls"] += 1
            if logits.device.type != "cpu" and p < 0.99:  # (the wide nucleus sorts the vocabulary: slow on a CPU)
                on_cpu = choose(logits.cpu(), temps, tops, us)
                c["cpu_equal"] += sum(x == y for x, y in zip(first, on_cpu))
                c["cpu_rows"] += n
            res["rows"] += n
    for c in res["cases"].values():
        res["repeat_equal_rows"] += c["repeat_equal"]
        res["repeat_rows"] += c["repeat_rows"]
        res["cpu_equal_rows"] += c["cpu_equal"]
        res["cpu_rows"] += c["cpu_rows"]
    res["reproducible"] = res["repeat_equal_rows"] == res["repeat_rows"]
    res["seconds"] = time.perf_counter() - started
    return res


SDPA_OP_WORDS = ("scaled_dot_product", "efficient_attention", "flash_attention", "cudnn_attention",
                 "attention_math", "fmha", "flash", "softmax")
GEMM_WORDS = ("gemm", "xmma", "cutlass", "cublas", "sm90", "sm80", "matmul", "addmm", "aten::mm", "aten::bmm",
              "aten::linear")


@torch.inference_mode()
def profile_kernels(engine, seqs, gpu=True) -> dict:
    """torch.profiler's SDPA operators and GPU kernels of one prefill and one decode step."""
    from torch.profiler import ProfilerActivity, profile
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if gpu and engine.device.type == "cuda" else [])
    out = {}

    def summary(prof):
        ops, kernels = {}, {}
        for ev in prof.events():
            name = ev.name
            is_gpu = str(getattr(ev, "device_type", "")).endswith("CUDA")
            low = name.lower()
            if is_gpu:
                if any(w in low for w in SDPA_OP_WORDS + GEMM_WORDS) or "attn" in low:
                    kernels[name[:160]] = kernels.get(name[:160], 0) + 1
            elif name.startswith("aten::") and any(w in low for w in SDPA_OP_WORDS + GEMM_WORDS):
                ops[name] = ops.get(name, 0) + 1
        sdpa = sorted({k for k in ops if "scaled_dot_product" in k or "attention" in k}) or sorted(
            {k for k in ops if k in ("aten::softmax", "aten::_softmax", "aten::matmul", "aten::bmm")})  # eager
        return {"sdpa_ops": sdpa, "aten_ops": dict(sorted(ops.items())),
                "gpu_kernels": dict(sorted(kernels.items(), key=lambda kv: -kv[1])[:40])}

    with profile(activities=acts) as prof:
        logits, cache, mask, _ = engine._prefill(seqs)
        sync(engine.device)
    out["prefill"] = summary(prof)
    feed = logits.argmax(dim=-1)[:, None]
    pos = torch.tensor([[len(s)] for s in seqs])
    if mask is not None:
        mask = torch.cat([mask, torch.ones(len(seqs), 1, dtype=mask.dtype)], dim=1)
    with profile(activities=acts) as prof:
        engine._forward(feed, pos, cache, mask)
        sync(engine.device)
    out["decode_step"] = summary(prof)
    return out


# ============================================================================ part 2
def batch_shape(engine, seqs, steps, target_index=0) -> dict:
    """One row (seqs[target_index]) alone and in other batches, fed the alone run's tokens for it."""
    n = len(seqs)
    t = seqs[target_index]
    others = [s for i, s in enumerate(seqs) if i != target_index]
    shorter = [s for s in others if len(s) < len(t)]
    longer = [s for s in others if len(s) > len(t)]
    mid = min(len(others), 7)
    configs = [("alone (replica)", [t], 0, None)]
    if shorter:
        configs.append(("with 1 shorter row (target unpadded)", [t, shorter[0]], 0, None))
    if longer:
        configs.append(("with 1 longer row (target left-padded)", [longer[0], t], 1, None))
    configs += [(f"{mid + 1} rows, target first", [t] + others[:mid], 0, None),
                (f"{mid + 1} rows, target last", others[:mid] + [t], mid, None),
                (f"{mid + 1} rows, other rows", [t] + others[-mid:], 0, None)]
    if len(others) >= 2 * mid:
        configs.append((f"{2 * mid + 1} rows", [t] + others[:2 * mid], 0, None))
    if n > 2 * mid + 1:
        configs.append((f"{n} rows", [t] + others, 0, None))
    configs.append((f"{mid + 1} rows, all but the target leave after forward {steps // 3}", [t] + others[:mid], 0,
                    (steps // 3, [0])))
    configs.append((f"{mid + 1} rows, half leave after forward {steps // 3}", [t] + others[:mid], 0,
                    (steps // 3, list(range(0, mid + 1, 2)))))
    fp = Fingerprint()
    alone = decode_run(engine, [t], steps, watch=0, fp=fp)
    ref_tokens = alone["fed"][:, 0]
    ref_logits = alone["watch_logits"]
    res = {"target_length": len(t), "steps": steps, "reference": "the target row alone (batch of 1)",
           "alone_decode_tokens_per_s": alone["decode_tokens_per_s"], "configs": []}
    for label, batch, idx, drop in configs:
        forced = torch.full((steps, len(batch)), -1, dtype=torch.long)
        forced[:, idx] = ref_tokens
        try:
            run = decode_run(engine, batch, steps, forced=forced, drop=drop, watch=idx, watch_ref=ref_logits, fp=fp)
            diff = run["watch_fp"] != alone["watch_fp"]
            flips = run["chosen"][:, idx] != alone["chosen"][:, 0]
            res["configs"].append({
                "config": label, "rows": len(batch), "target_index": idx, "target_pad": int(run["pads"][idx]),
                "drop": drop, "equal_to_alone": not bool(diff.any()), "first_differing_forward": first_index(diff),
                "forwards_differing": int(diff.sum()), "forwards": int(diff.numel()),
                "max_abs_logit_diff": float(run["watch_dmax"].max()), "greedy_flips": int(flips.sum()),
                "decode_tokens_per_s": run["decode_tokens_per_s"]})
        except Exception as exc:  # noqa: BLE001 - recorded, the next configuration still runs
            res["configs"].append({"config": label, **error_record(exc)})
    return res


# ============================================================================ part 3
def e2e_setup(engine, overrides: dict, n_pivots: int) -> dict:
    """Trunks, pivots, jobs and PassSettings by the stages' own code, on this engine."""
    params = params_mod.make(overrides)
    problems = data_mod.load_problems(params.task)
    batch = [(pid, problems[pid].question, problems[pid].gold)
             for pid in range(params.problem_start, params.problem_start + params.n_problems)]
    started = time.perf_counter()
    sampled, state = sampling.sample_batch(engine, params, batch)
    sync(engine.device)
    sample_s = time.perf_counter() - started
    rows = [sampling.trunk_row(t, kept=True, text=text, correct=ok) for got in sampled.values()
            for t, text, ok in zip(got["trunks"], got["texts"], got["correct"])]
    trunks = pd.DataFrame(rows)
    pivots = pivot_stage.mine(trunks, params, set(engine.special_ids)).head(n_pivots)
    jobs = {int(pid): replay.build_jobs(group, trunks[trunks.problem_id == pid], params.k)
            for pid, group in pivots.groupby("problem_id", sort=False)}
    tokens = [[int(x) for x in g] for g in trunks.gen_ids]
    return {"params": params, "cfg": replay.settings(params), "state": state, "jobs": jobs,
            "info": {"problems": len(batch), "trunks": len(trunks), "trunk_tokens": sum(map(len, tokens)),
                     "trunk_digest": hashlib.sha256(json.dumps(tokens).encode()).hexdigest()[:16],
                     "pivots": int(len(pivots)), "sample_s": round(sample_s, 2),
                     "sample_tokens_per_s": round(sum(map(len, tokens)) / sample_s, 1) if sample_s else None,
                     "pass_settings": {k: getattr(replay.settings(params), k) for k in
                                       ("k", "temperature", "top_p", "max_tokens", "probe_tokens", "stop_at_answer")},
                     "parameters": {k: overrides[k] for k in sorted(overrides)}}}


def compare_passes(a: dict, b: dict) -> dict:
    """Per pivot: continuations, probes and the probes' first-token logprobs, equal or not."""
    res = {"pivots": 0, "continuations_equal": 0, "continuations_differing": 0, "continuations": 0,
           "probes_equal": 0, "first_logprob_bit_exact": 0, "first_token_divergence": []}
    for pid, x in a.items():
        y = b[pid]
        res["pivots"] += 1
        res["continuations_equal"] += x.continuations == y.continuations
        res["probes_equal"] += x.probe_ids == y.probe_ids
        res["first_logprob_bit_exact"] += x.probe_first_logprob == y.probe_first_logprob
        for arm in x.continuations:
            for c1, c2 in zip(x.continuations[arm], y.continuations[arm]):
                res["continuations"] += 1
                if c1 != c2:
                    res["continuations_differing"] += 1
                    at = next((i for i, (u, v) in enumerate(zip(c1, c2)) if u != v), min(len(c1), len(c2)))
                    res["first_token_divergence"].append(at)
    div = sorted(res["first_token_divergence"])
    res["first_token_divergence"] = {"n": len(div), "min": div[0] if div else None,
                                     "median": div[len(div) // 2] if div else None, "first_20": div[:20]}
    return res


def e2e_setting(engine, setup: dict, variant: dict, budget: Budget | None, report_cb=None) -> dict:
    """exact1, exact1 again and exact2 on the same jobs under one setting; the pairs compared."""
    res = {"settings": describe_variant(variant), "passes": {}}
    outs, last = {}, None
    for label, name in E2E_PASSES:
        if budget is not None and last is not None and not budget.allow(1.3 * last, f"end_to_end {variant['name']} {label}"):
            res["stopped"] = f"budget: before {label}"
            break
        started = time.perf_counter()
        got, tokens = {}, 0
        with applied(engine, variant):
            for pid, jobs in setup["jobs"].items():
                for o in engine.run_pass(jobs, name, setup["cfg"], setup["state"][pid]):
                    got[o.pivot_id] = o
                    tokens += sum(len(c) for cs in o.continuations.values() for c in cs)
                    tokens += sum(len(p) for p in o.probe_ids.values())
        sync(engine.device)
        last = time.perf_counter() - started
        outs[label] = got
        res["passes"][label] = {"seconds": round(last, 2), "tokens": tokens,
                                "tokens_per_s": round(tokens / last, 1) if last else None,
                                "state_ok": sum(bool(o.resume.state_ok) for o in got.values())}
        if report_cb:
            report_cb(res)
    for x, y in E2E_PAIRS:
        if x in outs and y in outs:
            res[f"{x}_vs_{y}"] = compare_passes(outs[x], outs[y])
    return res


# ============================================================================ environment
def environment(engine=None) -> dict:
    import transformers
    env = {"python": sys.version.split()[0], "torch": torch.__version__, "transformers": transformers.__version__,
           "numpy": np.__version__, "cuda_runtime": torch.version.cuda, "platform": platform.platform(),
           "torch_threads": torch.get_num_threads(), "replaylib": str(Path(replaylib.__file__).parent),
           "replaylib_modules": {m.__name__: sha256_of(m.__file__)[:16] for m in
                                 (engine_hf, models, params_mod, data_mod, sampling, pivot_stage, replay)},
           "engine_hf_module": engine_hf.__name__, "engine_hf_sha256": sha256_of(engine_hf.__file__),
           "script_sha256": sha256_of(__file__),
           "CUBLAS_WORKSPACE_CONFIG": os.environ.get("CUBLAS_WORKSPACE_CONFIG"),
           "deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
           "deterministic_warn_only": torch.is_deterministic_algorithms_warn_only_enabled(),
           "fill_uninitialized_memory": getattr(torch.utils.deterministic, "fill_uninitialized_memory", None),
           "matmul_allow_tf32": torch.backends.cuda.matmul.allow_tf32,
           "matmul_allow_bf16_reduced_precision_reduction":
               getattr(torch.backends.cuda.matmul, "allow_bf16_reduced_precision_reduction", None),
           "cudnn_allow_tf32": torch.backends.cudnn.allow_tf32}
    try:  # a COMMIT file beside the code names it where the tree was copied without its history
        env["git_commit"] = ((ROOT / "COMMIT").read_text().strip() if (ROOT / "COMMIT").is_file() else
                             subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True,
                                            text=True, timeout=5).stdout.strip() or None)
    except (OSError, subprocess.SubprocessError):
        env["git_commit"] = None
    sdp = {}
    for key, fn in (("flash", "flash_sdp_enabled"), ("mem_efficient", "mem_efficient_sdp_enabled"),
                    ("math", "math_sdp_enabled"), ("cudnn", "cudnn_sdp_enabled")):
        if hasattr(torch.backends.cuda, fn):
            sdp[key] = getattr(torch.backends.cuda, fn)()
    env["sdp_enabled"] = sdp
    if torch.cuda.is_available():
        i = torch.cuda.current_device()
        prop = torch.cuda.get_device_properties(i)
        env.update({"gpu": torch.cuda.get_device_name(i), "gpu_capability": list(torch.cuda.get_device_capability(i)),
                    "gpu_memory_gib": round(prop.total_memory / 2**30, 1),
                    "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None})
        try:
            env["nvidia_smi"] = subprocess.run(
                ["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
                capture_output=True, text=True, timeout=10).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            env["nvidia_smi"] = None
    if engine is not None:
        env["engine"] = engine.describe()
        env["model_dtype"] = str(engine.model.dtype)
    return env


# ============================================================================ report
class Report:
    """determinism.json and determinism.txt, rewritten (atomically) after every measurement."""

    def __init__(self, out_dir: Path, args):
        self.out_dir = out_dir
        self.data = {"script": "docs/gpu-h200/scripts/hf_determinism.py",
                     "started": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                     "arguments": {k: v for k, v in vars(args).items() if k != "worker"},
                     "status": "running", "elapsed_s": 0.0, "skipped": [], "errors": [], "notes": []}

    def skip(self, what: str, why: str):
        self.data["skipped"].append({"what": what, "why": why})
        self.save()

    def error(self, what: str, exc: BaseException):
        self.data["errors"].append({"what": what, **error_record(exc)})
        self.save()

    def save(self):
        self.data["elapsed_s"] = round(elapsed(), 1)
        atomic_write(self.out_dir / "determinism.json", json.dumps(self.data, indent=1, default=str) + "\n")
        try:
            text = render(self.data)
        except Exception as exc:  # noqa: BLE001 - the JSON is the record; the summary must not lose it
            text = f"(summary failed: {one_line(exc)}; see determinism.json)\n"
        atomic_write(self.out_dir / "determinism.txt", text)


def fmt_cmp(c: dict | None) -> str:
    if not c:
        return "-"
    if c.get("equal"):
        return "equal"
    m = c.get("modules") or {}
    if m.get("first_module"):
        return f"DIFFER at forward {m['first_forward']}"
    lg = c.get("logits", {})
    if lg.get("first_forward") is not None:
        return f"DIFFER at forward {lg['first_forward']}"
    return "DIFFER"


def cmp_details(c: dict) -> list[str]:
    out = []
    m = c.get("modules") or {}
    if m.get("first_module"):
        out.append(f"first: forward {m['first_forward']}, module {m['first_module']}, rows {m['first_rows']} "
                   f"(left pads {m['first_rows_pads']}); {m['entries_differing']} of {m['entries']} "
                   f"(forward, module) entries differ, {m['rows_differing']} rows")
        out.append(f"modules differing at that forward: {', '.join(m['modules_differing_at_first_forward'])}")
        starts = {}
        for r in m["first_difference_per_row"]:
            starts.setdefault((r["forward"], r["module"]), []).append(r["row"])
        out.append("where each differing row starts: " + "; ".join(
            f"forward {f} {mod} rows {rows}" for (f, mod), rows in sorted(starts.items())))
    lg = c.get("logits", {})
    if lg.get("first_forward") is not None:
        mag = f", max |dlogit| {c['max_abs_logit_diff']:.4g}" if "max_abs_logit_diff" in c else ""
        out.append(f"logits differ at {lg['forwards_differing']} of {c.get('forwards_compared', c['forwards'])} "
                   f"forwards ({lg['row_forwards_differing']} row-forwards), first at forward {lg['first_forward']} "
                   f"rows {lg['first_rows'][:12]}{mag}; greedy token flips {c['greedy_flips']}")
    return out


def render(d: dict) -> str:
    L = []
    env = d.get("environment", {})
    args = d.get("arguments", {})
    L.append("hf_determinism: is replaylib's transformers engine reproducible run to run, and where not")
    L.append(f"model {args.get('model')} on {args.get('device')}"
             + (f" ({env['gpu']})" if env.get("gpu") else "")
             + f"; torch {env.get('torch')} (CUDA {env.get('cuda_runtime')}), transformers {env.get('transformers')}")
    L.append(f"status: {d['status']}; {d['elapsed_s']} s of a {args.get('budget_s')} s budget; started {d['started']}")
    L.append("'equal' = bitwise equal; forward 0 = the prefill, forward n = decode step n")

    loc = d.get("localisation")
    if loc:
        s = loc.get("setup", {})
        L += ["", f"1. LOCALISATION: {s.get('rows')} rows (prompt lengths {s.get('lengths')}, left-padded), "
                  f"prefill + {s.get('steps')} greedy decode steps; B is fed A's tokens, D is fed C's",
              f"   {'variant':<22} {'hooked A vs B':<24} {'no hooks C vs D':<24} {'decode tok/s':>12}  note"]
        variants = loc.get("variants", {})
        for name, v in variants.items():
            if "skipped" in v:
                L.append(f"   {name:<22} skipped: {v['skipped']}")
            elif "error" in v and "hooked" not in v:
                L.append(f"   {name:<22} ERROR: {v['error'][:150]}")
            else:
                tps = v.get("decode_tokens_per_s")
                note = v.get("settings", {}).get("note", "")
                L.append(f"   {name:<22} {fmt_cmp(v.get('hooked')):<24} {fmt_cmp(v.get('hook_free')):<24} "
                         f"{tps if tps is None else round(tps):>12}  {note}")
                ops = v.get("sdpa_ops") or {}
                if ops and "error" not in ops:
                    L.append(f"   {'':<22} attention {v.get('attention_in_effect')}, ops: prefill "
                             f"{ops.get('prefill')}, decode {ops.get('decode_step')}")
                if v.get("warn_only"):
                    L.append(f"   {'':<22} strict deterministic mode failed ({v['strict_error'][:120]}); "
                             f"ran with warn_only: {len(v.get('warnings', []))} distinct warnings")
        for name, v in variants.items():
            for key in ("hooked", "hook_free"):
                c = v.get(key)
                if c and not c.get("equal"):
                    L.append(f"   {name}, {key}:")
                    L += [f"     {line}" for line in cmp_details(c)]
            c = v.get("versus_default_run_a")
            if c:
                L.append(f"   {name}, run A vs default's run A (same settings, earlier in this process): {fmt_cmp(c)}")
                L += [f"     {line}" for line in cmp_details(c)]
            c = v.get("hooked_vs_hook_free")
            if c and not c.get("equal") and v.get("reproducible"):
                L.append(f"   {name}, hooked A vs hook-free C (same settings): {fmt_cmp(c)}; hooks change the arithmetic")
        cross = loc.get("cross_process", {})
        if cross:
            L.append("   cross-process: a fresh process fed the reference run's tokens, fingerprints compared")
            for name, c in cross.items():
                if "error" in c and "equal" not in c:
                    L.append(f"   {name}: ERROR {c['error'][:150]}")
                    continue
                L.append(f"   {name} vs {c.get('reference')}: {fmt_cmp(c)}  ({c.get('note', '')})")
                if not c.get("equal"):
                    L += [f"     {line}" for line in cmp_details(c)]
        sm = loc.get("sampler")
        if sm:
            if "error" in sm:
                L.append(f"   sampler: ERROR {sm['error'][:150]}")
            else:
                L.append(f"   sampler (choose_tokens twice on the same logits and uniforms): "
                         f"{sm['repeat_equal_rows']}/{sm['repeat_rows']} rows equal"
                         + (f"; on a CPU copy of the logits {sm['cpu_equal_rows']}/{sm['cpu_rows']} equal "
                            f"(not required)" if sm.get("cpu_rows") else ""))
        kern = loc.get("kernels")
        if kern:
            for rows, per in kern.items():
                if "error" in per:
                    L.append(f"   kernels, {rows} rows: ERROR {per['error'][:150]}")
                    continue
                for call, k in per.items():
                    g = list(k.get("gpu_kernels", {}))
                    attn = [x for x in g if any(w in x.lower() for w in ("attn", "attention", "fmha", "flash"))]
                    L.append(f"   kernels, default settings, {rows} rows, {call}: SDPA ops {k.get('sdpa_ops')}"
                             + (f"; attention kernels {attn[:3]}" if attn else ""))

    bs = d.get("batch_shape")
    if bs:
        L += ["", f"2. BATCH SHAPE: one row (length {bs.get('target_length')}) in other batches, fed its alone-run "
                  f"tokens; compared with the row alone, {bs.get('steps')} steps"]
        if "error" in bs and "configs" not in bs:
            L.append(f"   ERROR {bs['error'][:150]}")
        for c in bs.get("configs", []):
            if "error" in c:
                L.append(f"   {c['config']:<52} ERROR {c['error'][:100]}")
                continue
            verdict = "equal" if c["equal_to_alone"] else (f"DIFFER from forward {c['first_differing_forward']} "
                                                           f"({c['forwards_differing']}/{c['forwards']} forwards)")
            L.append(f"   {c['config']:<52} pad {c['target_pad']:>3}  {verdict:<36} max |dlogit| "
                     f"{c['max_abs_logit_diff']:.3g}, greedy flips {c['greedy_flips']}")

    e2e = d.get("end_to_end")
    if e2e:
        info = e2e.get("setup", {})
        L += ["", "3. END TO END (HFEngine.run_pass on the stages' jobs): pivots whose continuations are equal"]
        if "error" in info:
            L.append(f"   setup ERROR {info['error'][:150]}")
        elif info:
            ps = info.get("pass_settings", {})
            L.append(f"   {info.get('problems')} problems, {info.get('trunks')} trunks ({info.get('trunk_tokens')} "
                     f"tokens, {info.get('sample_tokens_per_s')} tok/s), {info.get('pivots')} pivots; K {ps.get('k')}, "
                     f"T {ps.get('temperature')}, top-p {ps.get('top_p')}, {ps.get('max_tokens')} tokens, "
                     f"probe {ps.get('probe_tokens')}")
        L.append(f"   {'setting':<22} {'exact1 vs exact1 again':<26} {'exact1 vs exact2':<26} "
                 f"{'probes (again)':<15} {'1st logprob (again)':<20} tok/s")
        for name, s in e2e.get("settings", {}).items():
            if "error" in s and "passes" not in s:
                L.append(f"   {name:<22} ERROR {s['error'][:150]}")
                continue
            a, b = s.get("exact1_vs_exact1_again"), s.get("exact1_vs_exact2")

            def frac(c, key="continuations_equal"):
                return f"{c[key]}/{c['pivots']}" if c else "-"
            tps = [p.get("tokens_per_s") for p in s.get("passes", {}).values()]
            L.append(f"   {name:<22} {frac(a):<26} {frac(b):<26} {frac(a, 'probes_equal'):<15} "
                     f"{frac(a, 'first_logprob_bit_exact'):<20} {tps}")
            for key, c in (("again", a), ("exact2", b)):
                if c and c["continuations_differing"]:
                    ftd = c["first_token_divergence"]
                    L.append(f"     vs {key}: {c['continuations_differing']}/{c['continuations']} continuations differ; "
                             f"first differing token index min {ftd['min']}, median {ftd['median']}")
            if s.get("stopped"):
                L.append(f"     stopped: {s['stopped']}")
            if s.get("trunk_digest"):
                L.append(f"     trunks in that process: digest {s['trunk_digest']} "
                         f"({'same' if s['trunk_digest'] == info.get('trunk_digest') else 'NOT the same'} as this "
                         f"process's trunks)")

    if env:
        L += ["", "4. ENVIRONMENT"]
        for k in ("python", "torch", "cuda_runtime", "cudnn", "transformers", "gpu", "gpu_capability", "nvidia_smi",
                  "platform", "torch_threads", "git_commit", "replaylib_modules", "engine_hf_module", "engine_hf_sha256", "replaylib",
                  "sdp_enabled", "matmul_allow_tf32", "matmul_allow_bf16_reduced_precision_reduction",
                  "CUBLAS_WORKSPACE_CONFIG", "deterministic_algorithms", "engine"):
            if k in env:
                L.append(f"   {k}: {env[k]}")
    if d.get("notes"):
        L += ["", "NOTES"] + [f"   {n}" for n in d["notes"]]
    if d.get("skipped"):
        L += ["", "SKIPPED"] + [f"   {s['what']}: {s['why']}" for s in d["skipped"]]
    if d.get("errors"):
        L += ["", "ERRORS"] + [f"   {e['what']}: {e['error']}" for e in d["errors"]]
    return "\n".join(L) + "\n"


# ============================================================================ fresh processes
def run_worker(task: dict, scratch: Path, timeout_s: float, env_extra: dict) -> dict:
    """Run this script as a worker in a fresh process; its result file is read even after a timeout."""
    name = task["name"]
    task_path, result_path, log_path = (scratch / f"{name}.task.json", scratch / f"{name}.result.json",
                                        scratch / f"{name}.log")
    task = {**task, "result": str(result_path), "budget_s": max(timeout_s - 2, 1)}
    task_path.write_text(json.dumps(task))
    env = {**os.environ, **env_extra}
    started = time.monotonic()
    with open(log_path, "w") as log:
        proc = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--worker", str(task_path)],
                                stdout=log, stderr=subprocess.STDOUT, env=env, cwd=str(ROOT))
        try:
            rc = proc.wait(timeout=max(timeout_s, 1))
        except subprocess.TimeoutExpired:
            rc = "timeout"
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    try:
        result = json.loads(result_path.read_text())
    except (OSError, ValueError):
        result = {}
    result.update({"process_seconds": round(time.monotonic() - started, 1), "returncode": rc})
    if rc != 0:
        result["log_tail"] = log_path.read_text()[-3000:] if log_path.exists() else ""
        result.setdefault("error", f"worker exited with {rc}")
    return result


def worker_main(task_path: str) -> int:
    """A fresh process: set deterministic mode as asked (before CUDA starts), load the model, then
    run part 1's default-settings variant (A, B, C, D and the reference comparison) and/or part 3."""
    task = json.loads(Path(task_path).read_text())
    out = {"name": task["name"], "pid": os.getpid()}
    result_path = Path(task["result"])
    deadline = time.monotonic() + task["budget_s"]

    def save():
        atomic_write(result_path, json.dumps(out, indent=1, default=str))
    try:
        if task.get("deterministic"):
            torch.use_deterministic_algorithms(True)
            torch.utils.deterministic.fill_uninitialized_memory = bool(task.get("fill", True))
        engine = engine_hf.HFEngine(task["model_path"], task["device"], "bfloat16",
                                    max_batch_rows=task.get("max_batch_rows", 128))
        out["environment"] = environment(engine)
        out["model_load_s"] = round(elapsed(), 1)
        save()
        variant = {"name": task["name"], **{k: task[k] for k in ("rows", "note", "reference", "deterministic",
                                                                  "fill") if k in task}}

        def strict_or_warn(fn):
            """fn(); in deterministic mode, an operation without a deterministic implementation raises: that
            error is recorded (it names the operation) and fn runs again with warn_only, its warnings kept."""
            try:
                return fn(), {}
            except RuntimeError as exc:
                if not (task.get("deterministic") and "deterministic" in str(exc)):
                    raise
                strict = one_line(exc)
                torch.use_deterministic_algorithms(True, warn_only=True)
                with warnings.catch_warnings(record=True) as caught:
                    warnings.simplefilter("always")
                    res = fn()
                return res, {"strict_error": strict, "warn_only": True,
                             "warnings": sorted({str(w.message)[:300] for w in caught})[:20]}

        if "seqs" in task:
            seqs, steps = task["seqs"], task["steps"]

            def part1():
                res, a = measure_variant(engine, variant, seqs, steps, task["store_cap_bytes"])
                torch.save({k: a[k] for k in ("fed", "logit_fps", "chosen", "names", "module_fps")}, task["save_run"])
                return res
            res, fallback = strict_or_warn(part1)
            out["variant"] = {**res, **fallback}
            save()
            if task.get("reference_run") and time.monotonic() < deadline:
                ref = torch.load(task["reference_run"])
                run = decode_run(engine, seqs, steps, forced=ref["fed"], hooks=True)
                cmp = compare_runs(ref, run, run["pads"])
                out["cross_process"] = {**cmp, "reference": task.get("reference"), "note": task.get("note", "")}
                save()
        if "e2e" in task and time.monotonic() < deadline:
            setup, fallback = strict_or_warn(lambda: e2e_setup(engine, task["e2e"]["overrides"], task["e2e"]["pivots"]))
            out["e2e_setup"] = {**setup["info"], **fallback}
            save()
            res, fallback = strict_or_warn(lambda: e2e_setting(engine, setup, variant, None,
                                                               report_cb=lambda r: (out.update({"e2e": r}), save())))
            out["e2e"] = {**res, **fallback, "trunk_digest": setup["info"]["trunk_digest"]}
        out["done"] = True
    except BaseException as exc:  # noqa: BLE001 - recorded for the parent
        out.update(error_record(exc))
        save()
        return 1
    save()
    return 0


# ============================================================================ the run
def prompts(engine, n: int) -> list[list[int]]:
    """n chat prompts (GSM8K test questions with the boxed instruction), of their own lengths."""
    instruction = params_mod.Params().instruction
    problems = data_mod.load_problems("gsm8k")
    return [engine.prompt_ids(p.question, instruction) for p in problems[:n]]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out_dir", nargs="?")
    ap.add_argument("--model", default=DEFAULT_MODEL, help="a model spec (embedded:NAME, tiny:SEED) or a directory")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--budget-s", type=float, default=400.0, help="wall-time budget, model loads included")
    ap.add_argument("--rows", type=int, default=None, help="part 1 batch rows (default: 128 on cuda, 4 on cpu)")
    ap.add_argument("--steps", type=int, default=None, help="part 1 and 2 decode steps (default: 64 on cuda, 8 on cpu)")
    ap.add_argument("--pivots", type=int, default=None, help="part 3 pivots at most (default: 32 on cuda, 8 on cpu)")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        return worker_main(args.worker)
    if not args.out_dir:
        ap.error("OUT_DIR is required")
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    cuda = args.device.startswith("cuda")
    args.rows = args.rows or (128 if cuda else 4)
    args.steps = args.steps or (64 if cuda else 8)
    args.pivots = args.pivots or (32 if cuda else 8)
    report = Report(out_dir, args)
    budget = Budget(args.budget_s, report)
    scratch = Path(tempfile.mkdtemp(prefix="hf_determinism-"))

    def hard_stop(signum, frame):
        why = "the budget ran out mid-measurement" if signum == getattr(signal, "SIGALRM", None) else "SIGTERM"
        raise BudgetExceeded(f"{why}, at {elapsed():.0f} s")
    signal.signal(signal.SIGTERM, hard_stop)
    if hasattr(signal, "SIGALRM"):
        signal.signal(signal.SIGALRM, hard_stop)
        signal.alarm(max(1, int(args.budget_s + HARD_STOP_S - elapsed())))
    try:
        run(args, report, budget, scratch, cuda)
        report.data["status"] = "complete" + (" (some measurements skipped for the budget)"
                                              if report.data["skipped"] else "")
    except BudgetExceeded as exc:
        report.data["status"] = f"stopped: {exc}"
    except BaseException as exc:  # noqa: BLE001 - the partial results are written below
        report.error("run", exc)
        report.data["status"] = f"stopped by an error: {one_line(exc)}"
    finally:
        if hasattr(signal, "SIGALRM"):
            signal.alarm(0)
        report.save()
        shutil.rmtree(scratch, ignore_errors=True)
    print((out_dir / "determinism.txt").read_text())
    return 0


def run(args, report: Report, budget: Budget, scratch: Path, cuda: bool) -> None:
    data = report.data
    model_path = models.resolve_model(args.model)
    if cuda and not torch.cuda.is_available():
        raise RuntimeError(f"--device {args.device}: this machine has no CUDA GPU (use --device cpu)")
    engine = engine_hf.HFEngine(model_path, args.device, "bfloat16", max_batch_rows=320 if cuda else 64)
    data["model_load_s"] = round(elapsed(), 1)
    data["environment"] = environment(engine)
    report.save()
    store_cap = (16 << 30) if cuda else (512 << 20)

    # ---- part 1: localisation
    pool = prompts(engine, max(args.rows, 16))
    padded = pool[:args.rows]
    cut = min(map(len, padded))
    equal = [s[-cut:] for s in padded]
    loc = data["localisation"] = {"setup": {"rows": len(padded), "steps": args.steps,
                                            "lengths": [min(map(len, padded)), max(map(len, padded))],
                                            "equal_rows_length": cut}, "variants": {}, "cross_process": {}}
    runs_a, estimate = {}, None
    for v in VARIANTS:
        name = v["name"]
        if v.get("cuda_only") and not cuda:
            loc["variants"][name] = {"settings": describe_variant(v), "skipped": "needs CUDA (not available here)"}
            report.save()
            continue
        if estimate is not None and not budget.allow(1.3 * estimate, f"localisation {name}"):
            continue
        try:
            res, a = measure_variant(engine, v, padded if v["rows"] == "padded" else equal, args.steps, store_cap)
            estimate = res["seconds"] if estimate is None else max(estimate, res["seconds"])
            if name == "default_again" and "default" in runs_a:  # the same settings, later in the process
                res["versus_default_run_a"] = compare_runs(torch.load(runs_a["default"]), a, a["pads"], forced=False)
            loc["variants"][name] = res
            if name == "default":
                # the sampler on three of run A's logits (prefill, middle, last decode step)
                if a["kept"]:
                    try:
                        picks = sorted({0, len(a["kept"]) // 2, len(a["kept"]) - 1})
                        loc["sampler"] = sampler_test(engine, [a["kept"][i] for i in picks])
                    except Exception as exc:  # noqa: BLE001
                        loc["sampler"] = error_record(exc)
                else:
                    report.data["notes"].append("sampler test skipped: run A's logits were not kept (memory cap)")
                path = scratch / "default.run.pt"
                torch.save({k: a[k] for k in ("fed", "logit_fps", "chosen", "names", "module_fps")}, path)
                runs_a[name] = path
            del a
        except Exception as exc:  # noqa: BLE001 - recorded; the next variant still runs
            loc["variants"][name] = {"settings": describe_variant(v), **error_record(exc)}
        report.save()

    worker_estimate = None
    for v in PROCESS_VARIANTS:
        name = v["name"]
        guess = worker_estimate or ((estimate or 10) + (40 if cuda else 15))
        if not budget.allow(guess, f"localisation {name} (fresh process)"):
            continue
        ref = runs_a.get(v["reference"])
        save_run = scratch / f"{name}.run.pt"
        task = {"name": name, "model_path": model_path, "device": args.device, "seqs": padded, "steps": args.steps,
                "store_cap_bytes": store_cap, "save_run": str(save_run),
                "reference_run": str(ref) if ref else None, **{k: v[k] for k in v if k not in ("env",)}}
        res = run_worker(task, scratch, min(budget.left(), 3 * guess), v.get("env", {}))
        worker_estimate = max(worker_estimate or 0, res.get("process_seconds", 0))
        if save_run.exists():
            runs_a[name] = save_run
        variant = res.get("variant") or {"settings": describe_variant(v), "error": res.get("error", "no result"),
                                         "log_tail": res.get("log_tail")}
        variant.update({k: res[k] for k in ("process_seconds", "returncode", "model_load_s", "log_tail") if k in res})
        if "environment" in res:
            variant["environment_flags"] = {k: res["environment"].get(k) for k in
                                            ("CUBLAS_WORKSPACE_CONFIG", "deterministic_algorithms",
                                             "deterministic_warn_only", "fill_uninitialized_memory")}
        loc["variants"][name] = variant
        if res.get("cross_process"):
            loc["cross_process"][name] = res["cross_process"]
        elif ref is None:
            loc["cross_process"][name] = {"error": f"no reference run ({v['reference']} did not finish)"}
        report.save()

    # the kernels the default settings run, for the shapes above
    if budget.allow(10 if cuda else 5, "kernels (profiler)"):
        loc["kernels"] = {}
        for label, seqs in (("padded", padded), ("equal-length", equal)):
            try:
                loc["kernels"][label] = profile_kernels(engine, seqs)
            except Exception as exc:  # noqa: BLE001
                loc["kernels"][label] = error_record(exc)
            report.save()

    # ---- part 2: batch shape
    shape_estimate = 12 * (estimate or 10) / 4  # about a dozen runs, each a quarter of a variant's four
    if budget.allow(shape_estimate, "batch_shape"):
        try:
            lengths = [len(s) for s in pool]
            target = sorted(range(len(pool)), key=lambda i: lengths[i])[len(pool) // 2]  # a middle length
            data["batch_shape"] = batch_shape(engine, pool, args.steps, target)
        except Exception as exc:  # noqa: BLE001
            data["batch_shape"] = error_record(exc)
        report.save()

    # ---- part 3: end to end
    e2e = data["end_to_end"] = {"settings": {}}
    overrides = e2e_overrides(args.model, args.device, small=not cuda)
    if not budget.allow(60 if cuda else 10, "end_to_end (trunks and a first pass)"):
        return
    try:
        setup = e2e_setup(engine, overrides, args.pivots)
        e2e["setup"] = setup["info"]
    except Exception as exc:  # noqa: BLE001
        e2e["setup"] = error_record(exc)
        report.save()
        return
    report.save()
    variants = {v["name"]: v for v in VARIANTS}
    found = loc["variants"]
    candidates = ["default"] + [n for n in ("sdpa_math", "sdpa_efficient", "sdpa_cudnn", "eager")
                                if found.get(n, {}).get("reproducible") and n in variants]
    e2e["candidates"] = candidates
    setting_estimate = None
    for name in candidates:
        if setting_estimate is not None and not budget.allow(1.2 * setting_estimate, f"end_to_end {name}"):
            continue
        started = time.perf_counter()

        def progress(partial, name=name):
            e2e["settings"][name] = partial
            report.save()
        try:
            e2e["settings"][name] = e2e_setting(engine, setup, variants[name], budget, progress)
        except Exception as exc:  # noqa: BLE001
            e2e["settings"][name] = error_record(exc)
        setting_estimate = max(setting_estimate or 0, time.perf_counter() - started)
        report.save()
    # deterministic mode end to end, in a fresh process, if part 1 found it reproducible
    det = found.get("deterministic", {})
    if det.get("reproducible"):
        guess = (worker_estimate or 40) + (setting_estimate or 60) + setup["info"]["sample_s"]
        if budget.allow(guess, "end_to_end deterministic (fresh process)"):
            v = next(p for p in PROCESS_VARIANTS if p["name"] == "deterministic")
            task = {"name": "deterministic_e2e", "model_path": model_path, "device": args.device,
                    "deterministic": True, "fill": True, "max_batch_rows": overrides["max_batch_rows"],
                    "e2e": {"overrides": overrides, "pivots": args.pivots}}
            res = run_worker(task, scratch, min(budget.left(), 2 * guess), v["env"])
            s = res.get("e2e") or {"error": res.get("error", "no result")}
            s.update({k: res[k] for k in ("process_seconds", "returncode", "e2e_setup", "log_tail") if k in res})
            s["settings"] = describe_variant(v)
            if "e2e_setup" in res:
                s["trunk_digest"] = res["e2e_setup"]["trunk_digest"]
            e2e["settings"]["deterministic_process"] = s
            report.save()
    elif "deterministic" in found:
        report.data["notes"].append("end_to_end in deterministic mode not run: part 1 did not find it reproducible")


if __name__ == "__main__":
    sys.exit(main())
