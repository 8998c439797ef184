"""Benchmark: the replay of a fixed workload, this package's engine against a naive baseline.

    python -m replaylib.bench --device cpu|cuda [--workload small|paper|tiny] [--check-invariant]
                              [--engine hf|vllm] [--bandwidth-tbs 4.8]
    python -m replaylib.bench --device cuda --workload paper7b --engine vllm [--problems N] [--startup-only]

paper7b (main_paper7b) is the paper's scale on vLLM: a random-weight model of Qwen2.5-7B-Instruct's
architecture, the paper-primary request structure with fixed lengths, the replay as stage 03 runs it
against one plain LLM.generate call with the same requests (its last line is
overhead_vs_plain_generate=<ratio>), the engine's start-up, and the projected cost of the paper's
seven configurations. The rest of this text is about the other workloads.

A workload fixes the model, the problems, the trunks (sampled by the engine itself with
the seeds of replaylib.engine.trunk_seed), the pivots (replaylib.pivots.mine with a fixed
Params), K and the lengths. On the same machine, in the same process and on the same
model object (same dtype, same linear kernel) it then replays every pivot's requests
(per arm: K sampled continuations and one greedy probe, prompt = job.prefix_ids(arm)):

  ours   HFEngine.run_pass(jobs, "refeed", ...): the re-feed pass, the apples-to-apples
         comparison with a re-feeding pipeline: both arms prefilled once, K + 1 rows per
         arm decoded in one batch, rows leaving at EOS / answer.
  naive  model.generate(...) one request at a time, as a typical credit pipeline does:
         every request re-feeds its whole prefix (on the slow CPU workload: the requests
         of the first `naive_pivots` pivots; rates are compared, not totals).

Both are graded (replaylib.replay.estimate) and write their records (parquet), and for
both the benchmark prints generated continuation tokens/s (continuations + probes, over
the phase's wall time), pivots/minute, peak memory, and the time split (prefill, decode,
grading, I/O, other). Its last line is

    speedup_vs_naive=<ratio> tokens_per_s=<ours> naive_tokens_per_s=<theirs>

With --check-invariant (default on for the tiny workload) it also loads the engine in
invariant mode and asserts that the fast path (run_pass, which memoizes each arm's
prefill and assembles the rows' KV state) equals a deliberately slow reference (each row
prefilled and decoded alone through _prefill / _decode), record by record: continuation
token ids, probe token ids, probe first-token logprobs (bit for bit). A mismatch exits 1.

The dtype stays what the workload says (bf16): speed comes from the engine, never from
changing the numerics being measured.
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime
import os
import platform
import resource
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import torch

from .data import load_problems
from .engine import ARMS, PassSettings, PivotOutput, trunk_seed
from .sampling import trunk_row
from .params import BOXED_INSTRUCTION, make

LAST_LINE = "speedup_vs_naive={ratio:.3f} tokens_per_s={ours:.2f} naive_tokens_per_s={naive:.2f}"


@dataclass(frozen=True)
class Workload:
    name: str
    model: str
    problems: tuple  # GSM8K test problem ids
    n_rollouts: int
    max_trunk_tokens: int
    max_pivots_per_rollout: int
    pivot_window: int
    k: int
    max_cont_tokens: int
    probe_tokens: int
    stop_at_answer: bool
    max_batch_rows: int
    naive_pivots: int  # 0: all pivots
    check_pivots: int  # pivots of the invariant check
    check_max_tokens: int  # continuation limit of the invariant check
    check_default: bool
    dtype: str = "bfloat16"
    temperature: float = 0.7
    top_p: float = 0.95
    margin_threshold: float = 1.0
    block_size: int = 1


EMBEDDED = "embedded:qwen2.5-coder-0.5b-instruct"
WORKLOADS = {
    # seconds, for the tests: the tiny random-weight model
    "tiny": Workload("tiny", "tiny:0", (1,), 2, 40, 1, 0, 4, 16, 8, True, 64,
                     naive_pivots=0, check_pivots=2, check_max_tokens=8, check_default=True),
    # the embedded model and pivot shape (K=4, stop at the answer, pivots among the last 64 tokens, 96-token
    # continuations, 2 pivots per trunk), within 10 minutes on 2 CPU cores
    "small": Workload("small", EMBEDDED, (0, 1), 1, 320, 2, 64, 4, 96, 32, True, 128,
                      naive_pivots=1, check_pivots=1, check_max_tokens=8, check_default=False),
    # the paper's sizes (K=4, 400-token continuations, pivots anywhere, no early stop), for the GPU
    "paper": Workload("paper", EMBEDDED, tuple(range(8)), 2, 512, 5, 0, 4, 400, 32, False, 320,
                      naive_pivots=2, check_pivots=2, check_max_tokens=32, check_default=False),
}


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


def speedup(fast: PhaseResult, naive: PhaseResult) -> float:
    """Tokens per second of a phase over the naive baseline's (inf when the baseline timed nothing)."""
    return fast.tokens_per_s / naive.tokens_per_s if naive.tokens_per_s > 0 else float("inf")


# ---------------------------------------------------------------- workload
def build_workload(engine, wl: Workload, log=print):
    """Trunks (engine-sampled, fixed seeds), pivots (fixed Params) and pivot jobs."""
    from . import pivots as pivot_stage
    from .grading import grade
    from .replay import build_jobs
    problems = {p.problem_id: p for p in load_problems("gsm8k")}
    prompts = {pid: engine.prompt_ids(problems[pid].question, BOXED_INSTRUCTION) for pid in wl.problems}
    seeds = {(pid, r): trunk_seed(pid, r) for pid in wl.problems for r in range(wl.n_rollouts)}
    trunks, _ = engine.sample_trunks(prompts, wl.n_rollouts, seeds, wl.temperature, wl.top_p,
                                     wl.max_trunk_tokens, 5)
    rows = [trunk_row(t, kept=True, correct=grade(engine.decode(t.gen_ids), problems[pid].gold, "gsm8k"))
            for pid in wl.problems for t in trunks[pid]]
    trunks_df = pd.DataFrame(rows)
    params = make({"config": f"bench-{wl.name}", "model": wl.model, "margin_threshold": wl.margin_threshold,
                   "block_size": wl.block_size, "max_pivots_per_rollout": wl.max_pivots_per_rollout,
                   "pivot_window": wl.pivot_window, "k": wl.k, "max_cont_tokens": wl.max_cont_tokens,
                   "probe_tokens": wl.probe_tokens, "stop_at_answer": wl.stop_at_answer,
                   "cont_temperature": wl.temperature, "cont_top_p": wl.top_p, "dtype": wl.dtype},
                  where=f"bench workload {wl.name}")
    pivots = pivot_stage.mine(trunks_df, params, engine.special_ids)
    jobs, gold = [], {}
    for pid in wl.problems:
        group = pivots[pivots.problem_id == pid]
        if len(group):
            jobs += build_jobs(group, trunks_df[trunks_df.problem_id == pid], wl.k)
        gold[pid] = problems[pid].gold
    log(f"trunks: {len(rows)} ({', '.join(str(len(r['gen_ids'])) for r in rows)} tokens); "
        f"pivots: {len(jobs)} (gen_index {', '.join(str(j.gen_index) for j in jobs)})")
    return jobs, gold, params


def pass_settings(wl: Workload, max_tokens: int | None = None) -> PassSettings:
    return PassSettings(k=wl.k, temperature=wl.temperature, top_p=wl.top_p,
                        max_tokens=max_tokens or wl.max_cont_tokens, probe_tokens=wl.probe_tokens,
                        stop_at_answer=wl.stop_at_answer, task="gsm8k")


def generated_tokens(out: PivotOutput) -> int:
    return sum(len(c) for arm in ARMS for c in out.continuations[arm]) + sum(len(out.probe_ids[a]) for a in ARMS)


def grade_and_write(engine, jobs, outs, gold, clock: Clock, out_dir: Path, tag: str):
    """Grade every pivot (the A estimate) and write the records, timed as grading and I/O."""
    from .replay import estimate
    t0 = clock.now()
    records = []
    for job, out in zip(jobs, outs):
        a, wins = estimate(job, out, gold[job.problem_id], "gsm8k", engine.decode)
        records.append({"pivot_id": job.pivot_id, "problem_id": job.problem_id, "rollout": job.rollout,
                        "abs_pos": job.abs_pos, "A": a, **{f"wins_{arm}": int(sum(wins[arm])) for arm in ARMS},
                        "cont_tokens": sum(len(c) for arm in ARMS for c in out.continuations[arm]),
                        "probe_ids": {arm: list(map(int, out.probe_ids[arm])) for arm in ARMS},
                        "probe_first_logprob": {arm: float(out.probe_first_logprob[arm]) for arm in ARMS}})
    t1 = clock.now()
    clock.add("grading", t1 - t0)
    frame = pd.DataFrame(records)
    frame["probe_ids"] = frame["probe_ids"].map(str)
    frame["probe_first_logprob"] = frame["probe_first_logprob"].map(str)
    frame.to_parquet(out_dir / f"records_{tag}.parquet", index=False)
    clock.add("io", clock.now() - t1)
    return records


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


def run_ours(engine, jobs, gold, settings: PassSettings, out_dir: Path) -> tuple[PhaseResult, list]:
    clock = Clock(engine.device)
    traffic = DecodeTraffic(engine.model)
    forward = engine._forward

    def counted_forward(ids, positions, cache, mask, *rest):
        if ids.shape[1] == 1:
            traffic.add_step(ids.shape[0], cache.get_seq_length() + 1)
        return forward(ids, positions, cache, mask, *rest)

    engine._forward = counted_forward
    undo = [clock.wrap(engine, "_prefill", "prefill"), clock.wrap(engine, "_decode", "decode"),
            lambda: delattr(engine, "_forward")]
    try:
        with PeakMemory(engine.device) as mem:
            t0 = clock.now()
            outs = engine.run_pass(jobs, "refeed", settings, None)
            clock.add("pass", clock.now() - t0)
            grade_and_write(engine, jobs, outs, gold, clock, out_dir, "ours")
            total = clock.now() - t0
    finally:
        for u in undo:
            u()
    t = clock.t
    split = {"prefill": t.get("prefill", 0.0), "decode": t.get("decode", 0.0), "grading": t["grading"],
             "io": t["io"]}
    split["other"] = max(0.0, total - sum(split.values()))  # KV assembly of the rows, first-step logprobs
    return PhaseResult("ours (HFEngine refeed)", len(jobs), len(jobs) * 2 * (settings.k + 1),
                       sum(generated_tokens(o) for o in outs), total, split, mem.peak_bytes, mem.start_bytes,
                       mem.label, traffic), outs


# ---------------------------------------------------------------- (a') the vLLM engine
def vllm_engine(model_path: str, wl: Workload, gpu_memory_utilization: float):
    from .engine_vllm import VLLMEngine
    params = make({"config": f"bench-{wl.name}", "model": model_path, "engine": "vllm", "device": "cuda",
                   "dtype": wl.dtype, "gpu_memory_utilization": gpu_memory_utilization, "enforce_eager": False,
                   "temperature": wl.temperature, "top_p": wl.top_p, "max_trunk_tokens": wl.max_trunk_tokens},
                  where=f"bench workload {wl.name}")
    return VLLMEngine.from_params(params)


def run_vllm(engine, hf_model, jobs, gold, settings: PassSettings, out_dir: Path) -> tuple[PhaseResult, list]:
    """VLLMEngine.run_pass refeed over the same jobs: one generate call (prefill and decode together)."""
    clock = Clock(torch.device("cuda"))
    with PeakMemory(torch.device("cuda")) as mem:
        t0 = clock.now()
        outs = engine.run_pass(jobs, "refeed", settings, None)
        clock.add("generate", clock.now() - t0)
        grade_and_write(engine, jobs, outs, gold, clock, out_dir, "vllm")
        total = clock.now() - t0
    # vLLM's steps are not visible from here: every request of the pass is admitted at once (one call,
    # fewer requests than max_num_seqs), so the decode takes at least as many steps as the longest request
    traffic = DecodeTraffic(hf_model)
    lengths = [(job.abs_pos + 1, len(c)) for job, o in zip(jobs, outs) for arm in ARMS
               for c in [*o.continuations[arm], o.probe_ids[arm]]]
    traffic.steps = max(n for _, n in lengths)
    traffic.rows = sum(n for _, n in lengths)
    traffic.context = sum(n * p + n * (n + 1) // 2 for p, n in lengths)
    split = {"prefill": 0.0, "decode": clock.t["generate"], "grading": clock.t["grading"], "io": clock.t["io"]}
    split["other"] = max(0.0, total - sum(split.values()))
    return PhaseResult("ours (vLLM refeed)", len(jobs), len(lengths), sum(generated_tokens(o) for o in outs),
                       total, split, mem.peak_bytes, mem.start_bytes, mem.label, traffic), outs


# ---------------------------------------------------------------- (b) naive: model.generate per request
class _AnswerStop:
    """Stop a batch-of-one generate once a final answer is complete (as the engine's stop_at_answer)."""

    def __init__(self, engine, prefix_text: str, prompt_len: int):
        from .grading import answer_complete
        self.engine, self.text, self.start, self.seen = engine, prefix_text, len(prefix_text), prompt_len
        self.answer_complete = answer_complete

    def __call__(self, input_ids, scores, **kwargs):
        new = input_ids[0, self.seen:].tolist()
        self.seen = input_ids.shape[1]
        for t in new:
            self.text += self.engine.tok.decode([t])
        done = self.answer_complete(self.text, self.start)
        return torch.full((input_ids.shape[0],), done, dtype=torch.bool, device=input_ids.device)


def naive_pivot(engine, job, settings: PassSettings) -> PivotOutput:
    """One pivot's requests, each through model.generate alone (the whole prefix re-fed every time)."""
    from transformers import StoppingCriteriaList
    conts, probe_ids, probe_lp = {a: [] for a in ARMS}, {}, {}
    common = {"eos_token_id": sorted(engine.stop_ids), "pad_token_id": engine.pad_id,
              "use_cache": True, "return_dict_in_generate": True}
    for arm in ARMS:
        prompt = job.prefix_ids(arm)
        ids = torch.tensor([prompt], device=engine.device)
        mask = torch.ones_like(ids)
        prefix_text = engine.decode(job.gen_prefix + [job.forced[arm]]) if settings.stop_at_answer else None
        for k in range(settings.k):
            torch.manual_seed(job.seeds[arm][k])
            stop = StoppingCriteriaList([_AnswerStop(engine, prefix_text, len(prompt))]) if prefix_text is not None \
                else None
            with torch.inference_mode():
                out = engine.model.generate(input_ids=ids, attention_mask=mask, do_sample=True,
                                            temperature=settings.temperature, top_p=settings.top_p, top_k=0,
                                            max_new_tokens=settings.max_tokens, stopping_criteria=stop, **common)
            conts[arm].append(out.sequences[0, len(prompt):].tolist())
        with torch.inference_mode():
            out = engine.model.generate(input_ids=ids, attention_mask=mask, do_sample=False,
                                        max_new_tokens=settings.probe_tokens, output_logits=True, **common)
        probe = out.sequences[0, len(prompt):].tolist()
        probe_ids[arm] = probe
        probe_lp[arm] = float(torch.log_softmax(out.logits[0][0].float(), dim=-1)[probe[0]])
    return PivotOutput(job.pivot_id, conts, probe_ids, probe_lp, {})


def run_naive(engine, jobs, gold, settings: PassSettings, out_dir: Path) -> tuple[PhaseResult, list]:
    clock = Clock(engine.device)
    starts = []

    def pre(module, args, kwargs):
        ids = kwargs.get("input_ids", args[0] if args else None)
        starts.append((ids is not None and ids.shape[-1] > 1, clock.now()))

    def post(module, args, kwargs, output):
        is_prefill, t0 = starts.pop()
        if is_prefill:
            clock.add("prefill", clock.now() - t0)

    hooks = [engine.model.register_forward_pre_hook(pre, with_kwargs=True),
             engine.model.register_forward_hook(post, with_kwargs=True)]
    try:
        with PeakMemory(engine.device) as mem:
            t0 = clock.now()
            outs = []
            for job in jobs:
                outs.append(naive_pivot(engine, job, settings))
            clock.add("generate", clock.now() - t0)
            grade_and_write(engine, jobs, outs, gold, clock, out_dir, "naive")
            total = clock.now() - t0
    finally:
        for h in hooks:
            h.remove()
    t = clock.t
    split = {"prefill": t.get("prefill", 0.0), "decode": t["generate"] - t.get("prefill", 0.0),
             "grading": t["grading"], "io": t["io"]}
    split["other"] = max(0.0, total - sum(split.values()))
    return PhaseResult("naive (generate x1)", len(jobs), len(jobs) * 2 * (settings.k + 1),
                       sum(generated_tokens(o) for o in outs),
                       total, split, mem.peak_bytes, mem.start_bytes, mem.label), outs


# ---------------------------------------------------------------- exactness in invariant mode
def reference_pivot(engine, job, settings: PassSettings) -> PivotOutput:
    """The slow reference: every row prefilled from scratch and decoded alone (invariant engine)."""
    from .engine_hf import _Rows
    conts, probe_ids, probe_lp = {a: [] for a in ARMS}, {}, {}
    for arm in ARMS:
        text = engine.decode(job.gen_prefix + [job.forced[arm]]) if settings.stop_at_answer else None
        for kind in [*range(settings.k), "probe"]:
            greedy = kind == "probe"
            logits, cache, mask, _ = engine._prefill([job.prefix_ids(arm)])
            # continuations may stop at a complete answer; probes are greedy and fixed-length
            stop = settings.stop_at_answer and not greedy
            rows = _Rows(seeds=[0 if greedy else job.seeds[arm][kind]],
                         temperature=[0.0 if greedy else settings.temperature],
                         top_p=[1.0 if greedy else settings.top_p],
                         max_new=[settings.probe_tokens if greedy else settings.max_tokens],
                         stop_at_answer=stop, prefix_text=[text] if stop else None)
            tokens = engine._decode(logits, cache, mask, [job.abs_pos + 1], rows)[0][0]
            if greedy:
                probe_ids[arm] = tokens[:settings.probe_tokens]
                probe_lp[arm] = float(torch.log_softmax(logits, dim=-1)[0, tokens[0]])
            else:
                conts[arm].append(tokens)
    return PivotOutput(job.pivot_id, conts, probe_ids, probe_lp, {})


def compare_outputs(fast: list[PivotOutput], slow: list[PivotOutput]) -> list[str]:
    """Differences between two passes' records, one line each (empty: identical)."""
    problems = []
    if len(fast) != len(slow):
        return [f"{len(fast)} fast records against {len(slow)} slow ones"]
    for a, b in zip(fast, slow):
        for arm in ARMS:
            for k, (x, y) in enumerate(zip(a.continuations[arm], b.continuations[arm])):
                if x != y:
                    problems.append(f"pivot {a.pivot_id} {arm} continuation {k}: {x} != {y}")
            if len(a.continuations[arm]) != len(b.continuations[arm]):
                problems.append(f"pivot {a.pivot_id} {arm}: continuation counts differ")
            if a.probe_ids[arm] != b.probe_ids[arm]:
                problems.append(f"pivot {a.pivot_id} {arm} probe: {a.probe_ids[arm]} != {b.probe_ids[arm]}")
            if a.probe_first_logprob[arm] != b.probe_first_logprob[arm]:
                problems.append(f"pivot {a.pivot_id} {arm} probe logprob: {a.probe_first_logprob[arm]!r} != "
                                f"{b.probe_first_logprob[arm]!r}")
    return problems


def check_invariant(model_path: str, wl: Workload, device: str, jobs, log=print) -> bool:
    from .engine_hf import HFEngine
    engine = HFEngine(model_path, device, wl.dtype, invariant=True)
    chosen = jobs[:wl.check_pivots]
    settings = pass_settings(wl, wl.check_max_tokens)
    t0 = time.perf_counter()
    fast = engine.run_pass(chosen, "refeed", settings, None)
    t1 = time.perf_counter()
    slow = [reference_pivot(engine, job, settings) for job in chosen]
    t2 = time.perf_counter()
    diffs = compare_outputs(fast, slow)
    rows = len(chosen) * 2 * (settings.k + 1)
    log(f"invariant check: {len(chosen)} pivots, {rows} rows, max_tokens {settings.max_tokens}, "
        f"engine {engine.describe()['linear_kernel']} kernel; fast path {t1 - t0:.1f} s, "
        f"slow reference {t2 - t1:.1f} s")
    if diffs:
        for line in diffs[:10]:
            log(f"  MISMATCH {line}")
        log(f"invariant check: FAILED ({len(diffs)} differences): the fast path's records differ from the "
            f"slow reference's in invariant mode")
        return False
    log("invariant check: PASSED (continuation ids, probe ids and probe logprobs identical, bit for bit)")
    return bool(chosen)


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


# ---------------------------------------------------------------- paper7b: the paper's scale on vLLM
PAPER7B = {
    # the paper-primary request structure (data/paper-records config): 20 problems, 8 trunks of up to 512
    # tokens, up to 5 pivots per trunk, K = 4, 400-token continuations, 32-token probes, three passes,
    # prefix caching, block 16; every generation runs to its length (ignore_eos), so token counts are known
    "problems": 20, "rollouts": 8, "trunk_tokens": 512, "pivots_per_trunk": 5, "k": 4, "cont_tokens": 400,
    "probe_tokens": 32, "passes": ("exact1", "exact2", "refeed"), "block_size": 16, "prompt_tokens": 128,
    "temperature": 0.7, "top_p": 0.95, "top_logprobs": 5, "max_model_len": 2048,
}
# the published record files of the paper's seven configurations (params/paper-*.yaml)
PAPER_CONFIG_RECORDS = {"paper-primary": "2026-06-11/primary.json", "paper-screened": "2026-06-11/screened.json",
                        "paper-k8": "2026-06-11/k8.json", "paper-k16": "2026-06-11/k16.json",
                        "paper-greedy": "2026-06-10/temp0.json", "paper-grpo": "2026-06-10/grpo.json",
                        "paper-phi": "2026-06-11/phi.json"}
PAPER_COST_CLAIM = "under 10 USD on an A100 (the paper)"
OVERHEAD_LINE = "overhead_vs_plain_generate={ratio:.3f}"


class _StubTokenizer:
    """No tokenizer travels with a random-weight model (skip_tokenizer_init): prompts are token ids and
    the stop ids come from the config; decode only renders ids (the benchmark grades nothing)."""

    def __init__(self, eos: list[int]):
        self.eos_token_id, self.all_special_ids = eos[0], list(eos)

    def decode(self, ids, skip_special_tokens=True):
        return " ".join(str(int(i)) for i in ids)


class _NoTokenizerLLM:
    """A vllm.LLM started with skip_tokenizer_init, seen by VLLMEngine through get_tokenizer."""

    def __init__(self, llm, eos: list[int]):
        self._llm, self._tok = llm, _StubTokenizer(eos)

    def get_tokenizer(self):
        return self._tok

    def __getattr__(self, name):
        return getattr(self._llm, name)


def paper_requests(records_dir: Path | None = None, cont_tokens: int = 400, probe_tokens: int = 32,
                   trunk_tokens: int = 512, passes: int = 3) -> list[dict]:
    """Per configuration, what its published records say it ran, counted from the files: pivots,
    problems, trunks (problems x the config's rollouts), K; and the tokens a replay with fixed lengths
    generates for it (every pass: 2 arms x (K continuations + 1 probe); the trunks twice: sampled
    once and regenerated once by the replay). An upper bound: the paper's continuations stop at EOS."""
    import json
    base = records_dir or Path(__file__).resolve().parents[1] / "data" / "paper-records"
    rows = []
    for config, rel in PAPER_CONFIG_RECORDS.items():
        data = json.loads((base / rel).read_text())
        pivots, cfg = data["pivots"], data["config"]
        problems = len({p["problem_id"] for p in pivots} | {p["problem_id"] for p in data.get("per_problem", [])})
        k = int(cfg["k"])
        trunks = problems * int(cfg["rollouts"])
        cont = passes * len(pivots) * 2 * (k * cont_tokens + probe_tokens)
        rows.append({"config": config, "file": rel, "model": cfg["model"], "pivots": len(pivots),
                     "problems": problems, "trunks": trunks, "k": k,
                     "requests": passes * len(pivots) * 2 * (k + 1), "continuation_tokens": cont,
                     "trunk_tokens": 2 * trunks * trunk_tokens,
                     "paper_elapsed_s": float(data.get("elapsed_seconds") or 0.0)})
    return rows


def project_campaign(rows: list[dict], tokens_per_s: float, trunk_tokens_per_s: float, startup_s: float,
                     warm_startup_s: float | None = None, stages: int = 2) -> list[dict]:
    """Seconds on one GPU at the measured rates, per configuration: its continuation tokens at the
    replay's rate (whose wall time includes regenerating the trunks), its trunks sampled once at the
    sampling stage's rate, and `stages` engine start-ups (sampling, replay): the campaign's first one
    cold, every later one with the compilation cache warm (warm_startup_s; None: all cold)."""
    out, warm = [], startup_s if warm_startup_s is None else warm_startup_s
    for i, r in enumerate(rows):
        starts = (startup_s + (stages - 1) * warm) if i == 0 else stages * warm
        s = r["continuation_tokens"] / tokens_per_s + r["trunk_tokens"] / 2 / trunk_tokens_per_s + starts
        out.append({**r, "projected_s": s})
    return out


def print_projection(rows: list[dict], log) -> float:
    log(f"{'configuration':16} {'file':26} {'problems':>8} {'trunks':>6} {'pivots':>6} {'K':>3} {'requests':>9} "
        f"{'cont. tokens':>12} {'hours':>7} {'paper A100 s':>12}")
    for r in rows:
        log(f"{r['config']:16} {r['file']:26} {r['problems']:>8} {r['trunks']:>6} {r['pivots']:>6} {r['k']:>3} "
            f"{r['requests']:>9} {r['continuation_tokens']:>12} {r['projected_s'] / 3600:>7.3f} "
            f"{r['paper_elapsed_s']:>12.1f}")
    total_h = sum(r["projected_s"] for r in rows) / 3600
    paper_h = sum(r["paper_elapsed_s"] for r in rows) / 3600
    log(f"seven configurations: {total_h:.3f} H200-hours projected (goal: under 1); the records' own "
        f"elapsed_seconds sum to {paper_h:.2f} hours; the paper's cost: {PAPER_COST_CLAIM}")
    return total_h


def main_project(args, log) -> int:
    """The campaign projection alone, from rates measured earlier (no GPU needed)."""
    w = PAPER7B
    rows = project_campaign(paper_requests(cont_tokens=w["cont_tokens"], probe_tokens=w["probe_tokens"],
                                           trunk_tokens=w["trunk_tokens"]),
                            args.tokens_per_s, args.trunk_tokens_per_s, args.startup_s, args.warm_startup_s)
    log(f"projection from measured rates: continuation tokens/s {args.tokens_per_s}, trunk tokens/s "
        f"{args.trunk_tokens_per_s}, start-up {args.startup_s} s cold, {args.warm_startup_s} s warm, 2 per "
        f"configuration")
    print_projection(rows, log)
    return 0


def vllm_dummy_llm(model_dir: Path, gpu_memory_utilization: float, block_size: int, max_model_len: int):
    """The engine of from_params (bf16, prefix caching, seed 0, raw logprobs, stats on for the preemption
    counter, CUDA graphs), on random weights and without a tokenizer."""
    import vllm
    return vllm.LLM(model=str(model_dir), load_format="dummy", skip_tokenizer_init=True, dtype="bfloat16",
                    enable_prefix_caching=True, block_size=block_size, gpu_memory_utilization=gpu_memory_utilization,
                    max_model_len=max_model_len, seed=0, enforce_eager=False, logprobs_mode="raw_logprobs",
                    disable_log_stats=False)


def synthetic_prompt(problem_id: int, n: int) -> list[int]:
    """A fixed prompt of token ids per problem (the random-weight model has no tokenizer; a chat-templated
    GSM8K question with the paper's instruction is about this long)."""
    import random
    rng = random.Random(stable_problem_seed(problem_id))
    return [rng.randrange(1000, 150000) for _ in range(n)]


def stable_problem_seed(problem_id: int) -> int:
    from .engine import stable_seed
    return stable_seed(problem_id, "bench-paper7b-prompt")


def spread_pivots(trunks: pd.DataFrame, per_trunk: int, block_size: int) -> pd.DataFrame:
    """Pivots spread evenly over each trunk at block-aligned positions (a random-weight model has a
    near-uniform next-token distribution, so every position is low-margin; the paper mines pivots
    anywhere in the trunk). alt: the best top-k token other than the sampled one."""
    rows = []
    for t in trunks.itertuples(index=False):
        gen, plen, seen = list(t.gen_ids), len(t.prompt_ids), set()
        for j in range(per_trunk):
            target = plen + int((j + 0.5) * len(gen) / per_trunk)
            abs_pos = target - target % block_size
            i = abs_pos - plen
            if i < 0 or i >= len(gen) or i in seen:
                continue
            seen.add(i)
            alt = next((int(x) for x in t.topk_ids[i] if int(x) != gen[i]), None)
            if alt is None:
                continue
            lps = list(t.topk_logprobs[i])
            rows.append({"pivot_id": len(rows), "problem_id": int(t.problem_id), "rollout": int(t.rollout),
                         "gen_index": i, "abs_pos": abs_pos, "margin": float(lps[0] - lps[1]), "actual": gen[i],
                         "alt": alt, "rollout_correct": 0})
    return pd.DataFrame(rows, columns=["pivot_id", "problem_id", "rollout", "gen_index", "abs_pos", "margin",
                                       "actual", "alt", "rollout_correct"])


def plain_requests(engine, trunk_rows: pd.DataFrame, jobs: list, settings: PassSettings, passes, trunk: dict):
    """The same requests as the replay, for one plain generate call: every problem's trunk requests once
    (the replay regenerates them at least once) and every pass's continuation and probe requests."""
    prompts, params = [], []
    for t in trunk_rows.itertuples(index=False):
        prompts.append([int(x) for x in t.prompt_ids])
        params.append(engine.SamplingParams(temperature=trunk["temperature"], top_p=trunk["top_p"],
                                            max_tokens=trunk["max_new_tokens"], logprobs=trunk["top_logprobs"],
                                            seed=int(t.seed), detokenize=False))
    for _ in passes:
        for job in jobs:
            for arm, kind in job.requests(settings.k):
                prompts.append(job.prefix_ids(arm))
                params.append(engine._request_params(settings, job, arm, kind))
    return prompts, params


def paper7b_traffic(config: dict, calls: list[list[tuple[int, int]]]) -> "DecodeTraffic":
    """Decode traffic of a sequence of generate calls, each a list of (prompt length, generated tokens):
    steps estimated as each call's longest request (a lower bound)."""
    from .models import kv_bytes_per_token, weight_bytes_per_step
    traffic = DecodeTraffic.__new__(DecodeTraffic)
    traffic.weight_bytes, traffic.kv_bytes_per_token = weight_bytes_per_step(config), kv_bytes_per_token(config)
    traffic.steps = sum(max((n for _, n in c), default=0) for c in calls)
    traffic.rows = sum(n for c in calls for _, n in c)
    traffic.context = sum(n * p + n * (n + 1) // 2 for c in calls for p, n in c)
    return traffic


def main_startup_only(args, log) -> int:
    """Start the paper7b engine once more (same model directory and compilation cache) and time it."""
    from .engine_vllm import prepare_environment
    from .models import write_config_dir
    out = Path(args.out or "runs/bench-paper7b")
    os.environ.setdefault("VLLM_CACHE_ROOT", str((out / "vllm-cache").resolve()))
    prepare_environment(False, "bench-paper7b", serving="inprocess")  # the mode lease 4 measured
    model_dir = write_config_dir(out / "qwen2.5-7b-instruct-config")
    t0 = time.perf_counter()
    vllm_dummy_llm(model_dir, args.gpu_memory_utilization or 0.9, PAPER7B["block_size"], PAPER7B["max_model_len"])
    log(f"startup_only: engine started in {time.perf_counter() - t0:.1f} s "
        f"(VLLM_CACHE_ROOT={os.environ['VLLM_CACHE_ROOT']})")
    return 0


def main_paper7b(args, log) -> int:
    from functools import partial

    from .engine_vllm import VLLMEngine, prepare_environment
    from .models import QWEN25_7B_INSTRUCT_CONFIG, QWEN25_7B_INSTRUCT_EOS, write_config_dir
    from .replay import build_jobs

    if args.startup_only:
        return main_startup_only(args, log)
    w = dict(PAPER7B)
    n_problems = args.problems or w["problems"]
    out = Path(args.out or "runs/bench-paper7b")
    out.mkdir(parents=True, exist_ok=True)
    # vLLM's torch.compile cache under the run directory: a later stage or rerun reuses it
    os.environ.setdefault("VLLM_CACHE_ROOT", str((out / "vllm-cache").resolve()))
    prepare_environment(False, "bench-paper7b", serving="inprocess")  # the mode lease 4 measured
    started = time.perf_counter()
    log(f"replaylib bench: workload paper7b, device cuda, "
        f"{datetime.datetime.now().astimezone().isoformat(timespec='seconds')}")
    log(f"host: {platform.node()}, {os.cpu_count()} CPUs, torch {torch.__version__}, "
        f"{torch.cuda.get_device_name() if torch.cuda.is_available() else 'no CUDA device'}")
    model_dir = write_config_dir(out / "qwen2.5-7b-instruct-config")
    log(f"model: Qwen2.5-7B-Instruct's config.json (replaylib.models.QWEN25_7B_INSTRUCT_CONFIG), random weights "
        f"(load_format dummy), bf16, no tokenizer (token-id prompts); VLLM_CACHE_ROOT={os.environ['VLLM_CACHE_ROOT']}")
    log(f"workload: {n_problems} of the paper's {w['problems']} problems, {w['rollouts']} trunks of "
        f"{w['trunk_tokens']} tokens, {w['pivots_per_trunk']} pivots per trunk (block-aligned, spread over the "
        f"trunk), K={w['k']}, continuations {w['cont_tokens']} tokens, probes {w['probe_tokens']} tokens, passes "
        f"{','.join(w['passes'])}, block {w['block_size']}, prompts {w['prompt_tokens']} token ids, ignore_eos")
    t0 = time.perf_counter()
    import vllm
    llm = vllm_dummy_llm(model_dir, args.gpu_memory_utilization or 0.9, w["block_size"], w["max_model_len"])
    startup = time.perf_counter() - t0
    engine = VLLMEngine(_NoTokenizerLLM(llm, QWEN25_7B_INSTRUCT_EOS), partial(vllm.SamplingParams, ignore_eos=True),
                        model=f"random-weight {QWEN25_7B_INSTRUCT_CONFIG['architectures'][0]} (Qwen2.5-7B-Instruct)",
                        version=vllm.__version__, config="bench-paper7b", enforce_eager=False)
    log(f"engine: vLLM {vllm.__version__} started in {startup:.1f} s (import included); {engine.describe()}")

    problems = list(range(n_problems))
    prompts = {pid: synthetic_prompt(pid, w["prompt_tokens"]) for pid in problems}
    seeds = {(pid, r): trunk_seed(pid, r) for pid in problems for r in range(w["rollouts"])}
    t0 = time.perf_counter()
    trunks, _ = engine.sample_trunks(prompts, w["rollouts"], seeds, w["temperature"], w["top_p"], w["trunk_tokens"],
                                     w["top_logprobs"])
    sampling_s = time.perf_counter() - t0
    trunk_rows = pd.DataFrame([trunk_row(t, correct=False) for pid in problems for t in trunks[pid]])
    trunk_tokens = int(sum(len(g) for g in trunk_rows.gen_ids))
    log(f"sampling (stage 01's engine work, one generate call per problem): {len(trunk_rows)} trunks, "
        f"{trunk_tokens} tokens in {sampling_s:.1f} s ({trunk_tokens / sampling_s:.0f} tokens/s)")
    pivots = spread_pivots(trunk_rows, w["pivots_per_trunk"], w["block_size"])
    settings = PassSettings(k=w["k"], temperature=w["temperature"], top_p=w["top_p"], max_tokens=w["cont_tokens"],
                            probe_tokens=w["probe_tokens"], stop_at_answer=False, task="gsm8k")
    jobs_by = {pid: build_jobs(pivots[pivots.problem_id == pid], trunk_rows[trunk_rows.problem_id == pid], w["k"])
               for pid in problems}
    all_jobs = [j for pid in problems for j in jobs_by[pid]]
    log(f"pivots: {len(all_jobs)} ({len(all_jobs) / max(1, n_problems):.1f} per problem)")

    # (1) the replay, as stage 03 runs it: per problem, make the trunk blocks resident, then the passes
    times = {"establish": 0.0, **{p: 0.0 for p in w["passes"]}}
    calls, cont_tokens, verified, exact_pivots, per_problem = [], 0, 0, 0, []
    t_replay = time.perf_counter()
    for pid in problems:
        tp = time.perf_counter()
        t0 = time.perf_counter()
        state, _ = engine.problem_state(None, pid, trunk_rows)
        times["establish"] += time.perf_counter() - t0
        calls.append([(w["prompt_tokens"], w["trunk_tokens"])] * w["rollouts"])
        establishes = state["established"]
        for name in w["passes"]:
            t0 = time.perf_counter()
            outs = engine.run_pass(jobs_by[pid], name, settings, state)
            times[name] += time.perf_counter() - t0
            lengths = [(job.abs_pos + 1, len(c)) for job, o in zip(jobs_by[pid], outs) for arm in ARMS
                       for c in [*o.continuations[arm], o.probe_ids[arm]]]
            calls.append(lengths)
            cont_tokens += sum(n for _, n in lengths)
            if name.startswith("exact"):
                exact_pivots += len(outs)
                verified += sum(bool(o.resume.get("state_ok")) for o in outs)
        per_problem.append((pid, time.perf_counter() - tp, state["established"], state["established"] - establishes))
    replay_s = time.perf_counter() - t_replay
    log(f"replay: {len(all_jobs)} pivots, {cont_tokens} continuation + probe tokens in {replay_s:.1f} s; exact "
        f"requests verified from the cache on {verified}/{exact_pivots} pivot-passes; trunk establishments "
        f"{sum(p[2] for p in per_problem)} over {n_problems} problems")
    expected = len(all_jobs) * len(w["passes"]) * 2 * (w["k"] * w["cont_tokens"] + w["probe_tokens"])
    if cont_tokens != expected:
        log(f"warning: {cont_tokens} tokens generated, {expected} expected from the fixed lengths")

    # (2) the floor: one plain LLM.generate call with the same requests and lengths on the same engine
    prompts_all, params_all = plain_requests(engine, trunk_rows, all_jobs, settings, w["passes"],
                                             engine.trunk_settings)
    engine._reset("plain generate")
    t0 = time.perf_counter()
    plain_outs = llm.generate([{"prompt_token_ids": p} for p in prompts_all], params_all, use_tqdm=False)
    plain_s = time.perf_counter() - t0
    plain_tokens = sum(len(o.outputs[0].token_ids) for o in plain_outs)
    plain_trunk = len(trunk_rows) * w["trunk_tokens"]
    log(f"plain generate: {len(prompts_all)} requests (the trunks once + every pass's requests), {plain_tokens} "
        f"tokens in {plain_s:.1f} s ({plain_tokens / plain_s:.0f} tokens/s)")
    replay_all_tokens = cont_tokens + sum(1 for _ in per_problem for _ in range(w["rollouts"])) * w["trunk_tokens"]

    # report
    bandwidth = (args.bandwidth_tbs or 4.8) * 1e12
    rate = cont_tokens / replay_s
    log("")
    log(f"{'':34} {'replay (stage 03)':>20} {'plain generate':>20}")
    log(f"{'problems / pivots':34} {f'{n_problems} / {len(all_jobs)}':>20} {f'{n_problems} / {len(all_jobs)}':>20}")
    log(f"{'generate calls':34} {len(calls):>20} {1:>20}")
    log(f"{'generated tokens (trunks incl.)':34} {replay_all_tokens:>20} {plain_tokens:>20}")
    log(f"{'wall time':34} {f'{replay_s:.2f} s':>20} {f'{plain_s:.2f} s':>20}")
    log(f"{'tokens/s (all generated)':34} {replay_all_tokens / replay_s:>20.0f} {plain_tokens / plain_s:>20.0f}")
    log(f"{'continuation tokens/s':34} {rate:>20.0f} {(plain_tokens - plain_trunk) / plain_s:>20.0f}")
    for key in ("establish", *w["passes"]):
        what = "regenerate trunks" if key == "establish" else f"pass {key}"
        log(f"{'time: ' + what:34} {f'{times[key]:.2f} s {100 * times[key] / replay_s:5.1f}%':>20}")
    slow = max(per_problem, key=lambda p: p[1])
    log(f"per problem: {replay_s / n_problems:.2f} s on average (slowest: problem {slow[0]}, {slow[1]:.2f} s, "
        f"{slow[2]} trunk establishments)")
    traffic = paper7b_traffic(QWEN25_7B_INSTRUCT_CONFIG, calls)
    log(traffic.describe(replay_s, bandwidth, "replay: steps estimated as each call's longest request, a lower "
                                               "bound, so the fraction is too; prefill included"))
    stage_s = startup + replay_s
    log(f"engine start-up: {startup:.1f} s = {100 * startup / stage_s:.1f}% of this replay stage's wall time "
        f"({stage_s:.1f} s: start-up + replay of {n_problems} problems); of a full {w['problems']}-problem stage "
        f"at this rate: {100 * startup / (startup + replay_s * w['problems'] / n_problems):.1f}%")

    rows = project_campaign(paper_requests(cont_tokens=w["cont_tokens"], probe_tokens=w["probe_tokens"],
                                           trunk_tokens=w["trunk_tokens"]),
                            rate, trunk_tokens / sampling_s, startup, args.warm_startup_s)
    log("")
    log(f"projected campaign on one H200 (counted from data/paper-records; continuation tokens at this replay's "
        f"rate, trunks sampled once at the sampling rate, 2 engine start-ups per configuration: {startup:.1f} s "
        f"cold, then {args.warm_startup_s if args.warm_startup_s is not None else startup:.1f} s):")
    total_h = print_projection(rows, log)
    overhead = replay_s / plain_s
    log(f"goals: overhead {overhead:.3f} (<= 1.15: {'met' if overhead <= 1.15 else 'not met'}); start-up share of "
        f"this stage {100 * startup / stage_s:.1f}% (<= 20%: {'met' if startup <= 0.2 * stage_s else 'not met'}); "
        f"campaign {total_h:.3f} H200-hours (< 1: {'met' if total_h < 1 else 'not met'})")
    log(f"total benchmark time {time.perf_counter() - started:.1f} s")
    log(f"tokens_per_s={rate:.2f} replay_s={replay_s:.2f} plain_generate_s={plain_s:.2f} startup_s={startup:.2f}")
    log(OVERHEAD_LINE.format(ratio=overhead))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m replaylib.bench", description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--workload", choices=sorted([*WORKLOADS, "paper7b"]), default="small")
    parser.add_argument("--model", help="override the workload's model spec (embedded:NAME, tiny:SEED, a directory)")
    parser.add_argument("--naive-pivots", type=int, help="pivots given to the naive baseline (0: all)")
    parser.add_argument("--check-invariant", action=argparse.BooleanOptionalAction, default=None,
                        help="assert fast path == slow reference in invariant mode (default: on for tiny only)")
    parser.add_argument("--threads", type=int, help="torch CPU threads (default: torch's own choice)")
    parser.add_argument("--out", help="keep the records written by both phases in this directory")
    parser.add_argument("--engine", choices=["hf", "vllm"], default="hf",
                        help="vllm (CUDA): also replay with the vLLM engine; the last line then reports it")
    parser.add_argument("--bandwidth-tbs", type=float,
                        help="memory bandwidth in TB/s for the decode bound (default: 4.8, an H200, on cuda; "
                             "none on cpu)")
    parser.add_argument("--gpu-memory-utilization", type=float,
                        help="the vLLM engine's share (default 0.3; paper7b: 0.9)")
    parser.add_argument("--problems", type=int, help="paper7b: replay only the first N of its 20 problems")
    parser.add_argument("--project-only", action="store_true",
                        help="paper7b: only print the campaign projection from the rates given below (no GPU)")
    parser.add_argument("--tokens-per-s", type=float, help="--project-only: the replay's continuation tokens/s")
    parser.add_argument("--trunk-tokens-per-s", type=float, help="--project-only: the sampling stage's tokens/s")
    parser.add_argument("--startup-s", type=float, help="--project-only: a cold engine start-up in seconds")
    parser.add_argument("--warm-startup-s", type=float,
                        help="paper7b: a start-up with the compilation cache warm, in seconds (--startup-only "
                             "measures it), used for every start after the first in the projection")
    parser.add_argument("--startup-only", action="store_true",
                        help="paper7b: only start the engine (same model directory and compilation cache) and time it")
    args = parser.parse_args(argv)
    if args.engine == "vllm" and args.device != "cuda":
        parser.error("--engine vllm runs on CUDA only: add --device cuda")
    bandwidth = args.bandwidth_tbs if args.bandwidth_tbs else (4.8 if args.device == "cuda" else None)
    bytes_per_s = bandwidth * 1e12 if bandwidth else None
    if args.workload == "paper7b" and args.project_only:
        if None in (args.tokens_per_s, args.trunk_tokens_per_s, args.startup_s):
            parser.error("--project-only needs --tokens-per-s, --trunk-tokens-per-s and --startup-s")
        return main_project(args, lambda msg: print(msg, flush=True))
    if args.workload == "paper7b":
        if args.engine != "vllm" or args.device != "cuda":
            parser.error("--workload paper7b runs the vLLM engine on CUDA: add --device cuda --engine vllm")
        return main_paper7b(args, lambda msg: print(msg, flush=True))
    if args.gpu_memory_utilization is None:
        args.gpu_memory_utilization = 0.3

    from transformers.utils import logging as hf_logging
    hf_logging.set_verbosity_error()
    from .engine_hf import HFEngine
    from .models import resolve_model

    if args.threads:
        torch.set_num_threads(args.threads)
    wl = WORKLOADS[args.workload]
    if args.model:
        wl = dataclasses.replace(wl, model=args.model)
    if args.naive_pivots is not None:
        wl = dataclasses.replace(wl, naive_pivots=args.naive_pivots)
    check = wl.check_default if args.check_invariant is None else args.check_invariant
    log = lambda msg: print(msg, flush=True)

    started = time.perf_counter()
    log(f"replaylib bench: workload {wl.name}, device {args.device}, "
        f"{datetime.datetime.now().astimezone().isoformat(timespec='seconds')}")
    log(f"host: {platform.node()} {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
        f"torch {torch.__version__} ({torch.get_num_threads()} threads)"
        + (f", {torch.cuda.get_device_name()}" if args.device == "cuda" and torch.cuda.is_available() else ""))
    t0 = time.perf_counter()
    try:
        model_path = resolve_model(wl.model)
        engine = HFEngine(model_path, args.device, wl.dtype, invariant=False, max_batch_rows=wl.max_batch_rows)
    except (RuntimeError, ValueError, OSError) as e:
        print(f"replaylib.bench: {e}", file=sys.stderr)
        return 2
    info = engine.describe()
    log(f"model {wl.model} ({info['dtype']}, linear kernel {info['linear_kernel']}, attention {info['attention']}), "
        f"loaded in {time.perf_counter() - t0:.1f} s")
    settings = pass_settings(wl)
    log(f"workload: GSM8K problems {list(wl.problems)}, {wl.n_rollouts} trunk(s) each (<= {wl.max_trunk_tokens} "
        f"tokens), <= {wl.max_pivots_per_rollout} pivots per trunk (margin < {wl.margin_threshold}, block_size "
        f"{wl.block_size}, pivot_window {wl.pivot_window}), K={wl.k}, continuations <= {wl.max_cont_tokens} tokens, "
        f"probes {wl.probe_tokens} tokens, stop_at_answer {wl.stop_at_answer}, T={wl.temperature}, "
        f"top_p={wl.top_p}, max_batch_rows {wl.max_batch_rows}")
    t0 = time.perf_counter()
    jobs, gold, _ = build_workload(engine, wl, log)
    log(f"setup: trunks sampled and pivots mined in {time.perf_counter() - t0:.1f} s (not benchmarked; {_load()})")
    if not jobs:
        log("no pivots in this workload; nothing to benchmark")
        return 2
    naive_jobs = jobs[:wl.naive_pivots] if wl.naive_pivots else jobs

    with tempfile.TemporaryDirectory(prefix="replaylib-bench-") as tmp:
        out_dir = Path(args.out) if args.out else Path(tmp)
        out_dir.mkdir(parents=True, exist_ok=True)
        log(f"(a) ours: HFEngine.run_pass refeed over {len(jobs)} pivots ...")
        ours, _ = run_ours(engine, jobs, gold, settings, out_dir)
        log(f"    {ours.tokens} tokens in {ours.seconds:.1f} s ({_load()})")
        log(f"(b) naive: model.generate one request at a time over {len(naive_jobs)} of the {len(jobs)} pivots ...")
        naive, _ = run_naive(engine, naive_jobs, gold, settings, out_dir)
        log(f"    {naive.tokens} tokens in {naive.seconds:.1f} s ({_load()})")
        phases, best = [ours, naive], ours
        if args.engine == "vllm":
            t0 = time.perf_counter()
            v_engine = vllm_engine(model_path, wl, args.gpu_memory_utilization)
            log(f"(a') vLLM {v_engine.version}: engine started in {time.perf_counter() - t0:.1f} s "
                f"({v_engine.describe()}); VLLMEngine.run_pass refeed over {len(jobs)} pivots ...")
            run_vllm(v_engine, engine.model, jobs[:1], gold, settings, out_dir)  # warm-up: graphs, caches
            v_ours, _ = run_vllm(v_engine, engine.model, jobs, gold, settings, out_dir)
            log(f"    {v_ours.tokens} tokens in {v_ours.seconds:.1f} s (after a one-pivot warm-up)")
            phases.insert(1, v_ours)
            best = v_ours

    ok = True
    if check:
        del engine  # the invariant engine loads its own copy of the model
        ok = check_invariant(model_path, wl, args.device, jobs, log)
    else:
        log("invariant check: not run (--check-invariant to run it)")
    report(phases, bytes_per_s, log)
    log(f"total benchmark time {time.perf_counter() - started:.1f} s")
    if best is not ours:
        log(f"HFEngine: speedup_vs_naive={speedup(ours, naive):.3f} tokens_per_s={ours.tokens_per_s:.2f}")
    log(LAST_LINE.format(ratio=speedup(best, naive), ours=best.tokens_per_s, naive=naive.tokens_per_s))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
