import os
import sys
from pathlib import Path

import pytest

# `make test` runs the tests in two processes, each starting kernels, engines and Ray actors with torch's
# threads: idle OpenMP threads then sleep rather than spin on cores the other process computes on (the same
# threads, so the same sums)
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tools"))  # the repository tools the tests check (make_notebooks, readme_tables)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """A tiny random-weight Qwen2 model (hidden 128: large enough that prefill and decode
    kernels round differently, as in real models), built from a config in seconds."""
    from replaylib.measure.models import build_tiny_model
    return str(build_tiny_model(tmp_path_factory.mktemp("tiny") / "model", seed=0, hidden_size=128))


@pytest.fixture(scope="session")
def tiny_engine(tiny_model_dir):
    from replaylib.measure.engine_hf import HFEngine
    return HFEngine(tiny_model_dir, "cpu", "bfloat16", invariant=False, max_batch_rows=64)


@pytest.fixture(scope="session")
def tiny_invariant_engine(tiny_model_dir):
    from replaylib.measure.engine_hf import HFEngine
    return HFEngine(tiny_model_dir, "cpu", "bfloat16", invariant=True)


@pytest.fixture
def isolated_models(tmp_path, monkeypatch):
    monkeypatch.setenv("REPLAYLIB_MODELS", str(tmp_path / "models"))
    return tmp_path / "models"


def slow_enabled() -> bool:
    return os.environ.get("REPLAYLIB_SLOW") == "1"


@pytest.fixture(scope="session")
def tiny_finished(tmp_path_factory):
    """One finished tiny run (every stage through the runner), shared: tests copy it before changing it."""
    from replaylib.run import main
    out = tmp_path_factory.mktemp("tiny-finished")
    assert main([str(REPO / "params" / "tiny.yaml"), "--out", str(out)]) == 0
    return out
