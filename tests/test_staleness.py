"""Stale results are never reused: partial shards, changed code and changed upstream outputs.

Each test works on a copy of one finished tiny run (all five notebooks through the runner).
"""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from replaylib.run import main

REPO = Path(__file__).resolve().parents[1]
REPLAY = "runs/tiny/03_three_pass_replay"


@pytest.fixture
def finished(tiny_finished):
    return tiny_finished


def tamper_shard(out: Path, rewrite_resume: bool) -> float:
    """Change A_exact1 of the first record of a finished shard; optionally record the new bytes as
    if they had been written under the current resume key. Returns the original value."""
    from replaylib.core.files import sha256_file
    stage = out / REPLAY
    shard = sorted((stage / "shards").glob("*.parquet"))[0]
    df = pd.read_parquet(shard)
    original = float(df.loc[0, "A_exact1"])
    df.loc[0, "A_exact1"] = 0.875  # not a multiple of 1/K = 1/2: no real run produces it
    df.to_parquet(shard, index=False)
    if rewrite_resume and (stage / "resume.json").exists():
        resume = json.loads((stage / "resume.json").read_text())
        for unit in resume["units"].values():
            for part in unit["parts"].values():
                if part[0] == str(shard.relative_to(stage)):
                    part[1] = sha256_file(shard)
        (stage / "resume.json").write_text(json.dumps(resume))
    return original


def records(out: Path) -> pd.DataFrame:
    return pd.read_parquet(out / REPLAY / "records.parquet").drop(columns=["config"])


def test_force_recomputes_a_tampered_shard(finished, tmp_path):
    out = tmp_path / "out"
    shutil.copytree(finished, out)
    tamper_shard(out, rewrite_resume=True)  # a shard that looks valid under the current key
    assert main([str(REPO / "params" / "tiny.yaml"), "03", "--force", "--out", str(out)]) == 0
    pd.testing.assert_frame_equal(records(out), records(finished))


def test_a_tampered_shard_is_not_reused_on_resume(finished, tmp_path):
    """Without --force, a killed stage resumes from its shards, but only from bytes it wrote."""
    from replaylib.runtime import params
    from replaylib.stages import replay
    out = tmp_path / "out"
    shutil.copytree(finished, out)
    tamper_shard(out, rewrite_resume=False)
    (out / REPLAY / "DONE").unlink()  # as if killed before finishing
    replay.run(params.load(REPO / "params" / "tiny.yaml"), out)
    pd.testing.assert_frame_equal(records(out), records(finished))


def copy_of_the_code(dest: Path) -> Path:
    for name in ("replaylib", "notebooks", "params", "data"):
        shutil.copytree(REPO / name, dest / name, ignore=shutil.ignore_patterns("__pycache__"))
    return dest


def run_in(code: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(code), "REPLAYLIB_MODELS": str(code / "models")}
    return subprocess.run([sys.executable, "-m", "replaylib.run", "params/tiny.yaml", *args], cwd=code, env=env,
                          capture_output=True, text=True, timeout=900)


def test_changed_library_code_reruns_the_stage_and_recomputes_its_shards(finished, tmp_path):
    code, out = copy_of_the_code(tmp_path / "code"), tmp_path / "out"
    shutil.copytree(finished, out)
    tamper_shard(out, rewrite_resume=True)  # reused if the stage trusted its old shards
    grading = code / "replaylib" / "measure" / "grading.py"  # the replay grades with it
    text = grading.read_text()
    signature = "def grade(text: str, gold: str, task: str) -> int:\n"
    assert signature in text
    grading.write_text(text.replace(signature, signature + "    text = str(text)\n"))  # new code, the same grades
    dry = run_in(code, "--dry-run", "--out", str(out))
    assert "03_three_pass_replay: would run (replaylib/measure/grading.py: grade changed)" in dry.stdout, dry.stdout
    done = run_in(code, "--out", str(out))
    assert done.returncode == 0, done.stderr
    pd.testing.assert_frame_equal(records(out), records(finished))


def test_changed_upstream_outputs_make_every_downstream_stage_stale(finished, tmp_path):
    code, out = copy_of_the_code(tmp_path / "code"), tmp_path / "out"
    shutil.copytree(finished, out)
    data = code / "data" / "gsm8k" / "test.jsonl"
    lines = data.read_text().splitlines()
    first = json.loads(lines[0])
    first["question"] = "Ann has 5 pens and gives away 2. How many pens does she have left?"
    data.write_text("\n".join([json.dumps(first)] + lines[1:]) + "\n")
    assert run_in(code, "01", "--out", str(out)).returncode == 0  # other prompts: other trunks
    dry = run_in(code, "--dry-run", "--out", str(out))
    would = [line.split("stage ")[1].split(":")[0] for line in dry.stdout.splitlines() if "would run" in line]
    assert would == ["02_pivot_mining", "03_three_pass_replay", "05_batch_invariant", "04_statistics"], dry.stdout
    assert "(the task's data file changed)" in dry.stdout  # it is in stage 01's key, and so in theirs
    assert run_in(code, "--out", str(out)).returncode == 0
    assert "every stage is up to date" in run_in(code, "--dry-run", "--out", str(out)).stdout
    sampled = json.loads((out / "runs/tiny/01_sampling/manifest.json").read_text())["outputs"]
    read = json.loads((out / "runs/tiny/02_pivot_mining/manifest.json").read_text())["inputs"]
    assert read == {f"01_sampling/{k}": v for k, v in sampled.items()}


def test_the_same_decode_time_state_saves_to_the_same_bytes(tmp_path):
    """Stage 01 rerun with identical results writes identical state files, so nothing downstream turns
    stale (safetensors writes its header's metadata in hash-map order, which differs between calls)."""
    import torch

    from replaylib.core.files import sha256_file
    from replaylib.measure.state import load_state, save_state
    state = {r: (torch.full((2, 2, 3, 4), float(r)), torch.full((2, 2, 3, 4), -float(r))) for r in range(8)}
    for i in range(4):
        save_state(state, tmp_path / f"{i}.safetensors")
    assert len({sha256_file(tmp_path / f"{i}.safetensors") for i in range(4)}) == 1
    loaded, verified = load_state(tmp_path / "0.safetensors")
    assert all(verified.values()) and torch.equal(loaded[3][0], state[3][0])
