"""The readers of the stages' outputs (runs/<config>/<stage>/), for the drivers, the notebooks' displays,
the report site and the tests: every table is checked against its column schema as it is read, so a
received run's files are refused in one line naming the file and the column."""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from ..analysis.records import check_columns, load_records
from ..core.paths import stage_dir
from ..measure import sampling

SAMPLING, PIVOTS, REPLAY, INVARIANT = "01_sampling", "02_pivot_mining", "03_three_pass_replay", "05_batch_invariant"

# the trunk table's columns and their types (records.check_columns)
TRUNK_COLUMNS = {"problem_id": "id", "rollout": "id", "seed": "int", "kept": "bool", "prompt_ids": "ids",
                 "gen_ids": "ids", "topk_ids": "ids per token", "topk_logprobs": "numbers per token", "text": "text",
                 "correct": "int", "finish_reason": "text", "n_tokens": "int"}
PIVOT_COLUMNS = {"pivot_id": "int", "problem_id": "id", "rollout": "id", "gen_index": "id", "abs_pos": "id",
                 "margin": "number", "actual": "id", "alt": "id", "rollout_correct": "int"}


def trunk_table(stage: Path) -> pd.DataFrame:
    """A stage-1 directory's trunk table (every scanned problem's trunks), checked against its schema."""
    return check_columns(pd.read_parquet(stage / "trunks.parquet"), stage / "trunks.parquet", TRUNK_COLUMNS)


def kept_trunks(stage: Path) -> pd.DataFrame:
    """A stage-1 directory's trunks of the kept problems, checked against the trunk table's schema."""
    return sampling.kept_trunks(trunk_table(stage))


def located(params, stage: str, out_dir=None) -> Path:
    """Where a configuration's finished stage is: its own run directory, or, for a run of its own for
    changed values that has not copied it yet (a notebook's plan and preview come before its stage runs),
    another configuration's finished stage with the same key (runtime.stage_copy.find_stage_elsewhere)."""
    from .stage_copy import find_stage_elsewhere
    own = stage_dir(params.config, stage, out_dir)
    if (own / "DONE").exists():
        return own
    return find_stage_elsewhere(params, stage, out_dir, exclude=params.config) or own


def load_sampling(params, out_dir=None) -> tuple[pd.DataFrame, dict, dict]:
    """Stage 1's trunks (kept problems), engine info and problem list."""
    path = sampling_dir(params, out_dir)
    return (kept_trunks(path), json.loads((path / "engine.json").read_text()),
            json.loads((path / "problems.json").read_text()))


def sampling_dir(params, out_dir=None) -> Path:
    return located(params, SAMPLING, out_dir)


def state_digests(params, out_dir=None) -> dict:
    """problem_id -> {rollout: digest of its decode-time state when it was produced} (empty for vLLM), from
    stage 1's manifest."""
    manifest = json.loads((sampling_dir(params, out_dir) / "manifest.json").read_text())
    return {int(pid): {int(r): d for r, d in per.items()} for pid, per in manifest.get("state_digests", {}).items()}


def read_pivots(path: Path) -> pd.DataFrame:
    """A pivot table, checked against its schema."""
    return check_columns(pd.read_parquet(path), path, PIVOT_COLUMNS)


def load_pivots(params, out_dir=None) -> pd.DataFrame:
    return read_pivots(located(params, PIVOTS, out_dir) / "pivots.parquet")


def load_margins(params, out_dir=None) -> pd.DataFrame:
    """Stage 2's margin of every generated token of the kept trunks."""
    return pd.read_parquet(located(params, PIVOTS, out_dir) / "margins.parquet")


def load_replay(params, out_dir=None) -> pd.DataFrame:
    """Stage 3's records, validated and parsed like any record file (replaylib.analysis.records)."""
    return load_records(stage_dir(params.config, REPLAY, out_dir) / "records.parquet")


def replay_finished(params, out_dir=None) -> bool:
    return (stage_dir(params.config, REPLAY, out_dir) / "DONE").exists()


def load_layer_profile(params, out_dir=None) -> pd.DataFrame | None:
    """[ours] Stage 3's layer_profile.parquet, or None where the run has none."""
    path = stage_dir(params.config, REPLAY, out_dir) / "layer_profile.parquet"
    return pd.read_parquet(path) if path.exists() else None


def invariant_table(params, out_dir=None) -> pd.DataFrame:
    """Stage 5's records.parquet as written (a finished stage's rows for its one unit)."""
    return pd.read_parquet(stage_dir(params.config, INVARIANT, out_dir) / "records.parquet")


def load_invariant(params, out_dir=None) -> pd.DataFrame:
    """Stage 5's records."""
    return load_records(stage_dir(params.config, INVARIANT, out_dir) / "records.parquet")
