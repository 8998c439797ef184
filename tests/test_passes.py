"""The pass table (replaylib.measure.passes) is the one list of passes: a pass added as a row alone is
accepted by the parameters, run by the engine of its kind, recorded, compared and tabulated."""
from pathlib import Path

import pandas as pd
import pytest

from replaylib.measure import engines, passes
from replaylib.runtime import params

REPO = Path(__file__).resolve().parents[1]
# a stand-in pass: another replica of refeed, computed by refeed's kernel on the transformers engine only (its
# name matches no other pass's, so only the table can tell an engine or a statistic what it is)
PREFILL3 = passes.Pass("prefill3", "a fresh prefill", "refeed", "replica", "prefill3", replica_of="refeed")


@pytest.fixture
def with_prefill3(monkeypatch):
    monkeypatch.setitem(passes.PASSES, "prefill3", PREFILL3)


def test_every_row_is_complete_and_the_required_passes_lead():
    assert passes.required() == ["exact1", "exact2", "refeed"] == list(passes.PASSES)[:3]
    for row in passes.PASSES.values():
        assert row.label and row.prefix and any(engines.runs(e, row.name) for e in engines.ENGINES)
        assert row.replica_of is None or row.replica_of in passes.PASSES
    assert passes.names("transplant") == ["xplant_refeed_kv", "xplant_decode_kv"]
    with pytest.raises(ValueError, match="unknown pass 'prefill3'") as e:
        passes.get("prefill3")
    assert "\n" not in str(e.value)


def test_a_pass_added_as_a_table_row_runs_through_replay_and_statistics(with_prefill3, tmp_path):
    from replaylib.analysis import tables
    from replaylib.analysis.records import load_records
    from replaylib.stages import invariant, pivots, replay, sampling, statistics
    tiny = params.load(REPO / "params" / "tiny.yaml").to_dict()
    p = params.make({**tiny, "passes": ["exact1", "exact2", "refeed", "prefill3"]})
    # an engine runs every pass of the kinds it has kernels for (replaylib.measure.engines), and no other
    vllm = {**tiny, "engine": "vllm", "device": "cuda", "stop_at_answer": False}
    assert params.make({**vllm, "passes": p.passes}).passes == p.passes
    with pytest.raises(ValueError, match="'passes' has block16, which the vllm engine does not run.*engine: hf"):
        params.make({**vllm, "passes": p.passes + ["block16"]})
    for stage in (sampling, pivots, replay, invariant, statistics):
        stage.run(p, tmp_path)
    records = load_records(tmp_path / "runs" / "tiny" / "03_three_pass_replay" / "records.parquet")
    assert len(records) and (records["A_prefill3"] == records["A_refeed"]).all()  # refeed's kernel, again
    assert records["cont_diff_prefill3"].notna().all() and "cache_ok_prefill3" not in records  # not an exact pass
    compared = tables.table_passes({"tiny": records})
    assert {"prefill3 vs exact1", "prefill3 vs refeed"} <= set(compared["comparison"])
    written = (tmp_path / "tables" / "tiny" / "tab10_passes.md").read_text()
    assert "prefill3 vs exact1" in written and "prefill3 vs refeed" in written
    fig4 = pd.read_csv(tmp_path / "figures" / "tiny" / "fig4_passes.csv")
    assert "prefill3 vs refeed" in set(fig4["comparison"])
