"""Leases 17 to 19: the numbers from the GRPO runs' outputs (examples/trl_grpo_vllm_credit.py: <out>/metrics.jsonl and
<out>/credit/pivots.jsonl): per run, the steps, the training's and credit's seconds and credit's share, the
rollouts and pivots measured, the certificates, the resumes verified, and the pooled rates with the verdict.
    python docs/gpu-h200/scripts/lease17_numbers.py DIR...      (each DIR a run's --out)"""
import json
import sys
from collections import Counter
from pathlib import Path


def summary(out: Path) -> str:
    logged = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    logged = [s for s in logged if "wall_s" in s and "train_runtime" not in s]  # the last: the run's summary
    steps = [s for s in logged if "credit/seconds" in s]  # the steps credit ran at (not waiting for its account)
    pivots_file = out / "credit" / "pivots.jsonl"
    pivots = [json.loads(line) for line in pivots_file.read_text().splitlines()] if pivots_file.exists() else []
    last = {k: v for s in logged for k, v in s.items()}  # each metric's latest value
    wall = sum(s["wall_s"] for s in logged)
    credit = sum(s["credit/seconds"] for s in steps)
    rollouts = sum(s.get("credit/rollouts", 0) for s in steps)
    measured = sum(1 for s in steps if s.get("credit/rollouts", 0) > 0)
    by_rollout = {(p["step"], p["id"]): p["certificate"] for p in pivots}
    lines = [f"{out.name}: {len(logged)} steps, credit ran at {len(steps)}, {wall:.1f} s of steps (credit's "
             f"included), credit {credit:.1f} s, share of the training's own time {last['credit/share_total']:.3f}",
             f"  steps with credit: {measured}; rollouts measured {rollouts:.0f}; pivots {len(pivots)}; "
             f"skipped {sum(s.get('credit/skipped', 0) for s in steps):.0f}",
             f"  certificates by rollout: {dict(Counter(by_rollout.values()))}" + first_diffs(pivots),
             f"  resumes verified: {sum(p.get('verified_resume', False) for p in pivots)}/{len(pivots)}; "
             f"replica verified: {sum(p.get('verified_replica', False) for p in pivots)}/{len(pivots)}",
             f"  pooled: common pivots {last.get('credit/pooled_common_pivots', 0):.0f}, problems "
             f"{last.get('credit/pooled_problems', 0):.0f}, floor {last.get('credit/pooled_floor')} "
             f"[{last.get('credit/pooled_floor_lo')}, {last.get('credit/pooled_floor_hi')}], refeed "
             f"{last.get('credit/pooled_refeed')} [{last.get('credit/pooled_refeed_lo')}, "
             f"{last.get('credit/pooled_refeed_hi')}], verdict value {last.get('credit/refeed_above_floor')}",
             f"  per step (step, wall s, credit s, budget s, estimated s, rollouts, share): " + "; ".join(
                 f"{s['step']} {s['wall_s']:.1f} {s['credit/seconds']:.1f} {s.get('credit/budget_s', 0):.1f} "
                 f"{s.get('credit/estimated_s', 0):.2f} {s.get('credit/rollouts', 0):.0f} "
                 f"{s.get('credit/share', 0):.3f}" for s in steps)]
    return "\n".join(lines)


def first_diffs(pivots: list) -> str:
    """Where the rollouts that differ first differ (certificate_first_diff, recorded from lease 19 on)."""
    at = sorted({(p["step"], p["id"]): p["certificate_first_diff"] for p in pivots
                 if p.get("certificate_first_diff") is not None}.values())
    return f"; first differing position: min {at[0]}, median {at[len(at) // 2]}, max {at[-1]}" if at else ""


if __name__ == "__main__":
    print("\n".join(summary(Path(d)) for d in sys.argv[1:]))
