"""Sampling trunks."""
from __future__ import annotations

import pandas as pd

from .grading import grade
from .seeds import trunk_seed


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


def screen_batches(params, n_total: int):
    """Problem indices to scan, in batches: twice as many as still needed, within the scan limit."""
    scanned, next_index = 0, params.problem_start
    limit = params.scan_limit if params.screen_mixed else params.n_problems
    per_batch = max(1, params.max_batch_rows // params.n_rollouts)

    def take(still_needed: int) -> list[int]:
        nonlocal scanned, next_index
        # screening keeps about half of the problems: scan twice what is still needed in one batch (a
        # decode step costs nearly the same for a few more rows); kept problems are still the first ones
        want = 2 * still_needed if params.screen_mixed else still_needed
        n = max(0, min(want, per_batch, limit - scanned, n_total - next_index))
        batch = list(range(next_index, next_index + n))
        scanned, next_index = scanned + n, next_index + n
        return batch
    return take


def batch_wave(params, take, still_needed: int) -> list[list[int]]:
    """The next batches to sample, as they would be taken one by one: with the screen, one batch
    (how many the next one scans depends on how many this one keeps); without it every batch at
    once (all are kept), so an executor with several engines samples them side by side."""
    if params.screen_mixed:
        return [b for b in [take(still_needed)] if b]
    wave = []
    while still_needed > 0 and (batch := take(still_needed)):
        wave.append(batch)
        still_needed -= len(batch)
    return wave


def engine_info(engine) -> dict:
    """What engine.json records about the engine (run on the engine, wherever it lives)."""
    return {"engine": engine.describe(), "stop_ids": sorted(engine.stop_ids),
            "special_ids": sorted(engine.special_ids), "kv_block_size": getattr(engine, "kv_block_size", None)}


def sample_batch(engine, params, batch: list[tuple]) -> tuple[dict, dict | None]:
    """One unit of stage 01: the trunks of one batch of problems (pid, question, gold), graded.
    Returns ({pid: prompt, trunks, correct, texts}, decode-time state by problem or None)."""
    prompts = {pid: engine.prompt_ids(question, params.instruction) for pid, question, _ in batch}
    seeds = {(pid, r): trunk_seed(pid, r) for pid in prompts for r in range(params.n_rollouts)}
    trunks, state = engine.sample_trunks(prompts, params.n_rollouts, seeds, params.temperature, params.top_p,
                                         params.max_trunk_tokens, params.top_logprobs)
    out = {}
    for pid, _, gold in batch:
        texts = [engine.decode(t.gen_ids) for t in trunks[pid]]
        out[pid] = {"prompt": prompts[pid], "trunks": trunks[pid], "texts": texts,
                    "correct": [grade(text, gold, params.task) for text in texts]}
    return out, state


class Screen:
    """The difficulty screen and the trunk table, problem by problem in the order sampled: a problem is kept
    while fewer than n_problems are, and (with screen_mixed) only if its trunk accuracy is neither 0 nor 1;
    every scanned problem's trunks are rows of the table, marked kept or not."""

    def __init__(self, params, problems):
        self.params, self.problems = params, problems  # problems: the task's, by problem id
        self.kept, self.rows, self.scanned = [], [], []

    def add(self, sampled: dict) -> list[int]:
        """One batch's sampled problems ({pid: prompt, trunks, correct, texts}); returns those kept."""
        kept = []
        for pid, got in sampled.items():
            accuracy = sum(got["correct"]) / len(got["correct"])
            keep = len(self.kept) < self.params.n_problems and (not self.params.screen_mixed or 0 < accuracy < 1)
            self.scanned.append({"problem_id": pid, "gold": self.problems[pid].gold, "trunk_accuracy": accuracy,
                                 "kept": keep, "prompt_tokens": len(got["prompt"])})
            for t, ok, text in zip(got["trunks"], got["correct"], got["texts"]):
                self.rows.append(trunk_row(t, kept=keep, text=text, correct=ok))
            if keep:
                self.kept.append(pid)
                kept.append(pid)
        return kept

    def trunks(self) -> pd.DataFrame:
        return pd.DataFrame(self.rows)

    def accuracy(self) -> pd.DataFrame:
        return pd.DataFrame(self.scanned)

    def problem_list(self) -> dict:
        """problems.json: the kept problems in order, and every scanned one."""
        return {"kept": self.kept, "scanned": self.scanned}


def engine_record(info: dict) -> dict:
    """engine.json: the engine's description, then its stop and special ids and block size."""
    return {**info["engine"], **{k: v for k, v in info.items() if k != "engine"}}
