"""Stepping through a stage: every stage offers plan and preview, a preview's rows are the full run's rows for
that unit and it writes nothing under the output root, and a notebook keeps its engine between calls."""
import json
from pathlib import Path

import pandas as pd
import pytest

from replaylib.display import stepping
from replaylib.runtime import outputs, params
from replaylib.stages import invariant, pivots, replay, sampling, statistics

REPO = Path(__file__).resolve().parents[1]
TINY = REPO / "params" / "tiny.yaml"


def snapshot(root: Path) -> dict:
    """Every file under an output root with its bytes' size and modification time."""
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns) for p in root.rglob("*") if p.is_file()}


def test_stage_03_s_preview_equals_its_records_for_that_unit_and_writes_nothing(tiny_finished):
    P = params.load(TINY)
    before = snapshot(tiny_finished)
    units = replay.plan(P, tiny_finished)
    assert [u.name for u in units] == ["problem_00000", "problem_00001"] and units[0].size == 18
    first = replay.preview(P, units[0], tiny_finished)
    records = pd.read_parquet(tiny_finished / "runs/tiny/03_three_pass_replay/records.parquet")
    assert len(first) == 6 and set(first.problem_id) == {0}
    assert stepping.same_rows(first, records, ["problem_id", "rollout", "abs_pos"])
    assert stepping.same_rows(first.assign(A_refeed=first.A_refeed + 1), records,
                              ["problem_id", "rollout", "abs_pos"]) is False  # the comparison can fail
    assert replay.preview(P, "problem_00001", tiny_finished).problem_id.unique().tolist() == [1]
    assert snapshot(tiny_finished) == before


def test_every_stage_s_preview_is_its_run_s_rows(tiny_finished):
    P = params.load(TINY)
    root = tiny_finished
    before = snapshot(root)
    first = sampling.preview(P, None, root)  # the first batch: every trunk of problems 0 and 1
    trunks = outputs.trunk_table(root / "runs/tiny/01_sampling")
    assert len(sampling.plan(P, root)) == 1 and len(first) == 6
    assert stepping.same_rows(first, trunks, ["problem_id", "rollout"])
    mined = pivots.preview(P, 0, root)
    assert stepping.same_rows(mined, outputs.load_pivots(P, root), ["pivot_id"])
    inv = invariant.preview(P, None, root)
    recorded = pd.read_parquet(root / "runs/tiny/05_batch_invariant/records.parquet")
    assert stepping.same_rows(inv, recorded, ["problem_id", "rollout", "abs_pos"])
    table1 = statistics.preview(P, None, root)
    written = pd.read_csv(root / "tables/tiny/tab1_main.csv", dtype=str, keep_default_na=False)
    assert table1.astype(str).replace({"nan": "", "None": ""}).values.tolist() == written.values.tolist()
    assert snapshot(root) == before


def test_a_notebook_keeps_its_engine_while_what_builds_it_stays_the_same(tiny_model_dir):
    """In a Jupyter kernel a preview, the stage and a rerun with another k share one engine; another model
    builds another (the old one closed)."""
    from replaylib.runtime import executor
    P = params.make({"config": "keep", "model": tiny_model_dir})
    try:
        a = executor.LocalExecutor(P, keep=True)
        engine = a.engine
        a.close()
        assert engine.model is not None  # kept open for the next call
        b = executor.LocalExecutor(params.make({"config": "keep", "model": tiny_model_dir, "k": 2}), keep=True)
        assert b.engine is engine
        c = executor.LocalExecutor(params.make({"config": "keep", "model": tiny_model_dir, "max_batch_rows": 7}),
                                   keep=True)
        assert c.engine is not engine and engine.model is None  # rebuilt; the old one closed
        d = executor.LocalExecutor(P, keep=False)
        assert d.engine is not c.engine
        d.close()
    finally:
        executor.close_kept_engine()


def test_a_unit_that_is_not_in_the_plan_is_one_line(tiny_finished):
    with pytest.raises(ValueError, match="no unit named 'problem_09999'") as e:
        replay.preview(params.load(TINY), "problem_09999", tiny_finished)
    assert "\n" not in str(e.value)


def test_the_plan_and_preview_read_a_renamed_run_s_shared_stages_where_they_are(tiny_finished, tmp_path):
    """Before a run of its own for changed values has copied its shared stages (its notebook plans and
    previews first), they are read from the finished run with the same key; nothing is copied yet."""
    import dataclasses
    import shutil
    root = tmp_path / "root"
    shutil.copytree(tiny_finished, root)
    renamed = dataclasses.replace(params.load(TINY), k=1, config="tiny-k1")
    units = replay.plan(renamed, root)
    assert len(units) == 2 and not (root / "runs" / "tiny-k1").exists()
    recorded = json.loads((root / "runs/tiny/01_sampling/manifest.json").read_text())
    assert outputs.sampling_dir(renamed, root) == root / "runs/tiny/01_sampling" and recorded["outputs"]
