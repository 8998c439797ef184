"""Keep each notebook's parameters cell in step with the schema: notebooks/*.ipynb are the source
(edit them in Jupyter and commit them, outputs cleared); this tool rewrites only the cell tagged
`parameters` of each stage notebook from replaylib.runtime.params, so a new parameter reaches its notebook
with `make notebooks`. `--check` changes nothing and exits 1 naming the notebooks out of date.

    python tools/make_notebooks.py [--check]
"""
from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import nbformat

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from replaylib.runtime.params import EXECUTOR_KEYS, Params, own_keys
from replaylib.runtime.registry import CAMPAIGN, EXECUTOR_STAGES, STAGES


def parameters_source(stage: str) -> str:
    """The parameters cell of a stage notebook: plain literals (papermill parses one '=' a line), the
    defaults, each with its meaning, the ones that apply only to Ray or to vLLM under a header saying so;
    the upstream stages' values arrive in `upstream`."""
    fields = {f.name: f for f in dataclasses.fields(Params)}
    defaults = Params()

    def line(k):
        return f"{k} = {getattr(defaults, k)!r}  # {fields[k].metadata['doc']}"

    def only(keys, start):  # the keys whose meaning starts with `start`: they apply to one engine or executor
        return [k for k in keys if fields[k].metadata["doc"].startswith(start)]

    lines = ["# Parameters (plain literals): a value left as it is comes from the configuration `config` names "
             "(its params file,",
             "# or its finished run); a value changed here is a tweak: the run goes to a run directory named after "
             "what differs.",
             line("config"),
             'out_dir = ""  # root of runs/, figures/ and tables/ (empty: the repository)',
             "upstream = {}  # the upstream stages' values (the runner passes them; empty: the configuration's)",
             "preview = True  # run the first unit on its own before the stage, to look at it (it writes nothing "
             "kept; the runner passes False unless given --preview)"]
    if stage in EXECUTOR_STAGES:  # where the engines run: in no stage key (replaylib/runtime/executor.py)
        ray = only(EXECUTOR_KEYS, "ray:")
        lines.append("# where the engines run (in no stage's key)")
        lines += [line(k) for k in EXECUTOR_KEYS if k not in ray]
        lines.append("# Ray only (executor = 'ray'): its engines")
        lines += [line(k) for k in ray]
    vllm = only(own_keys(stage), "vLLM")
    lines.append(f"# this stage's own parameters ({stage})")
    lines += [line(k) for k in own_keys(stage) if k not in vllm]
    if vllm:
        lines.append("# vLLM only (engine = 'vllm'): its memory, context, kernels and serving mode")
        lines += [line(k) for k in vllm]
    lines.append("# display (in no stage's key: changing it reruns nothing)")
    lines += [line(k) for k in Params.display_keys()]
    assert all(x.count("=") <= 1 for x in lines if not x.startswith("#")), "papermill parses one '=' a line"
    return "\n".join(lines)


CAMPAIGN_PARAMETERS = ("# Parameters: plain literals. `python -m replaylib.campaign CAMPAIGN.yaml` or papermill -p overrides them.\n"
                       "campaign = 'params/campaign-paper.yaml'  # the campaign file (its paths resolve from the "
                       "repository root)\n"
                       'out_dir = ""  # root of runs/, figures/ and tables/ (empty: the repository)')


def wanted(stage: str) -> str:
    return CAMPAIGN_PARAMETERS if stage == CAMPAIGN.name else parameters_source(stage)


def parameters_cell(nb):
    tagged = [c for c in nb.cells if c.cell_type == "code" and "parameters" in c.metadata.get("tags", [])]
    if len(tagged) != 1:
        raise SystemExit(f"a notebook needs exactly one cell tagged 'parameters' (found {len(tagged)})")
    return tagged[0]


def main(argv) -> int:
    check, stale = "--check" in argv, []
    for stage in STAGES + [CAMPAIGN.name]:
        path = REPO / "notebooks" / f"{stage}.ipynb"
        nb = nbformat.read(str(path), as_version=4)
        cell = parameters_cell(nb)
        if cell.source == wanted(stage):
            continue
        stale.append(str(path.relative_to(REPO)))
        if not check:
            cell.source = wanted(stage)
            nbformat.write(nb, str(path))
            print("updated the parameters cell of", path.relative_to(REPO))
    if check and stale:
        print("parameters cells out of date (run `make notebooks`): " + ", ".join(stale))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
