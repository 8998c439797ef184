"""A stage's code fingerprint is its computation: what decides its outputs' bytes changes it, and
nothing else does (replaylib.runtime.fingerprint). Each case edits a copy of the code as a user would
and compares the five stages' fingerprints before and after."""
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

REPO = Path(__file__).resolve().parents[1]
STAGES = ["01_sampling", "02_pivot_mining", "03_three_pass_replay", "04_statistics", "05_batch_invariant"]


@pytest.fixture(scope="module")
def code(tmp_path_factory):
    dest = tmp_path_factory.mktemp("code")
    for name in ("replaylib", "notebooks"):
        shutil.copytree(REPO / name, dest / name, ignore=shutil.ignore_patterns("__pycache__"))
    return dest


def fingerprints(code: Path) -> dict:
    script = ("import json; from replaylib.runtime.fingerprint import code_fingerprint; "
              f"print(json.dumps({{s: code_fingerprint(s) for s in {STAGES!r}}}))")
    out = subprocess.run([sys.executable, "-c", script], cwd=code, env={**os.environ, "PYTHONPATH": str(code)},
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    import json
    return json.loads(out.stdout)


def edit_file(code: Path, rel: str, pattern: str, replacement: str):
    path = code / rel
    text = path.read_text()
    new, n = re.subn(pattern, replacement, text, count=1)
    assert n == 1, f"{rel}: {pattern!r} not found (the test's edit point moved)"
    path.write_text(new)


def edit_notebook(code: Path, stage: str, change):
    path = code / "notebooks" / f"{stage}.ipynb"
    nb = nbformat.read(str(path), as_version=4)
    change(nb.cells)
    nbformat.write(nb, str(path))


def _set_option(cells):
    setup = next(c for c in cells if c.cell_type == "code" and "pd.set_option" in c.source)
    setup.source = setup.source.replace('pd.set_option("display.max_colwidth", 80)',
                                        'pd.set_option("display.max_colwidth", 120)')


def _label(cells):
    shown = next(c for c in cells if c.cell_type == "code" and '"state verified (exact_ok)"' in c.source)
    shown.source = shown.source.replace('"state verified (exact_ok)"', '"decode-time state verified"')


NOTHING_COMPUTED = {
    "a display option in notebook 03": lambda c: edit_notebook(c, "03_three_pass_replay", _set_option),
    "a label in notebook 03": lambda c: edit_notebook(c, "03_three_pass_replay", _label),
    "the help text of a display parameter": lambda c: edit_file(
        c, "replaylib/runtime/params.py", r"row of the replay records shown in the worked examples",
        "row of the replay records that the worked examples show"),
    "a message of verify_run": lambda c: edit_file(
        c, "replaylib/runtime/rundir.py", r"no stage directories found", "holds no stage directory"),
    "a log message of the vLLM engine": lambda c: edit_file(
        c, "replaylib/measure/engine_vllm.py", r"vLLM engine stopped", "the vLLM engine has stopped"),
    "the log format": lambda c: edit_file(c, "replaylib/__init__.py", r"\[replaylib\] %\(message\)s",
                                          "replaylib: %(message)s"),
    "a comment and a docstring in a kernel": lambda c: edit_file(
        c, "replaylib/measure/replay.py", r'(def estimate\([^\n]*\n\s*""")', r"\1In short: "),
}


@pytest.mark.parametrize("edit", list(NOTHING_COMPUTED), ids=list(NOTHING_COMPUTED))
def test_edits_that_compute_nothing_leave_every_stage_fresh(code, tmp_path, edit):
    copy = tmp_path / "code"
    shutil.copytree(code, copy)
    before = fingerprints(copy)
    NOTHING_COMPUTED[edit](copy)
    assert fingerprints(copy) == before


COMPUTING = {  # edit -> the stages whose fingerprint must change
    "the transformers engine": (lambda c: edit_file(c, "replaylib/measure/hf_sampling.py",
                                                    r"NUCLEUS_CANDIDATES = 128", "NUCLEUS_CANDIDATES = 96"),
                                {"01_sampling", "03_three_pass_replay", "05_batch_invariant"}),
    "the replay kernel": (lambda c: edit_file(c, "replaylib/measure/replay.py",
                                              r'sum\(wins\["actual"\]\) / len\(wins\["actual"\]\)',
                                              'sum(wins["actual"]) / max(1, len(wins["actual"]))'),
                          {"03_three_pass_replay", "05_batch_invariant"}),
    "the pivot rule": (lambda c: edit_file(c, "replaylib/measure/mining.py", r"lps\[0\] - lps\[1\] >= params",
                                           "lps[0] - lps[1] > params"),
                       {"02_pivot_mining", "03_three_pass_replay", "05_batch_invariant"}),
    "the compute cell of notebook 03": (lambda c: edit_notebook(c, "03_three_pass_replay", lambda cells: [
        setattr(x, "source", x.source + "\nrecords = records.head(1)") for x in cells
        if "compute" in x.metadata.get("tags", [])]), {"03_three_pass_replay"}),
    "a statistic": (lambda c: edit_file(c, "replaylib/analysis/stats.py", r"MARGIN_SPLIT = 0\.3", "MARGIN_SPLIT = 0.25"),
                    {"04_statistics"}),
}


@pytest.mark.parametrize("edit", list(COMPUTING), ids=list(COMPUTING))
def test_edits_of_the_computation_make_their_stages_stale(code, tmp_path, edit):
    copy = tmp_path / "code"
    shutil.copytree(code, copy)
    before = fingerprints(copy)
    change, stale = COMPUTING[edit]
    change(copy)
    after = fingerprints(copy)
    assert {s for s in STAGES if after[s] != before[s]} == stale


def test_a_stage_s_modules_are_its_computing_subpackages_only():
    from replaylib.runtime.fingerprint import stage_modules
    replay = set(stage_modules("03_three_pass_replay"))
    assert {"replaylib.measure.replay", "replaylib.measure.engine_hf", "replaylib.measure.engine_vllm",
            "replaylib.measure.grading", "replaylib.measure.state"} <= replay
    assert all(m.startswith("replaylib.measure.") for m in replay)
    assert stage_modules("02_pivot_mining") == ["replaylib.measure.mining"]
    stats = set(stage_modules("04_statistics"))
    assert {"replaylib.analysis.stats", "replaylib.analysis.tables", "replaylib.analysis.plotting"} <= stats
    assert all(m.startswith(("replaylib.analysis.", "replaylib.measure.")) for m in stats)
    assert "replaylib.measure.engine_hf" not in stats  # the statistics read records, not engines
