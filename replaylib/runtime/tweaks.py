"""A run of its own for changed values: change one value (a notebook's parameters cell, papermill's ``-p k 2``,
the runner's ``--set k=2``) and the run goes to a run directory named after what differs (runs/embedded-k2/),
so a finished run is never replaced; the stages it shares with the finished run are copied there
(runtime.stagedir.ConfigStage.copy_missing_upstream)."""
from __future__ import annotations

import hashlib
import json
import re

from ..core.paths import PARAMS, stage_dir
from ..core.progress import RUNNER_ENV
from .params import Params, from_notebook, load

MAX_NAME = 80


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


def reference(params: Params, stage: str, out_dir=None) -> tuple[dict | None, str]:
    """What these values are compared with: the configuration's finished stage (its params.json), else its
    params file (params/<config>.yaml); (values or None, where they come from)."""
    path = stage_dir(params.config, stage, out_dir)
    if (path / "DONE").exists():
        try:
            recorded = json.loads((path / "params.json").read_text())
            return {**recorded["params"], "__key__": recorded["key"]}, f"the finished run in {path}/"
        except (OSError, ValueError, KeyError):
            return None, ""
    file = PARAMS / f"{params.config}.yaml"
    if file.is_file():
        try:
            return load(file).to_dict(), f"params/{file.name}"
        except (OSError, ValueError):
            return None, ""
    return None, ""


def own_run(params: Params, stage: str, out_dir=None) -> tuple[Params, str | None]:
    """These parameters under a run name of their own when they differ from the configuration's finished stage
    (or params file) in what the stage computes; (params, a note saying where the run goes, or None)."""
    values, source = reference(params, stage, out_dir)
    if values is None:
        return params, None
    keys = [k for k in Params.keys_for(stage) if k != "config"]
    changed = {k: getattr(params, k) for k in keys if k in values and values[k] != getattr(params, k)}
    same_key = values.get("__key__") == params.stage_key(stage)
    if same_key or (not changed and "__key__" not in values):
        return params, None
    name = tweaked_name(params.config, changed) if changed else f"{params.config}-{params.stage_key(stage)[:6]}"
    theirs = stage_dir(name, stage, out_dir)
    if (theirs / "DONE").exists():  # a run of that name already made with other values
        try:
            if json.loads((theirs / "params.json").read_text()).get("key") != params.stage_key(stage):
                name = f"{name}-{params.stage_key(stage)[:6]}"
        except (OSError, ValueError):
            name = f"{name}-{params.stage_key(stage)[:6]}"
    what = ", ".join(f"{k} = {v!r} ({values[k]!r} there)" for k, v in changed.items()) or "its inputs"
    note = (f"[replaylib] {what} differs from {source}: this run goes to runs/{name}/ (the stages it shares are "
            f"copied from runs/{params.config}/; continue it in the next notebooks with config = '{name}')")
    return Params(**{**params.to_dict(), "config": name}), note


def notebook_params(namespace: dict, stage: str) -> Params:
    """A stage notebook's parameters (params.from_notebook: its parameters cell and its upstream stages'
    values); outside the runner, which names its runs itself, values that differ from the configuration's
    finished stage (or params file) get a run of their own, and the notebook says where."""
    import os
    params = from_notebook(namespace, stage)
    if os.environ.get(RUNNER_ENV):
        return params
    params, note = own_run(params, stage, namespace.get("out_dir") or None)
    if note:
        print(note, flush=True)
    return params
