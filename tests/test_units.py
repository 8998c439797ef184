"""The one runner of every stage's kernel (replaylib.runtime.units): a plan that grows as units finish, shards
reused only under their key and with their bytes, and a killed stage resuming from the units it finished.
The first tests use a kernel of plain Python (no model); the last kills the sampling stage between batches."""
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from replaylib.measure.units import Kernel, Outputs, Unit
from replaylib.runtime.shards import ShardStore
from replaylib.runtime.units import NoEngine, compute, pick

REPO = Path(__file__).resolve().parents[1]
CALLS = []


def waves_plan(params, inputs, done):
    """Unit b is known once a is done, c once b is: a plan that grows, as stage 01's screen does."""
    units = [Unit("a", "unit a", (1,))]
    if "a" in done:
        units.append(Unit("b", "unit b", (int(done["a"]["rows"]["x"].sum()) + 1,)))
    if "b" in done:
        units.append(Unit("c", "unit c", (3,)))
    return units


def square(engine, params, x):
    CALLS.append(x)
    return {"rows": pd.DataFrame({"x": [x, x * x]}), "info": {"x": x}, "seconds": {"work": 0.5}}


def assemble(params, inputs, done):
    rows = pd.concat([done[u.name]["rows"] for u in waves_plan(params, inputs, done)], ignore_index=True)
    return Outputs({"rows.parquet": rows}, result=rows)


KERNEL = Kernel(plan=waves_plan, unit=square, assemble=assemble, shard=lambda u, part, v: f"shards/{u.name}.{part}"
                + (".parquet" if part == "rows" else ".json"))


def opener(opened):
    def open_executor(n):
        opened.append(n)
        return NoEngine()
    return open_executor


def test_a_growing_plan_runs_wave_by_wave_and_a_store_keeps_every_unit(tmp_path):
    CALLS.clear()
    opened = []
    out = compute(KERNEL, None, {}, opener(opened), ShardStore(tmp_path, "key-1"), where=None)
    assert CALLS == [1, 3, 3] and opened == [1]  # b's argument came from a's rows; one executor for all waves
    assert set(out.done) == {"a", "b", "c"} and out.ran == ["a", "b", "c"]
    assert out.seconds["work"] == 1.5 and set(out.unit_seconds) == {"a", "b", "c"}
    assert KERNEL.assemble(None, {}, out.done).result["x"].tolist() == [1, 1, 3, 9, 3, 9]
    again = compute(KERNEL, None, {}, opener(opened), ShardStore(tmp_path, "key-1"))
    assert CALLS == [1, 3, 3] and opened == [1] and again.ran == []  # every unit reused, no executor opened
    assert again.unit_seconds["b"] == {"work": 0.5}  # the timing of a reused unit is the one recorded
    assert again.done["b"]["info"] == {"x": 3}


def test_a_shard_is_reused_only_under_its_key_and_with_its_bytes(tmp_path):
    CALLS.clear()
    compute(KERNEL, None, {}, opener([]), ShardStore(tmp_path, "key-1"))
    (tmp_path / "shards" / "b.info.json").write_text('{"x": 4}')  # changed since it was written
    CALLS.clear()
    compute(KERNEL, None, {}, opener([]), ShardStore(tmp_path, "key-1"))
    assert CALLS == [3]
    other = ShardStore(tmp_path, "key-2")
    assert not other.fresh and other.load(Unit("a", "unit a")) is None
    assert ShardStore(tmp_path, "key-1").changed() == []
    (tmp_path / "shards" / "a.rows.parquet").unlink()
    assert ShardStore(tmp_path, "key-1").changed() == ["shards/a.rows.parquet"]


def test_a_unit_is_picked_by_position_name_or_itself_and_an_unknown_name_is_one_line():
    units = [Unit(name, f"unit {name}") for name in "abc"]
    assert pick(units, None).name == "a" and pick(units, 2).name == "c" and pick(units, "b").name == "b"
    assert pick(units, units[1]) is units[1]
    with pytest.raises(ValueError, match="no unit named 'z' in the plan") as e:
        pick(units, "z")
    assert "\n" not in str(e.value)
    for outside in (-1, 3, 10**9, True, False):  # never the last unit, unit 1 or a bare IndexError
        with pytest.raises(ValueError, match="give a position from 0 to 2") as e:
            pick(units, outside)
        assert "\n" not in str(e.value)


def test_a_killed_sampling_stage_resumes_from_the_batches_it_finished(tmp_path):
    """Stage 01 in batches of one problem (max_batch_rows 3): killed once the first batch's shard is
    recorded, its rerun reuses that batch and ends with the bytes of an uninterrupted run."""
    params = tmp_path / "batches.yaml"
    params.write_text(f"extends: {REPO / 'params' / 'tiny.yaml'}\nconfig: batches\nmax_batch_rows: 3\n")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    script = ("import sys, replaylib; from replaylib.runtime import params; from replaylib.stages import sampling; "
              "replaylib.log_to_stdout(); sampling.run(params.load(sys.argv[1]), sys.argv[2])")
    # the stage stops itself once its first batch is recorded, and is killed there (never by the machine's speed)
    stopping = ("import os, signal; from replaylib.runtime import shards; real = shards.ShardStore.record\n"
                "def record(self, *a, **k):\n    real(self, *a, **k); os.kill(os.getpid(), signal.SIGSTOP)\n"
                "shards.ShardStore.record = record\n")
    subprocess.run([sys.executable, "-c", script, str(params), str(whole)], env=env, check=True, capture_output=True)
    proc = subprocess.Popen([sys.executable, "-c", stopping + script, str(params), str(cut)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    record = cut / "runs" / "batches" / "01_sampling" / "resume.json"
    _, status = os.waitpid(proc.pid, os.WUNTRACED)
    assert os.WIFSTOPPED(status), f"the stage ended (status {status}) before its first batch was recorded"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    done = json.loads(record.read_text())["units"]
    assert list(done) == ["batch_00000"]
    rerun = subprocess.run([sys.executable, "-c", script, str(params), str(cut)], env=env, check=True,
                           capture_output=True, text=True)
    assert "01_sampling, executor local: 1 unit(s) to run" in rerun.stdout  # the other batch was reused
    stage = cut / "runs" / "batches" / "01_sampling"
    assert not (stage / "shards").exists()  # a resume's scratch, gone once the stage finished
    for name in ("trunks.parquet", "accuracy.csv", "problems.json", "state/problem_00000.safetensors",
                 "state/problem_00001.safetensors"):
        assert (stage / name).read_bytes() == (whole / "runs" / "batches" / "01_sampling" / name).read_bytes(), name
    manifest = json.loads((stage / "manifest.json").read_text())
    assert manifest["seconds"].get("trunks", 0) > 0 and "batch_00000" not in json.dumps(manifest["outputs"])
