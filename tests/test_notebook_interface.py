"""The stage notebooks as a researcher uses them: "Run All" on a finished run reads it (no unit computed, no file
under the output root written), a run after a preview takes the unit the preview computed, every route to a
stage (the notebook, papermill, the runner, ``make stage``) treats an up-to-date stage alike, and a notebook
runs the configuration its ``config`` names."""
import hashlib
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from replaylib.measure.engines import FACTORY_ENV
from replaylib.runtime import params
from replaylib.runtime.registry import RUN_ORDER

REPO = Path(__file__).resolve().parents[1]
TINY = REPO / "params" / "tiny.yaml"


def state(root: Path) -> dict:
    """Every file under an output root (not the stage locks) with its sha256 and modification time."""
    return {str(p.relative_to(root)): (hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_mtime_ns)
            for p in sorted(root.rglob("*")) if p.is_file() and ".locks" not in p.parts}


def execute(stage: str, root: Path, where: Path, **values) -> str:
    """A stage notebook executed with papermill, given only these values (as a person would); its outputs'
    text."""
    import papermill
    executed = where / f"{stage}.ipynb"
    papermill.execute_notebook(str(REPO / "notebooks" / f"{stage}.ipynb"), str(executed),
                               parameters={"out_dir": str(root), **values}, cwd=str(REPO), kernel_name="python3",
                               progress_bar=False)
    return executed.read_text()


@pytest.fixture
def root(tiny_finished, tmp_path):
    out = tmp_path / "root"
    shutil.copytree(tiny_finished, out)
    return out


def test_run_all_on_a_finished_run_computes_nothing_and_writes_nothing(root, tmp_path, monkeypatch):
    """Every stage notebook, top to bottom with its preview, on a finished up-to-date tiny run: each preview
    and each compute cell read the finished stage, no engine starts (one would stop the notebook) and every
    file under the output root keeps its bytes and its modification time."""
    monkeypatch.setenv(FACTORY_ENV, "no_engine:refuse")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(REPO / "tests"), str(REPO)]))
    before = state(root)
    for stage in RUN_ORDER:
        text = execute(stage, root, tmp_path, config="tiny", preview=True)
        assert f"{stage}: up to date" in text and "read from the finished stage" in text, stage
    assert state(root) == before


def test_a_run_after_a_preview_takes_the_previewed_unit(root):
    """A stage that has not run: its preview computes one unit, kept in memory, and the run takes it (one unit
    fewer to compute) to the same bytes as an uninterrupted run."""
    from replaylib.stages import pivots, replay
    P = params.load(TINY)
    for stage, module, expected in (("03_three_pass_replay", replay, {"computed": 1, "from_preview": 1, "reused": 0}),
                                    ("02_pivot_mining", pivots, {"computed": 0, "from_preview": 1, "reused": 0})):
        path = root / "runs" / "tiny" / stage
        finished = {p.name: p.read_bytes() for p in path.glob("*.parquet")}
        (path / "DONE").unlink()
        shutil.rmtree(path / "shards", ignore_errors=True)
        (path / "resume.json").unlink(missing_ok=True)
        first = module.preview(P, 0, root)
        assert first.attrs["preview"]["source"] == "computed" and first.attrs["preview"]["key"] == P.stage_key(stage)
        module.run(P, root)
        assert json.loads((path / "manifest.json").read_text())["units"] == expected, stage
        assert {p.name: p.read_bytes() for p in path.glob("*.parquet")} == finished, stage
        again = module.preview(P, 0, root)  # finished now: read, not computed
        assert again.attrs["preview"]["source"] == "finished run"


def test_every_route_leaves_an_up_to_date_stage_as_it_is(root, tmp_path):
    """make stage, the runner's --set with the configuration's own value, and papermill with the notebook's
    own defaults: none recomputes an up-to-date stage or writes a file."""
    before = state(root)
    made = subprocess.run(["make", "--no-print-directory", "stage", "STAGE=03", "CONFIG=tiny", f"ARGS=--out {root}"],
                          cwd=REPO, capture_output=True, text=True, timeout=600)
    assert made.returncode == 0, made.stderr
    assert "ran        nothing: every stage was up to date" in made.stdout
    ran = subprocess.run([str(Path(os.sys.executable)), "-m", "replaylib.run", str(TINY), "--set", "k=2", "--upto", "03",
                          "--out", str(root)], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert ran.returncode == 0 and "ran        nothing: every stage was up to date" in ran.stdout, ran.stderr
    text = execute("03_three_pass_replay", root, tmp_path, config="tiny", preview=False, k=2)
    assert "03_three_pass_replay: up to date" in text
    assert state(root) == before


def test_a_notebook_runs_the_configuration_it_names(root, tmp_path):
    """Notebook 01 given n_rollouts = 4 runs tiny's values with that change into a run of its own; notebook 02
    given only that run's name takes every other value from it (tiny's, not the cell's embedded literals);
    papermill's -p k 4 (the cell's own literal) is a change too, and where the name it would take is a params
    file of other values (params/tiny-k4.yaml), the run gets a name of its own."""
    before = state(root / "runs" / "tiny")
    text = execute("01_sampling", root, tmp_path, config="tiny", preview=False, n_rollouts=4)
    assert "changed here: n_rollouts = 4" in text and "this run goes to runs/tiny-n_rollouts4/" in text
    execute("02_pivot_mining", root, tmp_path, config="tiny-n_rollouts4", preview=False)
    mined = json.loads((root / "runs" / "tiny-n_rollouts4" / "02_pivot_mining" / "params.json").read_text())["params"]
    tiny = params.load(TINY)
    assert mined["n_rollouts"] == 4 and mined["min_rollout_tokens"] == tiny.min_rollout_tokens == 8
    assert mined["max_pivots_per_rollout"] == tiny.max_pivots_per_rollout == 2
    assert state(root / "runs" / "tiny") == before
    text = execute("03_three_pass_replay", root, tmp_path, config="tiny", preview=False, k=4)
    assert "params/tiny-k4.yaml holds run tiny-k4 with other values" in text
    named = [p.name for p in (root / "runs").iterdir() if p.name.startswith("tiny-k4-")]
    assert len(named) == 1 and not (root / "runs" / "tiny-k4").exists()
    replayed = json.loads((root / "runs" / named[0] / "03_three_pass_replay" / "params.json").read_text())["params"]
    assert replayed["k"] == 4 and replayed["max_cont_tokens"] == tiny.max_cont_tokens == 12
    assert state(root / "runs" / "tiny") == before


def test_forcing_two_stages_leaves_one_between_them_that_reads_the_same_inputs(root):
    """--force on stages 02 and 04: 02 recomputes to the same bytes, so stage 03 between them (which 04 reads)
    is read, not recomputed: its records keep their bytes and its manifest says nothing was computed again."""
    replay = root / "runs" / "tiny" / "03_three_pass_replay"
    records = (replay / "records.parquet").read_bytes()
    manifest = (replay / "manifest.json").read_bytes()
    ran = subprocess.run([os.sys.executable, "-m", "replaylib.run", str(TINY), "02_pivot_mining", "04_statistics",
                          "--force", "--out", str(root)], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert ran.returncode == 0, ran.stderr
    assert "03_three_pass_replay: up to date" in (replay / "03_three_pass_replay.ipynb").read_text()
    assert (replay / "records.parquet").read_bytes() == records and (replay / "manifest.json").read_bytes() == manifest
    assert json.loads((root / "runs" / "tiny" / "02_pivot_mining" / "manifest.json").read_text())["units"]["computed"]
