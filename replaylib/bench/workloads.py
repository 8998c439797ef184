"""The replay benchmark on a fixed workload (tiny, small, paper): this package's engine against a naive
baseline, and optionally the vLLM engine (replaylib.bench)."""
from __future__ import annotations

import argparse
import dataclasses
import datetime
import os
import platform
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import torch

from ..measure.data import load_problems
from ..measure.engine import ARMS, PassSettings, PivotOutput
from ..measure.sampling import trunk_row
from ..measure.seeds import trunk_seed
from ..runtime.params import BOXED_INSTRUCTION, make
from .measure import (
    Clock,
    DecodeTraffic,
    PeakMemory,
    PhaseResult,
    _load,
    generated_tokens,
    report,
    speedup,
)

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
    dtype: str = "bfloat16"
    temperature: float = 0.7
    top_p: float = 0.95
    margin_threshold: float = 1.0
    block_size: int = 1

EMBEDDED = "embedded:qwen2.5-coder-0.5b-instruct"

WORKLOADS = {
    # seconds, for the tests: the tiny random-weight model
    "tiny": Workload("tiny", "tiny:0", (1,), 2, 40, 1, 0, 4, 16, 8, True, 64,
                     naive_pivots=0),
    # the embedded model and pivot shape (K=4, stop at the answer, pivots among the last 64 tokens, 96-token
    # continuations, 2 pivots per trunk), within 10 minutes on 2 CPU cores
    "small": Workload("small", EMBEDDED, (0, 1), 1, 320, 2, 64, 4, 96, 32, True, 128,
                      naive_pivots=1),
    # the paper's sizes (K=4, 400-token continuations, pivots anywhere, no early stop), for the GPU
    "paper": Workload("paper", EMBEDDED, tuple(range(8)), 2, 512, 5, 0, 4, 400, 32, False, 320,
                      naive_pivots=2),
}

# ---------------------------------------------------------------- workload
def build_workload(engine, wl: Workload, log=print):
    """Trunks (engine-sampled, fixed seeds), pivots (fixed Params) and pivot jobs."""
    from ..measure import mining as pivot_stage
    from ..measure.grading import grade
    from ..measure.replay import build_jobs
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

def grade_and_write(engine, jobs, outs, gold, clock: Clock, out_dir: Path, tag: str):
    """Grade every pivot (the A estimate) and write the records, timed as grading and I/O."""
    from ..measure.replay import estimate
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
    from ..measure.engine_vllm import VLLMEngine
    from ..runtime.vllm_processes import EngineProcesses
    params = make({"config": f"bench-{wl.name}", "model": model_path, "engine": "vllm", "device": "cuda",
                   "dtype": wl.dtype, "gpu_memory_utilization": gpu_memory_utilization, "enforce_eager": False,
                   "temperature": wl.temperature, "top_p": wl.top_p, "max_trunk_tokens": wl.max_trunk_tokens},
                  where=f"bench workload {wl.name}")
    return VLLMEngine.from_params(params, lifecycle=EngineProcesses())

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
        from ..measure.grading import answer_complete
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

def main(argv: list[str] | None = None) -> int:
    from . import __doc__ as bench_doc
    parser = argparse.ArgumentParser(prog="python -m replaylib.bench", description=bench_doc.split("\n\n")[0])
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--workload", choices=sorted([*WORKLOADS, "paper7b"]), default="small")
    parser.add_argument("--model", help="override the workload's model spec (embedded:NAME, tiny:SEED, a directory)")
    parser.add_argument("--naive-pivots", type=int, help="pivots given to the naive baseline (0: all)")
    parser.add_argument("--threads", type=int, help="torch CPU threads (default: torch's own choice)")
    parser.add_argument("--out", help="keep the records written by both phases in this directory")
    parser.add_argument("--engine", choices=["hf", "vllm"], default="hf",
                        help="vllm (CUDA): also replay with the vLLM engine; the last line then reports it")
    parser.add_argument("--workers", type=int, default=1,
                        help="also replay the workload on this many transformers engines side by side, each in a "
                             "process of its own, its problems dealt among them (the Ray executor's sharing of one "
                             "GPU); prints their aggregate tokens/s")
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
    if args.workers < 1:
        parser.error(f"--workers {args.workers}: it must be at least 1")
    bandwidth = args.bandwidth_tbs if args.bandwidth_tbs else (4.8 if args.device == "cuda" else None)
    bytes_per_s = bandwidth * 1e12 if bandwidth else None
    if args.workload == "paper7b" and args.project_only:
        if None in (args.tokens_per_s, args.trunk_tokens_per_s, args.startup_s):
            parser.error("--project-only needs --tokens-per-s, --trunk-tokens-per-s and --startup-s")
        from .paper7b import main_project
        return main_project(args, lambda msg: print(msg, flush=True))
    if args.workload == "paper7b":
        if args.engine != "vllm" or args.device != "cuda":
            parser.error("--workload paper7b runs the vLLM engine on CUDA: add --device cuda --engine vllm")
        from .paper7b import main_paper7b
        return main_paper7b(args, lambda msg: print(msg, flush=True))
    if args.gpu_memory_utilization is None:
        args.gpu_memory_utilization = 0.3

    from transformers.utils import logging as hf_logging
    hf_logging.set_verbosity_error()
    from ..measure.engine_hf import HFEngine
    from ..measure.models import resolve_model

    if args.threads:
        torch.set_num_threads(args.threads)
    wl = WORKLOADS[args.workload]
    if args.model:
        wl = dataclasses.replace(wl, model=args.model)
    if args.naive_pivots is not None:
        wl = dataclasses.replace(wl, naive_pivots=args.naive_pivots)
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
        if args.workers > 1:
            from . import side_by_side
            log(f"(a'') ours on {args.workers} engines side by side, the {len(jobs)} pivots dealt by problem ...")
            many = side_by_side.run(model_path, args.device, wl.dtype, wl.max_batch_rows, jobs, settings, args.workers)
            log(f"    {many['engines']} engines: {many['tokens']} tokens in {many['seconds']:.1f} s, "
                f"{many['tokens_per_s']:.2f} tokens/s together ({ours.tokens_per_s:.2f} on one engine); each "
                + ", ".join(f"{r:.2f}" for r in many["per_engine_tokens_per_s"]) + f" tokens/s ({_load()})")
            log(f"side_by_side_tokens_per_s={many['tokens_per_s']:.2f} engines={many['engines']}")
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

    report(phases, bytes_per_s, log)
    log(f"total benchmark time {time.perf_counter() - started:.1f} s")
    if best is not ours:
        log(f"HFEngine: speedup_vs_naive={speedup(ours, naive):.3f} tokens_per_s={ours.tokens_per_s:.2f}")
    log(LAST_LINE.format(ratio=speedup(best, naive), ours=best.tokens_per_s, naive=naive.tokens_per_s))
    return 0
