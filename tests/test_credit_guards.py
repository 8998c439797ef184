"""The credit tool against hostile or careless input: bounds and the model's context refused before a model
loads, NaN and infinities refused and never certified, a user's grader that hangs, exits, returns NaN or
prints without end, an --out that is not the tool's or is in use, input that used to end in a traceback, and
dialect fields that contradict each other. Each is one line on stderr, exit status 2, and nothing written."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from test_credit import sampled_rollouts, write

from replaylib.credit import cli

REPO = Path(__file__).resolve().parents[1]
GOOD = {"id": "a", "prompt_ids": [1, 345, 267, 201], "response_ids": [44, 279, 320, 161, 12], "ground_truth": "7"}


QUICK = ["--k", "1", "--max-cont-tokens", "1", "--margin", "0"]  # were the input accepted, a short run


def refused(capsys, path, out, *args, model=None, grader="gsm8k") -> str:
    """The command's one line on stderr (exit status 2, nothing under out)."""
    argv = [str(path), "--model", model, "--grader", grader, "--out", str(out), *QUICK, *args]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("error: "), err
    assert not Path(out).exists()
    return err


@pytest.fixture
def bad_line(tmp_path):
    """A file whose only line is not JSON: on code that applies no bound, the run stops there instead."""
    path = tmp_path / "r.jsonl"
    path.write_text("{\n")
    return path


@pytest.mark.parametrize("args, named", [
    (["--k", "1000000"], "--k 1000000; it must be at most 256"),
    (["--max-cont-tokens", "1000000000"], "--max-cont-tokens 1000000000; it must be at most 32768"),
    (["--probe-tokens", "1000000"], "--probe-tokens 1000000; it must be at most 32768"),
    (["--temperature", "nan"], "--temperature nan; give a finite number"),
    (["--success-above", "nan"], "--success-above nan: give a finite number"),
    (["--margin", "inf"], "--margin inf; give a finite number"),
    (["--grader-timeout", "0"], "--grader-timeout 0: give a positive number of seconds"),
    (["--grader-timeout", "1e300"], "--grader-timeout 1e+300: give at most 86400 seconds (a day)"),
    (["--executor", "ray", "--workers", "1000000"], "--workers 1000000; it must be at most 256"),
])
def test_settings_out_of_the_runner_s_bounds_are_refused_before_a_model_loads(args, named, bad_line, tmp_path, capsys,
                                                                               isolated_models):
    err = refused(capsys, bad_line, tmp_path / "out", *args, model="tiny:0")
    assert named in err and "--model" not in err, err
    assert not isolated_models.exists()  # tiny:0 was never built: nothing was loaded


def test_a_device_is_not_a_rollouts_file(tmp_path, capsys, tiny_model_dir):
    err = refused(capsys, "/dev/zero", tmp_path / "out", model=tiny_model_dir)
    assert "/dev/zero: not a regular file" in err


def test_rollouts_past_the_token_bound_or_the_model_s_context_are_refused_naming_the_rollout(tmp_path, capsys,
                                                                                              tiny_model_dir):
    # the tiny model has 2048 positions: 8 + 2200 tokens do not fit, whatever the pivots
    long = dict(GOOD, id="long", response_ids=[7] * 2200)
    path = write(tmp_path / "r.jsonl", [GOOD, long])
    err = refused(capsys, path, tmp_path / "out", model=tiny_model_dir)
    assert f"{path}:2 (id 'long')" in err and "past the model's context of 2048 positions" in err, err
    # pivots plus continuations: 4 + 1900 tokens fit, but not with 256 continuation tokens after the last one
    near = dict(GOOD, id="near", response_ids=[7] * 1900)
    path = write(tmp_path / "r2.jsonl", [near])
    err = refused(capsys, path, tmp_path / "out", "--max-cont-tokens", "256", model=tiny_model_dir)
    assert "(id 'near')" in err and "lower --max-cont-tokens/--probe-tokens to at most 144" in err, err
    # a 10^6-token response is past the runner's bound on a sequence
    path = write(tmp_path / "r3.jsonl", [dict(GOOD, response_ids=[7] * 1_000_000)])
    err = refused(capsys, path, tmp_path / "out", model=tiny_model_dir)
    assert "field 'response_ids' has 1000000 tokens, more than 32768" in err, err


def test_given_positions_decide_what_must_fit_the_context():
    from replaylib.credit.checks import check_lengths
    from replaylib.credit.inputs import BadInput, parse_record
    from replaylib.credit.tool import Settings
    settings = Settings(model="m", grader="gsm8k", max_cont_tokens=256)
    early = parse_record(dict(GOOD, response_ids=[7] * 1900, positions=[10]), "f:1", 600)
    check_lengths([early], 2048, settings, "f")  # 4 + 11 + 256 fit
    late = parse_record(dict(GOOD, response_ids=[7] * 1900, positions=[1850]), "f:1", 600)
    with pytest.raises(BadInput, match="last position"):
        check_lengths([late], 2048, settings, "f")


@pytest.mark.parametrize("case, named", [
    ("nan top-1", "field 'top_logprobs' at position 0 holds logprob nan"),
    ("inf top-k", "field 'top_logprobs' at position 1 holds logprob -inf"),
    ("nan ground truth", "field 'ground_truth' is nan"),
])
def test_nan_and_infinity_in_the_rollouts_are_refused(case, named, tmp_path, capsys, tiny_model_dir):
    top = [[[44, -0.5], [45, -1.5]] for _ in GOOD["response_ids"]]
    if case == "nan top-1":
        for step in top:
            step[0][1] = float("nan")
    elif case == "inf top-k":
        top[1][1][1] = float("-inf")
    row = dict(GOOD, top_logprobs=top)
    if case == "nan ground truth":
        row = dict(GOOD, ground_truth=float("nan"))
    path = tmp_path / "r.jsonl"
    path.write_text(json.dumps(row) + "\n")  # json writes NaN and -Infinity, and reads them back
    err = refused(capsys, path, tmp_path / "out", model=tiny_model_dir)
    assert f"{path}:1" in err and named in err, err


def test_a_nan_is_never_certified():
    from types import SimpleNamespace

    from replaylib.measure.credit_certificate import certificate
    forced = SimpleNamespace(topk_ids=[[44, 45]] * 3, topk_logprobs=[[-0.5, -1.5]] * 3, observed=None)
    recorded = [[[44, -0.5], [45, -1.5]]] * 3
    assert certificate(recorded, None, forced)["certificate"] == "bit-exact"
    nan = [[[44, float("nan")], [45, -1.5]]] * 3
    assert certificate(nan, None, forced)["certificate"] == "differs"
    broken = SimpleNamespace(topk_ids=forced.topk_ids, topk_logprobs=[[float("nan"), -1.5]] * 3, observed=None)
    assert certificate(recorded, None, broken)["certificate"] == "differs"


@pytest.mark.parametrize("grader, named", [
    ("sleeps", "took longer than 1 s grading (stopped; raise --grader-timeout if it needs longer)"),
    ("exits", "called sys.exit(0)"),
    ("not_a_number", "returned nan, not a finite score"),
])
def test_a_grader_that_hangs_exits_or_returns_nan_is_one_line_naming_it_and_the_rollout(grader, named, tmp_path, capsys,
                                                                                         tiny_model_dir):
    path = write(tmp_path / "r.jsonl", [GOOD])
    spec = f"tests.credit_grader:{grader}"
    timeout = ["--grader-timeout", "1"] if grader == "sleeps" else []  # (starting the process is not timed by it)
    err = refused(capsys, path, tmp_path / "out", *timeout, model=tiny_model_dir, grader=spec)
    assert f"{path}:1: field 'ground_truth': --grader {spec} {named}" in err, err


def test_a_grader_s_prints_are_counted_not_shown(tiny_engine, tiny_model_dir, tmp_path):
    path = write(tmp_path / "r.jsonl", sampled_rollouts(tiny_engine, n=1))
    argv = [sys.executable, "-m", "replaylib.credit", str(path), "--model", tiny_model_dir, "--grader",
            "tests.credit_grader:chatty", "--out", str(tmp_path / "out"), "--k", "1", "--max-cont-tokens", "4",
            "--margin", "9", "--max-pivots-per-rollout", "1"]
    done = subprocess.run(argv, capture_output=True, cwd=REPO, env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert done.returncode == 0, done.stderr[-2000:]
    assert len(done.stdout) + len(done.stderr) < 10_000, (len(done.stdout), len(done.stderr))
    grader = json.loads((tmp_path / "out" / "summary.json").read_text())["grader"]
    assert grader["calls"] > 0 and grader["printed_bytes"] >= 200_000 * grader["calls"]
    assert b"the grader printed" in done.stdout


def test_an_out_that_holds_a_user_s_files_or_is_a_file_is_refused(tmp_path, capsys, tiny_model_dir):
    path = write(tmp_path / "r.jsonl", [GOOD])
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "summary.json").write_text('{"my": "results"}')
    argv = [str(path), "--model", tiny_model_dir, "--grader", "gsm8k", "--k", "1", "--max-cont-tokens", "1"]
    assert cli.main([*argv, "--out", str(mine)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "holds files this tool did not write (summary.json)" in err, err
    assert (mine / "summary.json").read_text() == '{"my": "results"}' and sorted(os.listdir(mine)) == ["summary.json"]
    # a repository's root: refused, nothing scattered into it
    root = tmp_path / "repo"
    root.mkdir()
    for name in ("README.md", "pyproject.toml"):
        (root / name).write_text("x")
    assert cli.main([*argv, "--out", str(root)]) == 2
    assert sorted(os.listdir(root)) == ["README.md", "pyproject.toml"]
    # a file
    assert cli.main([*argv, "--out", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 2 and f"--out {path}: is a file, not a directory" in err, err


def test_an_out_with_files_named_as_the_tool_s_outputs_but_not_its_marker_is_refused(tmp_path, capsys,
                                                                                     tiny_model_dir):
    path = write(tmp_path / "r.jsonl", [GOOD])
    mine = tmp_path / "mine"
    (mine / "shards").mkdir(parents=True)
    files = {"summary.json": '{"my": "summary"}', "report.html": "<p>mine</p>", "shards/manifest.json": "{}"}
    for name, text in files.items():
        (mine / name).write_text(text)
    argv = [str(path), "--model", tiny_model_dir, "--grader", "gsm8k", "--out", str(mine), *QUICK]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert "holds files this tool did not write (report.html, shards, summary.json)" in err, err
    assert sorted(str(p.relative_to(mine)) for p in mine.rglob("*")) == [
        "report.html", "shards", "shards/manifest.json", "summary.json"]
    assert all((mine / name).read_text() == text for name, text in files.items())


def test_two_runs_on_one_out_cannot_run_at_once(tiny_engine, tiny_model_dir, tmp_path, capsys):
    path = write(tmp_path / "r.jsonl", sampled_rollouts(tiny_engine, n=1))
    out = tmp_path / "out"
    argv = [str(path), "--model", tiny_model_dir, "--grader", "gsm8k", "--out", str(out), "--k", "1",
            "--max-cont-tokens", "2", "--margin", "9", "--max-pivots-per-rollout", "1"]
    assert cli.main(argv) == 0  # the directory is the tool's now
    capsys.readouterr()
    first = (out / "credit.parquet").read_bytes()
    from replaylib.credit.outdir import holding
    with holding(out):  # another run holds it (a lock taken through another descriptor)
        assert cli.main([*argv[:-6], "--k", "2", *argv[-4:]]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"another credit run (pid {os.getpid()}) is writing there" in err, err
    assert (out / "credit.parquet").read_bytes() == first
    assert cli.main(argv) == 0  # released with its holder


@pytest.mark.parametrize("case", ["5000 digits", "deep nesting", "lone surrogate"])
def test_input_that_used_to_end_in_a_traceback_is_one_line(case, tmp_path, capsys, tiny_model_dir):
    text = {"5000 digits": json.dumps(GOOD).replace('"response_ids": [44', '"response_ids": [' + "4" * 5000),
            "deep nesting": '{"id": "a", "x": ' + "[" * 100_000 + "]" * 100_000 + "}",
            "lone surrogate": json.dumps(GOOD).replace('"id": "a"', '"id": "a\\ud800"')}[case]
    path = tmp_path / "r.jsonl"
    path.write_text(text + "\n")
    err = refused(capsys, path, tmp_path / "out", model=tiny_model_dir)
    assert f"{path}:1: " in err, err
    if case == "lone surrogate":
        assert "field 'id' holds a string that is not valid Unicode" in err


def test_a_model_path_that_does_not_exist_is_not_a_hub_message(tmp_path, capsys):
    path = write(tmp_path / "r.jsonl", [GOOD])
    err = refused(capsys, path, tmp_path / "out", model="/nonexistent")
    assert "--model /nonexistent: no such directory" in err and "repo" not in err.lower(), err


@pytest.mark.parametrize("extra, named", [
    ({"answer": "7", "label": "8"}, "fields 'label' and 'answer' both give the ground truth and differ"),
    ({"prompts": [9, 9]}, "fields 'prompt_ids' and 'prompts' both give the prompt ids and differ"),
])
def test_dialect_fields_that_contradict_each_other_are_refused(extra, named, tmp_path, capsys, tiny_model_dir):
    row = dict(GOOD, **extra)
    if "answer" in extra:
        del row["ground_truth"]
    path = write(tmp_path / "r.jsonl", [row])
    err = refused(capsys, path, tmp_path / "out", model=tiny_model_dir)
    assert f"{path}:1: {named}; keep one of them" in err, err


def test_dialect_fields_that_agree_or_are_text_are_read():
    from replaylib.credit.inputs import parse_record
    trl = dict(GOOD, prompts="What is 3 + 4?", answer="7")  # TRL's text prompt beside its ids; answer agrees
    assert parse_record(trl, "f:1", 600).prompt_ids == GOOD["prompt_ids"]


def test_a_run_that_fails_before_writing_leaves_its_out_as_it_found_it(tmp_path):
    from replaylib.credit.outdir import holding
    new, empty, used = tmp_path / "new", tmp_path / "empty", tmp_path / "used"
    empty.mkdir()
    with holding(used):
        (used / "credit.parquet").write_bytes(b"rows")
    before = sorted(os.listdir(used))
    for out in (new, empty, used):
        with pytest.raises(RuntimeError), holding(out):
            raise RuntimeError("the engine did not start")
    assert not new.exists() and os.listdir(empty) == [] and sorted(os.listdir(used)) == before


def test_an_estimator_used_after_close_says_so_in_one_line(tiny_engine):
    from test_credit import FAST

    from replaylib.credit.estimator import Estimator
    from replaylib.credit.inputs import BadInput
    rows = sampled_rollouts(tiny_engine, n=1)
    estimator = Estimator(engine=tiny_engine, grader="gsm8k", **FAST)
    assert len(estimator(rows)) > 0
    estimator.close()
    estimator.close()  # twice is no error
    with pytest.raises(BadInput, match=r"^this Estimator was closed; make a new one$"):
        estimator(rows)
