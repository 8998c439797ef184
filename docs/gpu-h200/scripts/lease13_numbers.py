"""The numbers of leases 13 and 14, from the replay records that came back whole (docs/gpu-h200/lease1N/records; a
batch-invariant stage's as NAME-invariant.parquet, summarised from its invariant.json) and, where given, the
sampling stage's trunks (the returned root, not kept: its prompt token counts).

    python docs/gpu-h200/scripts/lease13_numbers.py docs/gpu-h200/lease13 [RETURNED_RUNS_DIR ...]
    python docs/gpu-h200/scripts/lease13_numbers.py docs/gpu-h200/lease14 [RETURNED_RUNS_DIR ...]
"""
import json
import sys
from pathlib import Path

import pandas as pd

from replaylib.analysis import records as rec
from replaylib.analysis import stats

PASSES = ("exact2", "refeed", "refeed2", "block16")


def main(evidence: Path, returned: list[Path]) -> None:
    for path in sorted((evidence / "records").glob("*-invariant.parquet")):  # a batch-invariant stage's records
        cfg = path.stem.removesuffix("-invariant")
        summary = json.loads((evidence / "runs" / cfg / "05_batch_invariant" / "invariant.json").read_text())
        print(f"== {cfg}, batch-invariant: {json.dumps(summary, sort_keys=True)[:600]}")
    for path in sorted(p for p in (evidence / "records").glob("*.parquet") if not p.stem.endswith("-invariant")):
        cfg = path.stem
        df = rec.load_records(path)
        problems = json.loads((evidence / "runs" / cfg / "01_sampling" / "problems.json").read_text())
        scanned = problems["scanned"]
        print(f"== {cfg}: {len(df)} pivots over {df.problem_id.nunique()} problems; problems kept "
              f"{len(problems['kept'])} of {len(scanned)} scanned (trunk accuracy of the kept: "
              f"{[s['trunk_accuracy'] for s in scanned if s['kept']]})")
        said = [f"every pivot resumed a verified state: {int(df.exact_ok.sum())}/{len(df)}",
                f"states {df.state_established.value_counts().to_dict()}"]
        if df.state_established.str.startswith("regenerated").any():  # vLLM: the prefix cache
            said.append(f"exact requests served from the cache: exact1 {int(df.cache_ok_exact1.sum())}, exact2 "
                        f"{int(df.cache_ok_exact2.sum())}; preemptions "
                        f"{int(df.preemptions_exact1.sum() + df.preemptions_exact2.sum())}")
        print("   " + "; ".join(said))
        for p in (p for p in PASSES if f"A_{p}" in df):
            print(f"   {p}: A equal to exact1 {int((df[f'A_{p}'] == df.A_exact1).sum())}/{len(df)}, greedy probe "
                  f"tokens identical {int((~df[f'greedy_divergence_{p}']).sum())}, its first logprob bit-exact "
                  f"{int((df[f'greedy_first_logprob_delta_{p}'] == 0).sum())}")
        q = stats.table1_numbers(df)
        print("   Table 1: " + ", ".join(f"{k} {v:.2f}" if isinstance(v, float) else f"{k} {v}" for k, v in q.items()))
        for root in returned:
            trunks = root / cfg / "01_sampling" / "trunks.parquet"
            if trunks.is_file():
                t = pd.read_parquet(trunks)
                print(f"   trunks: prompt tokens {sorted(set(t.prompt_ids.map(len)))[:6]}, generated tokens mean "
                      f"{t.n_tokens.mean():.1f}, finish {t.finish_reason.value_counts().to_dict()}")
                break


if __name__ == "__main__":
    main(Path(sys.argv[1]), [Path(a) for a in sys.argv[2:]])
