"""Lease 10's numbers from the credit tool's outputs (python lease10_numbers.py /tmp/cr): per run the pivots,
certificates, unverified pivots, floor and re-feed shares, Table 1's numbers and the claims' verdicts; the
decode rate per pass (timing.json) with --invariant against stock on the same rollouts; and the Ray run's
rows against the in-process run's for the same rollouts (both in-process engines: deterministic)."""
import json
import sys
from pathlib import Path

import pandas as pd

root = Path(sys.argv[1])
runs = [d for d in ("stock", "invariant", "inprocess", "ray") if (root / d / "summary.json").exists()]
rates = {}
for name in runs:
    s = json.loads((root / name / "summary.json").read_text())
    t = json.loads((root / name / "timing.json").read_text())
    rates[name] = t["passes"]
    share = lambda x: "-" if x is None else f"{100 * x:.1f}%"  # noqa: E731
    print(f"[{name}] rollouts {s['rollouts']} pivots {s['pivots']} common {s['common_pivots']} not verified "
          f"{s['not_verified']} passes agree {s['passes_agree']}/{s['pivots']} floor {share(s['floor'])} refeed "
          f"{share(s['refeed'])} certificates {s['certificates']}" +
          (f" invariant_ok {s['invariant_ok']}" if "invariant_ok" in s else ""))
    if "table1" in s:
        print(f"[{name}] table1 " + ", ".join(f"{k} {v:.3g}" if isinstance(v, float) else f"{k} {v}"
                                             for k, v in s["table1"].items()))
        for claim, v in s["claims"].items():
            print(f"[{name}] claim '{claim}': {v['verdict']} (n {v['n']}; {v['value']}; {v['why']})")
    print(f"[{name}] engine {json.dumps(s['engine'], sort_keys=True)}")
    print(f"[{name}] tokens/s " + ", ".join(f"{p} {r['tokens_per_s']} ({r['tokens']} tokens, {r['seconds']} s)"
                                            for p, r in t["passes"].items()))
if "stock" in rates and "invariant" in rates:
    for p in ("forced decoding", "resume", "replica", "refeed"):
        a, b = rates["stock"].get(p), rates["invariant"].get(p)
        if a and b and a["tokens_per_s"] and b["tokens_per_s"]:
            print(f"[cost of --invariant] {p}: stock {a['tokens_per_s']} tok/s, invariant {b['tokens_per_s']} tok/s, "
                  f"ratio {b['tokens_per_s'] / a['tokens_per_s']:.3f}")
if "ray" in runs and "inprocess" in runs:
    ray = pd.read_parquet(root / "ray" / "credit.parquet")
    local = pd.read_parquet(root / "inprocess" / "credit.parquet")
    local = local[local["id"].isin(set(ray["id"]))].reset_index(drop=True)
    cols = [c for c in ray.columns if c != "line"]
    print(f"[ray vs in-process] {len(ray)} and {len(local)} rows; equal on every column but 'line': "
          f"{ray[cols].equals(local[cols])}")
