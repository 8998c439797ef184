"""Lease 9: the in-process embedded configuration computed by the layered code against what earlier
leases computed with the code before it (same parameters, same engine).

    python docs/gpu-h200/scripts/lease9_compare.py OUT_ROOT LEASE7_RUN LEASE5_RUN

OUT_ROOT holds runs/gpu-embedded-inprocess (stages 01-03); LEASE7_RUN is lease 7's runs/gpu-embedded
(its manifests record the sha256 of its trunks and pivots: the multi-process trunks, which equal the
in-process ones, lease 8); LEASE5_RUN is lease 5's in-process run of the same configuration (its
records, compared on their common columns).
"""
import hashlib
import json
import sys
from pathlib import Path

import pandas as pd


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def main(out_root: str, lease7: str, lease5: str) -> int:
    run = Path(out_root) / "runs" / "gpu-embedded-inprocess"
    same = True
    for stage, files in (("01_sampling", ["trunks.parquet", "problems.json", "accuracy.csv"]),
                         ("02_pivot_mining", ["pivots.parquet", "margins.parquet"])):
        theirs = json.loads((Path(lease7) / stage / "manifest.json").read_text())["outputs"]
        for name in files:
            ok = sha256(run / stage / name) == theirs.get(name)
            same &= ok
            print(f"{stage}/{name} vs lease 7: {'identical' if ok else 'differ'}")
    old = pd.read_parquet(Path(lease5) / "03_three_pass_replay" / "records.parquet")
    new = pd.read_parquet(run / "03_three_pass_replay" / "records.parquet")
    cols = [c for c in old.columns if c in new.columns and c != "config"]
    key = ["problem_id", "rollout", "abs_pos"]
    a, b = (df.sort_values(key).reset_index(drop=True)[cols] for df in (old, new))
    ok = a.equals(b)
    same &= ok
    print(f"03_three_pass_replay/records.parquet vs lease 5: {len(cols)} common columns, {len(a)} vs {len(b)} rows, "
          + ("identical" if ok else f"differ in {[c for c in cols if not a[c].equals(b[c])]}"))
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:4]))
