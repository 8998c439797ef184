"""What recording what a stage used costs (replaylib.core.recording): every stage of a configuration run with
recording and without it, side by side on one machine. Each run is a process of its own, as the runner runs a
stage (it imports the package, arms the probes, builds its engine, computes and writes); the seconds are those
of the stage itself (replaylib.runtime.units.run_stage: engine start, units, assembly, writing), not of the
interpreter's start. The two ways alternate (with, without; then without, with) so that a drift of the
machine's speed falls on both. Without recording, the sessions record nothing and no probe is installed.

    python -m replaylib.bench.recording_cost [--config params/tiny.yaml] [--repeats 3] [--out DIR]

It first runs the configuration once (python -m replaylib.run) into --out, then reruns each stage in place;
its printout ends with the stages' total both ways and their difference."""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from ..core.paths import REPO
from ..runtime.registry import RUN_ORDER

RUN_ONE = """
import contextlib, importlib, json, sys, time
from replaylib.core import recording
if sys.argv[3] == "without":
    class Nothing:
        def record(self):
            return {"code": {}, "files": {}}

    @contextlib.contextmanager
    def session():
        yield Nothing()
    recording.session = session
    recording.built = lambda make: make()
    recording.Recorded.__call__ = lambda self, engine, *args: self.fn(engine, *args)
from replaylib.runtime import params
from replaylib.runtime.registry import stage as entry
from replaylib.runtime.stagedir import StageDir
from replaylib.runtime.units import run_stage
P, stage, out = params.load(sys.argv[1]), sys.argv[2], sys.argv[4]
declared = importlib.import_module("replaylib.stages." + entry(stage).driver).STAGE
sd = StageDir(P, stage, out)
sd.clear()
started = time.perf_counter()
run_stage(sd, declared.kernel, P, lambda: declared.inputs(P, out))
print(json.dumps({"seconds": time.perf_counter() - started}))
"""


def run_stage_once(config: str, stage: str, how: str, out: Path) -> float:
    done = subprocess.run([sys.executable, "-c", RUN_ONE, config, stage, how, str(out)], cwd=REPO, capture_output=True,
                          text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])["seconds"]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m replaylib.bench.recording_cost", description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="params/tiny.yaml")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default=None, help="output root (default: a temporary directory)")
    args = ap.parse_args(argv)
    out = Path(args.out or tempfile.mkdtemp(prefix="recording-cost-"))
    subprocess.run([sys.executable, "-m", "replaylib.run", args.config, "--out", str(out)], cwd=REPO, check=True,
                   capture_output=True)
    seconds = {(s, how): [] for s in RUN_ORDER for how in ("with", "without")}
    for repeat in range(args.repeats):
        order = ("with", "without") if repeat % 2 == 0 else ("without", "with")
        for stage in RUN_ORDER:
            for how in order:
                seconds[(stage, how)].append(run_stage_once(args.config, stage, how, out))
                print(f"repeat {repeat + 1} {stage} {how} recording: {seconds[(stage, how)][-1]:.2f} s", flush=True)
    print(f"\n{args.config}, {args.repeats} repeats, median seconds of each stage (run_stage, in a process of its own)")
    print(f"{'stage':22} {'with':>8} {'without':>8} {'difference':>18}")
    totals = {"with": 0.0, "without": 0.0}
    for stage in RUN_ORDER:
        med = {how: statistics.median(seconds[(stage, how)]) for how in totals}
        for how in totals:
            totals[how] += med[how]
        diff = med["with"] - med["without"]
        print(f"{stage:22} {med['with']:8.2f} {med['without']:8.2f} {diff:+8.2f} s {100 * diff / med['without']:+6.1f}%")
    diff = totals["with"] - totals["without"]
    print(f"{'all stages':22} {totals['with']:8.2f} {totals['without']:8.2f} {diff:+8.2f} s "
          f"{100 * diff / totals['without']:+6.1f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
