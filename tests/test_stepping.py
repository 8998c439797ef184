"""Stepping through a stage: every stage offers plan and preview, a preview's rows are the full run's rows for
that unit and it writes nothing under the output root, and a notebook keeps its engine between calls."""
import html
import json
import re
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


EQUAL = "The full run's rows for the previewed unit equal the preview's, value for value."
DIFFER = "The full run's rows for the previewed unit DIFFER from the preview's."


def test_each_stage_s_preview_agrees_with_what_its_notebook_loads_and_a_changed_value_differs(tiny_finished, tmp_path):
    """The notebooks compare a preview with the run's rows as they load them: 01 outputs.trunk_table, 02 the pivot
    table and 03 the records the stage returns, 05 outputs.load_invariant (which parses the probes' JSON text)."""
    import shutil
    P = params.load(TINY)
    root = tmp_path / "root"
    shutil.copytree(tiny_finished, root)  # 02 and 03 run again here (nothing to compute: same key, same shards)
    keys = ["problem_id", "rollout", "abs_pos"]
    trunks = sampling.preview(P, None, root)
    loaded = outputs.trunk_table(root / "runs/tiny/01_sampling")
    assert stepping.agreement(trunks, loaded, ["problem_id", "rollout"], P) == EQUAL
    assert stepping.agreement(trunks.assign(n_tokens=trunks.n_tokens + 1), loaded, ["problem_id", "rollout"],
                              P) == DIFFER
    mined = pivots.preview(P, 0, root)
    pivot_table = pivots.run(P, root)
    assert stepping.agreement(mined, pivot_table, ["pivot_id"], P) == EQUAL
    assert stepping.agreement(mined.assign(margin=mined.margin + 1), pivot_table, ["pivot_id"], P) == DIFFER
    replayed = replay.preview(P, None, root)
    records = replay.run(P, root)
    assert stepping.agreement(replayed, records, keys, P) == EQUAL
    assert stepping.agreement(replayed.assign(A_refeed=replayed.A_refeed + 1), records, keys, P) == DIFFER
    inv = invariant.preview(P, None, root)
    loaded = outputs.load_invariant(P, root)
    assert isinstance(loaded.greedy_first_exact1.iloc[0], dict) and isinstance(inv.greedy_first_exact1.iloc[0], str)
    assert stepping.agreement(inv, loaded, keys, P) == EQUAL
    probe = json.loads(inv.greedy_first_exact1.iloc[0])
    probe["actual"][1] += 1e-6  # another first logprob, in the JSON text
    assert stepping.agreement(inv.assign(greedy_first_exact1=[json.dumps(probe)] * len(inv)), loaded, keys,
                              P) == DIFFER


def test_a_preview_made_with_other_values_is_named_stale_not_different(tiny_finished):
    import dataclasses
    P = params.load(TINY)
    stage = "03_three_pass_replay"
    records = pd.read_parquet(tiny_finished / "runs/tiny/03_three_pass_replay/records.parquet")
    first = records[records.problem_id == 0].reset_index(drop=True)
    keys = ["problem_id", "rollout", "abs_pos"]
    assert stepping.agreement(first, records, keys, P) == EQUAL  # no attrs: compared as they are
    made = dataclasses.replace(P, k=4)
    first.attrs["preview"] = {"stage": stage, "key": made.stage_key(stage), "source": "computed",
                              "values": {k: getattr(made, k) for k in params.Params.keys_for(stage)}}
    assert stepping.agreement(first, records, keys, P) == (
        "The preview was made with k = 4; these records with k = 2: run the preview cell again to compare.")
    first.attrs["preview"].update(key=P.stage_key(stage), values={k: getattr(P, k) for k in params.Params.keys_for(stage)})
    assert stepping.agreement(first, records, keys, P) == EQUAL
    assert stepping.agreement(first.assign(A_exact1=first.A_exact1 + 1), records, keys, P) == DIFFER


def test_the_replay_preview_shows_the_pivot_asked_for_and_refuses_one_outside_in_one_line(tiny_finished):
    P = params.load(TINY)
    first = replay.preview(P, None, tiny_finished)
    trunks = outputs.load_sampling(P, tiny_finished)[0]
    for row in (0, len(first) - 1):
        shown = stepping.replay_preview(first, P, trunks, tiny_finished, pivot=row)
        r = first.iloc[row]
        assert f"rollout {r.rollout}, generated token {r.gen_index} (absolute position {r.abs_pos})" in shown
    with pytest.raises(ValueError, match=f"pivot {len(first)} is not a row of the preview's records "
                                         f"\\(0 to {len(first) - 1}\\)") as e:
        stepping.replay_preview(first, P, trunks, tiny_finished, pivot=len(first))
    assert "\n" not in str(e.value)


def test_the_mining_and_invariant_previews_are_compact(tiny_finished):
    """02: each pivot's text before it and both tokens decoded with their logprobs, no columns of ids; 05: per pivot
    each pass's A and only the channels on which a pass differs, led by whether every pass was identical."""
    P = params.load(TINY)
    trunks = outputs.load_sampling(P, tiny_finished)[0]
    mined = pivots.preview(P, 0, tiny_finished)
    shown = stepping.pivots_preview(mined, P, trunks, rows=3)
    head, rows = html_table(shown)
    assert head == ["problem_id", "rollout", "gen_index", "margin", "before", "actual", "alternative"]
    assert len(rows) == 3 and f"The first 3 of {len(mined)} pivots." in shown
    decoded = r".+ \((-?\d+\.\d{3}|not in the top-\d+)\)"  # a token's text and its raw logprob, not its id
    assert all(re.fullmatch(decoded, r[5]) and re.fullmatch(decoded, r[6]) for r in rows)
    inv = invariant.preview(P, None, tiny_finished)
    shown = stepping.invariant_preview(inv)
    assert shown.startswith("<p>All passes identical at every pivot (1 of 1)")
    assert html_table(shown)[0] == ["problem_id", "rollout", "position", "A_exact1", "A_exact2", "A_refeed"]
    shown = stepping.invariant_preview(inv.assign(greedy_divergence_refeed=True))
    assert "Passes differ at 1 of 1 pivots, on: probe tokens differ." in shown
    assert html_table(shown)[0][-2:] == ["probe tokens differ, exact2", "probe tokens differ, refeed"]


def html_table(text: str) -> tuple[list[str], list[list[str]]]:
    """A frame's to_html: its header and its rows' cells, as text."""
    head = [html.unescape(h) for h in re.findall(r"<th>(.*?)</th>", text)]
    rows = [[html.unescape(c) for c in re.findall(r"<td>(.*?)</td>", row, re.S)]
            for row in re.findall(r"<tr>(.*?)</tr>", text.split("<tbody>")[1], re.S)]
    return head, rows


def test_the_closing_cell_names_where_the_results_are_and_the_next_notebook(tmp_path):
    P = params.load(TINY)
    text = stepping.next_step(P, "03_three_pass_replay", tmp_path)
    assert text == (f"This stage's results are in `{tmp_path}/runs/tiny/03_three_pass_replay/`. Next: "
                    f"`notebooks/05_batch_invariant.ipynb`, with `config = 'tiny'` in its parameters cell.")
    assert "`runs/tiny/01_sampling/`. Next: `notebooks/02_pivot_mining.ipynb`" in stepping.next_step(P, "01_sampling")
    assert "Next: `notebooks/04_statistics.ipynb`" in stepping.next_step(P, "05_batch_invariant")
    last = stepping.next_step(P, "04_statistics", tmp_path)
    assert f"its tables in `{tmp_path}/tables/tiny/` and its figures in `{tmp_path}/figures/tiny/`" in last
    assert "This is the last stage" in last and "Next:" not in last


def test_a_unit_s_repr_is_its_name_label_and_size():
    from replaylib.measure.units import Unit
    unit = Unit("problem_00000", "problem 0", (pd.DataFrame({"x": range(1000)}),), 18)
    assert repr(unit) == "Unit(name='problem_00000', label='problem 0', size=18)"
