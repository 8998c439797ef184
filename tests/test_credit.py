"""The credit tool (python -m replaylib.credit) on a tiny random-weight model: input fields and their
aliases, the certificate, resume against its replica, a user's grader, bad input refused in one line,
a killed run resumed from its shards."""
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from replaylib.credit import cli, inputs
from replaylib.credit.tool import Settings, run
from replaylib.measure import credit as kernel

REPO = Path(__file__).resolve().parents[1]
VOCAB = 600
FAST = dict(k=2, max_cont_tokens=6, margin=9.0, max_pivots_per_rollout=2)


PROMPT = [1, 345, 267, 201, 44, 279, 320, 161]


def sampled_rollouts(engine, n=2, max_new=10, prompt=tuple(PROMPT), tag="r"):
    """Rollouts the engine itself sampled, as a JSONL would carry them (recorded top-k included)."""
    prompt = list(prompt)
    trunks, _ = engine.sample_trunks({0: prompt}, n, {(0, r): 100 + r for r in range(n)}, 0.7, 0.95, max_new, 5)
    return [{"id": f"{tag}{t.rollout}", "prompt_ids": t.prompt_ids, "response_ids": t.gen_ids, "ground_truth": "7",
             "top_logprobs": [[[i, lp] for i, lp in zip(ids, lps)] for ids, lps in zip(t.topk_ids, t.topk_logprobs)]}
            for t in trunks[0]]


def write(path: Path, rows) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture(scope="module")
def rollouts(tiny_engine):
    return sampled_rollouts(tiny_engine)


@pytest.fixture(scope="module")
def credited(tiny_engine, tiny_model_dir, rollouts, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("credit")
    out = tmp / "out"
    summary = run(write(tmp / "r.jsonl", rollouts), out, Settings(model=tiny_model_dir, grader="tests.credit_grader:"
                                                                  "compute_score", **FAST), engine=tiny_engine)
    return out, summary


def test_the_certificate_is_bit_exact_on_the_engine_s_own_rollouts(credited):
    out, summary = credited
    frame = pd.read_parquet(out / "credit.parquet")
    assert len(frame) == summary["pivots"] > 0
    assert set(frame.certificate) == {"bit-exact"} and set(frame.margin_source) == {"recorded"}
    for col in ["id", "position", "token_id", "alt_token_id", "margin", "k", "A_resume", "A_replica", "A_refeed",
                "A_resume_lo", "A_resume_hi", "wins_resume_actual", "wins_refeed_alt", "certificate", "within_floor"]:
        assert col in frame.columns, col
    assert {"pivots", "floor", "refeed", "settings", "versions"} <= set(summary)
    page = (out / "report.html").read_text()
    assert "Content-Security-Policy" in page and "<script" not in page and "http" not in page.split("<body>")[1]


def test_resume_equals_its_replica_on_the_transformers_engine(credited):
    frame = pd.read_parquet(credited[0] / "credit.parquet")
    assert (frame.A_resume == frame.A_replica).all()
    assert (frame.continuations_resume == frame.continuations_replica).all()
    assert credited[1]["floor"] in (None, 0.0)


def test_the_python_api_returns_the_frame_the_command_writes(tiny_engine, tiny_model_dir, rollouts, credited, tmp_path):
    from replaylib.credit import estimate
    frame = estimate(rollouts, model=tiny_model_dir, grader="tests.credit_grader:compute_score", out=tmp_path / "api",
                     engine=tiny_engine, **FAST)
    pd.testing.assert_frame_equal(frame, pd.read_parquet(credited[0] / "credit.parquet"))
    assert (tmp_path / "api" / "summary.json").exists()
    assert not (tmp_path / "api" / "rollouts.jsonl").exists()  # a list is read in memory, never written


def test_perturbed_top_logprobs_are_not_bit_exact(tiny_engine, tiny_model_dir, rollouts, tmp_path):
    """A recorded top-1 logprob moved by 1e-6 (position 0 precedes every pivot) is within float32 arithmetic of
    the forced decode's; moved by 1e-3 it is not."""
    for shift, verdict in ((1e-6, "within arithmetic"), (1e-3, "differs")):
        bad = json.loads(json.dumps(rollouts))
        for r in bad:
            r["top_logprobs"][0][0][1] += shift
        out = tmp_path / f"out{shift}"
        run(write(tmp_path / "r.jsonl", bad), out, Settings(model=tiny_model_dir, grader="gsm8k", **FAST),
            engine=tiny_engine)
        frame = pd.read_parquet(out / "credit.parquet")
        assert set(frame.certificate) == {verdict}, (shift, set(frame.certificate))
        assert frame.certificate_max_diff.between(shift * 0.5, shift * 1.5).all(), frame.certificate_max_diff


def test_without_top_logprobs_margins_come_from_the_forced_decode_and_positions_are_obeyed(
        tiny_engine, tiny_model_dir, rollouts, tmp_path):
    bare = [{k: v for k, v in r.items() if k != "top_logprobs"} for r in rollouts]
    bare[0]["positions"] = [3, 1]
    run(write(tmp_path / "r.jsonl", bare), tmp_path / "out", Settings(model=tiny_model_dir, grader="gsm8k", **FAST),
        engine=tiny_engine)
    frame = pd.read_parquet(tmp_path / "out" / "credit.parquet")
    assert set(frame.margin_source) == {"forced"} and set(frame.certificate) == {"not recorded"}
    assert frame[frame.id == "r0"].position.tolist() == [1, 3]
    # the forced decode's margins are the recorded ones: same pivots as with top_logprobs
    recorded = [p["position"] for p in kernel.select_pivots(rollouts[1]["response_ids"], rollouts[1]["top_logprobs"],
                                                             9.0, 2, tiny_engine.special_ids)]
    assert frame[frame.id == "r1"].position.tolist() == recorded


def test_invariant_mode_makes_every_pass_agree(tiny_invariant_engine, tiny_model_dir, rollouts, tmp_path):
    one = [dict(rollouts[0], response_ids=rollouts[0]["response_ids"][:4], top_logprobs=None)]
    summary = run(write(tmp_path / "r.jsonl", one), tmp_path / "out",
                  Settings(model=tiny_model_dir, grader="gsm8k", invariant=True, k=1, max_cont_tokens=3,
                           margin=99.0, max_pivots_per_rollout=1), engine=tiny_invariant_engine)
    assert summary["pivots"] == 1 and summary["invariant_ok"] is True


def test_every_field_and_alias_reads_the_same_rollout(rollouts):
    base = dict(rollouts[0], data_source="gsm8k", positions=[2])
    ours = inputs.parse_line(json.dumps(base), "f:1", VOCAB)
    renamed = [
        {"completion_ids": base["response_ids"]},  # TRL
        {"prompts": base["prompt_ids"], "responses": base["response_ids"],  # verl
         "reward_model": {"ground_truth": "7"}},
        {"prompt_token_ids": base["prompt_ids"], "output_token_ids": base["response_ids"], "label": "7"},  # OpenRLHF
        {"answer": "7"}]
    drops = {"completion_ids": ["response_ids"], "prompts": ["prompt_ids", "response_ids", "ground_truth"],
             "prompt_token_ids": ["prompt_ids", "response_ids", "ground_truth"], "answer": ["ground_truth"]}
    for alias in renamed:
        row = {k: v for k, v in base.items() if k not in drops[next(iter(alias))]} | alias
        assert inputs.parse_line(json.dumps(row), "f:1", VOCAB) == ours, alias
    assert (ours.id, ours.ground_truth, ours.data_source, ours.positions) == ("r0", "7", "gsm8k", [2])
    # padded batches as dumped: verl's attention_mask (prompts left-padded, responses right-padded), TRL's masks
    p, r = base["prompt_ids"], base["response_ids"]
    verl = {k: v for k, v in base.items() if k not in ("prompt_ids", "response_ids")} | {
        "prompts": [0, 0] + p, "responses": r + [0], "attention_mask": [0, 0] + [1] * (len(p) + len(r)) + [0]}
    assert inputs.parse_line(json.dumps(verl), "f:1", VOCAB) == ours
    trl = dict(base, prompt_ids=[0] + p, completion_ids=r + [0, 0], prompt_mask=[0] + [1] * len(p),
               completion_mask=[1] * len(r) + [0, 0])
    del trl["response_ids"]
    assert inputs.parse_line(json.dumps(trl), "f:1", VOCAB) == ours
    assert inputs.parse_line(json.dumps(dict(base, id=5)), "f:1", VOCAB).id == 5
    minimal = {k: base[k] for k in ("id", "prompt_ids", "response_ids", "ground_truth")}
    r = inputs.parse_line(json.dumps(minimal), "f:1", VOCAB)
    assert r.top_logprobs is None and r.positions is None and r.data_source is None


def test_the_graders(rollouts):
    from replaylib.credit import graders
    r = inputs.parse_line(json.dumps(dict(rollouts[0], ground_truth="72")), "f:1", VOCAB)
    assert graders.Grader("gsm8k", 0)("so the answer is 72", r) == 1
    assert graders.Grader("math", 0)("the answer is $\\boxed{72}$", r) == 1
    assert graders.Grader("math", 0)("the answer is $\\boxed{71}$", r) == 0
    user = graders.Grader("tests.credit_grader:compute_score", 0)
    assert user("7 apples", r) == 1 and user("no", r) == 0
    assert graders.Grader("tests.credit_grader:always", 1)("x", r) == 0  # --success-above 1


def bad_cases(rollouts):
    good = {k: rollouts[0][k] for k in ("id", "prompt_ids", "response_ids", "ground_truth")}
    n = len(good["response_ids"])
    return {
        "text": ([dict(good, response_ids="the answer is 7")], "gsm8k", "response_ids"),
        "vocab": ([dict(good, prompt_ids=[1, VOCAB + 5])], "gsm8k", "prompt_ids"),
        "position": ([dict(good, positions=[n])], "gsm8k", "positions"),
        "ground_truth": ([{k: v for k, v in good.items() if k != "ground_truth"}], "gsm8k", "ground_truth"),
        "top_logprobs": ([dict(good, top_logprobs=[[[1, 0.0]]])], "gsm8k", "top_logprobs"),
        "import": ([good], "tests.no_such_grader:compute_score", "--grader"),
        "raises": ([good], "tests.credit_grader:broken", "ground_truth"),
        "repeated id": ([good, good], "gsm8k", "id"),
        "not json": (["{"], "gsm8k", "JSON"),
    }


@pytest.mark.parametrize("case", ["text", "vocab", "position", "ground_truth", "top_logprobs", "import", "raises",
                                  "repeated id", "not json"])
def test_bad_input_is_refused_in_one_line_and_nothing_is_written(case, rollouts, tiny_model_dir, tmp_path, capsys):
    rows, grader, field = bad_cases(rollouts)[case]
    path = tmp_path / "r.jsonl"
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    out = tmp_path / "out"
    assert cli.main([str(path), "--model", tiny_model_dir, "--grader", grader, "--out", str(out), "--k", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and field in err, err
    if field != "--grader":
        assert f"{path}:{len(rows)}" in err, err
    assert not out.exists()


def test_enforce_eager_reaches_the_vllm_engine_s_parameters_and_the_shard_key(rollouts, tiny_model_dir, tmp_path,
                                                                             capsys):
    """--enforce-eager (the sampler ran without CUDA graphs) builds the engine so and keys the shards apart (other
    kernels, other numbers); on the transformers engine, which has no CUDA graphs, it is one line."""
    eager = Settings(model="tiny:0", grader="gsm8k", engine="vllm", device="cuda", enforce_eager=True)
    graphs = Settings(model="tiny:0", grader="gsm8k", engine="vllm", device="cuda")
    assert eager.params().enforce_eager and not graphs.params().enforce_eager
    assert eager.key() != graphs.key()
    path = write(tmp_path / "r.jsonl", rollouts)
    assert cli.main([str(path), "--model", tiny_model_dir, "--grader", "gsm8k", "--out", str(tmp_path / "o"),
                     "--enforce-eager"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--enforce-eager" in err and not (tmp_path / "o").exists()


def test_the_vllm_engine_without_vllm_is_refused_in_one_line(rollouts, tiny_model_dir, tmp_path, capsys):
    pytest.importorskip("transformers")
    if __import__("importlib").util.find_spec("vllm") is not None:
        pytest.skip("vLLM is installed here")
    path = write(tmp_path / "r.jsonl", rollouts)
    assert cli.main([str(path), "--model", tiny_model_dir, "--grader", "gsm8k", "--out", str(tmp_path / "o"),
                     "--engine", "vllm", "--device", "cuda"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "vLLM 0.22.1" in err, err
    assert not (tmp_path / "o").exists()


def command(path, out, model):
    return [sys.executable, "-m", "replaylib.credit", str(path), "--model", model, "--grader", "gsm8k",
            "--out", str(out), "--k", "2", "--max-cont-tokens", "6", "--margin", "9", "--max-pivots-per-rollout", "2"]


STOP_AFTER_FIRST_RECORD = """
import os, signal, sys
from replaylib.credit import cli
from replaylib.runtime import shards
real = shards.ShardStore.record
def record(self, *args, **kwargs):
    real(self, *args, **kwargs)
    os.kill(os.getpid(), signal.SIGSTOP)
shards.ShardStore.record = record
sys.exit(cli.main(sys.argv[1:]))
"""


def test_a_killed_run_resumes_from_its_shards_to_the_same_bytes(tiny_engine, tiny_model_dir, tmp_path):
    # two prompts: two groups, two shards
    rows = sampled_rollouts(tiny_engine, n=2, max_new=8) + sampled_rollouts(tiny_engine, n=2, max_new=8,
                                                                            prompt=PROMPT[:6], tag="s")
    path = write(tmp_path / "r.jsonl", rows)
    env = dict(os.environ, PYTHONPATH=str(REPO))
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    subprocess.run(command(path, whole, tiny_model_dir), env=env, check=True, capture_output=True)
    # the run stops itself once its first group is recorded, and is killed there (never by the machine's speed)
    proc = subprocess.Popen([sys.executable, "-c", STOP_AFTER_FIRST_RECORD, *command(path, cut, tiny_model_dir)[3:]],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, status = os.waitpid(proc.pid, os.WUNTRACED)
    assert os.WIFSTOPPED(status), f"the run ended (status {status}) before its first group was recorded"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    record = cut / "shards" / "resume.json"
    done = [rel for unit in json.loads(record.read_text())["units"].values() for rel, _ in unit["parts"].values()]
    kept = {rel: (cut / "shards" / rel).stat().st_mtime_ns for rel in done}
    assert 0 < len(done) and not (cut / "credit.parquet").exists()
    result = subprocess.run(command(path, cut, tiny_model_dir), env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-2000:]
    assert all((cut / "shards" / rel).stat().st_mtime_ns == t for rel, t in kept.items())  # reused, not rewritten
    assert (cut / "credit.parquet").read_bytes() == (whole / "credit.parquet").read_bytes()
    timing = json.loads((cut / "timing.json").read_text())  # the reused groups keep the timing they were made with
    assert len(timing["groups"]) == 2 and all(g["passes"]["resume"]["seconds"] > 0 for g in timing["groups"])
    assert [g["reused"] for g in timing["groups"]].count(True) == len(kept) // 2
    # a shard is reused only under its own key, and only with the bytes its record holds
    from replaylib.credit.kernel import KERNEL, groups_of
    from replaylib.runtime.shards import ShardStore
    units = KERNEL.plan(None, {"groups": groups_of(inputs.read_rollouts(path, VOCAB)), "path": str(path)}, {})
    assert len(units) == 2
    key = json.loads(record.read_text())["resume_key"]
    assert all(ShardStore(cut / "shards", key).load(u) is not None for u in units)
    assert all(ShardStore(cut / "shards", "other settings").load(u) is None for u in units)
    shard = cut / "shards" / ShardStore(cut / "shards", key).units[units[0].name]["parts"]["rows"][0]
    shard.write_bytes(shard.read_bytes()[:-1] + b"x")
    assert ShardStore(cut / "shards", key).load(units[0]) is None
    assert Settings(model=tiny_model_dir, grader="gsm8k", k=3).key() != Settings(model=tiny_model_dir,
                                                                                 grader="gsm8k").key()


def test_an_edit_of_what_computed_a_group_recomputes_it_and_a_comment_or_label_does_not(tiny_engine, tiny_model_dir,
                                                                                        tmp_path):
    """Each shard keeps the record of what computed it (the code that ran, the user's grader and the modules it
    imports): an edit of any of them recomputes the shards they made; a docstring or the kernel's progress label
    recomputes none."""
    import shutil
    code = tmp_path / "code"
    shutil.copytree(REPO / "replaylib", code / "replaylib", ignore=shutil.ignore_patterns("__pycache__"))
    (tmp_path / "helper2.py").write_text("SCORE = 0.0\n")
    (tmp_path / "grader2.py").write_text("import helper2\n\n\ndef score(data_source, solution_str, ground_truth, "
                                         "extra_info=None):\n    return helper2.SCORE\n")
    path = write(tmp_path / "r.jsonl", sampled_rollouts(tiny_engine, n=2, max_new=8))
    out = tmp_path / "o"

    def run_tool() -> dict:
        subprocess.run(["grader2:score" if a == "gsm8k" else a for a in command(path, out, tiny_model_dir)],
                       env=dict(os.environ, PYTHONPATH=str(code)), cwd=tmp_path, check=True, capture_output=True)
        record = json.loads((out / "shards" / "resume.json").read_text())
        files = [rel for unit in record["units"].values() for rel, _ in unit["parts"].values()]
        return {rel: (out / "shards" / rel).stat().st_mtime_ns for rel in files}

    files = run_tool()
    first = pd.read_parquet(out / "credit.parquet")
    assert (first.wins_resume_actual == 0).all()  # every grade 0
    record = json.loads((out / "shards" / "resume.json").read_text())["units"]
    used = next(iter(record.values()))["dependencies"]
    assert {str(tmp_path / "grader2.py"), str(tmp_path / "helper2.py")} <= set(used["files"])
    assert "replaylib.measure.credit:credit_group" in used["code"]
    kernel_file = code / "replaylib" / "measure" / "credit.py"
    text = kernel_file.read_text()
    kernel_file.write_text(text.replace('"""Every pass over one group\'s pivots,', '"""In short: every pass over one '
                                                                              'group\'s pivots,', 1))
    assert kernel_file.read_text() != text
    tool = code / "replaylib" / "credit" / "kernel.py"
    tool.write_text(tool.read_text().replace('progress=("credit", "rollout")', 'progress=("credit groups", "rollout")'))
    assert run_tool() == files  # a docstring and a progress label: every shard reused as it was
    (tmp_path / "helper2.py").write_text("SCORE = 1.0\n")  # what the grader imports
    rewritten = run_tool()
    assert all(rewritten[rel] != t for rel, t in files.items())
    assert (pd.read_parquet(out / "credit.parquet").wins_resume_actual == 2).all()  # graded anew: K=2 of 2
    files = rewritten
    kernel_file.write_text(text.replace("    jobs = jobs_for(prompt, responses, pivots, seeds)\n",
                                        "    jobs = jobs_for(prompt, responses, pivots, seeds)\n    jobs = list(jobs)\n", 1))
    assert all(t != files[rel] for rel, t in run_tool().items())  # the kernel's code: recomputed


def test_export_writes_a_run_s_trunks_as_rollouts(tiny_engine, tmp_path):
    from replaylib.credit.export import export
    prompt = [1, 345, 267, 201, 44, 279, 320, 161]
    trunks, _ = tiny_engine.sample_trunks({0: prompt}, 2, {(0, 0): 3, (0, 1): 4}, 0.7, 0.95, 8, 5)
    stage = tmp_path / "runs" / "tiny" / "01_sampling"
    stage.mkdir(parents=True)
    from replaylib.measure.sampling import trunk_row  # the trunk table as stage 01 writes it
    pd.DataFrame([trunk_row(t, kept=True, text=tiny_engine.decode(t.gen_ids), correct=0)
                  for t in trunks[0]]).to_parquet(stage / "trunks.parquet")
    (stage / "params.json").write_text(json.dumps({"params": {"task": "gsm8k"}}))
    out = tmp_path / "rollouts.jsonl"
    assert export(tmp_path / "runs" / "tiny", out) == 2
    read = inputs.read_rollouts(out, VOCAB)
    assert [r.id for r in read] == ["0:0", "0:1"] and read[1].response_ids == trunks[0][1].gen_ids
    assert kernel.seeds_for("0:1", 8, 2, 1, 0, "replay")["alt"] == [kernel.continuation_seed(0, 1, 10, "alt", 0)]
    pd.DataFrame([{"problem_id": 0, "kept": True}]).to_parquet(stage / "trunks.parquet")  # not stage 01's table
    with pytest.raises(inputs.BadInput, match="trunks.parquet: has no column"):
        export(tmp_path / "runs" / "tiny", out)


def test_a_run_without_pivots_writes_empty_results(tiny_engine, tiny_model_dir, rollouts, tmp_path):
    summary = run(write(tmp_path / "r.jsonl", rollouts), tmp_path / "out",
                  Settings(model=tiny_model_dir, grader="gsm8k", **dict(FAST, margin=0.0)), engine=tiny_engine)
    assert summary["pivots"] == 0 and summary["floor"] is None
    assert len(pd.read_parquet(tmp_path / "out" / "credit.parquet")) == 0
    assert "No pivot" in (tmp_path / "out" / "report.html").read_text()


def test_the_report_escapes_what_it_shows():
    from replaylib.credit.report import report_html
    frame = pd.DataFrame([{"id": "<script>alert(1)</script>", "position": 0, "A_resume": 0.5}])
    summary = {"pivots": 1, "rollouts": 1, "common_pivots": 1, "floor": 0.0, "refeed": None,
               "settings": {"passes": ["resume"], "model": "<img src=http://x>"}, "engine": {}, "versions": {}}
    page = report_html(frame, summary)
    assert "<script>" not in page and "<img" not in page and "&lt;script&gt;" in page


def test_a_device_the_machine_lacks_is_refused_in_one_line(rollouts, tiny_model_dir, tmp_path, capsys):
    import torch
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    path = write(tmp_path / "r.jsonl", rollouts)
    assert cli.main([str(path), "--model", tiny_model_dir, "--grader", "gsm8k", "--out", str(tmp_path / "o"),
                     "--device", "cuda"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--device cuda" in err and not (tmp_path / "o").exists()


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("REPLAYLIB_SLOW") != "1", reason="set REPLAYLIB_SLOW=1")
@pytest.mark.parametrize("name", ["qwen2.5-coder-0.5b-instruct", "smollm2-135m-instruct", "gemma-3-270m"])
def test_the_embedded_model_s_own_rollouts_are_certified_and_resume_equals_its_replica(name, tmp_path):
    """Each embedded model (bf16) on the CPU: two rollouts of a GSM8K-like prompt sampled by the engine, then
    credited with --model embedded:NAME: every certificate bit-exact, resume equal to its replica."""
    from replaylib.measure.engine_hf import HFEngine
    from replaylib.measure.models import resolve_model
    engine = HFEngine(resolve_model(f"embedded:{name}"), "cpu", "bfloat16")
    prompt = engine.prompt_ids("Tom has 3 apples and buys 4 more. How many apples does he have?",
                               "\nPlease reason step by step, and put your final answer within \\boxed{}.")
    rows = sampled_rollouts(engine, n=2, max_new=24, prompt=prompt)
    summary = run(write(tmp_path / "r.jsonl", rows), tmp_path / "out",
                  Settings(model=f"embedded:{name}", grader="gsm8k", k=2, max_cont_tokens=16,
                           margin=9.0, max_pivots_per_rollout=2), engine=engine)
    frame = pd.read_parquet(tmp_path / "out" / "credit.parquet")
    assert summary["pivots"] == len(frame) > 0 and set(frame["certificate"]) == {"bit-exact"}
    assert (frame["continuations_resume"] == frame["continuations_replica"]).all() and summary["floor"] in (0.0, None)
