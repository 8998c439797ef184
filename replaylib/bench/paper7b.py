"""The paper7b workload: the paper's scale on vLLM (a random-weight Qwen2.5-7B-Instruct architecture, the
paper-primary request structure with fixed lengths), the replay as stage 03 runs it against one plain
LLM.generate call of the same requests, the engine's start-up, and the projected cost of the paper's
seven configurations (``--project-only`` needs no GPU)."""
from __future__ import annotations

import datetime
import json
import os
import platform
import time
from pathlib import Path

import pandas as pd
import torch

from ..measure.engine import ARMS, PassSettings
from ..measure.sampling import trunk_row
from ..measure.seeds import trunk_seed
from .measure import DecodeTraffic, kv_bytes_per_token, weight_bytes_per_step

# The config.json of Qwen/Qwen2.5-7B-Instruct (the paper's main model), value for value: the
# benchmark builds the architecture from it on the GPU with random weights (vLLM's
# load_format="dummy"), no download. Random weights cost exactly what real ones do.
QWEN25_7B_INSTRUCT_CONFIG = {
    "architectures": ["Qwen2ForCausalLM"],
    "attention_dropout": 0.0,
    "bos_token_id": 151643,
    "eos_token_id": 151645,
    "hidden_act": "silu",
    "hidden_size": 3584,
    "initializer_range": 0.02,
    "intermediate_size": 18944,
    "max_position_embeddings": 32768,
    "max_window_layers": 28,
    "model_type": "qwen2",
    "num_attention_heads": 28,
    "num_hidden_layers": 28,
    "num_key_value_heads": 4,
    "rms_norm_eps": 1e-06,
    "rope_theta": 1000000.0,
    "sliding_window": 131072,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.43.1",
    "use_cache": True,
    "use_sliding_window": False,
    "vocab_size": 152064,
}
# its generation_config.json's stop ids (<|im_end|>, <|endoftext|>)
QWEN25_7B_INSTRUCT_EOS = [151645, 151643]


def write_config_dir(path: str | Path, config: dict = QWEN25_7B_INSTRUCT_CONFIG,
                     eos_token_id: list[int] = QWEN25_7B_INSTRUCT_EOS) -> Path:
    """A model directory holding only config.json and generation_config.json (no weights, no
    tokenizer): what vLLM needs with load_format="dummy" and skip_tokenizer_init=True."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    (path / "generation_config.json").write_text(json.dumps(
        {"bos_token_id": config.get("bos_token_id"), "eos_token_id": list(eos_token_id)}, indent=2) + "\n")
    return path



# ---------------------------------------------------------------- paper7b: the paper's scale on vLLM
PAPER7B = {
    # the paper-primary request structure (data/paper-records config): 20 problems, 8 trunks of up to 512
    # tokens, up to 5 pivots per trunk, K = 4, 400-token continuations, 32-token probes, three passes,
    # prefix caching, block 16; every generation runs to its length (ignore_eos), so token counts are known
    "problems": 20, "rollouts": 8, "trunk_tokens": 512, "pivots_per_trunk": 5, "k": 4, "cont_tokens": 400,
    "probe_tokens": 32, "passes": ("exact1", "exact2", "refeed"), "block_size": 16, "prompt_tokens": 128,
    "temperature": 0.7, "top_p": 0.95, "top_logprobs": 5, "max_model_len": 2048,
}

# the published record files of the paper's seven configurations (params/paper-*.yaml)
PAPER_CONFIG_RECORDS = {"paper-primary": "2026-06-11/primary.json", "paper-screened": "2026-06-11/screened.json",
                        "paper-k8": "2026-06-11/k8.json", "paper-k16": "2026-06-11/k16.json",
                        "paper-greedy": "2026-06-10/temp0.json", "paper-grpo": "2026-06-10/grpo.json",
                        "paper-phi": "2026-06-11/phi.json"}

PAPER_COST_CLAIM = "under 10 USD on an A100 (the paper)"

OVERHEAD_LINE = "overhead_vs_plain_generate={ratio:.3f}"

class _StubTokenizer:
    """No tokenizer travels with a random-weight model (skip_tokenizer_init): prompts are token ids and
    the stop ids come from the config; decode only renders ids (the benchmark grades nothing)."""

    def __init__(self, eos: list[int]):
        self.eos_token_id, self.all_special_ids = eos[0], list(eos)

    def decode(self, ids, skip_special_tokens=True):
        return " ".join(str(int(i)) for i in ids)

class _NoTokenizerLLM:
    """A vllm.LLM started with skip_tokenizer_init, seen by VLLMEngine through get_tokenizer."""

    def __init__(self, llm, eos: list[int]):
        self._llm, self._tok = llm, _StubTokenizer(eos)

    def get_tokenizer(self):
        return self._tok

    def __getattr__(self, name):
        return getattr(self._llm, name)

def paper_requests(records_dir: Path | None = None, cont_tokens: int = 400, probe_tokens: int = 32,
                   trunk_tokens: int = 512, passes: int = 3) -> list[dict]:
    """Per configuration, what its published records say it ran, counted from the files: pivots,
    problems, trunks (problems x the config's rollouts), K; and the tokens a replay with fixed lengths
    generates for it (every pass: 2 arms x (K continuations + 1 probe); the trunks twice: sampled
    once and regenerated once by the replay). An upper bound: the paper's continuations stop at EOS."""
    import json
    base = records_dir or Path(__file__).resolve().parents[2] / "data" / "paper-records"
    rows = []
    for config, rel in PAPER_CONFIG_RECORDS.items():
        data = json.loads((base / rel).read_text())
        pivots, cfg = data["pivots"], data["config"]
        problems = len({p["problem_id"] for p in pivots} | {p["problem_id"] for p in data.get("per_problem", [])})
        k = int(cfg["k"])
        trunks = problems * int(cfg["rollouts"])
        cont = passes * len(pivots) * 2 * (k * cont_tokens + probe_tokens)
        rows.append({"config": config, "file": rel, "model": cfg["model"], "pivots": len(pivots),
                     "problems": problems, "trunks": trunks, "k": k,
                     "requests": passes * len(pivots) * 2 * (k + 1), "continuation_tokens": cont,
                     "trunk_tokens": 2 * trunks * trunk_tokens,
                     "paper_elapsed_s": float(data.get("elapsed_seconds") or 0.0)})
    return rows

def project_campaign(rows: list[dict], tokens_per_s: float, trunk_tokens_per_s: float, startup_s: float,
                     warm_startup_s: float | None = None, stages: int = 2, shared_engines: bool = True) -> list[dict]:
    """Seconds on one GPU at the measured rates, per configuration: its continuation tokens at the
    replay's rate (whose wall time includes regenerating the trunks), its trunks sampled once at the
    sampling stage's rate, and its engine start-ups. shared_engines (a campaign's default,
    replaylib.runtime.engine_service): one engine per model serves every stage and configuration of that model,
    so each model's first configuration pays one cold start-up (a model compiles its own graphs) and the
    others none; else `stages` start-ups per configuration (sampling, replay), the campaign's first one
    cold and every later one with the compilation cache warm (warm_startup_s; None: all cold)."""
    out, warm, seen = [], startup_s if warm_startup_s is None else warm_startup_s, set()
    for i, r in enumerate(rows):
        if shared_engines:
            starts = 0.0 if r["model"] in seen else startup_s
            seen.add(r["model"])
        else:
            starts = (startup_s + (stages - 1) * warm) if i == 0 else stages * warm
        s = r["continuation_tokens"] / tokens_per_s + r["trunk_tokens"] / 2 / trunk_tokens_per_s + starts
        out.append({**r, "projected_s": s, "startup_s": starts})
    return out

def print_projection(rows: list[dict], log) -> float:
    log(f"{'configuration':16} {'file':26} {'problems':>8} {'trunks':>6} {'pivots':>6} {'K':>3} {'requests':>9} "
        f"{'cont. tokens':>12} {'hours':>7} {'paper A100 s':>12}")
    for r in rows:
        log(f"{r['config']:16} {r['file']:26} {r['problems']:>8} {r['trunks']:>6} {r['pivots']:>6} {r['k']:>3} "
            f"{r['requests']:>9} {r['continuation_tokens']:>12} {r['projected_s'] / 3600:>7.3f} "
            f"{r['paper_elapsed_s']:>12.1f}")
    total_h = sum(r["projected_s"] for r in rows) / 3600
    paper_h = sum(r["paper_elapsed_s"] for r in rows) / 3600
    log(f"seven configurations: {total_h:.3f} H200-hours projected (goal: under 1); the records' own "
        f"elapsed_seconds sum to {paper_h:.2f} hours; the paper's cost: {PAPER_COST_CLAIM}")
    return total_h

def main_project(args, log) -> int:
    """The campaign projection alone, from rates measured earlier (no GPU needed): with one engine per model
    for all its stages (what campaigns do), and, for comparison, with an engine per stage."""
    w = PAPER7B
    requests = paper_requests(cont_tokens=w["cont_tokens"], probe_tokens=w["probe_tokens"],
                              trunk_tokens=w["trunk_tokens"])
    rows = project_campaign(requests, args.tokens_per_s, args.trunk_tokens_per_s, args.startup_s, args.warm_startup_s)
    log(f"projection from measured rates: continuation tokens/s {args.tokens_per_s}, trunk tokens/s "
        f"{args.trunk_tokens_per_s}, start-up {args.startup_s} s cold; one engine per model for all its stages "
        f"and configurations")
    total = print_projection(rows, log)
    per_stage = project_campaign(requests, args.tokens_per_s, args.trunk_tokens_per_s, args.startup_s,
                                 args.warm_startup_s, shared_engines=False)
    log(f"of which engine start-ups {sum(r['startup_s'] for r in rows) / 3600:.3f} h, continuations "
        f"{sum(r['continuation_tokens'] for r in rows) / args.tokens_per_s / 3600:.3f} h, trunk sampling "
        f"{sum(r['trunk_tokens'] for r in rows) / 2 / args.trunk_tokens_per_s / 3600:.3f} h; with an engine per stage "
        f"(2 per configuration, {args.warm_startup_s} s warm after the first) "
        f"{sum(r['projected_s'] for r in per_stage) / 3600:.3f} h (total here {total:.3f} h)")
    return 0

def vllm_dummy_llm(model_dir: Path, gpu_memory_utilization: float, block_size: int, max_model_len: int):
    """The engine of from_params (bf16, prefix caching, seed 0, raw logprobs, stats on for the preemption
    counter, CUDA graphs), on random weights and without a tokenizer."""
    import vllm
    return vllm.LLM(model=str(model_dir), load_format="dummy", skip_tokenizer_init=True, dtype="bfloat16",
                    enable_prefix_caching=True, block_size=block_size, gpu_memory_utilization=gpu_memory_utilization,
                    max_model_len=max_model_len, seed=0, enforce_eager=False, logprobs_mode="raw_logprobs",
                    disable_log_stats=False)

def synthetic_prompt(problem_id: int, n: int) -> list[int]:
    """A fixed prompt of token ids per problem (the random-weight model has no tokenizer; a chat-templated
    GSM8K question with the paper's instruction is about this long)."""
    import random
    rng = random.Random(stable_problem_seed(problem_id))
    return [rng.randrange(1000, 150000) for _ in range(n)]

def stable_problem_seed(problem_id: int) -> int:
    from ..measure.seeds import stable_seed
    return stable_seed(problem_id, "bench-paper7b-prompt")

def spread_pivots(trunks: pd.DataFrame, per_trunk: int, block_size: int) -> pd.DataFrame:
    """Pivots spread evenly over each trunk at block-aligned positions (a random-weight model has a
    near-uniform next-token distribution, so every position is low-margin; the paper mines pivots
    anywhere in the trunk). alt: the best top-k token other than the sampled one."""
    rows = []
    for t in trunks.itertuples(index=False):
        gen, plen, seen = list(t.gen_ids), len(t.prompt_ids), set()
        for j in range(per_trunk):
            target = plen + int((j + 0.5) * len(gen) / per_trunk)
            abs_pos = target - target % block_size
            i = abs_pos - plen
            if i < 0 or i >= len(gen) or i in seen:
                continue
            seen.add(i)
            alt = next((int(x) for x in t.topk_ids[i] if int(x) != gen[i]), None)
            if alt is None:
                continue
            lps = list(t.topk_logprobs[i])
            rows.append({"pivot_id": len(rows), "problem_id": int(t.problem_id), "rollout": int(t.rollout),
                         "gen_index": i, "abs_pos": abs_pos, "margin": float(lps[0] - lps[1]), "actual": gen[i],
                         "alt": alt, "rollout_correct": 0})
    return pd.DataFrame(rows, columns=["pivot_id", "problem_id", "rollout", "gen_index", "abs_pos", "margin",
                                       "actual", "alt", "rollout_correct"])

def plain_requests(engine, trunk_rows: pd.DataFrame, jobs: list, settings: PassSettings, passes, trunk: dict):
    """The same requests as the replay, for one plain generate call: every problem's trunk requests once
    (the replay regenerates them at least once) and every pass's continuation and probe requests."""
    prompts, params = [], []
    for t in trunk_rows.itertuples(index=False):
        prompts.append([int(x) for x in t.prompt_ids])
        params.append(engine.SamplingParams(temperature=trunk["temperature"], top_p=trunk["top_p"],
                                            max_tokens=trunk["max_new_tokens"], logprobs=trunk["top_logprobs"],
                                            seed=int(t.seed), detokenize=False))
    for _ in passes:
        for job in jobs:
            for arm, kind in job.requests(settings.k):
                prompts.append(job.prefix_ids(arm))
                params.append(engine._request_params(settings, job, arm, kind))
    return prompts, params

def paper7b_traffic(config: dict, calls: list[list[tuple[int, int]]]) -> "DecodeTraffic":
    """Decode traffic of a sequence of generate calls, each a list of (prompt length, generated tokens):
    steps estimated as each call's longest request (a lower bound)."""
    traffic = DecodeTraffic.__new__(DecodeTraffic)
    traffic.weight_bytes, traffic.kv_bytes_per_token = weight_bytes_per_step(config), kv_bytes_per_token(config)
    traffic.steps = sum(max((n for _, n in c), default=0) for c in calls)
    traffic.rows = sum(n for c in calls for _, n in c)
    traffic.context = sum(n * p + n * (n + 1) // 2 for c in calls for p, n in c)
    return traffic

def main_startup_only(args, log) -> int:
    """Start the paper7b engine once more (same model directory and compilation cache) and time it."""
    from ..measure.vllm_setup import prepare_environment
    out = Path(args.out or "runs/bench-paper7b")
    os.environ.setdefault("VLLM_CACHE_ROOT", str((out / "vllm-cache").resolve()))
    prepare_environment(False, "bench-paper7b", serving="inprocess")  # the mode lease 4 measured
    model_dir = write_config_dir(out / "qwen2.5-7b-instruct-config")
    t0 = time.perf_counter()
    vllm_dummy_llm(model_dir, args.gpu_memory_utilization or 0.9, PAPER7B["block_size"], PAPER7B["max_model_len"])
    log(f"startup_only: engine started in {time.perf_counter() - t0:.1f} s "
        f"(VLLM_CACHE_ROOT={os.environ['VLLM_CACHE_ROOT']})")
    return 0

def main_paper7b(args, log) -> int:
    from functools import partial

    from ..measure.engine_vllm import VLLMEngine
    from ..measure.replay import build_jobs
    from ..measure.vllm_setup import prepare_environment

    if args.startup_only:
        return main_startup_only(args, log)
    w = dict(PAPER7B)
    n_problems = args.problems or w["problems"]
    out = Path(args.out or "runs/bench-paper7b")
    out.mkdir(parents=True, exist_ok=True)
    # vLLM's torch.compile cache under the run directory: a later stage or rerun reuses it
    os.environ.setdefault("VLLM_CACHE_ROOT", str((out / "vllm-cache").resolve()))
    prepare_environment(False, "bench-paper7b", serving="inprocess")  # the mode lease 4 measured
    started = time.perf_counter()
    log(f"replaylib bench: workload paper7b, device cuda, "
        f"{datetime.datetime.now().astimezone().isoformat(timespec='seconds')}")
    log(f"host: {platform.node()}, {os.cpu_count()} CPUs, torch {torch.__version__}, "
        f"{torch.cuda.get_device_name() if torch.cuda.is_available() else 'no CUDA device'}")
    model_dir = write_config_dir(out / "qwen2.5-7b-instruct-config")
    log(f"model: Qwen2.5-7B-Instruct's config.json (replaylib.bench.paper7b.QWEN25_7B_INSTRUCT_CONFIG), random weights "
        f"(load_format dummy), bf16, no tokenizer (token-id prompts); VLLM_CACHE_ROOT={os.environ['VLLM_CACHE_ROOT']}")
    log(f"workload: {n_problems} of the paper's {w['problems']} problems, {w['rollouts']} trunks of "
        f"{w['trunk_tokens']} tokens, {w['pivots_per_trunk']} pivots per trunk (block-aligned, spread over the "
        f"trunk), K={w['k']}, continuations {w['cont_tokens']} tokens, probes {w['probe_tokens']} tokens, passes "
        f"{','.join(w['passes'])}, block {w['block_size']}, prompts {w['prompt_tokens']} token ids, ignore_eos")
    t0 = time.perf_counter()
    import vllm
    llm = vllm_dummy_llm(model_dir, args.gpu_memory_utilization or 0.9, w["block_size"], w["max_model_len"])
    startup = time.perf_counter() - t0
    engine = VLLMEngine(_NoTokenizerLLM(llm, QWEN25_7B_INSTRUCT_EOS), partial(vllm.SamplingParams, ignore_eos=True),
                        model=f"random-weight {QWEN25_7B_INSTRUCT_CONFIG['architectures'][0]} (Qwen2.5-7B-Instruct)",
                        version=vllm.__version__, config="bench-paper7b", enforce_eager=False, serving="inprocess")
    log(f"engine: vLLM {vllm.__version__} started in {startup:.1f} s (import included); {engine.describe()}")

    problems = list(range(n_problems))
    prompts = {pid: synthetic_prompt(pid, w["prompt_tokens"]) for pid in problems}
    seeds = {(pid, r): trunk_seed(pid, r) for pid in problems for r in range(w["rollouts"])}
    t0 = time.perf_counter()
    trunks, _ = engine.sample_trunks(prompts, w["rollouts"], seeds, w["temperature"], w["top_p"], w["trunk_tokens"],
                                     w["top_logprobs"])
    sampling_s = time.perf_counter() - t0
    trunk_rows = pd.DataFrame([trunk_row(t, correct=False) for pid in problems for t in trunks[pid]])
    trunk_tokens = int(sum(len(g) for g in trunk_rows.gen_ids))
    log(f"sampling (stage 01's engine work, one generate call per problem): {len(trunk_rows)} trunks, "
        f"{trunk_tokens} tokens in {sampling_s:.1f} s ({trunk_tokens / sampling_s:.0f} tokens/s)")
    pivots = spread_pivots(trunk_rows, w["pivots_per_trunk"], w["block_size"])
    settings = PassSettings(k=w["k"], temperature=w["temperature"], top_p=w["top_p"], max_tokens=w["cont_tokens"],
                            probe_tokens=w["probe_tokens"], stop_at_answer=False, task="gsm8k")
    jobs_by = {pid: build_jobs(pivots[pivots.problem_id == pid], trunk_rows[trunk_rows.problem_id == pid], w["k"])
               for pid in problems}
    all_jobs = [j for pid in problems for j in jobs_by[pid]]
    log(f"pivots: {len(all_jobs)} ({len(all_jobs) / max(1, n_problems):.1f} per problem)")

    # (1) the replay, as stage 03 runs it: per problem, make the trunk blocks resident, then the passes
    times = {"establish": 0.0, **{p: 0.0 for p in w["passes"]}}
    calls, cont_tokens, verified, exact_pivots, per_problem = [], 0, 0, 0, []
    t_replay = time.perf_counter()
    for pid in problems:
        tp = time.perf_counter()
        t0 = time.perf_counter()
        state, _ = engine.problem_state(None, pid, trunk_rows)
        times["establish"] += time.perf_counter() - t0
        calls.append([(w["prompt_tokens"], w["trunk_tokens"])] * w["rollouts"])
        establishes = state.established
        for name in w["passes"]:
            t0 = time.perf_counter()
            outs = engine.run_pass(jobs_by[pid], name, settings, state)
            times[name] += time.perf_counter() - t0
            lengths = [(job.abs_pos + 1, len(c)) for job, o in zip(jobs_by[pid], outs) for arm in ARMS
                       for c in [*o.continuations[arm], o.probe_ids[arm]]]
            calls.append(lengths)
            cont_tokens += sum(n for _, n in lengths)
            if name.startswith("exact"):
                exact_pivots += len(outs)
                verified += sum(bool(o.resume.state_ok) for o in outs)
        per_problem.append((pid, time.perf_counter() - tp, state.established, state.established - establishes))
    replay_s = time.perf_counter() - t_replay
    log(f"replay: {len(all_jobs)} pivots, {cont_tokens} continuation + probe tokens in {replay_s:.1f} s; exact "
        f"requests verified from the cache on {verified}/{exact_pivots} pivot-passes; trunk establishments "
        f"{sum(p[2] for p in per_problem)} over {n_problems} problems")
    expected = len(all_jobs) * len(w["passes"]) * 2 * (w["k"] * w["cont_tokens"] + w["probe_tokens"])
    if cont_tokens != expected:
        log(f"warning: {cont_tokens} tokens generated, {expected} expected from the fixed lengths")

    # (2) the floor: one plain LLM.generate call with the same requests and lengths on the same engine
    prompts_all, params_all = plain_requests(engine, trunk_rows, all_jobs, settings, w["passes"],
                                             engine.trunk_settings)
    engine._reset("plain generate")
    t0 = time.perf_counter()
    plain_outs = llm.generate([{"prompt_token_ids": p} for p in prompts_all], params_all, use_tqdm=False)
    plain_s = time.perf_counter() - t0
    plain_tokens = sum(len(o.outputs[0].token_ids) for o in plain_outs)
    plain_trunk = len(trunk_rows) * w["trunk_tokens"]
    log(f"plain generate: {len(prompts_all)} requests (the trunks once + every pass's requests), {plain_tokens} "
        f"tokens in {plain_s:.1f} s ({plain_tokens / plain_s:.0f} tokens/s)")
    replay_all_tokens = cont_tokens + sum(1 for _ in per_problem for _ in range(w["rollouts"])) * w["trunk_tokens"]

    # report
    bandwidth = (args.bandwidth_tbs or 4.8) * 1e12
    rate = cont_tokens / replay_s
    log("")
    log(f"{'':34} {'replay (stage 03)':>20} {'plain generate':>20}")
    log(f"{'problems / pivots':34} {f'{n_problems} / {len(all_jobs)}':>20} {f'{n_problems} / {len(all_jobs)}':>20}")
    log(f"{'generate calls':34} {len(calls):>20} {1:>20}")
    log(f"{'generated tokens (trunks incl.)':34} {replay_all_tokens:>20} {plain_tokens:>20}")
    log(f"{'wall time':34} {f'{replay_s:.2f} s':>20} {f'{plain_s:.2f} s':>20}")
    log(f"{'tokens/s (all generated)':34} {replay_all_tokens / replay_s:>20.0f} {plain_tokens / plain_s:>20.0f}")
    log(f"{'continuation tokens/s':34} {rate:>20.0f} {(plain_tokens - plain_trunk) / plain_s:>20.0f}")
    for key in ("establish", *w["passes"]):
        what = "regenerate trunks" if key == "establish" else f"pass {key}"
        log(f"{'time: ' + what:34} {f'{times[key]:.2f} s {100 * times[key] / replay_s:5.1f}%':>20}")
    slow = max(per_problem, key=lambda p: p[1])
    log(f"per problem: {replay_s / n_problems:.2f} s on average (slowest: problem {slow[0]}, {slow[1]:.2f} s, "
        f"{slow[2]} trunk establishments)")
    traffic = paper7b_traffic(QWEN25_7B_INSTRUCT_CONFIG, calls)
    log(traffic.describe(replay_s, bandwidth, "replay: steps estimated as each call's longest request, a lower "
                                               "bound, so the fraction is too; prefill included"))
    stage_s = startup + replay_s
    log(f"engine start-up: {startup:.1f} s = {100 * startup / stage_s:.1f}% of this replay stage's wall time "
        f"({stage_s:.1f} s: start-up + replay of {n_problems} problems); of a full {w['problems']}-problem stage "
        f"at this rate: {100 * startup / (startup + replay_s * w['problems'] / n_problems):.1f}%")

    rows = project_campaign(paper_requests(cont_tokens=w["cont_tokens"], probe_tokens=w["probe_tokens"],
                                           trunk_tokens=w["trunk_tokens"]),
                            rate, trunk_tokens / sampling_s, startup, args.warm_startup_s)
    log("")
    log(f"projected campaign on one H200 (counted from data/paper-records; continuation tokens at this replay's "
        f"rate, trunks sampled once at the sampling rate, 2 engine start-ups per configuration: {startup:.1f} s "
        f"cold, then {args.warm_startup_s if args.warm_startup_s is not None else startup:.1f} s):")
    total_h = print_projection(rows, log)
    overhead = replay_s / plain_s
    log(f"goals: overhead {overhead:.3f} (<= 1.15: {'met' if overhead <= 1.15 else 'not met'}); start-up share of "
        f"this stage {100 * startup / stage_s:.1f}% (<= 20%: {'met' if startup <= 0.2 * stage_s else 'not met'}); "
        f"campaign {total_h:.3f} H200-hours (< 1: {'met' if total_h < 1 else 'not met'})")
    log(f"total benchmark time {time.perf_counter() - started:.1f} s")
    log(f"tokens_per_s={rate:.2f} replay_s={replay_s:.2f} plain_generate_s={plain_s:.2f} startup_s={startup:.2f}")
    log(OVERHEAD_LINE.format(ratio=overhead))
    return 0
