"""Lease 11's numbers (python lease11_numbers.py ROOT [RERUN_ROOT]): the transformers engine on CUDA.
Per configuration under ROOT/runs: pivots, flagged resumes, replica exactness (exact2 against exact1 on
every channel), stage 03's wall time and decode rate; Table 1's numbers; the transplant table; the layer
profile (where the re-fed K and V first differ from the decode-time ones, relative to the prompt's end).
Then the two-runs checks: gpu-embedded-xplant-fp32's exact passes against gpu-embedded-xplant's (another
run of the same trunks, pivots and batches) and, given RERUN_ROOT, gpu-embedded-xplant's stage 03 rerun
there against ROOT's, on every column."""
import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from replaylib.analysis import stats, stats_extras

root = Path(sys.argv[1])
rerun = Path(sys.argv[2]) if len(sys.argv) > 2 else None
MAIN, FP32, ALONE = "gpu-embedded-xplant", "gpu-embedded-xplant-fp32", "gpu-embedded-xplant-alone"
pd.set_option("display.width", 250)
pd.set_option("display.max_columns", 30)


def records(base: Path, config: str):
    path = base / "runs" / config / "03_three_pass_replay" / "records.parquet"
    return pd.read_parquet(path) if path.exists() else None


def pass_columns(df, name):
    return sorted(c for c in df.columns if c.endswith("_" + name))


def value(x):
    """A cell as comparable text (lists, arrays and dicts of them as values; NaN as NaN)."""
    return json.dumps(x, default=lambda v: v.tolist() if hasattr(v, "tolist") else str(v), sort_keys=True)


def equal_rows(pairs) -> list[bool]:
    """Per row: every (series a, series b) pair equal there."""
    pairs = list(pairs)
    return [all(value(a.iloc[i]) == value(b.iloc[i]) for a, b in pairs) for i in range(len(pairs[0][0]))]


for config in (MAIN, FP32, ALONE):
    df = records(root, config)
    if df is None:
        print(f"[{config}] no records")
        continue
    manifest = json.loads((root / "runs" / config / "03_three_pass_replay" / "manifest.json").read_text())
    passes = [c[2:] for c in df.columns if c.startswith("A_")]
    tokens = {p: int(df[f"cont_tokens_{p}"].sum()) for p in passes if f"cont_tokens_{p}" in df}
    print(f"[{config}] pivots {len(df)} problems {df.problem_id.nunique()} exact_ok {int(df.exact_ok.sum())} "
          f"first_step_exact {int(df.first_step_exact.fillna(False).sum())} passes {passes}")
    print(f"[{config}] stage 03 seconds {json.dumps(manifest.get('summary', manifest).get('seconds', {}))}")
    print(f"[{config}] continuation tokens per pass {tokens}")
    skip = ("greedy_divergence", "greedy_first_logprob_delta", "cont_diff")  # comparisons with exact1 itself
    pairs = [(c, c.replace("_exact1", "_exact2")) for c in pass_columns(df, "exact1") if not c.startswith(skip)]
    pairs = [(a, b) for a, b in pairs if b in df.columns]
    eq = equal_rows((df[a], df[b]) for a, b in pairs)
    print(f"[{config}] exact2 == exact1 on every channel ({', '.join(a for a, _ in pairs)}): "
          f"{sum(eq)}/{len(df)}")
    t1 = stats.table1_numbers(df)
    print(f"[{config}] table1 " + ", ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}"
                                           for k, v in t1.items()))
    tab = stats_extras.transplant(df)
    if len(tab):
        print(f"[{config}] transplant table\n{tab.to_string(index=False)}")
    # the grading-free channel: how far each pass's first-token logprobs are from exact1's and from refeed's
    firsts = {p: stats_extras._probe_first(df, p) for p in passes}
    for p in passes[1:]:
        far = {ref: np.array([abs(x[a] - y[a]) for x, y in zip(firsts[p], firsts[ref]) for a in x])
               for ref in ("exact1", "refeed")}
        print(f"[{config}] first-token |logprob difference| of {p}: " + "; ".join(
            f"against {ref} median {np.median(d):.2e}, mean {d.mean():.2e}, "
            f"zero at {int((d == 0).sum())}/{len(d)} probes" for ref, d in far.items()))
    prof = root / "runs" / config / "03_three_pass_replay" / "layer_profile.parquet"
    if prof.exists():
        profile = pd.read_parquet(prof)
        same_state = profile.groupby(["problem_id", "rollout", "abs_pos"]).max_abs_diff.max() == 0
        prompt_same = profile.groupby(["problem_id", "rollout", "abs_pos"]).max_abs_diff_prompt.max() == 0
        keyed = df.set_index(["problem_id", "rollout", "abs_pos"])
        ids = same_state[same_state].index
        print(f"[{config}] re-fed prefix state equal to the decode-time one at every layer and position: "
              f"{len(ids)}/{len(same_state)} pivots; over the prompt's positions: {int(prompt_same.sum())}/"
              f"{len(prompt_same)}")
        if len(ids):
            sub = keyed.loc[ids]
            e1, rf = stats_extras._probe_first(sub, "exact1"), stats_extras._probe_first(sub, "refeed")
            common = sub[(sub[[f"A_{p}" for p in passes]] != 0).any(axis=1)]
            flips = int((np.sign(common.A_exact1) != np.sign(common.A_refeed)).sum())
            print(f"[{config}]   there (generated positions before the pivot: {sorted(set(sub.gen_index))}), refeed's "
                  f"first-token logprobs equal exact1's at {sum(x == y for x, y in zip(e1, rf))}/{len(sub)} pivots; "
                  f"A's sign differs at {flips}/{len(common)} common pivots")
        summary = stats_extras.layer_profile_summary(profile)
        summary.to_csv(root / f"layer_profile_{config}.csv", index=False)
        for tensor, g in summary.groupby("tensor"):
            print(f"[{config}] layer profile {tensor}: share of pivots differing per layer "
                  f"{g.share_differing.min():.2f}-{g.share_differing.max():.2f}; median first difference vs the "
                  f"prompt's end, layers 0-{g.layer.max()}: {g.median_first_diff_vs_prompt_end.tolist()}")

main, fp32 = records(root, MAIN), records(root, FP32)
if main is not None and fp32 is not None:
    cols = [c for p in ("exact1", "exact2") for c in pass_columns(main, p)] + ["first_step_exact", "exact_ok"]
    eq = equal_rows((main[c].reset_index(drop=True), fp32[c].reset_index(drop=True)) for c in cols)
    print(f"[two runs] {FP32}'s exact passes against {MAIN}'s: {sum(eq)}/{len(main)} pivots equal on "
          f"{len(cols)} columns")
if rerun is not None and main is not None and records(rerun, MAIN) is not None:
    again = records(rerun, MAIN)
    cols = [c for c in main.columns if c in again.columns]
    eq = equal_rows((main[c].reset_index(drop=True), again[c].reset_index(drop=True)) for c in cols)
    print(f"[two runs] {MAIN}'s stage 03 run again: {sum(eq)}/{len(main)} pivots equal on all {len(cols)} "
          f"columns; records.parquet sha256 equal: "
          f"{(root / 'runs' / MAIN / '03_three_pass_replay' / 'records.parquet').read_bytes() == (rerun / 'runs' / MAIN / '03_three_pass_replay' / 'records.parquet').read_bytes()}")
