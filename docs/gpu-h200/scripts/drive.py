"""Device driver: run replaylib stage functions directly (no papermill) and print the evidence.

usage: python3 drive.py PARAMS_YAML OVERRIDES_JSON STAGES
STAGES: comma list of sample, pivots, replay, stats, invariant (run in this order, one process).
"""
import json
import logging
import sys
import time
import traceback

import yaml

sys.path.insert(0, ".")
logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")

from replaylib import params as P  # noqa: E402

base, over, stages = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3].split(",")
data = yaml.safe_load(open(base))
data.update(over)
data.setdefault("config", "gpu-smoke")
dropped = {k: data.pop(k) for k in list(data) if k not in P.Params.names()}
if dropped:
    print("DROPPED unknown params (not in this tree's schema):", dropped, flush=True)
p = P.make(data, where=f"{base} + {over}")
print("PARAMS", json.dumps(p.to_dict(), default=str), flush=True)

# log what problem_state reports (trunk reproduction) on either engine
try:
    from replaylib import engine_vllm

    _orig_ps = engine_vllm.VLLMEngine.problem_state

    def _ps(self, sampling_dir, problem_id, trunks):
        st, ver = _orig_ps(self, sampling_dir, problem_id, trunks)
        print(f"PROBLEM_STATE vllm problem {problem_id}: verified {ver} "
              f"({sum(ver.values())}/{len(ver)} identical), trunk_blocks {st['trunk_blocks']}, "
              f"established {st['established']}, num_blocks {self.num_blocks}, preemptions {self.preemptions}",
              flush=True)
        return st, ver

    engine_vllm.VLLMEngine.problem_state = _ps
except Exception as e:  # noqa: BLE001
    print("no vllm wrapper:", e)
try:
    from replaylib import engine_hf

    _orig_hps = engine_hf.HFEngine.problem_state

    def _hps(self, *a, **k):
        st, ver = _orig_hps(self, *a, **k)
        print(f"PROBLEM_STATE hf problem {a[1]}: verified {ver} ({sum(ver.values())}/{len(ver)})", flush=True)
        return st, ver

    engine_hf.HFEngine.problem_state = _hps
    # engine_hf.choose_tokens builds inv_t on the CPU (fails with cuda logits): patched here only, at run time
    import inspect
    import textwrap
    src = textwrap.dedent(inspect.getsource(engine_hf.choose_tokens))
    bug = "dtype=torch.float32)[:, None]"
    if bug in src:
        exec(compile(src.replace(bug, "dtype=torch.float32, device=logits.device)[:, None]"), "choose_tokens", "exec"),
             engine_hf.__dict__)
        print("PATCHED engine_hf.choose_tokens at run time: inv_t created on logits.device", flush=True)
except Exception as e:  # noqa: BLE001
    print("no hf wrapper:", e)

COLS = ["problem_id", "rollout", "abs_pos", "margin", "A_exact1", "A_exact2", "A_refeed", "exact_ok",
        "cache_ok_exact1", "cache_ok_exact2", "first_step_exact", "greedy_divergence_exact2",
        "greedy_divergence_refeed", "greedy_first_logprob_delta_exact2", "greedy_first_logprob_delta_refeed",
        "cont_diff_exact2", "cont_diff_refeed"]


def show_records(tag, recs):
    import pandas as pd
    cols = [c for c in COLS if c in recs.columns]
    with pd.option_context("display.width", 250, "display.max_rows", 500, "display.max_columns", 50):
        print(f"RECORDS {tag} ({len(recs)})\n{recs[cols].to_string()}", flush=True)
    n = len(recs)
    if not n:
        return
    c = {"records": n, "exact_ok": int(recs.exact_ok.sum())}
    for name in ("cache_ok_exact1", "cache_ok_exact2"):
        if name in recs:
            c[name] = int(recs[name].astype(bool).sum())
    for name in ("exact2", "refeed"):
        c[f"A_equal_{name}"] = int((recs[f"A_{name}"] == recs["A_exact1"]).sum())
        c[f"probe_tokens_diverge_{name}"] = int(recs[f"greedy_divergence_{name}"].sum())
        c[f"probe_first_lp_bitexact_{name}"] = int((recs[f"greedy_first_logprob_delta_{name}"] == 0).sum())
        c[f"pivots_with_cont_diff_{name}"] = int((recs[f"cont_diff_{name}"] > 0).sum())
        c[f"cont_diff_total_{name}"] = int(recs[f"cont_diff_{name}"].sum())
    c["A_identical_all_passes"] = int(((recs.A_exact1 == recs.A_exact2) & (recs.A_exact1 == recs.A_refeed)).sum())
    print(f"COUNTS {tag} {json.dumps(c)}", flush=True)


def stats_of(tag, recs):
    from replaylib import stats
    s = stats.summarize(recs)
    keep = {k: s.get(k) for k in ("n_records", "n_problems", "excluded_not_exact", "common", "excess_pp",
                                   "probes", "cache", "mcnemar")}
    print(f"SUMMARY {tag} {json.dumps(keep, default=str)}", flush=True)
    import pandas as pd
    recs = recs.copy()
    recs.attrs["configs"] = {p.config: {"model": p.model, "k": p.k, "cont_temp": p.cont_temperature,
                                        "problems": int(recs.problem_id.nunique())}}
    t = stats.table1({tag: recs})
    with pd.option_context("display.width", 250, "display.max_columns", 50):
        print(f"TABLE1 {tag}\n{t.to_string(index=False)}", flush=True)


t0 = time.time()
try:
    if "sample" in stages:
        from replaylib import sampling
        r = sampling.run(p)
        print("SAMPLING", json.dumps(r, default=str), f"{time.time() - t0:.1f}s", flush=True)
        trunks, info, probs = sampling.load(p)
        print("TRUNKS", len(trunks), "n_tokens", trunks.n_tokens.tolist(), "finish",
              trunks.finish_reason.value_counts().to_dict(), "correct", int(trunks.correct.sum()), flush=True)
    if "pivots" in stages:
        from replaylib import pivots
        pv = pivots.run(p)
        print("PIVOTS", len(pv), pv.groupby("problem_id").size().to_dict(), "abs_pos%16",
              sorted(set((pv.abs_pos % 16).tolist())), f"{time.time() - t0:.1f}s", flush=True)
    if "replay" in stages:
        from replaylib import replay
        recs = replay.run(p)
        print(f"REPLAY done {time.time() - t0:.1f}s", flush=True)
        show_records(p.config, recs)
    if "stats" in stages:
        from replaylib import replay
        stats_of(p.config, replay.load(p))
    if "invariant" in stages:
        from replaylib import invariant
        try:
            rep = invariant.run(p)
            print("INVARIANT_REPORT", json.dumps(rep, default=str), flush=True)
        except AssertionError as e:
            print("INVARIANT_FAILED", e, flush=True)
        recs = invariant.load(p) if False else None
        import pandas as pd
        from replaylib.rundir import StageDir
        path = StageDir(p, invariant.STAGE).path
        recs = pd.read_parquet(path / "records.parquet")
        print("INVARIANT_JSON", (path / "invariant.json").read_text(), flush=True)
        show_records(p.config + " (invariant)", recs)
        if len(recs):
            stats_of(p.config + " (invariant)", recs)
        print(f"INVARIANT done {time.time() - t0:.1f}s", flush=True)
    if "table1both" in stages:
        import pandas as pd
        from replaylib import invariant, replay, stats
        from replaylib.rundir import StageDir
        rows = {}
        for tag, path in ((p.config + " stock", StageDir(p, replay.STAGE).path),
                          (p.config + " batch-invariant", StageDir(p, invariant.STAGE).path)):
            df = pd.read_parquet(path / "records.parquet")
            df.attrs["configs"] = {p.config: {"model": "qwen2.5-coder-0.5b-instruct", "k": p.k,
                                              "cont_temp": p.cont_temperature,
                                              "problems": int(df.problem_id.nunique())}}
            rows[tag] = df
        with pd.option_context("display.width", 250, "display.max_columns", 50):
            print("TABLE1_BOTH\n" + stats.table1(rows).to_string(index=False), flush=True)
except Exception:
    traceback.print_exc()
    print("DRIVE_FAILED", flush=True)
    sys.exit(1)
print("DRIVE_OK", stages, f"{time.time() - t0:.1f}s", flush=True)
