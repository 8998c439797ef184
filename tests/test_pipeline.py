"""All five stage notebooks through the runner on params/tiny.yaml, in a temporary directory."""
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from replaylib import params, rundir
from replaylib.params import STAGES
from replaylib.run import main, plan

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("out")
    assert main([str(REPO / "params" / "tiny.yaml"), "--out", str(out)]) == 0
    return out


def test_every_stage_finishes_with_manifest_and_notebook(tiny_run):
    for stage in STAGES:
        d = tiny_run / "runs" / "tiny" / stage
        assert (d / "DONE").exists() and (d / f"{stage}.ipynb").exists()
        manifest = json.loads((d / "manifest.json").read_text())
        assert manifest["key"] == params.load(REPO / "params" / "tiny.yaml").stage_key(stage)
        assert {"git", "versions", "device", "inputs", "outputs"} <= set(manifest)
    assert rundir.verify_run(tiny_run / "runs" / "tiny") == []


def test_records_follow_the_published_schema(tiny_run):
    from replaylib.records import REQUIRED, load_records
    recs = load_records(tiny_run / "runs" / "tiny" / "03_three_pass_replay" / "records.parquet")
    assert len(recs) > 0 and set(REQUIRED) <= set(recs.columns)
    for name in ("exact1", "exact2", "refeed"):
        k = 2  # params/tiny.yaml
        assert ((recs[f"A_{name}"] * k).round() == recs[f"A_{name}"] * k).all()
        assert recs[f"A_{name}"].between(-1, 1).all()
    assert recs.exact_ok.all()
    assert (recs.A_exact1 == recs.A_exact2).all()  # one deterministic process: the replica is exact


def test_tables_and_figures_are_written(tiny_run):
    assert (tiny_run / "tables" / "tiny" / "tab1_main.md").exists()
    for name in ("fig1_quadrants", "fig2_configs", "fig3_logprob_ecdf"):
        assert (tiny_run / "figures" / "tiny" / f"{name}.pdf").exists()
    inv = json.loads((tiny_run / "runs" / "tiny" / "05_batch_invariant" / "invariant.json").read_text())
    assert inv["all_identical"] is True


def test_rerun_is_a_no_op_and_a_change_reruns_only_what_it_invalidates(tiny_run, tmp_path):
    tiny = params.load(REPO / "params" / "tiny.yaml")
    assert plan(tiny, [], False, tiny_run) == []
    changed = params.make({**{k: v for k, v in tiny.to_dict().items()}, "bootstrap_draws": 20})
    assert [s for s, _ in plan(changed, [], False, tiny_run)] == ["04_statistics"]
    changed = params.make({**tiny.to_dict(), "k": 3})
    assert [s for s, _ in plan(changed, [], False, tiny_run)] == ["03_three_pass_replay", "05_batch_invariant",
                                                                   "04_statistics"]
    assert [s for s, _ in plan(tiny, ["02_pivot_mining"], False, tiny_run)] == ["02_pivot_mining"]


def test_a_stage_refuses_an_upstream_made_with_other_parameters(tiny_run):
    other = params.make({**params.load(REPO / "params" / "tiny.yaml").to_dict(), "margin_threshold": 0.5})
    stage = rundir.StageDir(other, "03_three_pass_replay", tiny_run)
    with pytest.raises(rundir.UpstreamError, match="margin_threshold: 1.0 there, 0.5 here"):
        stage.check_upstream("02_pivot_mining")


def test_a_modified_upstream_file_is_refused(tiny_run, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(tiny_run, copy)
    (copy / "runs" / "tiny" / "02_pivot_mining" / "pivots.parquet").write_bytes(b"changed")
    tiny = params.load(REPO / "params" / "tiny.yaml")
    with pytest.raises(rundir.UpstreamError, match="changed or missing"):
        rundir.StageDir(tiny, "03_three_pass_replay", copy).check_upstream("02_pivot_mining")
    assert any("sha256 differs" in p for p in rundir.verify_run(copy / "runs" / "tiny"))


def test_runner_refuses_unknown_parameters_in_one_line(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("config: bad\nmax_cont_token: 3\n")
    proc = subprocess.run([sys.executable, "-m", "replaylib.run", str(bad), "--out", str(tmp_path)],
                          capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and "max_cont_token" in proc.stderr
    assert not (tmp_path / "runs").exists()
    proc = subprocess.run([sys.executable, "-m", "replaylib.run", str(REPO / "params" / "tiny.yaml"), "stage9"],
                          capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 2 and "unknown stage" in proc.stderr
