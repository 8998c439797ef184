"""The credit tool's vLLM path on the stand-in (tests/vllm_standin.py): forced decoding through the
forcing logits processor, certificates on rollouts the engine sampled, resume against its replica,
the check that stops a run whose forcing was not in effect; the processor's row rule on a tensor;
and the tool's Ray executor on the tiny model, which must give the local executor's bytes."""
import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from test_credit import PROMPT, sampled_rollouts, write
from vllm_standin import FakeLLM, FakeSP

from replaylib.credit import cli
from replaylib.credit.tool import Settings, run
from replaylib.measure.engine_vllm import VLLMEngine
from replaylib.measure.vllm_forcing import force_row

REPO = Path(__file__).resolve().parents[1]
PROMPTS = ([0, 5, 9, 14, 22, 31, 7, 1], [0, 6, 12, 30, 1])


def standin(forcing=True, llm_forcing=True, racy=False, serving="inprocess"):
    return VLLMEngine(FakeLLM(block_size=4, racy=racy, forcing=llm_forcing), FakeSP, serving=serving, config="credit",
                      forcing=forcing)


def sampled(engine, n=3, max_new=14):
    """Rollouts the stand-in sampled (recorded top-k), two prompts of n responses each."""
    rows = []
    for p, prompt in enumerate(PROMPTS):
        trunks, _ = engine.sample_trunks({p: prompt}, n, {(p, r): 50 + 10 * p + r for r in range(n)}, 0.7, 0.95,
                                         max_new, 4)
        rows += [{"id": f"p{p}r{t.rollout}", "prompt_ids": t.prompt_ids, "response_ids": t.gen_ids, "ground_truth": "7",
                  "top_logprobs": [[[i, lp] for i, lp in zip(ids, lps)] for ids, lps in
                                   zip(t.topk_ids, t.topk_logprobs)]} for t in trunks[p]]
    return rows


SETTINGS = dict(model="standin", grader="tests.credit_grader:compute_score", engine="vllm", device="cuda", k=2,
                max_cont_tokens=5, margin=9.0, max_pivots_per_rollout=2)


def test_force_row_leaves_only_the_forced_token_with_its_own_logit():
    torch = pytest.importorskip("torch")
    logits = torch.tensor([0.5, 2.0, -1.0, 0.25])
    out = force_row(logits.clone(), [2, 0], 0)
    assert out[2] == -1.0 and torch.isinf(out[[0, 1, 3]]).all() and int(out.argmax()) == 2
    assert force_row(logits.clone(), [2, 0], 1).argmax() == 0
    assert torch.equal(force_row(logits.clone(), [2, 0], 2), logits)  # past the response: untouched


def test_forced_decoding_certifies_the_engine_s_own_rollouts_and_resume_equals_its_replica(tmp_path):
    engine = standin()
    rows = sampled(engine)
    summary = run(write(tmp_path / "r.jsonl", rows), tmp_path / "out", Settings(**SETTINGS), engine=engine)
    frame = pd.read_parquet(tmp_path / "out" / "credit.parquet")
    assert summary["pivots"] == len(frame) > 0 and set(frame["id"]) <= {r["id"] for r in rows}
    assert set(frame["certificate"]) == {"bit-exact"}
    assert frame["verified_resume"].all() and frame["verified_replica"].all() and summary["not_verified"] == 0
    assert (frame["continuations_resume"] == frame["continuations_replica"]).all()
    assert summary["engine"]["forced_decoding"].endswith("vllm_forcing:ForcedTokens")
    # one forced-decoding call per prompt, every response of it in the call, each ending as it was sampled: at its
    # stop token (max_tokens: the sampler's, the call's longest that ran out), else at its length, EOS ignored
    forced = [(prompts, sps) for prompts, sps in engine.llm.calls if getattr(sps[0], "extra_args", None)]
    assert len(forced) >= len(PROMPTS)
    endings = set()
    for prompts, sps in forced:
        for sp in sps:
            resp = sp.extra_args["replaylib_forced_tokens"]
            if resp[-1] in (2, 3):  # the stand-in's EOS and its other stop token
                endings.add("stop")
                assert sp.stop_token_ids == [resp[-1]] and not sp.ignore_eos and sp.max_tokens >= len(resp)
            else:
                endings.add("length")
                assert sp.ignore_eos and sp.max_tokens == len(resp)
    assert endings == {"stop", "length"}
    timing = json.loads((tmp_path / "out" / "timing.json").read_text())
    assert set(timing["passes"]) == {"forced decoding", "resume", "replica", "refeed"}


def test_perturbed_recorded_logprobs_are_not_certified(tmp_path):
    engine = standin()
    rows = sampled(engine)
    for r in rows:
        r["top_logprobs"][0][0][1] += 1e-3
    run(write(tmp_path / "r.jsonl", rows), tmp_path / "out", Settings(**SETTINGS), engine=engine)
    frame = pd.read_parquet(tmp_path / "out" / "credit.parquet")
    # vLLM returns no logits, so no arithmetic bound: what is not bit-exact differs
    assert set(frame["certificate"]) == {"differs"} and frame["certificate_bound_used"].isna().all()
    assert frame["certificate_max_diff"].between(0.0009, 0.0011).all(), frame["certificate_max_diff"]


def test_a_run_whose_forcing_was_not_in_effect_stops(tmp_path, capsys):
    rows = sampled(standin())
    path = write(tmp_path / "r.jsonl", rows)
    with pytest.raises(RuntimeError, match="the forcing logits processor was not in effect"):
        run(path, tmp_path / "out", Settings(**SETTINGS), engine=standin(llm_forcing=False))
    assert not (tmp_path / "out" / "credit.parquet").exists()
    with pytest.raises(ValueError, match="forcing=True"):
        standin(forcing=False).force_trunks(PROMPTS[0], [rows[0]["response_ids"]], 4)


def test_the_multiprocess_engine_s_stock_passes_are_measured_not_assumed(tmp_path):
    """On the racy stand-in (the multi-process engine's stock calls batch as requests arrive) the forced
    decode is still certified (it is submitted synchronized), and every exact pass reports its resume."""
    engine = standin(racy=True, serving="multiprocess")
    rows = sampled(engine)
    summary = run(write(tmp_path / "r.jsonl", rows), tmp_path / "out", Settings(**SETTINGS), engine=engine)
    frame = pd.read_parquet(tmp_path / "out" / "credit.parquet")
    assert set(frame["certificate"]) == {"bit-exact"} and frame["verified_resume"].all()
    assert summary["floor"] is not None and summary["refeed"] is not None


def test_the_ray_executor_gives_the_local_executor_s_bytes(tiny_engine, tiny_model_dir, tmp_path):
    pytest.importorskip("ray")
    rows = sampled_rollouts(tiny_engine, n=2, max_new=8) + sampled_rollouts(tiny_engine, n=2, max_new=8,
                                                                            prompt=PROMPT[:6], tag="s")
    path = write(tmp_path / "r.jsonl", rows)
    base = [sys.executable, "-m", "replaylib.credit", str(path), "--model", tiny_model_dir, "--grader", "gsm8k",
            "--k", "2", "--max-cont-tokens", "6", "--margin", "9", "--max-pivots-per-rollout", "2"]
    env = {"PYTHONPATH": str(REPO), "RAY_USAGE_STATS_ENABLED": "0", "PATH": "/usr/bin:/bin"}
    local = subprocess.run(base + ["--out", str(tmp_path / "local")], env=env, capture_output=True, text=True)
    assert local.returncode == 0, local.stderr[-2000:]
    ray_run = subprocess.run(base + ["--out", str(tmp_path / "ray"), "--executor", "ray", "--workers", "2"], env=env,
                             capture_output=True, text=True)
    assert ray_run.returncode == 0, ray_run.stderr[-2000:]
    assert (tmp_path / "ray" / "credit.parquet").read_bytes() == (tmp_path / "local" / "credit.parquet").read_bytes()
    timing = json.loads((tmp_path / "ray" / "timing.json").read_text())
    assert timing["executor"] == "ray" and timing["workers"] == 2 and len(timing["groups"]) == 2
    # a grader that fails inside an actor is still one line naming the file, the line and the field
    for r in rows:
        r["data_source"] = "bad" if r["id"].startswith("s") else "ok"
    bad = write(tmp_path / "bad.jsonl", rows)
    failed = subprocess.run([*base[:3], str(bad), *base[4:7], "tests.credit_grader:fails_on_bad_source", *base[8:],
                             "--out", str(tmp_path / "bad"), "--executor", "ray", "--workers", "2"], env=env,
                            capture_output=True, text=True, cwd=REPO)
    errors = [ln for ln in failed.stderr.splitlines() if "error:" in ln]
    assert failed.returncode == 2 and len(errors) == 1, failed.stderr[-2000:]
    assert errors[0].endswith(f"{bad}:3: field 'ground_truth': --grader tests.credit_grader:fails_on_bad_source "
                              f"raised KeyError: 'no such field'"), errors


def test_workers_below_one_are_refused_in_one_line(tmp_path, capsys):
    path = write(tmp_path / "r.jsonl", [{"id": 1, "prompt_ids": [1], "response_ids": [2], "ground_truth": "1"}])
    assert cli.main([str(path), "--model", "tiny:0", "--grader", "gsm8k", "--out", str(tmp_path / "o"),
                     "--executor", "ray", "--workers", "0"]) == 2
    assert "--workers 0: must be at least 1" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()
