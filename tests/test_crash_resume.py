"""Fault injection: SIGKILL the replay stage at random points, rerun until done, and compare
with an uninterrupted run: nothing lost, nothing duplicated, nothing half-written."""
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd

from replaylib.runtime import params
from replaylib.stages import pivots, sampling

REPO = Path(__file__).resolve().parents[1]
SCRIPT = "import sys; from replaylib.runtime import params; from replaylib.stages import replay; replay.run(params.make(eval(sys.argv[1])), sys.argv[2])"


def replay_in_subprocess(overrides: dict, out: Path, kill_after: float | None = None) -> int:
    proc = subprocess.Popen([sys.executable, "-c", SCRIPT, repr(overrides), str(out)], cwd=REPO,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    if kill_after is None:
        return proc.wait(timeout=600)
    time.sleep(kill_after)
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGKILL)
    return proc.wait(timeout=60)


def test_killed_replay_resumes_to_the_same_records(tmp_path):
    base = params.load(REPO / "params" / "tiny.yaml").to_dict()
    overrides = {**base, "n_problems": 4, "max_cont_tokens": 16}
    p = params.make(overrides)
    clean = tmp_path / "clean"
    sampling.run(p, clean)
    pivots.run(p, clean)
    crashed = tmp_path / "crashed"
    shutil.copytree(clean, crashed)

    started = time.monotonic()
    assert replay_in_subprocess(overrides, clean) == 0
    duration = time.monotonic() - started  # kill points scale with this machine's speed
    stage = "runs/tiny/03_three_pass_replay"
    reference = pd.read_parquet(clean / stage / "records.parquet")

    rng = random.Random(0)
    kills = 0
    for _ in range(4):  # kill at random points: during start-up, mid-problem, between shards
        if replay_in_subprocess(overrides, crashed, kill_after=rng.uniform(0.2, 0.7) * duration) == 0:
            break  # it finished before the kill
        if (crashed / stage / "DONE").exists():
            break  # killed while exiting after DONE: the stage was complete (checked below)
        kills += 1
    assert kills >= 1
    assert replay_in_subprocess(overrides, crashed) == 0
    result = pd.read_parquet(crashed / stage / "records.parquet")
    key = ["problem_id", "rollout", "abs_pos"]
    assert not result.duplicated(key).any()
    pd.testing.assert_frame_equal(result.sort_values(key).reset_index(drop=True),
                                  reference.sort_values(key).reset_index(drop=True))
    leftovers = [f for f in (crashed / stage).rglob("*") if f.name.endswith(".tmp")]
    assert leftovers == []
