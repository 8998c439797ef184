"""A run of its own for changed values: change one value (a notebook's parameters cell, papermill's ``-p k 2``,
the runner's ``--set k=2``) and the run goes to a run directory named after what differs from the
configuration (runs/embedded-k2/), so a finished run is never replaced; the stages it shares with the finished
run are copied there (runtime.stagedir.ConfigStage.copy_missing_upstream).

A notebook runs the configuration its ``config`` names: every value its parameters cell leaves as the cell
has it comes from that configuration (its params file, else its finished run's params.json); a value changed
in the cell or given to papermill is a change, and the notebook says so. A name already taken by a run (or a
params file) of other values is never reused: the new run's name gets a short digest of its values."""
from __future__ import annotations

import ast
import hashlib
import json
import os
import re

from ..core.paths import PARAMS, config_dir, notebook_path
from ..core.progress import RUNNER_ENV
from .params import Params, from_notebook, load, make, notebook_keys
from .registry import RUN_ORDER, STAGES

MAX_NAME = 80
PAPERMILL_CELL = "# Parameters\n"  # how papermill's injected cell starts (its Python translator's comment)


def _value(v) -> str:
    if isinstance(v, list):
        return "+".join(str(x) for x in v)
    return str(v)


def tweaked_name(config: str, changed: dict) -> str:
    """The run name for a configuration with these values changed: config-<key><value>..., in the letters a
    run name takes; a digest of the values where that grows long."""
    name = re.sub(r"[^A-Za-z0-9._-]", "_", "-".join([config, *(f"{k}{_value(v)}" for k, v in changed.items())]))
    if len(name) <= MAX_NAME:
        return name
    digest = hashlib.sha256(json.dumps(changed, sort_keys=True, default=str).encode()).hexdigest()[:8]
    return f"{config}-{'-'.join(changed)[:MAX_NAME - len(config) - 10]}-{digest}".rstrip("-")


def computing_values(params: Params) -> dict:
    """The values that decide what some stage computes (not where it runs, nor the name, nor displays)."""
    keys = {k for stage in STAGES for k in Params.keys_for(stage)} - {"config"}
    return {k: getattr(params, k) for k in sorted(keys)}


def taken_by_others(name: str, params: Params, out_dir=None) -> str | None:
    """What holds this run name with other values (a params file, a stage of that run), or None."""
    file = PARAMS / f"{name}.yaml"
    if file.is_file():
        try:
            if computing_values(load(file)) != computing_values(params):
                return f"params/{file.name}"
        except (OSError, ValueError):
            return f"params/{file.name}"
    for path in sorted(config_dir(name, out_dir).glob("*/params.json")):
        try:
            recorded = json.loads(path.read_text())["params"]
        except (OSError, ValueError, KeyError, TypeError):
            return str(path.parent)
        if any(k != "config" and k in Params.names() and v != getattr(params, k) for k, v in recorded.items()):
            return str(path.parent)
    return None


def own_name(config: str, params: Params, changed: dict, out_dir=None) -> tuple[str, str | None]:
    """The run name for these values (``changed``: what differs from configuration ``config``): the name that says
    what differs, or, where that name holds a run of other values, the same with a digest of these values;
    (name, a note saying so or None)."""
    name = tweaked_name(config, changed)
    holder = taken_by_others(name, params, out_dir)
    if holder is None:
        return name, None
    digest = hashlib.sha256(json.dumps(computing_values(params), sort_keys=True, default=str).encode()).hexdigest()[:6]
    unique = f"{name[:MAX_NAME - 7]}-{digest}"
    return unique, f"[replaylib] {holder} holds run {name} with other values: this run is {unique}"


def configuration(config: str, out_dir=None) -> tuple[Params, str]:
    """The values of the configuration a name stands for, and where they come from: its params file, else the
    run of that name (the params.json of its latest stage), else the defaults."""
    file = PARAMS / f"{config}.yaml"
    if file.is_file():
        return load(file), f"params/{file.name}"
    for stage in reversed(RUN_ORDER):
        path = config_dir(config, out_dir) / stage / "params.json"
        try:
            values = json.loads(path.read_text())["values"]
        except (OSError, ValueError, KeyError, TypeError):
            continue
        return make({**values, "config": config}, where=str(path)), f"the run in {path.parent.parent}/"
    return Params(config=config), "the defaults (no params file or run of that name)"


def cell_literals(stage: str) -> dict:
    """The values a stage notebook's parameters cell holds as committed."""
    cells = json.loads(notebook_path(stage).read_text(encoding="utf-8"))["cells"]
    cell = next(c for c in cells if "parameters" in c.get("metadata", {}).get("tags", []))
    return _assignments("".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"])


def _assignments(source: str) -> dict:
    found = {}
    for node in ast.parse(source).body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            try:
                found[node.targets[0].id] = ast.literal_eval(node.value)
            except ValueError:
                continue
    return found


def injected(namespace: dict) -> set[str]:
    """The names papermill's injected cell set (IPython's input history holds it), even to a cell's own value."""
    history = namespace.get("In") or namespace.get("_ih") or []
    cells = [src for src in history if isinstance(src, str) and src.startswith(PAPERMILL_CELL)]
    return set(_assignments(cells[-1])) if cells else set()


def notebook_params(namespace: dict, stage: str) -> Params:
    """A stage notebook's parameters. Under the runner, as it passes them (params.from_notebook). Otherwise the
    configuration ``config`` names, with what the parameters cell or papermill changes; values that differ from
    the configuration get a run of their own (``own_name``), and the notebook says where."""
    if os.environ.get(RUNNER_ENV):
        return from_notebook(namespace, stage)
    out_dir = namespace.get("out_dir") or None
    config = namespace.get("config") or "embedded"
    make({"config": config}, where=f"notebook {stage}")  # a name that is not one: one line
    base, source = configuration(config, out_dir)
    literals, given = cell_literals(stage), injected(namespace)
    changed = {k: namespace[k] for k in notebook_keys(stage)
               if k in namespace and k != "config" and (k in given or namespace[k] != literals.get(k, namespace[k]))}
    changed.update(namespace.get("upstream") or {})
    params = make({**base.to_dict(), **changed, "config": config}, where=f"notebook {stage}")
    differing = {k: getattr(params, k) for k in Params.keys_for(stage)
                 if k != "config" and getattr(params, k) != getattr(base, k)}
    print(f"[replaylib] config {config}: the values of {source}"
          + (f"; changed here: {', '.join(f'{k} = {v!r}' for k, v in differing.items())}" if differing else ""),
          flush=True)
    if not differing:
        return params
    name, taken = own_name(config, params, differing, out_dir)
    if taken:
        print(taken, flush=True)
    print(f"[replaylib] this run goes to runs/{name}/ (the stages it shares are copied from runs/{config}/; "
          f"continue it in the next notebooks with config = '{name}')", flush=True)
    return Params(**{**params.to_dict(), "config": name})
