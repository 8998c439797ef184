"""Committed notebooks: no outputs, a parameters cell of plain literals matching the schema (a stage's
own keys; its upstream stages' values arrive in `upstream`). Everything else in them is the source,
edited in Jupyter."""
import ast
import json
import shutil
from pathlib import Path

import make_notebooks
import pytest

from replaylib.runtime.params import STAGES, Params, notebook_keys

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("stage", STAGES)
def test_notebook_has_no_outputs_and_a_parameters_cell(stage):
    nb = json.loads((REPO / "notebooks" / f"{stage}.ipynb").read_text())
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    assert all(not c.get("outputs") and c.get("execution_count") is None for c in code), "strip outputs"
    tagged = [c for c in code if "parameters" in c.get("metadata", {}).get("tags", [])]
    assert len(tagged) == 1
    tree = ast.parse("".join(tagged[0]["source"]))
    values = {}
    for node in tree.body:  # plain literal assignments only: the cell computes nothing
        assert isinstance(node, ast.Assign) and len(node.targets) == 1
        values[node.targets[0].id] = ast.literal_eval(node.value)
    defaults = Params()
    assert set(values) == {"out_dir", "upstream", "preview", *notebook_keys(stage)}
    assert values["upstream"] == {} and values["preview"] is True
    for name, value in values.items():
        if name not in ("out_dir", "upstream", "preview"):
            assert value == getattr(defaults, name), name


@pytest.mark.parametrize("stage", STAGES + ["06_campaign"])
def test_one_compute_cell_calls_the_stage_s_driver_and_nothing_else(stage):
    """The cell tagged compute is in the stage's code fingerprint (replaylib.runtime.fingerprint): it imports
    the stage's driver and calls it; what shows results is in other cells."""
    from replaylib.runtime.registry import stage as stage_entry
    nb = json.loads((REPO / "notebooks" / f"{stage}.ipynb").read_text())
    tagged = [c for c in nb["cells"] if "compute" in c.get("metadata", {}).get("tags", [])]
    assert len(tagged) == 1 and tagged[0]["cell_type"] == "code"
    body = ast.parse("".join(tagged[0]["source"])).body
    driver = stage_entry(stage).driver
    assert isinstance(body[0], ast.ImportFrom) and body[0].module == "replaylib.stages"
    assert [a.name for a in body[0].names] == [driver]
    assert len(body) == 2 and isinstance(body[1], ast.Assign) and isinstance(body[1].value, ast.Call)
    assert ast.unparse(body[1].value.func) == f"{driver}.run"


@pytest.mark.parametrize("stage", STAGES)
def test_papermill_sees_every_parameter(stage):
    import papermill
    declared = papermill.inspect_notebook(str(REPO / "notebooks" / f"{stage}.ipynb"))
    assert set(declared) == {"out_dir", "upstream", "preview", *notebook_keys(stage)}


def test_parameters_cells_are_what_the_schema_says():
    assert make_notebooks.main(["--check"]) == 0, "run `make notebooks`"


def test_the_tool_rewrites_only_the_parameters_cell(tmp_path, monkeypatch):
    """A notebook edited in Jupyter (prose, code) keeps every edit; only its parameters cell is rewritten."""
    import nbformat
    gen = make_notebooks
    (tmp_path / "notebooks").mkdir()
    for stage in STAGES + ["06_campaign"]:
        shutil.copy(REPO / "notebooks" / f"{stage}.ipynb", tmp_path / "notebooks")
    path = tmp_path / "notebooks" / "03_three_pass_replay.ipynb"
    nb = nbformat.read(str(path), as_version=4)
    nb.cells[0].source += "\n\nA note added in Jupyter."
    gen.parameters_cell(nb).source = "config = 'embedded'"
    nbformat.write(nb, str(path))
    monkeypatch.setattr(gen, "REPO", tmp_path)
    assert gen.main(["--check"]) == 1
    assert gen.main([]) == 0
    fixed = nbformat.read(str(path), as_version=4)
    assert fixed.cells[0].source.endswith("A note added in Jupyter.")
    assert gen.parameters_cell(fixed).source == gen.parameters_source("03_three_pass_replay")


def test_campaign_notebook_has_no_outputs_and_plain_parameters():
    import papermill
    path = REPO / "notebooks" / "06_campaign.ipynb"
    nb = json.loads(path.read_text())
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    assert all(not c.get("outputs") and c.get("execution_count") is None for c in code), "strip outputs"
    tagged = [c for c in code if "parameters" in c.get("metadata", {}).get("tags", [])]
    assert len(tagged) == 1
    values = {n.targets[0].id: ast.literal_eval(n.value) for n in ast.parse("".join(tagged[0]["source"])).body}
    assert values == {"campaign": "params/campaign-paper.yaml", "out_dir": ""}
    assert set(papermill.inspect_notebook(str(path))) == {"campaign", "out_dir"}


def test_the_credit_notebook_runs_headless_and_its_resume_is_stage_03_s_exact1(tmp_path):
    """notebooks/07_credit.ipynb: stage 01's trunks exported, credited with stage 03's settings, equal to its
    exact1 (the notebook asserts it), executed on the tiny model."""
    import papermill
    path = REPO / "notebooks" / "07_credit.ipynb"
    nb = json.loads(path.read_text())
    assert all(not c.get("outputs") and c.get("execution_count") is None for c in nb["cells"] if c["cell_type"] == "code")
    papermill.execute_notebook(str(path), str(tmp_path / "07.ipynb"), parameters={"out_dir": str(tmp_path)},
                               cwd=str(REPO), kernel_name="python3", progress_bar=False)
    assert (tmp_path / "credit" / "credit.parquet").exists()
