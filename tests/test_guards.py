"""Guards that stop before any model work: unwritable or full run directories, a GPU
configuration on a CPU machine, a task family end to end on the tiny model."""
import shutil

import pytest
import torch

from replaylib.core import paths
from replaylib.runtime import params, stagedir


def test_a_run_directory_that_cannot_be_created_is_refused(tmp_path):
    (tmp_path / "runs").write_text("a file where the runs folder should be")
    p = params.make({"config": "x"})
    with pytest.raises(OSError, match="cannot create the run directory") as e:
        stagedir.StageDir(p, "01_sampling", tmp_path).begin()
    assert "\n" not in str(e.value)


def test_a_full_disk_is_refused_before_any_work(tmp_path, monkeypatch):
    real = shutil.disk_usage
    monkeypatch.setattr(shutil, "disk_usage", lambda path: real(path)._replace(free=10 * 2**20))
    with pytest.raises(OSError, match="MiB free"):
        stagedir.StageDir(params.make({"config": "x"}), "01_sampling", tmp_path).begin()
    assert not (tmp_path / "runs" / "x" / "01_sampling" / "params.json").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only message")
def test_a_gpu_configuration_on_a_cpu_machine_is_refused(tiny_model_dir):
    from replaylib.measure.engine_hf import HFEngine
    with pytest.raises(RuntimeError, match="no CUDA GPU; set device: cpu"):
        HFEngine(tiny_model_dir, device="cuda")


def test_math500_runs_through_sampling_pivots_and_replay(tmp_path, isolated_models):
    from replaylib.runtime import outputs
    from replaylib.stages import pivots, replay, sampling
    p = params.make({**params.load(paths.REPO / "params" / "tiny.yaml").to_dict(), "task": "math500",
                     "n_problems": 1, "n_rollouts": 2, "max_trunk_tokens": 24, "max_cont_tokens": 8})
    sampling.run(p, tmp_path)
    trunks, _, problems = outputs.load_sampling(p, tmp_path)
    assert problems["kept"] == [0] and set(trunks.correct) <= {0, 1}
    pivots.run(p, tmp_path)
    records = replay.run(p, tmp_path)
    assert len(records) > 0 and records.exact_ok.all()
