"""Stage 1: sampling trunks (docs/protocol.md section 3.1), as a plan of batches, the unit that samples
one batch, and the screen that assembles them.

Per problem, N rollouts with per-rollout seeds hashed from (problem, "trunk", rollout), raw top-k
logprobs of every generated token, grading, and an optional difficulty screen that keeps a problem only
if its trunk accuracy is neither 0 nor 1. The transformers engine's decode-time KV of every trunk that
can be kept is saved (safetensors per problem) so that the replay stage, in another process, can resume
it.
"""
from __future__ import annotations

import logging

import pandas as pd

from .data import load_problems
from .grading import grade
from .seeds import trunk_seed
from .units import Kernel, Outputs, Unit

log = logging.getLogger("replaylib")


def trunk_row(t, kept=None, text=None, correct=None) -> dict:
    """One trunk as a row of the trunk table (the sampling stage's trunks.parquet, the invariant stage's
    and the benchmark's tables): its ids, tokens and raw top-k, with whichever of kept, text and
    correct the caller has, in the table's column order."""
    row = {"problem_id": t.problem_id, "rollout": t.rollout, "seed": t.seed}
    if kept is not None:
        row["kept"] = kept
    row.update({"prompt_ids": t.prompt_ids, "gen_ids": t.gen_ids, "topk_ids": t.topk_ids,
                "topk_logprobs": t.topk_logprobs})
    if text is not None:
        row["text"] = text
    if correct is not None:
        row["correct"] = correct
    row.update({"finish_reason": t.finish_reason, "n_tokens": len(t.gen_ids)})
    return row


def kept_trunks(trunks: pd.DataFrame) -> pd.DataFrame:
    """The trunks of the problems the screen kept: what the later stages measure."""
    return trunks[trunks.kept].reset_index(drop=True)


def engine_info(engine) -> dict:
    """What engine.json records about the engine (run on the engine, wherever it lives)."""
    return {"engine": engine.describe(), "stop_ids": sorted(engine.stop_ids),
            "special_ids": sorted(engine.special_ids), "kv_block_size": getattr(engine, "kv_block_size", None)}


def may_be_kept(params, correct: list) -> bool:
    """Whether the screen can keep a problem of this trunk accuracy (then its state is saved)."""
    return not params.screen_mixed or 0 < sum(correct) < len(correct)


# ---------------------------------------------------------------- plan
def plan(params, inputs, done: dict) -> list[Unit]:
    """The batches of problems to sample, in order: with the screen, one batch at a time, each scanning
    twice as many problems as are still needed (a decode step costs nearly the same for a few more rows;
    screening keeps about half), so the next batch is known once the last one is screened; without it
    every batch at once (all are kept). Kept problems are always the first ones that pass."""
    problems = load_problems(params.task)
    limit = params.scan_limit if params.screen_mixed else params.n_problems
    per_batch = max(1, params.max_batch_rows // params.n_rollouts)
    units, next_index, screen = [], params.problem_start, Screen(params)
    while len(screen.kept) < params.n_problems:
        still_needed = params.n_problems - len(screen.kept)
        wave = []
        while still_needed > 0:
            want = 2 * still_needed if params.screen_mixed else still_needed
            n = max(0, min(want, per_batch, limit - (next_index - params.problem_start), len(problems) - next_index))
            if not n:
                break
            batch = list(range(next_index, next_index + n))
            next_index += n
            wave.append(Unit(f"batch_{batch[0]:05d}", f"batch of problems {batch[0]}-{batch[-1]}",
                             ([(pid, problems[pid].question, problems[pid].gold) for pid in batch],),
                             size=len(batch) * params.n_rollouts))
            if params.screen_mixed:  # how many the next batch scans depends on what this one keeps
                break
            still_needed -= n
        units += wave
        if not wave or any(u.name not in done for u in wave):
            break
        for u in wave:
            screen.add(done[u.name]["trunks"])
    return units


# ---------------------------------------------------------------- unit
def sample_batch(engine, params, batch: list[tuple]) -> dict:
    """One unit: the trunks of one batch of problems (pid, question, gold), graded, as trunk-table rows in
    problem order; the decode-time state of each problem the screen may keep (``state_<pid>``: its
    safetensors bytes, with ``digests``: per problem and rollout the digest taken when it was produced);
    and what engine.json records of the engine."""
    from .state import state_bytes  # torch: only where an engine runs
    prompts = {pid: engine.prompt_ids(question, params.instruction, params.task) for pid, question, _ in batch}
    seeds = {(pid, r): trunk_seed(pid, r) for pid in prompts for r in range(params.n_rollouts)}
    trunks, state = engine.sample_trunks(prompts, params.n_rollouts, seeds, params.temperature, params.top_p,
                                         params.max_trunk_tokens, params.top_logprobs)
    rows, parts = [], {"engine": engine_info(engine)}
    digests = {}
    for pid, _, gold in batch:
        correct = []
        for t in trunks[pid]:
            text = engine.decode(t.gen_ids)
            correct.append(grade(text, gold, params.task))
            rows.append(trunk_row(t, text=text, correct=correct[-1]))
        if state is not None and may_be_kept(params, correct):  # the transformers engine's, for the replay
            parts[f"state_{pid:05d}"] = state_bytes(state[pid])
            digests[str(pid)] = {str(r): d for r, d in state[pid].expected.items()}
    parts["trunks"] = pd.DataFrame(rows)
    parts["digests"] = digests
    return parts


def shard_path(unit: Unit, part: str, value) -> str:
    suffix = ".safetensors" if part.startswith("state_") else ".parquet" if part == "trunks" else ".json"
    return f"shards/{unit.name}/{part}{suffix}"


# ---------------------------------------------------------------- assemble
class Screen:
    """The difficulty screen and the trunk table, problem by problem in the order sampled: a problem is kept
    while fewer than n_problems are, and (with screen_mixed) only if its trunk accuracy is neither 0 nor 1;
    every scanned problem's trunks are rows of the table, marked kept or not."""

    def __init__(self, params):
        self.params = params
        self.kept, self.frames, self.scanned = [], [], []

    def add(self, trunks: pd.DataFrame) -> list[int]:
        """One batch's trunk rows; returns the problems kept."""
        kept = []
        for pid, rows in trunks.groupby("problem_id", sort=False):
            correct = [int(c) for c in rows["correct"]]
            keep = len(self.kept) < self.params.n_problems and may_be_kept(self.params, correct)
            self.scanned.append({"problem_id": int(pid), "trunk_accuracy": sum(correct) / len(correct),
                                 "kept": keep, "prompt_tokens": len(rows["prompt_ids"].iloc[0])})
            self.frames.append(rows.assign(kept=keep))
            if keep:
                self.kept.append(int(pid))
                kept.append(int(pid))
        return kept


def assemble(params, inputs, done: dict) -> Outputs:
    """trunks.parquet (every scanned problem's trunks, marked kept), accuracy.csv, problems.json,
    engine.json and the kept problems' decode-time states."""
    problems = load_problems(params.task)
    units = [u for u in plan(params, inputs, done)]
    screen = Screen(params)
    for u in units:
        screen.add(done[u.name]["trunks"])
    if len(screen.kept) < params.n_problems:
        log.warning("kept %d of %d problems after scanning %d (scan_limit %d)", len(screen.kept), params.n_problems,
                    len(screen.scanned), params.scan_limit)
    if not screen.kept:
        raise RuntimeError(f"01_sampling: no problem passed the screen in {len(screen.scanned)} scanned; raise "
                           f"scan_limit or set screen_mixed: false")
    columns = ["problem_id", "rollout", "seed", "kept", "prompt_ids", "gen_ids", "topk_ids", "topk_logprobs",
               "text", "correct", "finish_reason", "n_tokens"]
    trunks = pd.concat(screen.frames, ignore_index=True)[columns]
    scanned = [{"problem_id": s["problem_id"], "gold": problems[s["problem_id"]].gold, **s} for s in screen.scanned]
    info = done[units[0].name]["engine"]
    files = {"trunks.parquet": trunks, "accuracy.csv": pd.DataFrame(scanned),
             "engine.json": {**info["engine"], **{k: v for k, v in info.items() if k != "engine"}},
             "problems.json": {"kept": screen.kept, "scanned": scanned}}
    # the digest of every decode-time state, taken when it was produced: the replay stage checks the
    # tensors it resumes against these, not against the saved file's own metadata
    digests = {}
    for u in units:
        for pid, per in done[u.name]["digests"].items():
            if int(pid) in screen.kept:
                files[f"state/problem_{int(pid):05d}.safetensors"] = done[u.name][f"state_{int(pid):05d}"]
                digests[pid] = per
    kept = trunks[trunks.kept]
    result = {"kept": screen.kept, "scanned": len(screen.scanned),
              "trunk_accuracy": float(trunks["correct"].mean()), "kept_accuracy": float(kept["correct"].mean())}
    return Outputs(files, {"engine": info["engine"], "state_digests": digests}, result=result)


KERNEL = Kernel(plan=plan, unit=sample_batch, assemble=assemble, shard=shard_path, keep_shards=False,
                progress=("trunks", "trunk"), count_rows=True)
