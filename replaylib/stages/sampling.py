"""Stage 1: sampling trunks (docs/protocol.md section 3.1).

Per problem, N rollouts with per-rollout seeds hashed from (problem, "trunk", rollout),
raw top-k logprobs of every generated token, grading, and an optional difficulty screen
that keeps a problem only if its trunk accuracy is neither 0 nor 1. The transformers
engine's decode-time KV of every kept trunk is saved (safetensors per problem) so that
the replay stage, in another process, can resume it.
"""
from __future__ import annotations

import json
import logging
import time

import pandas as pd

from ..core import progress
from ..core.files import atomic_save, atomic_write_json
from ..measure.data import load_problems
from ..measure.sampling import (
    batch_wave,
    engine_info,
    sample_batch,
    screen_batches,
    trunk_row,
)
from ..measure.state import save_state
from ..runtime.executor import lease_record, make_executor
from ..runtime.params import Params
from ..runtime.rundir import StageDir

log = logging.getLogger("replaylib")
STAGE = "01_sampling"


def run(params: Params, out_dir=None) -> dict:
    """Sample, grade and screen trunks; write problems.json, trunks.parquet, state/, accuracy.csv."""
    problems = load_problems(params.task)  # problem_start and n_problems are within it (params.make)
    stage = StageDir(params, STAGE, out_dir).begin()
    started = time.perf_counter()
    ex = make_executor(params, stage=STAGE)
    seconds = {"engine start": round(time.perf_counter() - started, 2)}
    started = time.perf_counter()
    try:
        info = ex.call(engine_info)
        log.info("config %s, stage %s, engine %s (executor %s)", params.config, STAGE, info["engine"], ex.name)
        take = screen_batches(params, len(problems))
        accepted, rows, scanned, digests = [], [], [], {}
        # a local engine advances the line as its trunks finish; Ray actors' trunks are counted as batches return
        bar = progress.bar(stage.path, "trunks", 0, "trunk", count_rows=ex.reports_progress)
        while len(accepted) < params.n_problems:
            wave = batch_wave(params, take, params.n_problems - len(accepted))
            if not wave:
                break
            units = [(f"{STAGE} batch of problems {b[0]}-{b[-1]}",
                      (params, [(pid, problems[pid].question, problems[pid].gold) for pid in b])) for b in wave]
            bar.add_total(sum(len(b) for b in wave) * params.n_rollouts)
            for _, (sampled, state) in ex.map(sample_batch, units):
                if not ex.reports_progress:
                    bar.update(sum(len(got["trunks"]) for got in sampled.values()))
                for pid, got in sampled.items():
                    accuracy = sum(got["correct"]) / len(got["correct"])
                    keep = len(accepted) < params.n_problems and (not params.screen_mixed or 0 < accuracy < 1)
                    scanned.append({"problem_id": pid, "gold": problems[pid].gold, "trunk_accuracy": accuracy,
                                    "kept": keep, "prompt_tokens": len(got["prompt"])})
                    for t, ok, text in zip(got["trunks"], got["correct"], got["texts"]):
                        rows.append(trunk_row(t, kept=keep, text=text, correct=ok))
                    if keep:
                        accepted.append(pid)
                        if state is not None:  # the transformers engine's decode-time KV, for the replay stage
                            save_state(state[pid], stage.file(f"state/problem_{pid:05d}.safetensors"))
                            digests[str(pid)] = {str(r): d for r, d in state[pid].expected.items()}
        seconds["trunks"] = round(time.perf_counter() - started, 2)
        started = time.perf_counter()
    finally:
        ex.close()
    seconds["engine stop"] = round(time.perf_counter() - started, 2)
    bar.close()
    if len(accepted) < params.n_problems:
        log.warning("kept %d of %d problems after scanning %d (scan_limit %d)", len(accepted), params.n_problems,
                    len(scanned), params.scan_limit)
    if not accepted:
        raise RuntimeError(f"{STAGE}: no problem passed the screen in {len(scanned)} scanned; raise scan_limit "
                           f"or set screen_mixed: false")
    trunks_df = pd.DataFrame(rows)
    accuracy = pd.DataFrame(scanned)
    atomic_save(stage.file("trunks.parquet"), lambda tmp: trunks_df.to_parquet(tmp, index=False))
    atomic_save(stage.file("accuracy.csv"), lambda tmp: accuracy.to_csv(tmp, index=False))
    atomic_write_json(stage.file("engine.json"), {**info["engine"], **{k: v for k, v in info.items() if k != "engine"}})
    atomic_write_json(stage.file("problems.json"), {"kept": accepted, "scanned": scanned})
    outputs = ["trunks.parquet", "accuracy.csv", "engine.json", "problems.json"]
    outputs += sorted(str(p.relative_to(stage.path)) for p in (stage.path / "state").glob("*.safetensors"))
    # the digest of every decode-time state, taken when it was produced: the replay stage checks the
    # tensors it resumes against these, not against the saved file's own metadata
    stage.finish(outputs, {"engine": info["engine"], "state_digests": digests, "seconds": seconds,
                           **lease_record(ex)})
    return {"kept": accepted, "scanned": len(scanned), "trunk_accuracy": float(trunks_df["correct"].mean()),
            "kept_accuracy": float(trunks_df[trunks_df.kept]["correct"].mean())}


def state_digests(params: Params, out_dir=None) -> dict:
    """problem_id -> {rollout: digest of its decode-time state when it was produced} (empty for vLLM)."""
    manifest = json.loads((StageDir(params, STAGE, out_dir).path / "manifest.json").read_text())
    return {int(pid): {int(r): d for r, d in per.items()} for pid, per in manifest.get("state_digests", {}).items()}


# the trunk table's columns and their types (records.check_columns)
TRUNK_COLUMNS = {"problem_id": "id", "rollout": "id", "seed": "int", "kept": "bool", "prompt_ids": "ids",
                 "gen_ids": "ids", "topk_ids": "ids per token", "topk_logprobs": "numbers per token", "text": "text",
                 "correct": "int", "finish_reason": "text", "n_tokens": "int"}


def load(params: Params, out_dir=None) -> tuple[pd.DataFrame, dict, dict]:
    """The sampling stage's trunks (kept problems), engine info and problem list."""
    from ..analysis.records import check_columns
    path = StageDir(params, STAGE, out_dir).path
    trunks = check_columns(pd.read_parquet(path / "trunks.parquet"), path / "trunks.parquet", TRUNK_COLUMNS)
    return (trunks[trunks.kept].reset_index(drop=True), json.loads((path / "engine.json").read_text()),
            json.loads((path / "problems.json").read_text()))
