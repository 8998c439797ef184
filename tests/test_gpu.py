"""The vLLM engine on a real GPU (skipped without CUDA and vLLM 0.22.1).

Each mode runs in its own process, since VLLM_BATCH_INVARIANT and the serving mode must be set
before vLLM is imported: this file is also the script (python tests/test_gpu.py MODE OUT). The
tiny random-weight model (params/gpu-smoke.yaml) runs the paper's mechanics: trunks,
block-aligned pivots, problem_state, exact1 / exact2 / refeed, in vLLM's multi-process engine
(the paper's) and in-process; the multi-process engine's core process is checked to end
with its engine, inside a Ray actor too, and to be stopped once a killed stage left it behind;
a run's stages share one engine (replaylib.runtime.engine_service), a run or campaign killed outright
leaves no engine holding GPU memory, and the credit tool certifies rollouts the engine sampled. The tests are independent processes with registries of their
own and fixed-size KV caches, so they can run side by side (pytest -n 4).
"""
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _gpu_ready() -> bool:
    if importlib.util.find_spec("vllm") is None:
        return False
    import torch
    return torch.cuda.is_available()


pytestmark = pytest.mark.skipif(not _gpu_ready(), reason="needs a CUDA GPU and vLLM 0.22.1")


def smoke_params(serving: str = "multiprocess"):
    import dataclasses

    from replaylib.runtime import params
    return dataclasses.replace(params.load(REPO / "params" / "gpu-smoke.yaml"), vllm_serving=serving)


def scenario(mode: str) -> dict:
    """Trunks, pivots and the three passes on the tiny model; per-channel comparison counts.
    mode: stock-multiprocess, stock-inprocess or invariant (multi-process)."""
    sys.path.insert(0, str(REPO))
    import pandas as pd

    from replaylib.measure import mining as pivots
    from replaylib.measure.data import load_problems
    from replaylib.measure.engines import make_engine
    from replaylib.measure.grading import grade
    from replaylib.measure.replay import build_jobs, settings
    from replaylib.measure.seeds import trunk_seed
    from replaylib.runtime.vllm_processes import EngineProcesses

    p = smoke_params("inprocess" if mode == "stock-inprocess" else "multiprocess")
    engine = make_engine(p, invariant=(mode == "invariant"), lifecycle=EngineProcesses())
    problems = load_problems(p.task)[p.problem_start:p.problem_start + p.n_problems]
    prompts = {q.problem_id: engine.prompt_ids(q.question, p.instruction) for q in problems}
    seeds = {(pid, r): trunk_seed(pid, r) for pid in prompts for r in range(p.n_rollouts)}
    trunks, state = engine.sample_trunks(prompts, p.n_rollouts, seeds, p.temperature, p.top_p, p.max_trunk_tokens,
                                         p.top_logprobs)
    gold = {q.problem_id: q.gold for q in problems}
    df = pd.DataFrame([{"problem_id": t.problem_id, "rollout": t.rollout, "seed": t.seed, "prompt_ids": t.prompt_ids,
                        "gen_ids": t.gen_ids, "topk_ids": t.topk_ids, "topk_logprobs": t.topk_logprobs,
                        "correct": grade(engine.decode(t.gen_ids), gold[t.problem_id], p.task)}
                       for ts in trunks.values() for t in ts])
    # through Parquet, as between the sampling and replay stages: token ids come back as numpy.int64,
    # which vLLM's prefix cache hashes differently from Python ints (a bug the H200 run found)
    with tempfile.TemporaryDirectory() as tmp:
        df.to_parquet(Path(tmp) / "trunks.parquet", index=False)
        df = pd.read_parquet(Path(tmp) / "trunks.parquet")
    mined = pivots.mine(df, p, engine.special_ids)
    out = {"engine": engine.describe(), "state_is_none": state is None, "pivots": len(mined), "trunks": len(df),
           "trunks_identical": 0, "trunks_identical_of": 0, "exact_requests_ok": 0, "exact_pivot_passes": 0,
           "differ": {"exact2": 0, "refeed": 0}, "probe_lp_differ": {"exact2": 0, "refeed": 0}}
    for pid, group in mined.groupby("problem_id"):
        jobs = build_jobs(group, df[df.problem_id == pid], p.k)
        handle, identical = engine.problem_state(None, int(pid), df)
        out["trunks_identical"] += sum(identical.values())
        out["trunks_identical_of"] += len(identical)
        outs = {name: {o.pivot_id: o for o in engine.run_pass(jobs, name, settings(p), handle)} for name in p.passes}
        for job in jobs:
            base = outs["exact1"][job.pivot_id]
            for name in ("exact1", "exact2"):
                out["exact_pivot_passes"] += 1
                out["exact_requests_ok"] += bool(outs[name][job.pivot_id].resume.state_ok)
            for name in ("exact2", "refeed"):
                o = outs[name][job.pivot_id]
                out["differ"][name] += (o.continuations, o.probe_ids) != (base.continuations, base.probe_ids)
                out["probe_lp_differ"][name] += o.probe_first_logprob != base.probe_first_logprob
    out["engine_core_pids"] = [proc.pid for proc in engine.processes]
    out["closed"] = engine.close()
    out["left_after_close"] = [proc.pid for proc in engine_processes()]
    return out


def engine_processes():
    from replaylib.runtime.vllm_processes import engine_processes as found
    return found()


def hold(ready_path: str) -> None:
    """Start the multi-process engine, say which processes it runs, then wait to be killed."""
    sys.path.insert(0, str(REPO))
    import time

    from replaylib.measure.engines import make_engine
    from replaylib.runtime.vllm_processes import EngineProcesses
    engine = make_engine(smoke_params(), lifecycle=EngineProcesses())
    Path(ready_path).write_text(json.dumps([proc.pid for proc in engine.processes]))
    time.sleep(900)


def in_ray_actor() -> dict:
    """The multi-process engine inside a Ray actor: its engine core is a child of the actor, and closing the
    executor ends it."""
    sys.path.insert(0, str(REPO))
    import dataclasses

    import psutil
    import ray

    from replaylib.runtime.executor import make_executor
    p = dataclasses.replace(smoke_params(), executor="ray", ray_workers=1, gpus_per_worker=1.0)
    ex = make_executor(p)
    described, pids = ex.call(lambda engine: (engine.describe(), [proc.pid for proc in engine.processes]))
    ex.close()
    if ray.is_initialized():
        ray.shutdown()
    return {"engine": described, "engine_core_pids": pids, "alive_after_close": [q for q in pids if
                                                                                 psutil.pid_exists(q)]}


def _env(tmp_path=None) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("VLLM_BATCH_INVARIANT", "VLLM_ENABLE_V1_MULTIPROCESSING")}
    if tmp_path is not None:  # a registry of its own: another test's engine start reaps nothing of this one
        env["REPLAYLIB_ENGINE_REGISTRY"] = str(tmp_path / "registry")
    return env


def gpu_memory_by_pid() -> dict:
    """GPU memory (bytes) held by each process on the first GPU, as NVML reports it."""
    import pynvml
    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    return {p.pid: int(p.usedGpuMemory or 0) for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle)}


def _descendants(pid: int) -> list:
    import psutil
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def _engine_pids(root_pid: int) -> dict:
    """Engine servers and vLLM engine cores among a process's descendants: {pid: role}."""
    found = {}
    for proc in _descendants(root_pid):
        try:
            title = proc.name() + " " + " ".join(proc.cmdline())
        except Exception:  # noqa: BLE001 - gone meanwhile
            continue
        if "replaylib.runtime.engine_service" in title:
            found[proc.pid] = "server"
        elif "VLLM::" in title or "EngineCore" in title:
            found[proc.pid] = "core"
    return found


def _wait_until(condition, timeout_s: float, poll_s: float = 1.0):
    import time
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(poll_s)
    return condition()


def _run(mode: str, tmp_path) -> dict:
    result = tmp_path / f"{mode}.json"
    proc = subprocess.run([sys.executable, __file__, mode, str(result)], cwd=REPO, env=_env(tmp_path),
                          capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    return json.loads(result.read_text())


@pytest.mark.parametrize("serving", ["multiprocess", "inprocess"])
def test_stock_engine_regenerates_its_trunks_and_every_exact_request_hits_the_cache(tmp_path, serving):
    r = _run(f"stock-{serving}", tmp_path)
    assert r["state_is_none"] and r["engine"]["engine"] == "vllm" and r["engine"]["batch_invariant"] is False
    assert r["engine"]["serving"] == serving
    assert r["pivots"] > 0, r
    # the regenerated trunks are the sampled ones: trunk requests are submitted synchronized in both modes
    assert r["trunks_identical"] == r["trunks_identical_of"], r
    assert r["exact_requests_ok"] == r["exact_pivot_passes"], r  # every exact request hit the trunk's blocks
    if serving == "inprocess":  # a replica of an identical batch (the multi-process replica may differ)
        assert r["differ"]["exact2"] == 0 and r["probe_lp_differ"]["exact2"] == 0, r
    else:
        assert r["engine_core_pids"] and r["closed"] == r["engine_core_pids"], r
    assert r["left_after_close"] == [], r


def test_batch_invariant_mode_makes_all_passes_identical(tmp_path):
    r = _run("invariant", tmp_path)
    assert r["engine"]["batch_invariant"] is True and r["engine"]["attention_backend"] == "TRITON_ATTN"
    assert r["engine"]["serving"] == "multiprocess"
    assert r["engine"]["enforce_eager"] is False  # eager mode was not invariant for a real model (docs/gpu-h200.md)
    assert r["pivots"] > 0 and r["exact_requests_ok"] == r["exact_pivot_passes"], r
    assert r["differ"] == {"exact2": 0, "refeed": 0} and r["probe_lp_differ"] == {"exact2": 0, "refeed": 0}, r


def test_the_engine_core_ends_with_its_engine_inside_a_ray_actor(tmp_path):
    pytest.importorskip("ray")
    r = _run("ray", tmp_path)
    assert r["engine"]["serving"] == "multiprocess" and r["engine_core_pids"], r
    assert r["alive_after_close"] == [], r


def test_a_killed_stage_leaves_no_engine_core_holding_gpu_memory(tmp_path):
    """A stage with an engine of its own (shared_engine: false, or a notebook run alone) killed with
    SIGKILL orphans its engine core, which keeps its GPU memory; the next engine start (here:
    reap_leftover_engines, which it calls first) stops it and the memory is free."""
    import time

    import psutil

    from replaylib.runtime.vllm_processes import reap_leftover_engines
    ready = tmp_path / "ready.json"
    env = _env(tmp_path)
    stage = subprocess.Popen([sys.executable, __file__, "hold", str(ready)], cwd=REPO, env=env)
    assert _wait_until(lambda: ready.exists() or stage.poll() is not None, 600) and ready.exists(), \
        "the engine did not start"
    cores = json.loads(ready.read_text())
    assert cores
    stage.kill()
    stage.wait()
    time.sleep(2)
    assert all(psutil.pid_exists(q) for q in cores)  # orphaned, still alive
    held = sum(gpu_memory_by_pid().get(q, 0) for q in cores)
    assert held > 2**30, held  # and still holding its KV cache (kv_cache_gib 2)
    os.environ["REPLAYLIB_ENGINE_REGISTRY"] = env["REPLAYLIB_ENGINE_REGISTRY"]
    try:
        stopped = reap_leftover_engines()
    finally:
        del os.environ["REPLAYLIB_ENGINE_REGISTRY"]
    assert {s["pid"] for s in stopped} == set(cores) and all(s["stopped"] for s in stopped)
    assert _wait_until(lambda: not set(cores) & set(gpu_memory_by_pid()), 30)  # given back


def _smoke_params_file(tmp_path, **changes) -> Path:
    import yaml

    from replaylib.runtime import params
    values = {**smoke_params().to_dict(), **changes}
    path = tmp_path / f"{values['config']}.yaml"
    path.write_text(yaml.safe_dump(values, sort_keys=False))
    params.load(path)  # valid
    return path


def test_a_run_s_stages_share_one_engine(tmp_path):
    """Stages 01 and 03 of a run on one multi-process engine, started once: trunks regenerated bit for bit
    and every exact request served from the cache, as with an engine per stage."""
    import pandas as pd
    path = _smoke_params_file(tmp_path, config="gpu-smoke-shared")
    proc = subprocess.run([sys.executable, "-m", "replaylib.run", str(path), "--upto", "03", "--out",
                           str(tmp_path / "out")], cwd=REPO, env=_env(tmp_path), capture_output=True, text=True,
                          timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    record = json.loads(next((tmp_path / "out" / "runs" / ".engines").glob("*/engines.json")).read_text())
    assert len(record["servers"]) == 1, record
    server = record["servers"][0]
    assert [lease["stage"].split()[-1] for lease in server["leases"]] == ["01_sampling", "03_three_pass_replay"]
    assert server["engine"]["serving"] == "multiprocess" and server["exit_code"] == 0
    records = pd.read_parquet(tmp_path / "out" / "runs" / "gpu-smoke-shared" / "03_three_pass_replay" /
                              "records.parquet")
    assert len(records) > 0 and records.exact_ok.all()
    assert (records.state_established == "regenerated, identical").all()
    import psutil
    assert not psutil.pid_exists(server["pid"]) and not _engine_pids(os.getpid())


def test_the_credit_tool_certifies_rollouts_vllm_sampled(tmp_path):
    """The credit tool on vLLM (docs/credit.md; lease 10 ran it on the embedded model): the tiny
    configuration's trunks, sampled by the default multi-process engine, exported as rollouts and forced
    back through the decode: every certificate bit-exact and every resume verified; with --invariant all
    three passes agree at every pivot."""
    path = _smoke_params_file(tmp_path, config="gpu-smoke-credit")
    out, env = tmp_path / "out", _env(tmp_path)
    for cmd in ([sys.executable, "-m", "replaylib.run", str(path), "--upto", "01_sampling", "--out", str(out)],
                [sys.executable, "-m", "replaylib.credit", "export", str(out / "runs" / "gpu-smoke-credit"),
                 "--out", str(tmp_path / "rollouts.jsonl")]):
        proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    base = [sys.executable, "-m", "replaylib.credit", str(tmp_path / "rollouts.jsonl"), "--model", "tiny:0",
            "--grader", "gsm8k", "--engine", "vllm", "--device", "cuda", "--k", "2", "--max-cont-tokens", "32",
            "--margin", "9", "--max-pivots-per-rollout", "2", "--gpu-memory-utilization", "0.2",
            "--max-model-len", "2048"]
    summaries = {}
    # the smoke configuration samples eagerly, so the stock pass forces eagerly too (with CUDA graphs the
    # kernels differ and so do the certificates: lease 12); invariant mode has kernels of its own
    for name, extra in (("stock", ["--enforce-eager"]), ("invariant", ["--invariant"])):
        proc = subprocess.run(base + ["--out", str(tmp_path / name), *extra], cwd=REPO, env=env, capture_output=True,
                              text=True, timeout=900)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        summaries[name] = json.loads((tmp_path / name / "summary.json").read_text())
    stock, invariant = summaries["stock"], summaries["invariant"]
    assert stock["pivots"] > 0 and stock["certificates"] == {"bit-exact": stock["pivots"]}, stock["certificates"]
    assert stock["not_verified"] == 0 and invariant["not_verified"] == 0
    assert invariant["invariant_ok"] and invariant["passes_agree"] == invariant["pivots"] > 0


def test_the_credit_tool_starts_beside_a_stage_s_running_engine(tmp_path):
    """A shared GPU: while a run's stages hold their vLLM engine, the credit tool starts one of its own with its
    fixed KV cache (--kv-cache-gib, 4 GiB by default; no profiling of the free memory another process holds or
    frees) and certifies the rollouts; the run finishes too."""
    path = _smoke_params_file(tmp_path, config="gpu-smoke-sampled")
    env, sampled = _env(tmp_path), tmp_path / "sampled"
    for cmd in ([sys.executable, "-m", "replaylib.run", str(path), "--upto", "01_sampling", "--out", str(sampled)],
                [sys.executable, "-m", "replaylib.credit", "export", str(sampled / "runs" / "gpu-smoke-sampled"),
                 "--out", str(tmp_path / "rollouts.jsonl")]):
        proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    beside = _smoke_params_file(tmp_path, config="gpu-smoke-beside", problem_start=2)
    run = subprocess.Popen([sys.executable, "-m", "replaylib.run", str(beside), "--upto", "03", "--out",
                            str(tmp_path / "beside")], cwd=REPO, env=env, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)
    try:
        cores = _wait_until(lambda: {q for q, role in _engine_pids(run.pid).items() if role == "core"
                                     and gpu_memory_by_pid().get(q, 0) > 2**30}, 600)
        assert cores and run.poll() is None, "the stages' engine was not up beside the tool"
        tool = subprocess.run([sys.executable, "-m", "replaylib.credit", str(tmp_path / "rollouts.jsonl"), "--model",
                               "tiny:0", "--grader", "gsm8k", "--engine", "vllm", "--device", "cuda", "--k", "2",
                               "--max-cont-tokens", "32", "--margin", "9", "--max-pivots-per-rollout", "2",
                               "--gpu-memory-utilization", "0.2", "--max-model-len", "2048", "--enforce-eager",
                               "--out", str(tmp_path / "credit")], cwd=REPO, env=env, capture_output=True, text=True,
                              timeout=900)
        overlapped = run.poll() is None or any(_engine_pids(run.pid))
        assert tool.returncode == 0, tool.stdout[-3000:] + tool.stderr[-3000:]
        assert run.wait(timeout=900) == 0
    finally:
        run.kill()
    summary = json.loads((tmp_path / "credit" / "summary.json").read_text())
    assert summary["pivots"] > 0 and summary["certificates"] == {"bit-exact": summary["pivots"]}
    assert summary["not_verified"] == 0 and summary["engine"]["num_gpu_blocks"]
    print(f"the tool ran while the stages' engine was {'still up' if overlapped else 'up at its start'}")


def test_the_estimator_forces_rollouts_through_an_llm_its_caller_built(tmp_path):
    """A trainer's own vllm.LLM, built with credit.llm_settings(): the estimator forces rollouts that LLM sampled
    back through its decode (every certificate passed, every resume verified) and leaves it serving."""
    out = tmp_path / "given.json"
    proc = subprocess.run([sys.executable, str(Path(__file__)), "given-llm", str(out)], cwd=REPO, env=_env(tmp_path),
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    found = json.loads(out.read_text())
    assert found["pivots"] > 0 and found["not_verified"] == 0, found
    assert set(found["certificates"]) <= {"bit-exact", "within arithmetic"}, found
    assert found["still_serving"] and found["engine"] == "vllm"


def given_llm() -> dict:
    """An in-process vllm.LLM built as a trainer would, with the forcing settings; rollouts it sampled, then the
    estimator on that LLM; whether the LLM still serves after the estimator closed."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    sys.path.insert(0, str(REPO))
    from vllm import LLM, SamplingParams

    from replaylib import credit
    from replaylib.measure.engine import chat_prompt_ids
    from replaylib.measure.models import resolve_model
    from replaylib.measure.vllm_trunks import topk_of
    llm = LLM(model=resolve_model("tiny:0"), dtype="bfloat16", gpu_memory_utilization=0.2, max_model_len=2048,
              kv_cache_memory_bytes=2 * 2**30, enforce_eager=True, seed=0, **credit.llm_settings())
    prompt = chat_prompt_ids(llm.get_tokenizer(), "What is 2 + 3?", "")
    sampled = llm.generate([{"prompt_token_ids": prompt}], SamplingParams(n=4, temperature=0.7, top_p=0.95,
                                                                          max_tokens=48, logprobs=5, seed=1),
                           use_tqdm=False)
    rows = []
    for i, c in enumerate(sampled[0].outputs):
        steps = [topk_of(step, 5) for step in c.logprobs]
        rows.append({"id": f"r{i}", "prompt_ids": prompt, "response_ids": [int(t) for t in c.token_ids],
                     "ground_truth": "5", "top_logprobs": [[[t, lp] for t, lp in zip(*s)] for s in steps]})
    estimator = credit.Estimator(llm=llm, grader="gsm8k", k=2, max_cont_tokens=16, margin=9.0,
                                 max_pivots_per_rollout=2)
    frame = estimator(rows)
    summary, described = estimator.summary, estimator.described
    estimator.close()
    again = llm.generate([{"prompt_token_ids": prompt}], SamplingParams(max_tokens=4, temperature=0.0), use_tqdm=False)
    return {"pivots": len(frame), "certificates": summary["certificates"], "not_verified": summary["not_verified"],
            "still_serving": len(again[0].outputs[0].token_ids) > 0, "engine": described["engine"]}


@pytest.mark.parametrize("what", ["runner", "campaign"])
def test_a_run_killed_outright_leaves_no_engine_holding_gpu_memory(tmp_path, what):
    """SIGKILL to the process whose broker leased the engines (a runner, or a campaign): its engine servers
    see it gone, close their engines and exit; the engine cores end with them and the GPU memory is back."""
    import signal

    import psutil
    import yaml
    path = _smoke_params_file(tmp_path, config=f"gpu-smoke-killed-{what}")
    if what == "runner":
        cmd = [sys.executable, "-m", "replaylib.run", str(path), "--upto", "03", "--out", str(tmp_path / "out")]
    else:
        spec = {"name": "killed", "rows": [{"label": "main pooled", "params": [str(path)],
                                           "published": "main pooled"}],
                "invariant": {"label": "batch-invariant", "params": str(path), "published": "batch-invariant"},
                "figure1": "main pooled", "figure3": [str(path)], "bootstrap_draws": 20}
        (tmp_path / "campaign.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
        cmd = [sys.executable, "-m", "replaylib.campaign", str(tmp_path / "campaign.yaml"), "--out",
               str(tmp_path / "out"), "--stages-only"]
    run = subprocess.Popen(cmd, cwd=REPO, env=_env(tmp_path), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        engines = _wait_until(lambda: {pid for pid, role in _engine_pids(run.pid).items() if role == "core"}
                              and _engine_pids(run.pid), 600)
        assert engines and "server" in engines.values() and "core" in engines.values(), engines
        # the engine core appears before it allocates its KV cache (kv_cache_gib 2): wait until it holds it
        held = _wait_until(lambda: sum(gpu_memory_by_pid().get(q, 0) for q in engines) > 2**30 and
                           sum(gpu_memory_by_pid().get(q, 0) for q in engines), 300)
        assert held > 2**30, held
        others = [p for p in _descendants(run.pid) if p.pid not in engines]
        assert run.poll() is None, "the run ended before it could be killed"
        run.send_signal(signal.SIGKILL)
        run.wait()
        assert _wait_until(lambda: not any(psutil.pid_exists(q) and psutil.Process(q).status() != psutil.STATUS_ZOMBIE
                                           for q in engines), 120), engines
        assert _wait_until(lambda: not set(engines) & set(gpu_memory_by_pid()), 30)
    finally:
        run.kill()
        for proc in locals().get("others", []):  # the runner's kernels, orphaned by the kill
            with __import__("contextlib").suppress(psutil.Error):
                proc.kill()


if __name__ == "__main__":
    mode, path = sys.argv[1], sys.argv[2]
    if mode == "hold":
        hold(path)
    elif mode == "given-llm":
        Path(path).write_text(json.dumps(given_llm()))
    else:
        Path(path).write_text(json.dumps(in_ray_actor() if mode == "ray" else scenario(mode)))
