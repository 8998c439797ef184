"""What the stage notebooks show, executed as the runner executes them (replaylib.runtime.notebook) on a copy of a
finished tiny run: every display renders, a figure drawn for display rewrites no file whose bytes are the same,
the claims are shown in full, progress bars warn of nothing, and a finished notebook's kernel stops quietly."""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pandas as pd
import pytest

from replaylib.core import progress
from replaylib.run import notebook_parameters
from replaylib.runtime import params
from replaylib.runtime.notebook import execute_notebook

REPO = Path(__file__).resolve().parents[1]
TINY = REPO / "params" / "tiny.yaml"


@pytest.fixture
def root(tiny_finished, tmp_path):
    shutil.copytree(tiny_finished, tmp_path / "root")
    return tmp_path / "root"


def execute(stage: str, root: Path, output: Path) -> dict:
    """A stage notebook executed with the runner's parameters (and its preview): cell id -> outputs."""
    values = notebook_parameters(params.load(TINY), stage, root, preview=True)
    execute_notebook(REPO / "notebooks" / f"{stage}.ipynb", output, values)
    return {c["id"]: c.get("outputs", []) for c in json.loads(output.read_text())["cells"]}


def shown(outputs: list, kind: str) -> str:
    return "".join("".join(o.get("data", {}).get(kind, "")) for o in outputs)


def test_notebook_02_shows_its_margin_histogram_and_rewrites_no_unchanged_figure_file(root, tmp_path):
    figures = [root / "figures" / "tiny" / f"figS1_margins.{e}" for e in ("pdf", "png", "csv")]
    cells = execute("02_pivot_mining", root, tmp_path / "first.ipynb")
    drawn = [c for c, outs in cells.items() if shown(outs, "image/png")]
    assert len(drawn) == 1 and "<Figure" not in shown(cells[drawn[0]], "text/plain")
    before = {f: (f.read_bytes(), f.stat().st_mtime_ns) for f in figures}
    cells = execute("02_pivot_mining", root, tmp_path / "second.ipynb")
    assert shown(cells[drawn[0]], "image/png")
    assert {f: (f.read_bytes(), f.stat().st_mtime_ns) for f in figures} == before
    closing = shown(cells["02-next"], "text/markdown")
    assert f"`{root}/runs/tiny/02_pivot_mining/`" in closing and "config = 'tiny'" in closing


def test_notebook_04_shows_every_claim_in_full_and_where_its_products_are(root, tmp_path):
    cells = execute("04_statistics", root, tmp_path / "04.ipynb")
    claims = pd.read_csv(root / "tables" / "tiny" / "tab21_claims.csv", dtype=str, keep_default_na=False)
    sentences = [s for s in claims.to_numpy().ravel() if len(s) > 80]
    assert sentences, "no claim cell longer than the set-up cell's display.max_colwidth: nothing is tested"
    page = "".join(shown(outs, "text/html") for outs in cells.values())
    assert all(s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;") in page for s in sentences)
    closing = shown(cells["04-next"], "text/markdown")
    assert f"`{root}/tables/tiny/`" in closing and "last stage" in closing


def test_a_kernel_without_ipywidgets_gets_text_bars_and_no_warning():
    """In a Jupyter kernel without ipywidgets, tqdm.auto warns "IProgress not found" when first imported (ours,
    or transformers' bars in a preview): the stage's bar is the text bar, and no import of tqdm.auto warns."""
    script = """
import sys, types, warnings
warnings.simplefilter("always")
sys.modules["ipywidgets"] = None  # not importable
sys.modules["ipykernel.zmqshell"] = types.ModuleType("ipykernel.zmqshell")  # how tqdm.autonotebook knows a kernel
sys.modules["IPython"] = types.SimpleNamespace(get_ipython=lambda: types.SimpleNamespace())
with warnings.catch_warnings(record=True) as caught:
    from replaylib.core import progress
    bar = progress.Bar(None, "replay", 3, "pivot-pass")
    from tqdm.auto import tqdm
print(json.dumps([type(bar.tqdm).__module__, tqdm.__module__, [str(w.message) for w in caught]]))
"""
    env = {k: v for k, v in os.environ.items() if k != progress.RUNNER_ENV}  # a notebook's own bar, not the runner's
    proc = subprocess.run([sys.executable, "-c", "import json" + script], cwd=REPO, capture_output=True, text=True,
                          env={**env, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 0, proc.stderr
    ours, theirs, warned = json.loads(proc.stdout)
    assert "notebook" not in ours and "notebook" not in theirs and warned == [], proc.stdout


SLOW_LAST_REPLY = """import time
kernel = get_ipython().kernel
reply = kernel.shell_handlers["kernel_info_request"]
async def slow(*args):  # the kernel's main thread held up right after a kernel_info reply, as on a busy machine
    await reply(*args)
    time.sleep(1)
kernel.shell_handlers["kernel_info_request"] = slow"""


def test_a_finished_notebook_s_kernel_stops_without_a_keyboard_interrupt(tmp_path, capfd):
    """Papermill shuts the kernel down on the reply to its last kernel_info request; jupyter_client sends it
    SIGINT first, which lands in that request where the kernel has not finished it yet."""
    nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(SLOW_LAST_REPLY)]),
                   str(tmp_path / "slow.ipynb"))
    execute_notebook(tmp_path / "slow.ipynb", tmp_path / "done.ipynb", {})
    assert (tmp_path / "done.ipynb").exists()
    assert "KeyboardInterrupt" not in capfd.readouterr().err


def test_token_pieces_read_without_transformers_are_transformers_pieces(tiny_finished):
    """Notebook 02 shows token pieces from the model's tokenizer.json (the tokenizers library, no transformers
    import): every id reads as transformers' tokenizer decodes it, special tokens included."""
    from replaylib.display import worked_examples
    model = params.load(TINY).model
    assert worked_examples._tokenizer_file(worked_examples._local_model_dir(model)) is not None
    full = worked_examples.tokenizer(model)
    ids = list(range(len(full)))
    assert worked_examples.token_pieces(model)(ids) == [full.decode([i]) for i in ids]
    pieces = subprocess.run([sys.executable, "-c", "import sys; from replaylib.display import worked_examples as w; "
                             f"w.token_pieces({model!r})([1]); print('transformers' in sys.modules)"],
                            cwd=REPO, capture_output=True, text=True, check=True)
    assert pieces.stdout.strip() == "False"


def test_recording_where_a_stage_ran_imports_no_torch():
    """A stage that computes nothing with torch (02, 04) does not import it to write its manifest's device
    record; a process that has torch records its thread count."""
    check = ("import sys; from replaylib.runtime.provenance import device_info; info = device_info(); "
             "print('torch' in sys.modules, 'torch_threads' in info); import torch; "
             "print('torch_threads' in device_info())")
    out = subprocess.run([sys.executable, "-c", check], cwd=REPO, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False", "True"]


def test_notebook_04_shows_the_lease_tables_a_checkout_has_and_skips_the_others(tmp_path, monkeypatch):
    """A checkout holding only part of docs/gpu-h200/lease11/products (the folder, one of its tables) renders."""
    import replaylib.core.paths as paths
    cell = next(c for c in nbformat.read(REPO / "notebooks" / "04_statistics.ipynb", as_version=4).cells
                if c.get("id") == "04-20")
    products = tmp_path / "repo" / "docs" / "gpu-h200" / "lease11" / "products"
    products.mkdir(parents=True)
    (products / "tab1_main.md").write_text("| a |\n")
    monkeypatch.setattr(paths, "REPO", tmp_path / "repo")
    displayed = []
    exec(cell.source, {"TABLES": tmp_path / "tables", "FIGURES": tmp_path / "figures", "display": displayed.append,
                       "Markdown": str, "Image": dict})
    assert displayed == ["**H200, lease 11: tab1_main**\n\n| a |\n"]
