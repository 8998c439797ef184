"""What the credit tool says beside its numbers: the plan before the first group, warnings that say what to
change (continuations cut at --max-cont-tokens, every A 0), within_floor only where something was compared,
timing.json after a resumed run, and report.html with each pivot's texts, escaped."""
import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
from test_credit import sampled_rollouts, write

from replaylib.credit.diagnostics import warnings
from replaylib.credit.report import pivot_html, report_html
from replaylib.credit.tool import Settings
from replaylib.measure import credit as kernel

REPO = Path(__file__).resolve().parents[1]


def test_within_floor_is_never_true_on_no_evidence():
    zero = {"A_resume": 0.0, "A_replica": 0.0, "A_refeed": 0.0}
    assert kernel.within_floor(zero) is None
    assert kernel.within_floor({"A_resume": 0.5}) is None
    assert kernel.within_floor(dict(zero, A_resume=0.5, A_refeed=0.5)) is True
    assert kernel.within_floor(dict(zero, A_resume=0.5, A_replica=0.5)) is False  # refeed alone changed the sign


def frame_of(a: float, wins: int, length: int, k: int = 2) -> pd.DataFrame:
    conts = json.dumps({"actual": [[1] * length] * k, "alt": [[1] * length] * k})
    row = {}
    for p in ("resume", "replica", "refeed"):
        row.update({f"A_{p}": a, f"wins_{p}_actual": wins, f"wins_{p}_alt": wins, f"continuations_{p}": conts})
    return pd.DataFrame([row, row])


def test_the_warnings_say_what_to_change():
    settings = Settings(model="m", grader="g", k=2, max_cont_tokens=8)
    (cut, zero) = warnings(frame_of(0.0, 0, 8), settings)
    assert cut.startswith("24 of 24 continuations (100%) reached --max-cont-tokens 8") and "raise --max-cont-tokens" \
        in cut
    assert "every A is 0" in zero and "no continuation was graded a success; check --grader" in zero
    assert warnings(frame_of(0.0, 2, 3), settings) == [
        "every A is 0 (2 pivots, 3 passes): every continuation was graded a success, so the arms cannot differ; "
        "give harder problems"]
    assert "raise --k" in warnings(frame_of(0.0, 1, 3), settings)[0]
    assert warnings(frame_of(0.5, 1, 3), settings) == []
    assert "no pivot" in warnings(pd.DataFrame(), settings)[0]


def command(path, out, model, *more):
    argv = [sys.executable, "-m", "replaylib.credit", str(path), "--model", model, "--out", str(out), "--k", "2",
            "--max-cont-tokens", "3", "--margin", "9", "--max-pivots-per-rollout", "2", *more]
    return subprocess.run(argv, capture_output=True, text=True, cwd=REPO, env=dict(os.environ, PYTHONPATH=str(REPO)))


def test_the_plan_the_warnings_and_timing_after_a_resume(tiny_engine, tiny_model_dir, tmp_path):
    path = write(tmp_path / "r.jsonl", sampled_rollouts(tiny_engine, n=2, max_new=8))
    out = tmp_path / "out"
    first = command(path, out, tiny_model_dir, "--grader", "tests.credit_grader:never")
    assert first.returncode == 0, first.stderr[-2000:]
    lines = first.stdout.splitlines()
    plan = next(i for i, ln in enumerate(lines) if "plan: " in ln)
    assert lines[plan].endswith("plan: 2 rollouts in 1 prompt groups; to compute: 1 groups, 16 tokens forced, up to 4 "
                                "pivots x 3 passes x 2 arms x K 2 = 48 continuations of at most 3 tokens (144 "
                                "tokens at most)"), lines[plan]
    warned = [ln for ln in lines if "warning: " in ln]
    assert plan < lines.index(warned[0]) and any("no continuation was graded a success" in w for w in warned), lines
    computed = json.loads((out / "timing.json").read_text())
    assert computed["computed_groups"] == 1 and computed["passes"]["resume"]["tokens"] > 0
    # rerun: every group reused from its shard, and timing.json still reports what they cost
    again = command(path, out, tiny_model_dir, "--grader", "tests.credit_grader:never")
    assert again.returncode == 0 and "(1 reused from shards); to compute: 0 groups" in again.stdout, again.stdout
    resumed = json.loads((out / "timing.json").read_text())
    assert resumed["reused_groups"] == 1 and resumed["computed_groups"] == 0
    assert resumed["passes"] == computed["passes"] and resumed["groups"][0]["reused"] is True
    assert json.loads((out / "summary.json").read_text())["grader"]["calls"] > 0


def test_the_report_shows_each_pivot_s_texts_escaped(tiny_engine, tiny_model_dir, tmp_path):
    rows = sampled_rollouts(tiny_engine, n=1, max_new=8)
    done = command(write(tmp_path / "r.jsonl", rows), tmp_path / "out", tiny_model_dir, "--grader", "gsm8k")
    assert done.returncode == 0, done.stderr[-2000:]
    page = (tmp_path / "out" / "report.html").read_text()
    frame = pd.read_parquet(tmp_path / "out" / "credit.parquet")
    assert page.count('<div class="pivot">') == len(frame) > 0
    first = frame.iloc[0]
    cont = json.loads(first.continuations_refeed)["alt"][0]
    import html
    shown = html.escape(tiny_engine.decode([int(first.alt_token_id)] + cont))
    assert f'<span class="text">{shown}</span>' in page and "before the pivot" in page
    assert page.count("success</span>") + page.count("failure</span>") == len(frame) * 3 * 2 * 2
    # model output is escaped wherever it is shown
    hostile = SimpleNamespace(prompt_ids=[1], response_ids=[2, 3])
    row = {"id": "<i>", "position": 1, "token_id": 3, "alt_token_id": 4, "A_resume": 0.0,
           "continuations_resume": json.dumps({"actual": [[5]], "alt": [[6]]}),
           "grades_resume": json.dumps({"actual": [1], "alt": [0]})}
    shown = pivot_html(row, hostile, lambda ids: "<script>alert(1)</script>", ["resume"])
    assert "<script>" not in shown and "<i>" not in shown and "&lt;script&gt;" in shown
    summary = {"pivots": 1, "rollouts": 1, "common_pivots": 0, "floor": None, "refeed": None,
               "warnings": ["<u>"], "settings": {"passes": ["resume"]}, "engine": {}, "versions": {}}
    assert "<u>" not in report_html(pd.DataFrame([row]), summary, {"<i>": hostile}, lambda ids: "<script>")
