"""The numbers docs/gpu-h200.md quotes for lease 7, from the run tree that came back.

    python docs/gpu-h200/scripts/lease7_numbers.py ROOT [LEASE6_RUNS LEASE5_RAY]

ROOT: the unpacked results (ROOT/runs/<config>/...). Per configuration: pivots, how their state was
established, exactness, the replica floor and re-feed on the common set, probe bit-exactness and
continuation differences per pass, the stage times split (manifests' "seconds"); then whether the
in-process trunks, pivots and records equal lease 6's (the code before the serving mode existed ran
in-process), and whether the multi-process trunks equal the in-process ones.
"""
import json
import sys
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from replaylib import stats  # noqa: E402
from replaylib.rundir import sha256_file  # noqa: E402

CONFIGS = ["gpu-embedded", "gpu-embedded-screened", "gpu-embedded-k8", "gpu-embedded-greedy",
           "gpu-embedded-synchronized", "gpu-embedded-inprocess", "gpu-embedded-screened-inprocess",
           "gpu-embedded-k8-inprocess", "gpu-embedded-greedy-inprocess"]


def manifest(root: Path, config: str, stage: str) -> dict:
    p = root / "runs" / config / stage / "manifest.json"
    return json.loads(p.read_text()) if p.exists() else {}


def per_config(root: Path, config: str) -> dict | None:
    path = root / "runs" / config / "03_three_pass_replay" / "records.parquet"
    if not path.exists():
        return None
    df = pd.read_parquet(path)
    kept = df[df.exact_ok]
    r = stats.rates(kept, "common")
    out = {"config": config, "pivots": len(df), "exact_ok": int(df.exact_ok.sum()),
           "state": df.state_established.value_counts().to_dict(),
           "cache_ok exact1/exact2": f"{int(df.cache_ok_exact1.sum())}/{int(df.cache_ok_exact2.sum())}",
           "preemptions": int(sum(df[c].fillna(0).sum() for c in df.columns if c.startswith("preemptions_"))),
           "common n": r["n"], "floor": f"{r['floor']['flips']}/{r['n']}", "refeed": f"{r['refeed']['flips']}/{r['n']}"}
    for p in ("exact2", "refeed"):
        out[f"probe bit-exact {p}"] = f"{int((df[f'greedy_first_logprob_delta_{p}'] == 0).sum())}/{len(df)}"
        out[f"continuations differing {p}"] = int(df[f"cont_diff_{p}"].sum())
    out["continuations per pass"] = int(sum(len(c) for v in df.continuations_exact1 for c in json.loads(v).values()))
    for stage in ("01_sampling", "03_three_pass_replay", "05_batch_invariant"):
        m = manifest(root, config, stage)
        if m.get("seconds") and not m.get("copied_from"):
            out[f"seconds {stage[:2]}"] = m["seconds"]
    return out


def same_file(a: Path, b: Path) -> str:
    if not (a.exists() and b.exists()):
        return "missing"
    return "identical" if sha256_file(a) == sha256_file(b) else "differ"


def main(argv):
    root = Path(argv[1])
    rows = [r for r in (per_config(root, c) for c in CONFIGS) if r]
    for r in rows:
        print(json.dumps(r))
    # in-process against lease 6 (stage 01/02 outputs by their recorded sha256; records on common columns)
    if len(argv) > 2:
        lease6 = Path(argv[2])
        for new, old in (("gpu-embedded-inprocess", "gpu-embedded"),
                         ("gpu-embedded-screened-inprocess", "gpu-embedded-screened")):
            for stage, files in (("01_sampling", ["trunks.parquet", "problems.json", "accuracy.csv"]),
                                 ("02_pivot_mining", ["pivots.parquet", "margins.parquet"])):
                theirs = json.loads((lease6 / old / stage / "manifest.json").read_text())["outputs"]
                ours = manifest(root, new, stage).get("outputs", {})
                print(f"{new} {stage} vs lease 6 {old}: " + ", ".join(
                    f"{f} {'identical' if ours.get(f) == theirs.get(f) else 'differ'}" for f in files))
        pairs = [("gpu-embedded-screened-inprocess", lease6 / "gpu-embedded-screened"),
                 ("gpu-embedded-k8-inprocess", lease6 / "gpu-embedded-k8"),
                 ("gpu-embedded-greedy-inprocess", lease6 / "gpu-embedded-greedy")]
        if len(argv) > 3:
            pairs.insert(0, ("gpu-embedded-inprocess", Path(argv[3])))
        for new, old_dir in pairs:
            a = root / "runs" / new / "03_three_pass_replay" / "records.parquet"
            b = old_dir / "03_three_pass_replay" / "records.parquet"
            if not (a.exists() and b.exists()):
                print(f"{new} records vs {old_dir}: missing")
                continue
            x, y = pd.read_parquet(a), pd.read_parquet(b)
            cols = [c for c in y.columns if c in x.columns and c != "config"]
            same = len(x) == len(y) and x[cols].reset_index(drop=True).equals(y[cols].reset_index(drop=True))
            print(f"{new} records vs {old_dir}: {len(cols)} common columns, {len(x)} vs {len(y)} rows, "
                  f"{'identical' if same else 'DIFFER'}")
    for mp, ip in (("gpu-embedded", "gpu-embedded-inprocess"), ("gpu-embedded-screened", "gpu-embedded-screened-inprocess")):
        print(f"trunks {mp} vs {ip}: " + same_file(root / "runs" / mp / "01_sampling" / "trunks.parquet",
                                                  root / "runs" / ip / "01_sampling" / "trunks.parquet"))


if __name__ == "__main__":
    main(sys.argv)
