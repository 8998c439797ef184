"""The replay on several transformers engines side by side on one device (``--workers N``): each engine in a
process of its own, the workload's problems dealt among them as the Ray executor deals a stage's units (a
problem stays on one engine); the aggregate continuation tokens/s over the wall time from the moment every
engine is loaded. One engine launches its kernels one decode step at a time and leaves a GPU mostly idle, so
engines side by side multiply what the GPU does per second (docs/engines.md)."""
from __future__ import annotations

import multiprocessing as mp
import os
import time
from collections import defaultdict
from concurrent.futures import ProcessPoolExecutor


def shares(jobs: list, n: int) -> list[list]:
    """The pivot jobs dealt by problem among at most n engines, in problem order, round robin."""
    by_problem = defaultdict(list)
    for job in jobs:
        by_problem[job.problem_id].append(job)
    out = [[] for _ in range(n)]
    for i, pid in enumerate(sorted(by_problem)):
        out[i % n] += by_problem[pid]
    return [share for share in out if share]


def _replay_share(model_path: str, device: str, dtype: str, max_batch_rows: int, jobs: list, settings, barrier,
                  threads: int) -> tuple[int, float, float]:
    """One engine's share: load, wait for the others, replay (refeed); (tokens, start, end) in wall-clock time."""
    import torch

    from ..measure.engine_hf import HFEngine
    from .measure import generated_tokens
    if device == "cpu":
        torch.set_num_threads(threads)
    engine = HFEngine(model_path, device, dtype, invariant=False, max_batch_rows=max_batch_rows)
    barrier.wait()
    start = time.time()
    outs = engine.run_pass(jobs, "refeed", settings, None)
    return sum(generated_tokens(o) for o in outs), start, time.time()


def run(model_path: str, device: str, dtype: str, max_batch_rows: int, jobs: list, settings, n: int) -> dict:
    """Replay the jobs on n engines side by side; the aggregate and per-engine continuation tokens/s."""
    parts = shares(jobs, n)
    threads = max(1, (os.cpu_count() or 1) // len(parts))  # on a CPU the engines share its cores
    with mp.Manager() as manager, ProcessPoolExecutor(len(parts), mp_context=mp.get_context("spawn")) as pool:
        barrier = manager.Barrier(len(parts))
        results = [f.result() for f in [pool.submit(_replay_share, model_path, device, dtype, max_batch_rows, part,
                                                    settings, barrier, threads) for part in parts]]
    tokens = sum(r[0] for r in results)
    seconds = max(r[2] for r in results) - min(r[1] for r in results)
    return {"engines": len(parts), "pivots": len(jobs), "tokens": tokens, "seconds": seconds,
            "tokens_per_s": tokens / seconds if seconds > 0 else 0.0,
            "per_engine_tokens_per_s": [r[0] / (r[2] - r[1]) if r[2] > r[1] else 0.0 for r in results]}
