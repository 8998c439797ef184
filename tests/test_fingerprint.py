"""A stage's code fingerprint is its computation: what decides its outputs' bytes changes it, and
nothing else does (replaylib.runtime.fingerprint). Each case edits a copy of the code as a user would
and compares the stages' fingerprints before and after, for a transformers and a vLLM configuration.

An edit is made at the first place in the package that holds its text, wherever that is: the tests name
what a line decides (which problems are kept, the margins, ...), not the file it lives in, so code that
moves out of the fingerprint's reach is caught."""
import json
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
ENGINES = ("hf", "vllm")


@pytest.fixture(scope="module")
def code(tmp_path_factory):
    dest = tmp_path_factory.mktemp("code")
    for name in ("replaylib", "notebooks"):
        shutil.copytree(REPO / name, dest / name, ignore=shutil.ignore_patterns("__pycache__"))
    return dest


def fingerprints(code: Path) -> dict:
    """{(stage, engine): fingerprint} of the code under ``code``."""
    script = ("import json; from replaylib.runtime.fingerprint import code_fingerprint; "
              f"print(json.dumps({{s + ' ' + e: code_fingerprint(s, e) for s in {STAGES!r} for e in {ENGINES!r}}}))")
    out = subprocess.run([sys.executable, "-c", script], cwd=code, env={**os.environ, "PYTHONPATH": str(code)},
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def edit_file(code: Path, rel: str, pattern: str, replacement: str):
    path = code / rel
    text = path.read_text()
    new, n = re.subn(pattern, replacement, text, count=1)
    assert n == 1, f"{rel}: {pattern!r} not found (the test's edit point moved)"
    path.write_text(new)


def edit_where(code: Path, text: str, replacement: str):
    """Replace the first occurrence of ``text`` in the package, in whichever module holds it."""
    for path in sorted((code / "replaylib").rglob("*.py")):
        if text in path.read_text():
            path.write_text(path.read_text().replace(text, replacement, 1))
            return
    raise AssertionError(f"{text!r} is nowhere in the package (the test's edit point moved)")


def add_statement(code: Path, line: str, statement: str):
    """Add a statement after the line that holds ``line`` (at that line's indentation), wherever it is."""
    for path in sorted((code / "replaylib").rglob("*.py")):
        lines = path.read_text().splitlines(keepends=True)
        for i, text in enumerate(lines):
            if line in text:
                indent = text[:len(text) - len(text.lstrip())]
                if text.rstrip().endswith(":"):
                    indent += "    "
                lines.insert(i + 1, f"{indent}{statement}\n")
                path.write_text("".join(lines))
                return
    raise AssertionError(f"{line!r} is nowhere in the package (the test's edit point moved)")


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


def _preview(cells):
    cell = next(c for c in cells if c.cell_type == "code" and ".preview(" in c.source)
    cell.source += "\nfirst = first.head(1)"


NOTHING_COMPUTED = {
    "a display option in notebook 03": lambda c: edit_notebook(c, "03_three_pass_replay", _set_option),
    "a label in notebook 03": lambda c: edit_notebook(c, "03_three_pass_replay", _label),
    "the preview cell of notebook 03": lambda c: edit_notebook(c, "03_three_pass_replay", _preview),
    "the help text of a display parameter": lambda c: edit_file(
        c, "replaylib/runtime/params.py", r"row of the replay records shown in the worked examples",
        "row of the replay records that the worked examples show"),
    "a message of verify_run": lambda c: edit_where(c, "no stage directories found", "holds no stage directory"),
    "a log message of the vLLM engine": lambda c: edit_file(
        c, "replaylib/measure/engine_vllm.py", r"vLLM engine stopped", "the vLLM engine has stopped"),
    "the log format": lambda c: edit_file(c, "replaylib/__init__.py", r"\[replaylib\] %\(message\)s",
                                          "replaylib: %(message)s"),
    "a comment and a docstring in a kernel": lambda c: edit_file(
        c, "replaylib/measure/replay.py", r'(def estimate\([^\n]*\n\s*""")', r"\1In short: "),
    "the name of a unit's progress phase": lambda c: edit_where(c, '"trunks (invariant)"', '"invariant trunks"'),
    "the message of a stage's check": lambda c: edit_where(c, "passes disagree in invariant mode",
                                                           "the passes disagreed in invariant mode"),
    "the run layer (the shard store)": lambda c: add_statement(c, "def changed(self) -> list[str]:", "pass"),
}


@pytest.mark.parametrize("edit", list(NOTHING_COMPUTED), ids=list(NOTHING_COMPUTED))
def test_edits_that_compute_nothing_leave_every_stage_fresh(code, tmp_path, edit):
    copy = tmp_path / "code"
    shutil.copytree(code, copy)
    before = fingerprints(copy)
    NOTHING_COMPUTED[edit](copy)
    assert fingerprints(copy) == before


ALL = set(STAGES)
COMPUTING = {  # edit -> the stages whose fingerprint must change, on a transformers and on a vLLM configuration
    "the transformers engine": (lambda c: edit_file(c, "replaylib/measure/hf_sampling.py",
                                                    r"NUCLEUS_CANDIDATES = 128", "NUCLEUS_CANDIDATES = 96"),
                                {"01_sampling", "03_three_pass_replay", "05_batch_invariant"}, set()),
    "the vLLM engine's sampling": (lambda c: add_statement(c, "for pid, prompt in prompts.items():",
                                                          "prompt = list(prompt)"),
                                   set(), {"01_sampling", "05_batch_invariant"}),
    "the replay kernel": (lambda c: edit_file(c, "replaylib/measure/replay.py",
                                              r'sum\(wins\["actual"\]\) / len\(wins\["actual"\]\)',
                                              'sum(wins["actual"]) / max(1, len(wins["actual"]))'),
                          {"03_three_pass_replay", "05_batch_invariant"}, {"03_three_pass_replay", "05_batch_invariant"}),
    "the pivot rule": (lambda c: edit_file(c, "replaylib/measure/mining.py", r"lps\[0\] - lps\[1\] >= params",
                                           "lps[0] - lps[1] > params"),
                       {"02_pivot_mining", "05_batch_invariant"}, {"02_pivot_mining", "05_batch_invariant"}),
    # which problems the screen keeps: the loop that stops once enough are kept
    "the screen": (lambda c: edit_where(c, "while len(screen.kept) < params.n_problems:",
                                        "while len(screen.kept) < params.n_problems + 0:"),
                   {"01_sampling"}, {"01_sampling"}),
    "the margins": (lambda c: edit_where(c, '"rollout": t.rollout, "margin": m}', '"rollout": t.rollout, "margin": -m}'),
                    {"02_pivot_mining"}, {"02_pivot_mining"}),
    "which problems the invariant stage uses": (
        lambda c: edit_where(c, '["kept"][:params.invariant_problems]', '["kept"][:params.invariant_problems + 0]'),
        {"05_batch_invariant"}, {"05_batch_invariant"}),
    "the kept-trunk filter": (lambda c: edit_where(c, "return trunks[trunks.kept].reset_index(drop=True)",
                                                   "return trunks[trunks.kept == True].reset_index(drop=True)"),
                              {"02_pivot_mining", "03_three_pass_replay"}, {"02_pivot_mining", "03_three_pass_replay"}),
    "a pass-table row": (lambda c: edit_file(c, "replaylib/measure/passes.py", r'(PASSES = \{p\.name: p for p in \()',
                                             r'\1\n    Pass("exact3", "the decode-time state, resumed", "exact", '
                                             r'"replica", "exact3", replica_of="exact1"),'),
                         {"03_three_pass_replay", "04_statistics", "05_batch_invariant"},
                         {"03_three_pass_replay", "04_statistics", "05_batch_invariant"}),
    "how a shard or an output is written": (lambda c: edit_where(c, "value.to_parquet(tmp, index=False)",
                                                                 "value.to_parquet(tmp, index=False, compression='gzip')"),
                                            ALL, ALL),
    "the compute cell of notebook 03": (lambda c: edit_notebook(c, "03_three_pass_replay", lambda cells: [
        setattr(x, "source", x.source + "\nrecords = records.head(1)") for x in cells
        if "compute" in x.metadata.get("tags", [])]), {"03_three_pass_replay"}, {"03_three_pass_replay"}),
    "a statistic": (lambda c: edit_file(c, "replaylib/analysis/stats.py", r"MARGIN_SPLIT = 0\.3", "MARGIN_SPLIT = 0.25"),
                    {"04_statistics"}, {"04_statistics"}),
}


@pytest.mark.parametrize("edit", list(COMPUTING), ids=list(COMPUTING))
def test_edits_of_the_computation_make_their_stages_stale(code, tmp_path, edit):
    copy = tmp_path / "code"
    shutil.copytree(code, copy)
    before = fingerprints(copy)
    change, stale_hf, stale_vllm = COMPUTING[edit]
    change(copy)
    after = fingerprints(copy)
    for engine, stale in (("hf", stale_hf), ("vllm", stale_vllm)):
        assert {s for s in STAGES if after[f"{s} {engine}"] != before[f"{s} {engine}"]} == stale, engine


def test_a_stage_s_definitions_are_what_its_kernel_reaches():
    from replaylib.runtime.fingerprint import stage_definitions
    sampling = stage_definitions("01_sampling", "hf")
    assert {"replaylib.measure.sampling:plan", "replaylib.measure.sampling:Screen.add",
            "replaylib.measure.engine_hf:HFEngine.sample_trunks", "replaylib.measure.hf_sampling:choose_tokens",
            "replaylib.measure.units:write_output"} <= set(sampling)
    assert not any(d.startswith(("replaylib.measure.passes:", "replaylib.measure.engine_vllm:")) for d in sampling)
    assert "replaylib.measure.engine_hf:HFEngine.run_pass" not in sampling  # the sampling runs no pass
    replay = set(stage_definitions("03_three_pass_replay", "vllm"))
    assert {"replaylib.measure.replay:replay_unit", "replaylib.measure.engine_vllm:VLLMEngine.run_pass",
            "replaylib.measure.passes:PASSES"} <= replay
    assert not any(d.startswith("replaylib.measure.engine_hf:") for d in replay)
    assert all(d.startswith(("replaylib.measure.", "replaylib.analysis.")) for d in replay)
    stats = set(stage_definitions("04_statistics"))
    assert {"replaylib.analysis.stats:MARGIN_SPLIT", "replaylib.analysis.tables:table1",
            "replaylib.analysis.plotting:save_figure"} <= stats
    assert not any("engine_" in d for d in stats)  # the statistics read records, not engines


def test_a_name_the_code_cannot_place_brings_in_its_whole_module(tmp_path):
    """A definition made at run time (a name given as text that no statement defines) counts its module."""
    from replaylib.runtime import fingerprint
    closure = fingerprint.closure([("replaylib.measure.vllm_forcing", "ForcedTokens")])
    assert ("replaylib.measure.vllm_forcing", "ForcedTokens") in closure
    assert any(name != "ForcedTokens" and mod == "replaylib.measure.vllm_forcing" for mod, name in closure)
