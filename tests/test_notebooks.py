"""Committed notebooks: no outputs, a parameters cell of plain literals matching the schema."""
import ast
import json
from pathlib import Path

import pytest

from replaylib.params import STAGES, Params, notebook_keys

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
    assert set(values) == {"out_dir", *notebook_keys(stage)}
    for name, value in values.items():
        if name != "out_dir":
            assert value == getattr(defaults, name), name


@pytest.mark.parametrize("stage", STAGES)
def test_papermill_sees_every_parameter(stage):
    import papermill
    declared = papermill.inspect_notebook(str(REPO / "notebooks" / f"{stage}.ipynb"))
    assert set(declared) == {"out_dir", *notebook_keys(stage)}


def test_notebooks_are_what_the_generator_writes():
    import nbformat
    import importlib.util
    spec = importlib.util.spec_from_file_location("make_notebooks", REPO / "tools" / "make_notebooks.py")
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    for stage in STAGES + ["06_campaign"]:
        committed = nbformat.read(str(REPO / "notebooks" / f"{stage}.ipynb"), as_version=4)
        fresh = gen.build(stage)
        assert [c.source for c in committed.cells] == [c.source for c in fresh.cells], \
            f"run `make notebooks` ({stage} is out of date)"


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
