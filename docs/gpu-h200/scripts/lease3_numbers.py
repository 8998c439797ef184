"""Every number of docs/gpu-h200.md's lease-3 section, from docs/gpu-h200/lease3/.

    .venv/bin/python docs/gpu-h200/scripts/lease3_numbers.py

Reads the records, JSON files, executed notebooks and logs that came back from the H200
(2026-11-30) and prints them, each block headed by the file it comes from. Light pandas
work only; nothing is recomputed on a model.
"""
from __future__ import annotations

import ast
import hashlib
import json
import re
from pathlib import Path

import numpy as np
import pandas as pd

from replaylib import stats
from replaylib.records import load_records

ROOT = Path(__file__).resolve().parents[1] / "lease3"
RUNS, LOGS = ROOT / "runs", ROOT / "logs"
MODEL = "embedded:qwen2.5-coder-0.5b-instruct"
pd.set_option("display.width", 250)
pd.set_option("display.max_columns", 30)


def rel(p: Path) -> str:
    return str(p.relative_to(ROOT.parent))


def head(title: str, *files: Path) -> None:
    print(f"\n=== {title}  [{', '.join(rel(f) for f in files)}]")


def records(config: str, stage: str = "03_three_pass_replay") -> tuple[pd.DataFrame, Path]:
    path = RUNS / config / stage / "records.parquet"
    return load_records(path), path


def num(x, fmt: str) -> str:
    return "None" if x is None else format(x, fmt)


def count(s: pd.Series) -> str:
    v = s.dropna().astype(bool)
    return f"{int(v.sum())}/{len(v)}" if len(v) else f"not recorded (all {len(s)} None)"


def trunks_block(config: str) -> None:
    path = RUNS / config / "01_sampling" / "trunks.parquet"
    t = pd.read_parquet(path, columns=["problem_id", "rollout", "correct", "n_tokens", "finish_reason"])
    acc = t.groupby("problem_id").correct.mean().to_dict()
    head(f"{config}: trunks", path)
    print(f"trunks {len(t)} over {t.problem_id.nunique()} problems; correct {int(t.correct.sum())}/{len(t)}; "
          f"finish {t.finish_reason.value_counts().to_dict()}; accuracy per problem {acc}")


def pivots_block(config: str) -> None:
    path = RUNS / config / "02_pivot_mining" / "pivots.parquet"
    p = pd.read_parquet(path)
    head(f"{config}: pivots", path)
    print(f"pivots {len(p)}; per problem {p.groupby('problem_id').size().to_dict()}")


def main_block(config: str, df: pd.DataFrame, path: Path) -> dict:
    s = stats.summarize(df)
    head(f"{config}: stage 03 records, stats.summarize", path)
    c, mc, cl, pr = s["common"], s["mcnemar"], s["clustered"], s["probes"]
    print(f"records {s['n_records']} ({s['n_problems']} problems); excluded_not_exact {s.get('excluded_not_exact')}")
    print(f"exact_ok {count(df.exact_ok)}; cache_ok_exact1 {count(df.cache_ok_exact1)}; "
          f"cache_ok_exact2 {count(df.cache_ok_exact2)}")
    print(f"first_step_exact {count(df.first_step_exact)}; regenerates_trunk {count(df.regenerates_trunk)}")
    print(f"common n {c['n']}: refeed {c['refeed']['flips']} flips = {100 * c['refeed']['rate']:.1f}% "
          f"(polarity {c['refeed']['polarity']}, zero crossings {c['refeed']['zero_crossings']}); "
          f"floor {c['floor']['flips']} flips = {100 * c['floor']['rate']:.1f}% (polarity {c['floor']['polarity']})")
    print(f"excess {num(s['excess_pp'], '+.1f')} pp; exact1-conditioned n {s['exact1_conditioned']['n']}: "
          f"excess {num(s['excess_pp_exact1'], '+.1f')} pp")
    print(f"McNemar b {mc['b']} c {mc['c']} z {mc['z']:.2f}; clustered: {cl['n_problems']} problems, "
          f"mean per-problem excess {num(cl['mean_excess'], '.1f')} pp, t {num(cl['t'], '.2f')} "
          f"(refeed worse {cl['refeed_worse']}, floor worse {cl['floor_worse']}, equal {cl['equal']})")
    b = s["bias"]
    print(f"bias of A_refeed - A_exact1: mean {num(b['mean'], '+.4f')}, t {num(b['t'], '.3f')}")
    for side, pass_ in (("refeed", "refeed"), ("replica", "exact2")):
        d = df[f"greedy_first_logprob_delta_{pass_}"].astype(float)
        div = df[f"greedy_divergence_{pass_}"].astype(bool)
        print(f"probes {side}: first-token logprob bit-exact {int((d == 0).sum())}/{len(d)}, "
              f"probe tokens diverge {int(div.sum())}/{len(d)}, median non-zero |delta| "
              f"{stats.probes(df)[side]['median_nonzero']}, p90 {pr[side]['p90']:.2e}")
    for pass_ in [p for p in ("exact2", "refeed", "refeed2", "serial", "block16") if f"A_{p}" in df.columns]:
        print(f"{pass_}: A equal to exact1 {int((df[f'A_{pass_}'] == df.A_exact1).sum())}/{len(df)}, "
              f"pivots with differing continuations {int((df[f'cont_diff_{pass_}'] > 0).sum())}, "
              f"differing continuations {int(df[f'cont_diff_{pass_}'].sum())} of {len(df) * 2 * 4}")
    if "A_refeed2" in df.columns:
        # load_records parses the published passes' probe fields; the extra passes' stay JSON text
        g1, g2 = (df[c].map(lambda v: json.loads(v) if isinstance(v, str) else v)
                  for c in ("greedy_first_refeed", "greedy_first_refeed2"))
        wins = (df.wins_refeed2_actual == df.wins_refeed_actual) & (df.wins_refeed2_alt == df.wins_refeed_alt)
        print(f"refeed2 vs refeed: A equal {int((df.A_refeed2 == df.A_refeed).sum())}/{len(df)}, "
              f"wins equal (both arms) {int(wins.sum())}/{len(df)}, "
              f"probe first token and logprob equal (both arms) {int((g1 == g2).sum())}/{len(df)}")
    same = np.ones(len(df), bool)
    for p in [c[2:] for c in df.columns if c.startswith("A_") and c != "A_exact1"]:
        same &= (df[f"A_{p}"] == df.A_exact1).to_numpy()
    print(f"A identical in all passes {int(same.sum())}/{len(df)}")
    return s


def tab10(config: str, df: pd.DataFrame, path: Path) -> None:
    head(f"{config}: stats.pass_comparisons (tab10)", path)
    t = stats.pass_comparisons(df)
    t["rate"] = t["rate"].map(lambda r: "-" if r is None else f"{100 * r:.1f}%")
    print(t.to_string(index=False))


def notebook_markdown(path: Path) -> list[str]:
    nb = json.loads(path.read_text())
    return ["".join(o["data"]["text/markdown"]) for c in nb["cells"] for o in c.get("outputs", [])
            if "text/markdown" in o.get("data", {})]


def notebook_text(path: Path) -> str:
    nb = json.loads(path.read_text())
    out = []
    for c in nb["cells"]:
        for o in c.get("outputs", []):
            if o.get("output_type") == "stream":
                out.append("".join(o["text"]))
            elif "text/plain" in o.get("data", {}):
                out.append("".join(o["data"]["text/plain"]))
    return "\n".join(out)


def papermill_times(path: Path) -> str:
    pm = json.loads(path.read_text())["metadata"].get("papermill", {})
    return f"start {pm.get('start_time')}, end {pm.get('end_time')}, duration {pm.get('duration')}"


def main() -> None:
    # ------------------------------------------------------------------ timeline, versions
    head("step timeline", LOGS / "progress")
    print((LOGS / "progress").read_text().rstrip())
    head("install, versions, GPU tests, conversion", LOGS / "install.log", LOGS / "versions.log",
         LOGS / "gpu_tests.log", LOGS / "convert.log")
    for name in ("install.log", "gpu_tests.log", "convert.log"):
        print((LOGS / name).read_text().rstrip())
    print("\n".join((LOGS / "versions.log").read_text().splitlines()[:5]))
    repo = ROOT.parents[2]
    logged = dict(reversed(l.split()) for l in (LOGS / "versions.log").read_text().splitlines()
                  if l.endswith(".py") and l.split()[-1].startswith("replaylib/"))
    here = {f"replaylib/{f.name}": hashlib.md5(f.read_bytes()).hexdigest() for f in sorted((repo / "replaylib").glob("*.py"))}
    diff = sorted(k for k in set(logged) | set(here) if logged.get(k) != here.get(k))
    print(f"replaylib/*.py md5 in versions.log vs this tree: {len(logged)} logged, "
          f"{'all equal' if not diff else 'differ: ' + ', '.join(diff)}")
    head("first attempt: vLLM start-up failures", LOGS / "run_vllm.log", LOGS / "run_extras.log")
    for name in ("run_vllm.log", "run_extras.log"):
        for line in (LOGS / name).read_text().splitlines():
            if line.startswith("error:"):
                print(f"{name}: {line[:line.index('. This happens')]}")

    # ------------------------------------------------------------------ stage timings
    head("stage timings ('done in N s'; papermill metadata for unfinished stages)",
         *(LOGS / n for n in ("run_vllm2.log", "run_hf.log", "run_extras2.log")))
    for name in ("run_vllm2.log", "run_hf.log", "run_extras2.log"):
        text = (LOGS / name).read_text()
        done = re.findall(r"config (\S+), stage (\S+): done in (\d+) s", text)
        started = re.findall(r"config (\S+), stage (\S+): running", text)
        for cfg, stage, sec in done:
            print(f"{name}: {cfg} {stage} {sec} s")
        for cfg, stage in started:
            if stage not in {s for _, s, _ in done}:
                nb = RUNS / cfg / stage / f"{stage}.ipynb"
                print(f"{name}: {cfg} {stage} started, no 'done' line; notebook {rel(nb)}: {papermill_times(nb)}")

    # ------------------------------------------------------------------ vLLM notebooks
    head("vLLM stage notebooks: attention backend, CUDA graphs, warnings",
         *sorted(RUNS.glob("gpu-embedded*/0[135]_*/*.ipynb")))
    for nb in sorted(RUNS.glob("gpu-embedded*/0[135]_*/*.ipynb")):
        if nb.parts[-3] == "gpu-embedded-hf":
            continue
        t = nb.read_text()
        m = re.search(r"stage \S+, engine (\{.*?\})", notebook_text(nb))
        eng = ast.literal_eval(m.group(1)) if m else {}  # the engine's describe() dict, as logged
        backends = re.findall(r"Using (\w+) attention backend", t) or "-"
        fa = re.findall(r"FlashAttention version (\d)", t) or "-"
        print(f"{rel(nb)}: backend line {backends}, FlashAttention version {fa}, "
              f"'Graph capturing finished' {t.count('Graph capturing finished')}, "
              f"engine attention_backend {eng.get('attention_backend')}, enforce_eager {eng.get('enforce_eager')}, "
              f"'regenerated trunks differ' {t.count('regenerated trunks differ')}, "
              f"'vLLM preempted' {t.count('vLLM preempted')}")

    # ------------------------------------------------------------------ gpu-embedded (vLLM)
    cfg = "gpu-embedded"
    trunks_block(cfg)
    pivots_block(cfg)
    nb3 = RUNS / cfg / "03_three_pass_replay" / "03_three_pass_replay.ipynb"
    text = notebook_text(nb3)
    head(f"{cfg}: trunk re-establishment in stage 03 (notebook output)", nb3)
    print("engine:", re.search(r"engine (\{.*?\}): \d+ problems to replay", text).group(1))
    print(f"'regenerated trunks differ' warnings: {text.count('regenerated trunks differ')}; "
          f"'preempted' warnings: {text.count('vLLM preempted')}; "
          f"'Successfully reset prefix cache' lines: {text.count('Successfully reset prefix cache')} "
          f"(one per trunk regeneration and one per refeed pass)")
    df, path = records(cfg)
    main_block(cfg, df, path)
    tab10(cfg, df, path)

    inv_path = RUNS / cfg / "05_batch_invariant" / "invariant.json"
    inv_df, inv_rec = records(cfg, "05_batch_invariant")
    head(f"{cfg}: batch-invariant stage", inv_path, inv_rec)
    inv = json.loads(inv_path.read_text())
    print({k: v for k, v in inv.items() if k != "engine"})
    print({k: inv["engine"][k] for k in ("attention_backend", "batch_invariant", "enforce_eager", "num_gpu_blocks")})
    print(f"problems {inv_df.problem_id.nunique()} ({inv_df.groupby('problem_id').size().to_dict()} pivots), "
          f"exact_ok {count(inv_df.exact_ok)}")
    s_inv = stats.summarize(inv_df)
    print(f"common n {s_inv['common']['n']}, refeed flips {s_inv['common']['refeed']['flips']}, "
          f"floor flips {s_inv['common']['floor']['flips']}")

    nb4 = RUNS / cfg / "04_statistics" / "04_statistics.ipynb"
    head(f"{cfg}: Table 1 as printed by stage 04", nb4)
    md = notebook_markdown(nb4)
    print(md[0].rstrip())
    for block in md[1:]:
        if block.startswith("**tab6_probes**") or block.startswith("**tab3_exact1_excess**"):
            print(block.rstrip())
    head(f"{cfg}: Table 1 recomputed here with stats.table1 (must equal the above)", path, inv_rec)
    rows = {cfg: df, f"{cfg} batch-invariant": inv_df}
    for (label, d), bi in zip(rows.items(), (False, True)):
        d.attrs["configs"] = {label: {"model": MODEL, "k": 4, "cont_temp": 0.7,
                                      "problems": int(d.problem_id.nunique()), "batch_invariant": bi}}
    print(stats.table1(rows).to_string(index=False))

    # ------------------------------------------------------------------ gpu-embedded-hf
    cfg = "gpu-embedded-hf"
    trunks_block(cfg)
    pivots_block(cfg)
    df, path = records(cfg)
    nb3 = RUNS / cfg / "03_three_pass_replay" / "03_three_pass_replay.ipynb"
    head(f"{cfg}: engine", nb3)
    print(re.search(r"engine (\{.*?\}): \d+ problems to replay", notebook_text(nb3)).group(1))
    main_block(cfg, df, path)
    head(f"{cfg}: stats.resume_exactness", path)
    for k, v in stats.resume_exactness(df).items():
        print(f"{k}: {v}")
    tab10(cfg, df, path)
    head(f"{cfg}: Table 1 row computed here (stage 04 did not run on the device)", path)
    df.attrs["configs"] = {cfg: {"model": MODEL, "k": 4, "cont_temp": 0.7,
                                 "problems": int(df.problem_id.nunique()), "batch_invariant": False}}
    print(stats.table1({cfg: df}).to_string(index=False))

    # ------------------------------------------------------------------ gpu-embedded-extras
    cfg = "gpu-embedded-extras"
    trunks_block(cfg)
    pivots_block(cfg)
    df, path = records(cfg)
    nb3 = RUNS / cfg / "03_three_pass_replay" / "03_three_pass_replay.ipynb"
    text = notebook_text(nb3)
    head(f"{cfg}: pass order, serial pass", path, nb3)
    print(f"pass_order values: {df.pass_order.value_counts().to_dict()}")
    cached_cols = [c for c in df.columns if "cached" in c]
    print(f"record columns naming cached tokens: {cached_cols or 'none (min_cached_tokens is not a record column)'}")
    n_serial = len(df) * 2 * (4 + 1)
    print(f"serial requests: {len(df)} pivots x 2 arms x (K 4 + 1 probe) = {n_serial}; "
          f"'Successfully reset prefix cache' lines in the notebook: {text.count('Successfully reset prefix cache')}; "
          f"'cached tokens right after a prefix-cache reset' errors: {text.count('right after a prefix-cache reset')}")
    main_block(cfg, df, path)
    tab10(cfg, df, path)
    head(f"{cfg}: stats.by_pass_order (tab11)", path)
    t = stats.by_pass_order(df)
    print(t.to_string(index=False))

    # the same problem 0 in gpu-embedded and gpu-embedded-extras
    a, _ = records("gpu-embedded")
    a = a[a.problem_id == 0].set_index(["rollout", "abs_pos"])
    b = df.set_index(["rollout", "abs_pos"])
    head("problem 0: gpu-embedded vs gpu-embedded-extras (separate processes, same seeds)",
         *(RUNS / c / "01_sampling" / "trunks.parquet" for c in ("gpu-embedded", "gpu-embedded-extras")),
         RUNS / "gpu-embedded" / "03_three_pass_replay" / "records.parquet", path)
    ta, tb = (pd.read_parquet(RUNS / c / "01_sampling" / "trunks.parquet", columns=["problem_id", "rollout", "gen_ids"])
              for c in ("gpu-embedded", "gpu-embedded-extras"))
    ta, tb = ta[ta.problem_id == 0].sort_values("rollout"), tb.sort_values("rollout")
    print(f"trunks of problem 0 identical token ids: "
          f"{sum(list(x) == list(y) for x, y in zip(ta.gen_ids, tb.gen_ids))}/{len(tb)}")
    same_keys = a.index.equals(b.index)
    print(f"same pivots (rollout, abs_pos): {same_keys} ({len(a)} vs {len(b)})")
    if same_keys:
        for p in ("exact1", "exact2", "refeed"):
            print(f"A_{p} equal: {int((a[f'A_{p}'] == b[f'A_{p}']).sum())}/{len(a)}")

    # ------------------------------------------------------------------ benchmark
    bench = LOGS / "bench_paper.log"
    head("benchmark: table, decode traffic, last lines", bench)
    lines = bench.read_text().splitlines()
    start = next(i for i, l in enumerate(lines) if l.lstrip().startswith("ours (HFEngine refeed)"))
    stop = next(i for i, l in enumerate(lines) if l.startswith("speedup_vs_naive="))
    print("\n".join(lines[start:stop + 1]))  # the table, its notes, the decode traffic lines, the results
    print("last line of the file:", lines[-1][:160])
    for line in lines:  # what ran: the workload, and each phase's start and result lines
        if line.startswith(("workload:", "trunks:", "(a)", "(b)", "(a')", "setup:")) or re.match(r"\s+\d+ tokens in", line):
            print(line[:250])


if __name__ == "__main__":
    main()
