"""Lease 21: the pooled verdict of each GRPO run, step by step, as the code it runs with judges it: the run's
<out>/credit/pivots.jsonl fed to the callback's own pooling (replaylib.credit.running.Pooled) one step at a time,
each change of verdict printed with its step.
    python docs/gpu-h200/scripts/lease21_verdicts.py DIR...      (each DIR a run's --out)"""
import sys
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from replaylib.credit.running import Pooled  # noqa: E402


def trajectory(out: Path) -> list[str]:
    pivots = pd.read_json(out / "credit" / "pivots.jsonl", lines=True)
    pooled, lines, said = Pooled(), [], None
    for step, frame in pivots.groupby("step", sort=True):
        pooled.add(frame)
        line = pooled.line()
        if line != said:
            lines.append(f"  step {step}: {line}")
            said = line
    return [f"{out.name}: {len(pivots)} pivots"] + lines


if __name__ == "__main__":
    print("\n".join(line for d in sys.argv[1:] for line in trajectory(Path(d))))
