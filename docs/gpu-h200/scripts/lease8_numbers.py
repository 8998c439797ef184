"""The numbers docs/gpu-h200.md quotes for lease 8, from the run trees that came back.

    python docs/gpu-h200/scripts/lease8_numbers.py RESULTS [LEASE7_RUNS LEASE5_RAY]

RESULTS holds rl/ (the campaign's root), rl2/ (gpu-embedded-inprocess with one engine for its stages)
and rl3/ (the same with an engine per stage) and logs/. Per configuration: pivots, how their state was
established, exactness, the replica floor and re-feed on the common set, probe bit-exactness and
continuation differences per pass, the stages' seconds and engine leases; the campaign's engines (starts,
leases, stops) and the share of its wall time during which an engine was starting or stopping; whether the
multi-process trunks equal the in-process ones; and the in-process check: rl2 against rl3, and against the
earlier leases' recorded outputs (trunks and pivots by their sha256 in lease 7's manifests, records on
their common columns against lease 5's).
"""
import json
import sys
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from replaylib import stats  # noqa: E402
from replaylib.rundir import sha256_file  # noqa: E402

CAMPAIGN = "campaign-gpu-paper-size"
CONFIGS = ["gpu-paper-size-primary", "gpu-paper-size-screened", "gpu-paper-size-k8", "gpu-paper-size-greedy",
           "gpu-paper-size-primary-inprocess", "gpu-paper-size-screened-inprocess"]


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
    out = {"config": config, "problems": int(df.problem_id.nunique()), "pivots": len(df),
           "exact_ok": int(df.exact_ok.sum()), "state": df.state_established.value_counts().to_dict(),
           "cache_ok exact1/exact2": f"{int(df.cache_ok_exact1.sum())}/{int(df.cache_ok_exact2.sum())}",
           "preemptions": int(sum(df[c].fillna(0).sum() for c in df.columns if c.startswith("preemptions_"))),
           "common n": r["n"], "floor": f"{r['floor']['flips']}/{r['n']}", "refeed": f"{r['refeed']['flips']}/{r['n']}"}
    for p in ("exact2", "refeed"):
        out[f"probe bit-exact {p}"] = f"{int((df[f'greedy_first_logprob_delta_{p}'] == 0).sum())}/{len(df)}"
        out[f"continuations differing {p}"] = int(df[f"cont_diff_{p}"].sum())
    out["continuations per pass"] = int(sum(len(c) for v in df.continuations_exact1 for c in json.loads(v).values()))
    for stage in ("01_sampling", "03_three_pass_replay", "05_batch_invariant"):
        m = manifest(root, config, stage)
        if m.get("copied_from"):
            out[f"stage {stage[:2]}"] = f"copied from {m['copied_from']}"
        elif m.get("seconds"):
            out[f"seconds {stage[:2]}"] = m["seconds"]
            if m.get("engine_lease"):
                lease = m["engine_lease"]
                out[f"engine {stage[:2]}"] = (f"started here ({lease['start_s']} s)" if lease["started_for_this_stage"]
                                              else "leased, already up") + f", server pid {lease['server_pid']}"
    inv = manifest(root, config, "05_batch_invariant")
    if inv.get("report"):
        out["invariant"] = {k: v for k, v in inv["report"].items() if k != "engine"}
    return out


def union_seconds(intervals: list) -> float:
    total, end = 0.0, None
    for a, b in sorted(intervals):
        if end is None or a > end:
            total += b - a
            end = b
        elif b > end:
            total += b - end
            end = b
    return total


def engines(root: Path) -> None:
    found = sorted((root / "runs" / ".engines").glob("*/engines.json"))
    for path in found:
        record = json.loads(path.read_text())
        wall = record["closed"] - record["opened"]
        print(f"engines of {path.parent.name}: broker open {wall:.1f} s, {len(record['servers'])} servers")
        busy = []
        for s in record["servers"]:
            ident = s["identity"]
            leases = [(lease["stage"], round(lease.get("released", record["closed"]) - lease["leased"], 1))
                      for lease in s["leases"]]
            print(f"  server {s.get('pid')}: {ident['serving']}{' batch-invariant' if ident['batch_invariant'] else ''}"
                  f", start {s.get('start_s')} s, stop {s.get('stop_s')} s, exit {s.get('exit_code')}, leases {leases}")
            if "ready" in s:
                busy.append((s["start_began"], s["ready"]))
            if "stopped" in s:
                busy.append((s["stop_began"], s["stopped"]))
        starts = sum(s.get("start_s") or 0 for s in record["servers"])
        stops = sum(s.get("stop_s") or 0 for s in record["servers"])
        during = union_seconds(busy)
        print(f"  engine starts {starts:.1f} s and stops {stops:.1f} s in all; some engine starting or stopping "
              f"during {during:.1f} s of the broker's {wall:.1f} s ({100 * during / wall:.1f}%)")


def same(a: Path, b: Path) -> str:
    if not (a.exists() and b.exists()):
        return "missing"
    return "identical" if sha256_file(a) == sha256_file(b) else "differ"


def main(argv):
    results = Path(argv[1])
    root = results / "rl"
    for r in (per_config(root, c) for c in CONFIGS):
        if r:
            print(json.dumps(r))
    engines(root)
    for mp, ip in (("gpu-paper-size-primary", "gpu-paper-size-primary-inprocess"),
                   ("gpu-paper-size-screened", "gpu-paper-size-screened-inprocess")):
        print(f"trunks {mp} vs {ip}: " + same(root / "runs" / mp / "01_sampling" / "trunks.parquet",
                                              root / "runs" / ip / "01_sampling" / "trunks.parquet"))
    config = "gpu-embedded-inprocess"
    shared, own = results / "rl2" / "runs" / config, results / "rl3" / "runs" / config
    for stage, name in (("01_sampling", "trunks.parquet"), ("02_pivot_mining", "pivots.parquet"),
                        ("03_three_pass_replay", "records.parquet")):
        print(f"{config} {stage}/{name}, one engine (rl2) vs an engine per stage (rl3): "
              + same(shared / stage / name, own / stage / name))
    if len(argv) > 2:
        lease7 = Path(argv[2]) / config
        for stage, files in (("01_sampling", ["trunks.parquet", "problems.json", "accuracy.csv"]),
                             ("02_pivot_mining", ["pivots.parquet", "margins.parquet"])):
            theirs = json.loads((lease7 / stage / "manifest.json").read_text())["outputs"]
            ours = json.loads((shared / stage / "manifest.json").read_text())["outputs"]
            print(f"{config} {stage} vs lease 7: " + ", ".join(
                f"{f} {'identical' if ours.get(f) == theirs.get(f) else 'differ'}" for f in files))
    if len(argv) > 3:
        old = pd.read_parquet(Path(argv[3]) / "03_three_pass_replay" / "records.parquet")
        new = pd.read_parquet(shared / "03_three_pass_replay" / "records.parquet")
        cols = [c for c in old.columns if c in new.columns and c != "config"]
        key = ["problem_id", "rollout", "abs_pos"]
        a = old.sort_values(key).reset_index(drop=True)[cols]
        b = new.sort_values(key).reset_index(drop=True)[cols]
        print(f"{config} records vs lease 5 (in-process): {len(cols)} common columns, {len(a)} vs {len(b)} rows, "
              + ("identical" if a.equals(b) else f"differ in {[c for c in cols if not a[c].equals(b[c])]}"))


if __name__ == "__main__":
    main(sys.argv)
