"""One edit to tweak a parameter: a changed value in a notebook's parameters cell, papermill's -p or the runner's
--set runs into a run directory of its own named after what differs, copying the stages it shares; the
finished run is left byte for byte as it was."""
import hashlib
import json
import shutil
import subprocess
from pathlib import Path

import pytest

from replaylib.run import main, notebook_parameters
from replaylib.runtime import params
from replaylib.runtime.tweaks import own_name, tweaked_name

REPO = Path(__file__).resolve().parents[1]
TINY = REPO / "params" / "tiny.yaml"


def digests(run: Path) -> dict:
    """Every file of a run directory (not the stage locks, which a runner takes and leaves) and its sha256."""
    return {str(p.relative_to(run)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(run.rglob("*"))
            if p.is_file() and ".locks" not in p.parts}


@pytest.fixture
def root(tiny_finished, tmp_path):
    out = tmp_path / "root"
    shutil.copytree(tiny_finished, out)
    return out


def test_a_run_name_says_what_differs():
    assert tweaked_name("embedded", {"k": 2}) == "embedded-k2"
    assert tweaked_name("embedded", {"k": 8, "cont_temperature": 0.0}) == "embedded-k8-cont_temperature0.0"
    assert tweaked_name("e", {"passes": ["exact1", "exact2", "refeed", "serial"]}) == \
        "e-passesexact1+exact2+refeed+serial".replace("+", "_")
    long = tweaked_name("embedded", {"instruction": "Think hard. " * 20})
    assert len(long) <= 80 and long.startswith("embedded-instruction-") and params.check_name(long, "x")


def test_a_name_taken_by_other_values_is_never_reused_and_the_same_values_keep_theirs(root):
    """Two values that read alike in a run name (ü∂ƒ漢字 and _____) get two runs; a params file of that name with
    other values takes the name too; the same values find their own run again."""
    import dataclasses

    from replaylib.runtime.stagedir import ConfigStage
    tiny = params.load(TINY)
    first = dataclasses.replace(tiny, instruction="ü∂ƒ漢字")
    name, note = own_name("tiny", first, {"instruction": first.instruction}, root)
    assert name == "tiny-instruction_____" and note is None
    stage = root / "runs" / name / "01_sampling"
    stage.mkdir(parents=True)  # that run, finished
    (stage / "params.json").write_text(json.dumps(ConfigStage(dataclasses.replace(first, config=name),
                                                              "01_sampling").recorded()))
    assert own_name("tiny", first, {"instruction": first.instruction}, root) == (name, None)  # the same values
    second = dataclasses.replace(tiny, instruction="_____")
    other, note = own_name("tiny", second, {"instruction": second.instruction}, root)
    assert other.startswith("tiny-instruction_____-") and other != name and "with other values" in note
    assert own_name("tiny", second, {"instruction": second.instruction}, root)[0] == other  # stable
    k4 = dataclasses.replace(tiny, k=4)  # params/tiny-k4.yaml: campaign-tiny's, other values
    named, note = own_name("tiny", k4, {"k": 4}, root)
    assert named.startswith("tiny-k4-") and "params/tiny-k4.yaml holds run tiny-k4 with other values" in note


def test_notebook_03_with_only_k_changed_runs_into_a_run_of_its_own(root):
    """papermill -p k 1 on notebook 03, config left as it is, beside a finished run: the run lands in
    runs/tiny-k1/, its sampling and pivots copied, the preview's rows equal to the run's, and the finished
    run byte for byte unchanged."""
    import papermill
    tiny = params.load(TINY)
    before = digests(root / "runs" / "tiny")
    values = notebook_parameters(tiny, "03_three_pass_replay", root, preview=True)
    values.pop("upstream")  # as a person running the notebook: the upstream values come from params.json
    values["k"] = 1
    executed = root / "executed.ipynb"
    papermill.execute_notebook(str(REPO / "notebooks" / "03_three_pass_replay.ipynb"), str(executed),
                               parameters=values, cwd=str(REPO), kernel_name="python3", progress_bar=False)
    assert digests(root / "runs" / "tiny") == before
    stage = root / "runs" / "tiny-k1" / "03_three_pass_replay"
    assert (stage / "DONE").exists() and json.loads((stage / "params.json").read_text())["params"]["k"] == 1
    for shared in ("01_sampling", "02_pivot_mining"):
        manifest = json.loads((root / "runs" / "tiny-k1" / shared / "manifest.json").read_text())
        assert manifest["copied_from"] == f"runs/tiny/{shared}"
    text = executed.read_text()
    assert "this run goes to runs/tiny-k1/" in text


def test_the_runner_s_set_runs_into_a_run_of_its_own_copying_what_it_shares(root, capsys):
    before = digests(root / "runs" / "tiny")
    assert main([str(TINY), "03", "--set", "k=1", "--out", str(root), "--dry-run"]) == 0
    planned = capsys.readouterr().out
    assert "config tiny-k1, stage 01_sampling: would copy" in planned and "03_three_pass_replay: would run" in planned
    assert not (root / "runs" / "tiny-k1").exists()
    assert main([str(TINY), "03", "--set", "k=1", "--out", str(root)]) == 0
    assert digests(root / "runs" / "tiny") == before
    assert json.loads((root / "runs/tiny-k1/01_sampling/manifest.json").read_text())["copied_from"] == \
        "runs/tiny/01_sampling"
    assert (root / "runs/tiny-k1/03_three_pass_replay/DONE").exists()
    assert main([str(TINY), "--set", "k=1", "--out", str(root), "--dry-run", "--upto", "03"]) == 0
    assert "every stage is up to date" in capsys.readouterr().out


def test_a_set_that_is_not_a_value_is_one_line(root, capsys):
    assert main([str(TINY), "--set", "k", "--out", str(root)]) == 2
    assert main([str(TINY), "--set", "kk=2", "--out", str(root)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and "--set k: write KEY=VALUE" in err[0] and "unknown parameter 'kk'" in err[1]


def test_make_stage_passes_each_assignment_as_one_argument_never_through_the_shell(root):
    def stage(set_text):
        return subprocess.run(["make", "--no-print-directory", "stage", "STAGE=03", "CONFIG=tiny", f"SET={set_text}",
                               f"ARGS=--dry-run --out {root}"], cwd=REPO, capture_output=True, text=True, timeout=600)
    injected = stage("k=3;echo INJECTED")
    assert "INJECTED" not in injected.stdout and injected.returncode != 0
    assert "parameter 'k' must be int" in injected.stderr  # the whole text was k's value
    spaced = stage("instruction=two words k=2")
    assert spaced.returncode == 0 and "config tiny-instructiontwo_words" in spaced.stdout, spaced.stderr
    assert "no embedded model to fetch" in spaced.stderr  # tiny uses none


def test_the_commands_a_run_suggests_quote_their_values():
    import argparse

    from replaylib.run import assignments, command
    args = argparse.Namespace(params="params/tiny.yaml", set=["instruction=two words; rm x"], upto=["03"], out=None)
    assert command(args) == "python -m replaylib.run params/tiny.yaml --set 'instruction=two words; rm x' --upto 03"
    assert assignments(" k=2  instruction=two words max_cont_tokens=8") == ["k=2", "instruction=two words",
                                                                          "max_cont_tokens=8"]
