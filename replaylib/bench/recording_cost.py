"""What recording what a stage used costs (replaylib.core.recording): a configuration's stages run by the runner
with recording and without it, side by side on one machine, each stage's seconds as the runner measures them
(its kernel's start, imports, engine, units, writing: runs/<config>/<stage>/runner.json). The ways alternate
(with, without; then without, with) so that a drift of the machine's speed falls on both.

Without recording, each process's sessions record nothing and no probe is installed (a sitecustomize module
on the kernels' path replaces them, for this benchmark only). ``--ways with,without,settrace`` adds the
alternative recording leaves aside: a ``sys.settrace`` hook collecting every code object run (the hook's cost
alone; it records nothing).

    python -m replaylib.bench.recording_cost [--config params/tiny.yaml] [--repeats 3] [--ways with,without]
                                             [--out DIR]

It prints each run's stage times, then each stage's median both ways and the difference."""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from ..core.paths import REPO
from ..runtime.params import load
from ..runtime.registry import RUN_ORDER

WAY_ENV = "REPLAYLIB_BENCH_RECORDING"
SITECUSTOMIZE = f'''
import contextlib, os, sys
way = os.environ.get("{WAY_ENV}", "with")
if way != "with":
    from replaylib.core import recording

    class Nothing:
        def record(self):
            return {{"code": {{}}, "files": {{}}}}

    @contextlib.contextmanager
    def session():
        if way == "settrace":
            import threading
            seen = set()

            def hook(frame, event, arg):
                seen.add(frame.f_code)
            sys.settrace(hook)
            threading.settrace(hook)
        try:
            yield Nothing()
        finally:
            sys.settrace(None)
            if way == "settrace":
                threading.settrace(None)
    recording.session = session
    recording.built = lambda make: make()
    recording.Recorded.__call__ = lambda self, engine, *args: self.fn(engine, *args)
'''


def run_all(config: str, out: Path, way: str, hook_dir: Path) -> dict:
    """Every stage of the configuration, recomputed by the runner (--force); {stage: seconds}."""
    env = {**os.environ, WAY_ENV: way,
           "PYTHONPATH": os.pathsep.join([str(hook_dir), str(REPO)] + [p for p in [os.environ.get("PYTHONPATH")] if p])}
    subprocess.run([sys.executable, "-m", "replaylib.run", config, "--force", "--out", str(out)], cwd=REPO, env=env,
                   check=True, capture_output=True)
    name = load(REPO / config).config
    return {s: json.loads((out / "runs" / name / s / "runner.json").read_text())["seconds"] for s in RUN_ORDER}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m replaylib.bench.recording_cost", description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="params/tiny.yaml")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--ways", default="with,without", help="with, without, settrace (comma-separated)")
    ap.add_argument("--out", default=None, help="output root (default: a temporary directory)")
    args = ap.parse_args(argv)
    out = Path(args.out or tempfile.mkdtemp(prefix="recording-cost-"))
    hook_dir = Path(tempfile.mkdtemp(prefix="recording-cost-hook-"))
    (hook_dir / "sitecustomize.py").write_text(SITECUSTOMIZE)
    ways = [w.strip() for w in args.ways.split(",")]
    seconds = {(s, w): [] for s in RUN_ORDER for w in ways}
    for repeat in range(args.repeats):
        for way in ways if repeat % 2 == 0 else ways[::-1]:
            for stage, secs in run_all(args.config, out, way, hook_dir).items():
                seconds[(stage, way)].append(secs)
            print(f"repeat {repeat + 1}, {way} recording: " + ", ".join(
                f"{s} {seconds[(s, way)][-1]:.1f} s" for s in RUN_ORDER), flush=True)
    others = [w for w in ways if w != "without"]
    print(f"\n{args.config}, {args.repeats} repeats: median seconds of each stage as the runner measures it")
    print(f"{'stage':22} {'without':>9}" + "".join(f" {w:>9} {'difference':>17}" for w in others))
    totals = dict.fromkeys(ways, 0.0)
    for stage in RUN_ORDER + ["all stages"]:
        med = totals if stage == "all stages" else {w: statistics.median(seconds[(stage, w)]) for w in ways}
        if stage != "all stages":
            for w in ways:
                totals[w] += med[w]
        print(f"{stage:22} {med['without']:9.2f}" + "".join(
            f" {med[w]:9.2f} {med[w] - med['without']:+8.2f} s {100 * (med[w] / med['without'] - 1):+5.1f}%"
            for w in others))
    return 0


if __name__ == "__main__":
    sys.exit(main())
