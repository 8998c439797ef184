"""A stage is stale exactly when something it used changed: the package code that ran while it computed (in any
process), what that code reads at module level, the notebook's compute cell, and the files it read
(replaylib.core.recording). Each case edits a copy of the code, the data or the model beside a copy of a
finished tiny run made with that code, and asks the runner which stages would run (``--dry-run``).

An edit is made at the first place in the package that holds its text, wherever that is: the tests name what a
line decides, not the file it lives in, so code that moves is followed."""
import ast
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
STAGES = ["01_sampling", "02_pivot_mining", "03_three_pass_replay", "05_batch_invariant", "04_statistics"]

# the patterns a reading of the source cannot follow, each reached by the pivot mining's unit: every function
# returns 0, so the stage's outputs stay those of the finished run
PATTERNS = '''"""Functions reached only in ways a static reading of the source cannot follow."""
import importlib
import json
import logging
import sys
from math import exp, log

import replaylib.measure._patterns

_log = logging.getLogger("replaylib")
X = 2
X = int(X)
NAME = "by_globals"


def by_getattr():
    return 0


def by_globals():
    return 0


def by_sys_modules():
    return 0


def by_import_module():
    return 0


def fully_qualified():
    return 0


def _wrap(f):
    def inner():
        return f()
    return inner


def rebound():
    return 0


rebound = _wrap(rebound)


def uses_log(d):
    return log(exp(d) + 1) * 0


def uses_a_list_named_log():
    log = []
    log.append(0)
    return sum(log)


def uses_x():
    return X * 0


class Encoder(json.JSONEncoder):
    def default(self, o):
        return 0


def run_all() -> int:
    module = importlib.import_module(__name__)
    total = getattr(module, "by_getattr")() + globals()[NAME]() + getattr(sys.modules[__name__], "by_sys_modules")()
    total += importlib.import_module("replaylib.measure._patterns").by_import_module()
    total += replaylib.measure._patterns.fully_qualified() + rebound() + uses_log(0.5) + uses_a_list_named_log()
    total += uses_x() + len(json.dumps(object(), cls=Encoder)) - 1
    message = f"the patterns added up to {total}"
    _log.info("patterns ran: %d", total)
    print("patterns ran")
    assert total == 0, "the patterns must add up to 0"
    if total:
        raise ValueError(message)
    return total
'''


def copy_tree(src: Path, dest: Path) -> Path:
    shutil.copytree(src, dest, ignore=shutil.ignore_patterns("__pycache__", ".locks"))
    return dest


def environment(root: Path) -> dict:
    return {**os.environ, "PYTHONPATH": str(root / "code"), "REPLAYLIB_MODELS": str(root / "code" / "models")}


def runner(root: Path, *args: str, params: str = "params/tiny.yaml") -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "replaylib.run", params, *args, "--out", str(root / "out")],
                          cwd=root / "code", env=environment(root), capture_output=True, text=True, timeout=900)


def would_run(root: Path, params: str = "params/tiny.yaml") -> dict:
    """{stage: why} for every stage a dry run would run."""
    dry = runner(root, "--dry-run", params=params)
    assert dry.returncode == 0, dry.stderr
    return dict(re.findall(r"stage (\S+): would run \((.*)\)", dry.stdout))


def own(stale: dict) -> dict:
    """The stages stale for a reason of their own (not only because a stage they read reruns)."""
    return {s: why for s, why in stale.items() if why != "upstream reruns"}


def edit(root: Path, text: str, replacement: str, where: str = "replaylib") -> None:
    """Replace the first occurrence of ``text`` under code/<where>, in whichever file holds it."""
    under = root / "code" / where
    for path in [under] if under.is_file() else sorted(under.rglob("*.py")):
        if text in path.read_text():
            path.write_text(path.read_text().replace(text, replacement, 1))
            return
    raise AssertionError(f"{text!r} is nowhere under {where} (the test's edit point moved)")


def edit_notebook(root: Path, stage: str, change) -> None:
    path = root / "code" / "notebooks" / f"{stage}.ipynb"
    nb = nbformat.read(str(path), as_version=4)
    change(nb.cells)
    nbformat.write(nb, str(path))


def recorded(root: Path, stage: str) -> dict:
    return json.loads((root / "out" / "runs" / "tiny" / stage / "manifest.json").read_text())["dependencies"]


@pytest.fixture(scope="module")
def hooked(tiny_finished, tmp_path_factory):
    """A copy of the code, data and tiny model; a finished tiny run made with it; and the pivot mining's unit
    reaching the patterns above (stage 02 rerun with them, its outputs unchanged)."""
    from replaylib.core.paths import models_dir
    root = tmp_path_factory.mktemp("dependencies")
    for name in ("replaylib", "notebooks", "params", "data"):
        copy_tree(REPO / name, root / "code" / name)
    copy_tree(models_dir() / "tiny-seed0", root / "code" / "models" / "tiny-seed0")
    copy_tree(tiny_finished, root / "out")
    assert would_run(root) == {}, "the copy of the finished run is not up to date with the copy of the code"
    (root / "code" / "replaylib" / "measure" / "_patterns.py").write_text(PATTERNS)
    edit(root, "    margins = ", "    _patterns.run_all()\n    margins = ", where="replaylib/measure/mining.py")
    edit(root, "from .units import Kernel, Outputs, Unit\n", "from . import _patterns\nfrom .units import Kernel, Outputs, "
         "Unit\n", where="replaylib/measure/mining.py")
    assert set(own(would_run(root))) == {"02_pivot_mining"}
    pivots = (root / "out" / "runs" / "tiny" / "02_pivot_mining" / "pivots.parquet").read_bytes()
    done = runner(root, "02")
    assert done.returncode == 0, done.stderr
    assert (root / "out" / "runs" / "tiny" / "02_pivot_mining" / "pivots.parquet").read_bytes() == pivots
    assert would_run(root) == {}
    return root


@pytest.fixture
def case(hooked, tmp_path):
    """A fresh copy of the hooked code and run, for one edit."""
    copy_tree(hooked / "code", tmp_path / "code")
    copy_tree(hooked / "out", tmp_path / "out")
    return tmp_path


# ---------------------------------------------------------------- code that ran, wherever it was reached

PATTERN_EDITS = {  # a function reached only as the pattern says, edited so that it returns 0 another way
    "getattr(module, name)": ("def by_getattr():\n    return 0", "def by_getattr():\n    return 1 - 1", "by_getattr"),
    "globals()[NAME]": ("def by_globals():\n    return 0", "def by_globals():\n    return 1 - 1", "by_globals"),
    "getattr(sys.modules[__name__], ...)": ("def by_sys_modules():\n    return 0",
                                            "def by_sys_modules():\n    return 1 - 1", "by_sys_modules"),
    "importlib.import_module": ("def by_import_module():\n    return 0", "def by_import_module():\n    return 1 - 1",
                                "by_import_module"),
    "a fully qualified call": ("def fully_qualified():\n    return 0", "def fully_qualified():\n    return 1 - 1",
                               "fully_qualified"),
    "f = wrap(f) after the def": ("rebound = _wrap(rebound)", "rebound = _wrap(_wrap(rebound))", "rebound"),
    "the function f = wrap(f) rebinds": ("def rebound():\n    return 0", "def rebound():\n    return 1 - 1", "rebound"),
    "X = 2; X = int(X)": ("X = 2\n", "X = 3\n", "X"),
    "log from math": ("log(exp(d) + 1) * 0", "log(exp(d) + 2) * 0", "uses_log"),
    "a list named log": ("log.append(0)", "log.append(0 * 2)", "uses_a_list_named_log"),
    "json.JSONEncoder.default, called by json": ("    def default(self, o):\n        return 0",
                                                 "    def default(self, o):\n        return 1 - 1", "Encoder.default"),
}


@pytest.fixture(scope="module")
def patterns_edited(hooked, tmp_path_factory):
    """Every pattern's function edited at once in a copy: (what a dry run says, every change the pivot
    mining's record finds, in the words of the runner)."""
    root = tmp_path_factory.mktemp("patterns")
    copy_tree(hooked / "code", root / "code")
    copy_tree(hooked / "out", root / "out")
    for text, replacement, _ in PATTERN_EDITS.values():
        edit(root, text, replacement, where="replaylib/measure/_patterns.py")
    manifest = root / "out" / "runs" / "tiny" / "02_pivot_mining" / "manifest.json"
    found = subprocess.run([sys.executable, "-c", "import json, sys; from replaylib.core.recording import changes; "
                            "print(json.dumps(changes(json.load(open(sys.argv[1]))['dependencies'])))", str(manifest)],
                           cwd=root / "code", env=environment(root), capture_output=True, text=True, check=True)
    return own(would_run(root)), json.loads(found.stdout)


@pytest.mark.parametrize("pattern", list(PATTERN_EDITS), ids=list(PATTERN_EDITS))
def test_code_reached_in_ways_a_reading_cannot_follow_makes_its_stage_stale(patterns_edited, pattern):
    stale, changes = patterns_edited
    assert set(stale) == {"02_pivot_mining"} and stale["02_pivot_mining"].startswith("replaylib/measure/_patterns.py")
    assert f"replaylib/measure/_patterns.py: {PATTERN_EDITS[pattern][2]} changed" in changes


COMPUTING = {  # an edit of what computes -> the stages stale for a reason of their own (a transformers run)
    "the transformers engine's sampling": (("NUCLEUS_CANDIDATES = 128", "NUCLEUS_CANDIDATES = 96"),
                                           {"01_sampling", "03_three_pass_replay", "05_batch_invariant"}),
    "the vLLM engine": (("for pid, prompt in prompts.items():", "for pid, prompt in list(prompts.items()):"), set()),
    "the replay kernel": (('sum(wins["actual"]) / len(wins["actual"])', 'sum(wins["actual"]) / max(1, len(wins["actual"]))'),
                          {"03_three_pass_replay", "05_batch_invariant"}),
    "the pivot rule": (("lps[0] - lps[1] >= params", "lps[0] - lps[1] > params"),
                       {"02_pivot_mining", "05_batch_invariant"}),
    "the screen": (("while len(screen.kept) < params.n_problems:", "while len(screen.kept) < params.n_problems + 0:"),
                   {"01_sampling"}),
    "which problems the invariant stage uses": (('["kept"][:params.invariant_problems]',
                                                 '["kept"][:params.invariant_problems + 0]'), {"05_batch_invariant"}),
    "the kept-trunk filter": (("return trunks[trunks.kept].reset_index(drop=True)",
                               "return trunks[trunks.kept == True].reset_index(drop=True)"),
                              {"02_pivot_mining", "03_three_pass_replay"}),
    "a pass-table row": (("PASSES = {p.name: p for p in (", 'PASSES = {p.name: p for p in (\n    Pass("exact3", '
                          '"the decode-time state, resumed", "exact", "replica", "exact3", replica_of="exact1"),'),
                         {"03_three_pass_replay", "04_statistics", "05_batch_invariant"}),
    "how a table is written": (("value.to_parquet(tmp, index=False)", "value.to_parquet(tmp, index=False, "
                                "compression='gzip')"), set(STAGES)),
    "a statistic": (("MARGIN_SPLIT = 0.3", "MARGIN_SPLIT = 0.25"), {"04_statistics"}),
}


@pytest.mark.parametrize("what", list(COMPUTING), ids=list(COMPUTING))
def test_an_edit_of_what_computes_makes_exactly_the_stages_that_ran_it_stale(case, what):
    (text, replacement), stale = COMPUTING[what]
    edit(case, text, replacement)
    assert set(own(would_run(case))) == stale


def test_a_compute_cell_is_part_of_its_stage(case):
    def head(cells):
        cell = next(c for c in cells if "compute" in c.metadata.get("tags", []))
        cell.source += "\nrecords = records.head(1)"
    edit_notebook(case, "03_three_pass_replay", head)
    assert own(would_run(case)) == {"03_three_pass_replay": "notebooks/03_three_pass_replay.ipynb (its compute cell) "
                                                            "changed"}


def test_a_layer_torch_calls_by_protocol_makes_the_stages_that_ran_it_stale(case):
    """Fp32AccumulateLinear.forward runs where the CPU lacks bf16 instructions (nn.Module calls it)."""
    from replaylib.measure.hf_linear import cpu_has_native_bf16
    forward = "replaylib.measure.hf_linear:Fp32AccumulateLinear.forward"
    ran = {s for s in STAGES if forward in recorded(case, s)["code"]}
    if not cpu_has_native_bf16():  # the batch-invariant engine computes each linear its own way
        assert {"01_sampling", "03_three_pass_replay"} <= ran
    else:
        assert ran == set()
    edit(case, "F.linear(x.float(), self.weight32, self.bias32)", "F.linear(x.float(), self.weight32 * 1.01, self.bias32)")
    stale = would_run(case)
    assert {s for s, why in stale.items() if "Fp32AccumulateLinear.forward changed" in why} == ran
    assert set(stale) == (set(STAGES) if ran else set())  # 02 and 04 read their outputs


def test_how_a_json_output_is_written_makes_every_stage_that_wrote_one_stale(case):
    wrote = {s for s in STAGES if "replaylib.core.files:atomic_write_json" in recorded(case, s)["code"]}
    assert {"01_sampling", "04_statistics", "05_batch_invariant"} <= wrote
    edit(case, "json.dumps(obj, indent=2, default=str)", "json.dumps(obj, indent=1, default=str)")
    stale = would_run(case)
    assert {s for s, why in stale.items() if "atomic_write_json changed" in why} == wrote


def test_how_a_stage_reads_its_inputs_makes_it_stale(case):
    edit(case, '"trunks": outputs.trunk_table(path),', '"trunks": outputs.trunk_table(path).head(3),',
         where="replaylib/stages/pivots.py")
    assert would_run(case)["02_pivot_mining"] == "replaylib/stages/pivots.py: inputs changed"
    edit(case, "return check_columns(pd.read_parquet(path), path, PIVOT_COLUMNS)",
         "return check_columns(pd.read_parquet(path), path, PIVOT_COLUMNS).head(1)")
    assert would_run(case)["03_three_pass_replay"] in ("replaylib/runtime/outputs.py: read_pivots changed",
                                                       "upstream reruns")
    assert "read_pivots changed" in " ".join(would_run(case).values())


def test_a_model_built_from_code_is_kept_only_while_that_code_is_as_it_was(case):
    """The tiny model's directory records what built it: an edit of that code makes the stages that loaded it
    stale, and the next stage to load it builds it again with the new code."""
    assert would_run(case) == {}
    edit(case, "embed_scale: float = 8.0", "embed_scale: float = 4.0")
    stale = would_run(case)
    assert set(stale) == set(STAGES)
    assert {s for s, why in stale.items() if "build_tiny_model changed" in why} == {
        "01_sampling", "03_three_pass_replay", "05_batch_invariant"}
    model = case / "code" / "models" / "tiny-seed0"
    weights = (model / "model.safetensors").read_bytes()
    subprocess.run([sys.executable, "-c", "from replaylib.measure.models import resolve_model; resolve_model('tiny:0')"],
                   cwd=case / "code", env=environment(case), check=True, capture_output=True, timeout=300)
    assert (model / "model.safetensors").read_bytes() != weights  # built again, by the new code
    built = json.loads((model / "built-by.json").read_text())["code"]
    sys.path.insert(0, str(case / "code"))
    assert built["replaylib.measure.models:build_tiny_model"] != recorded(case, "01_sampling")["code"][
        "replaylib.measure.models:build_tiny_model"]


def test_a_data_file_a_stage_read_makes_it_stale(tiny_finished, tmp_path):
    """The published records the statistics stage read (not in any stage key) are part of its record."""
    for name in ("replaylib", "notebooks", "params", "data"):
        copy_tree(REPO / name, tmp_path / "code" / name)
    (tmp_path / "code" / "models").mkdir()
    done = runner(tmp_path, params="params/paper.yaml")
    assert done.returncode == 0, done.stderr
    files = json.loads((tmp_path / "out" / "runs" / "paper" / "04_statistics" / "manifest.json").read_text())[
        "dependencies"]["files"]
    k8 = "data/paper-records/2026-06-11/k8.json"
    assert k8 in files
    assert would_run(tmp_path, "params/paper.yaml") == {}
    path = tmp_path / "code" / k8
    path.write_text(path.read_text().replace('"A_refeed": 0.5', '"A_refeed": 0.25', 3))
    assert would_run(tmp_path, "params/paper.yaml") == {"04_statistics": f"{k8} changed"}


# ---------------------------------------------------------------- what only reports, or only shows

def _kernel_display(root: Path) -> None:
    for text, replacement in [('progress=("trunks", "trunk"), count_rows=True', 'progress=("sampled trunks", "trunk")'),
                              ('progress=("pivots", "trunk")', 'progress=("pivot mining", "trunk")'),
                              ('preview=lambda parts: parts["records"], progress=("replay", "pivot-pass")',
                               'preview=lambda parts: parts["records"].head(5), progress=("passes", "pivot-pass")'),
                              ('preview=lambda parts: parts["records"], progress=("invariant", "trunk")',
                               'preview=lambda parts: parts["records"].head(2), progress=("invariant mode", "trunk")'),
                              ('preview=lambda parts: parts["tables"]["tab1_main"], progress=("statistics", "unit")',
                               'preview=lambda parts: parts["tables"]["tab2_jaccard"], progress=("stats", "unit")')]:
        edit(root, text, replacement)


def _annotations(root: Path) -> None:
    edit(root, "special_ids: list) -> dict:", "special_ids: list[int]) -> dict[str, object]:")
    edit(root, "gold: str) -> dict:", "gold: str) -> dict[str, object]:", where="replaylib/measure/replay.py")
    edit(root, "def statistics_unit(engine, params, records: dict | None) -> dict:",
         "def statistics_unit(engine, params, records: dict[str, str] | None) -> dict[str, object]:")


def _messages(root: Path) -> None:
    edit(root, '"invariant mode decodes one sequence at a time"', '"one sequence a step in invariant mode"')
    edit(root, 'print("patterns ran")', 'print("the patterns ran")')
    edit(root, '_log.info("patterns ran: %d", total)', '_log.info("the patterns ran: %d", total)')
    edit(root, 'f"the patterns added up to {total}"', 'f"they added up to {total}, not 0"')
    edit(root, '"the patterns must add up to 0"', '"a sum of 0 was expected"')
    edit(root, '"trunks (invariant)"', '"invariant trunks"')
    edit(root, "passes disagree in invariant mode", "the passes disagreed in invariant mode")
    edit(root, "no stage directories found", "holds no stage directory")
    edit(root, "vLLM engine stopped", "the vLLM engine has stopped")
    edit(root, "row of the replay records shown in the worked examples", "row of the replay records the worked "
                                                                          "examples show")
    edit(root, "[replaylib] %(message)s", "replaylib: %(message)s")
    edit(root, '    """Every pass over one', '    # how the passes run\n    """Every pass over one')


def _notebooks(root: Path) -> None:
    def comment(cells):
        cell = next(c for c in cells if "compute" in c.metadata.get("tags", []))
        cell.source = "# the whole stage, in one call\n" + cell.source

    def display(cells):
        for cell in cells:
            if cell.cell_type == "code" and "compute" not in cell.metadata.get("tags", []) and \
                    "parameters" not in cell.metadata.get("tags", []):
                cell.source += "\n# shown below"
    for stage in ("02_pivot_mining", "03_three_pass_replay", "04_statistics"):
        edit_notebook(root, stage, comment)
    for stage in STAGES:
        edit_notebook(root, stage, display)


def _run_layer(root: Path) -> None:
    edit(root, "def changed(self) -> list[str]:", "def changed(self) -> list[str]:  # shards whose bytes moved")
    edit(root, "    def changed(self) -> list[str]:", "    def changed(self):", where="replaylib/runtime/shards.py")


def test_edits_that_only_report_or_show_leave_every_stage_up_to_date(case):
    """A Kernel's progress label, row counting and preview; annotations; messages of asserts, errors, prints,
    loggers (``_log`` too) and the texts built for them; progress phases; help texts; the log format;
    comments and docstrings; comments in compute cells and any display cell; the run layer: all at once."""
    for change in (_kernel_display, _annotations, _messages, _notebooks, _run_layer):
        change(case)
    assert would_run(case) == {}


def test_the_same_kinds_of_edit_to_what_computes_make_those_stages_stale(case):
    """The counterpart of the test above: a Kernel's other fields, and the code beside those messages."""
    edit(case, 'preview=lambda parts: parts["records"], progress=("replay", "pivot-pass")',
         'preview=lambda parts: parts["records"], progress=("replay", "pivot-pass"), keep_shards=True')
    edit(case, "    if total:\n", "    if total > 0:\n")
    stale = would_run(case)
    assert stale["02_pivot_mining"] == "replaylib/measure/_patterns.py: run_all changed"
    assert stale["03_three_pass_replay"] == "replaylib/measure/replay.py: KERNEL changed"


CACHED = "def f():\n    return {}\n"
CACHED_RUN = """
import json
from replaylib.core import definitions, recording
from replaylib.measure import _cached
with recording.session() as here:
    value = _cached.f()
print(json.dumps([value, definitions.fact("replaylib.measure._cached", "f")[0], _cached.f.__code__.co_filename,
                  sorted(here.record()["code"])]))
definitions.save_cache()
"""


def test_the_caches_serve_only_what_a_file_holds_and_follow_a_copy(tmp_path):
    """The probed code and the definitions kept between processes (core.paths.cache_dir) are those of the
    file's content: an edit that keeps the file's size and time is neither run from the cache nor recorded
    from it, and a copy of the repository elsewhere runs its own file."""
    module = "replaylib/measure/_cached.py"
    copies = [tmp_path / "a", tmp_path / "b"]
    for copy in copies:
        shutil.copytree(REPO / "replaylib", copy / "replaylib", ignore=shutil.ignore_patterns("__pycache__"))
        (copy / module).write_text(CACHED.format(1))

    def ran(copy: Path) -> list:
        done = subprocess.run([sys.executable, "-c", CACHED_RUN], cwd=copy, capture_output=True, text=True,
                              env={**os.environ, "PYTHONPATH": str(copy), "REPLAYLIB_CACHE": str(tmp_path / "cache")})
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)

    value, digest, filename, recorded = ran(copies[0])
    assert (value, filename) == (1, str(copies[0] / module)) and "replaylib.measure._cached:f" in recorded
    path = copies[0] / module
    before = path.stat()
    path.write_text(CACHED.format(2))
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert path.stat().st_size == before.st_size and path.stat().st_mtime_ns == before.st_mtime_ns
    value, edited, filename, recorded = ran(copies[0])
    # the file's code runs and is recorded, not the cached one
    assert value == 2 and edited != digest and "replaylib.measure._cached:f" in recorded
    value, copied, filename, _ = ran(copies[1])
    assert (value, copied, filename) == (1, digest, str(copies[1] / module))


REACHABLE = """
import gc, importlib, json, pkgutil, sys, types
import replaylib
from replaylib.core import recording
from replaylib.measure import grading


def unreachable():
    gc.collect()
    reached = {id(f) for n, m in list(sys.modules.items()) if recording.recorded_module(n) and m is not None
               for f in recording._reachable(m)[0]}
    files = {getattr(m, "__file__", None) for n, m in list(sys.modules.items()) if recording.recorded_module(n)}
    return sorted(f.__qualname__ for f in gc.get_objects() if type(f) is types.FunctionType
                  and f.__code__.co_filename in files and id(f) not in reached)


for m in pkgutil.walk_packages(replaylib.__path__, "replaylib."):
    if recording.recorded_module(m.name):
        importlib.import_module(m.name)
before = unreachable()
held_elsewhere = [types.FunctionType(grading.grade.__code__, {})]  # as a hook another library keeps
print(json.dumps([before, unreachable()]))
"""


def test_every_function_a_recorded_module_made_is_found_from_its_namespace():
    """Functions made before recording began get their probes by being found from their module's namespace
    (recording._reachable), not by scanning every object: so every function of the recorded modules that exists
    once they are imported must be found that way (a function only another library holds, as a hook registered
    at import, would run unrecorded). The check finds such a function when there is one."""
    done = subprocess.run([sys.executable, "-c", REACHABLE], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    before, with_one_held_elsewhere = json.loads(done.stdout.splitlines()[-1])
    assert before == []
    assert with_one_held_elsewhere == ["grade"]


def test_a_definition_s_digest_does_not_depend_on_how_this_python_prints_code(monkeypatch):
    """Runs made under one Python (3.12 on a GPU machine) read as up to date under another (3.11 on a laptop):
    the digest is of the code's syntax tree, not of ast.unparse's text, which 3.12 prints otherwise for some
    f-strings (shard_path's nested quotes)."""
    from replaylib.core import definitions
    src = ("def shard_path(unit, part, value):\n"
           "    return f\"s/{unit.name}.p\" if part == 'r' else f\"s/{unit.name.replace('problem', part)}.p\"\n")
    before = definitions.canonical(definitions.normalised(ast.parse(src).body[0]))
    printed = ast.unparse
    monkeypatch.setattr(ast, "unparse", lambda node: printed(node).replace("'", '"'))  # another Python's quotes
    assert definitions.canonical(definitions.normalised(ast.parse(src).body[0])) == before
    assert "'problem'" in before and "Constant(value='r')" in before  # what it computes is all there
    other = src.replace("'problem'", "'problems'")
    assert definitions.canonical(definitions.normalised(ast.parse(other).body[0])) != before
    definitions._fact.cache_clear()  # a real definition's digest, as the recorder takes it, under both
    monkeypatch.setattr(definitions, "_disk", type("NoDisk", (), {"get": lambda *a: None, "put": lambda *a: None})())
    real = definitions.digest("replaylib.measure.replay:shard_path")
    monkeypatch.setattr(ast, "unparse", printed)
    definitions._fact.cache_clear()
    assert definitions.digest("replaylib.measure.replay:shard_path") == real
    definitions._fact.cache_clear()
