"""Fault injection: SIGKILL the replay stage at points it reaches (starting up, half-way through writing a
shard, a shard written but not yet recorded, in the middle of a problem, between shards), rerun until done,
and compare with an uninterrupted run: nothing lost, nothing duplicated, nothing half-written.

Each kill point is a place in the stage's own flow: the stage stops itself there (SIGSTOP) and the test
kills it, so where it dies never depends on the machine's speed."""
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pandas as pd

from replaylib.runtime import params
from replaylib.stages import pivots, sampling

REPO = Path(__file__).resolve().parents[1]
STAGE = "runs/tiny/03_three_pass_replay"
# argv: the parameters, the output root, then where to stop: an object, its function, which call, and
# whether the stage stops before the call or after it returns ("write" stops after a shard's temporary file
# is written, before it is renamed into place)
SCRIPT = """
import os, signal, sys
from replaylib.core import files
from replaylib.runtime import params, shards, units
from replaylib.measure import engine_hf
from replaylib.stages import replay
overrides, out, owner, name, nth, when = eval(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]), sys.argv[6]
target = {"replay": replay, "units": units, "files": files, "ShardStore": shards.ShardStore,
          "HFEngine": engine_hf.HFEngine}[owner]
real, calls = getattr(target, name), []

def stop():
    os.kill(os.getpid(), signal.SIGSTOP)  # the test kills the stage here

def wrapper(*args, **kwargs):
    calls.append(1)
    here = len(calls) == nth
    if here and when == "write":
        path, writer = args
        return real(path, lambda tmp: (writer(tmp), stop()))
    if here and when == "before":
        stop()
    result = real(*args, **kwargs)
    if here and when == "after":
        stop()
    return result
setattr(target, name, wrapper)
replay.run(params.make(overrides), out)
"""


def replay_in_subprocess(overrides: dict, out: Path, stop_at: tuple | None = None) -> int:
    """Run the replay stage; with stop_at, kill it where it stops itself and return None."""
    proc = subprocess.Popen([sys.executable, "-c", SCRIPT, repr(overrides), str(out),
                             *map(str, stop_at or ("replay", "run", 0, "never"))], cwd=REPO,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    if stop_at is None:
        return proc.wait()
    _, status = os.waitpid(proc.pid, os.WUNTRACED)  # until it stops itself, or ends
    assert os.WIFSTOPPED(status), f"the stage ended (status {status}) before its kill point {stop_at}"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    return None


def recorded_shards(out: Path) -> set:
    units = json.loads((out / STAGE / "resume.json").read_text())["units"]
    return {rel for unit in units.values() for rel, _ in unit["parts"].values()}


def temporary_files(out: Path) -> list:
    return [f for f in (out / STAGE).rglob("*") if f.name.endswith(".tmp")]


def test_killed_replay_resumes_to_the_same_records(tmp_path):
    base = params.load(REPO / "params" / "tiny.yaml").to_dict()
    overrides = {**base, "n_problems": 4, "max_cont_tokens": 16}
    p = params.make(overrides)
    clean = tmp_path / "clean"
    sampling.run(p, clean)
    pivots.run(p, clean)
    crashed = tmp_path / "crashed"
    shutil.copytree(clean, crashed)
    assert replay_in_subprocess(overrides, clean) == 0
    reference = pd.read_parquet(clean / STAGE / "records.parquet")
    order = pd.read_parquet(clean / "runs/tiny/02_pivot_mining/pivots.parquet").problem_id.unique()
    shards = [f"shards/problem_{pid:05d}.parquet" for pid in order]  # the order the stage replays them in
    assert len(shards) >= 3 and recorded_shards(clean) == set(shards)

    replay_in_subprocess(overrides, crashed, ("units", "make_executor", 1, "before"))  # starting up
    assert recorded_shards(crashed) == set()
    replay_in_subprocess(overrides, crashed, ("files", "atomic_save", 1, "write"))  # half-way through a shard
    assert len(temporary_files(crashed)) == 1 and recorded_shards(crashed) == set()
    replay_in_subprocess(overrides, crashed, ("ShardStore", "record", 1, "before"))  # written, not recorded
    assert (crashed / STAGE / shards[0]).exists() and recorded_shards(crashed) == set()
    assert temporary_files(crashed) == []  # the half-written one was removed when the stage began again
    passes = len(p.passes)  # one run_pass call per pass and problem: this stops in the second problem
    replay_in_subprocess(overrides, crashed, ("HFEngine", "run_pass", passes + 2, "before"))
    assert recorded_shards(crashed) == {shards[0]}
    replay_in_subprocess(overrides, crashed, ("ShardStore", "record", 1, "after"))  # between two shards
    assert recorded_shards(crashed) == {shards[0], shards[1]}
    assert not (crashed / STAGE / "DONE").exists()

    assert replay_in_subprocess(overrides, crashed) == 0
    result = pd.read_parquet(crashed / STAGE / "records.parquet")
    key = ["problem_id", "rollout", "abs_pos"]
    assert not result.duplicated(key).any()
    pd.testing.assert_frame_equal(result.sort_values(key).reset_index(drop=True),
                                  reference.sort_values(key).reset_index(drop=True))
    assert temporary_files(crashed) == []
