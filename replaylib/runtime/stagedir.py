"""Run directories: runs/<config>/<NN_stage>/ with params.json, manifest.json and DONE.

A stage opens its directory with `StageDir.begin`, which checks every upstream stage (finished, same
parameter key, files unchanged) and removes a stale DONE. Files are written to a temporary name and
renamed, and `finish` writes the manifest, then DONE.

Partial results (the shards of a stage's units) survive a crash and are reused only when they were made
from the same parameters and the same upstream files, and what each used is as it was: `begin` keeps a
resume key (the stage key, the sha256 of every upstream output read) in resume.json with the sha256 of every
shard written under it and its record of what it used (replaylib.runtime.shards), and clears the directory
when the key differs.

A finished stage's manifest holds the record of what it used (``dependencies``: the definitions of the
package that ran, wherever its units ran, the notebook's compute cells and the files read;
replaylib.core.recording): the stage is stale when any of them is no longer as recorded.

What defines a stage directory (its key, what it is made of, the stages it reads, how to rerun it,
whether a renamed configuration starts from another's stages) is its *definition*: a configuration's
stage (``ConfigStage``, here) or a campaign's statistics (replaylib.runtime.campaigns.CampaignStage).
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import time
from pathlib import Path

from ..core import definitions, recording
from ..core.files import atomic_write_bytes, atomic_write_json
from ..core.paths import DEFAULT_OUT, PARAMS, config_dir, notebook_path, out_root, stage_dir
from .locks import LOCK_TOKEN_ENV, StageLock
from .origin import origin
from .params import Params
from .provenance import changed_outputs, device_info, git_state, versions
from .registry import RUN_ORDER
from .registry import stage as stage_entry
from .shards import ShardStore
from .stage_copy import copy_stage, find_stage_elsewhere, remove_links

MIN_FREE_BYTES = 200 * 2**20
RESUME_FILE = "resume.json"
KEEP_SUFFIXES = (".ipynb", ".log")  # the runner's executed notebook and log, written while the stage runs
PARAMS_FILE_ENV = "REPLAYLIB_PARAMS_FILE"  # the runner's params file, for the commands errors suggest


class UpstreamError(RuntimeError):
    pass


def rerun_command(params: Params, stage: str, out_dir=None) -> str:
    """The command that reruns a stage of this configuration: its params file (the runner's, else
    params/<config>.yaml where it exists) and the output root when it is not the default."""
    src = os.environ.get(PARAMS_FILE_ENV)
    if not src:
        guess = PARAMS / f"{params.config}.yaml"
        src = f"params/{params.config}.yaml" if guess.exists() else "PARAMS.yaml (the file of this configuration)"
    out = "" if out_dir is None or Path(out_dir).resolve() == DEFAULT_OUT.resolve() else f" --out {out_dir}"
    return f"python -m replaylib.run {src} {stage}{out}"


def notebook_record(stage: str) -> dict:
    """The record of a stage notebook's compute cells (the call of its stage: part of what computes it)."""
    if not notebook_path(stage).is_file():
        return {}
    entry = definitions.NOTEBOOK + stage
    return {"code": {entry: definitions.digest(entry)}, "files": {}}


def resume_key_of(key: str, inputs: dict) -> str:
    """The key a stage's shards are kept under: its parameters' key and the upstream outputs it reads."""
    return hashlib.sha256(json.dumps({"key": key, "inputs": inputs}, sort_keys=True).encode()).hexdigest()[:16]


class ConfigStage:
    """A configuration's stage: its key is its parameters' (and its upstream stages' keys), its upstream
    stages are the configuration's own, a renamed configuration starts from the finished stages it shares
    with another, and a notebook never replaces a finished stage made with other parameters."""
    copies_upstream = True
    refuses_replacing = True

    def __init__(self, params: Params, stage: str, out_dir=None):
        stage_entry(stage)  # a registered stage
        self.params, self.stage, self.out_dir, self.config = params, stage, out_dir, params.config

    def key(self) -> str:
        return self.params.stage_key(self.stage)

    def notebook(self) -> dict:
        return notebook_record(self.stage)

    def upstreams(self) -> dict[str, "StageDir"]:
        """The stages whose outputs this one reads, by the name its manifest's inputs give them."""
        return {s: StageDir(self.params, s, self.out_dir) for s in self.params.data_upstream(self.stage)}

    def recorded(self) -> dict:
        """params.json: what the key is made of, and every value of the configuration it ran in (``values``: what
        a notebook naming this run takes for the values its cell leaves as they are)."""
        from .params import task_data_sha256
        return {"stage": self.stage, "key": self.key(), "config": self.config,
                "params": {k: getattr(self.params, k) for k in Params.keys_for(self.stage)},
                "data_sha256": {self.params.task: task_data_sha256(self.params.task)},
                "values": {k: v for k, v in self.params.to_dict().items() if k != "config"}}

    def changed_values(self, recorded: dict) -> dict:
        """The parameters whose value differs between a recorded params.json and these."""
        theirs = recorded.get("params", {})
        return {k: (theirs.get(k), getattr(self.params, k)) for k in Params.keys_for(self.stage)
                if k != "config" and theirs.get(k) != getattr(self.params, k)}

    def differences(self, recorded: dict) -> str:
        """What differs between a recorded params.json and these parameters, in words."""
        diff = [f"{k}: {a!r} there, {b!r} here" for k, (a, b) in self.changed_values(recorded).items()]
        if self._data_moved(recorded):
            diff.append("the task's data file changed since it ran")
        return "; ".join(diff) or "its key differs: made by another version of replaylib"

    def why_key_differs(self, recorded: dict) -> str:
        """Why a finished stage's recorded key is not this one's, in a few words."""
        return "the task's data file changed" if not self.changed_values(recorded) and self._data_moved(recorded) \
            else "parameters changed"

    def _data_moved(self, recorded: dict) -> bool:
        from .params import task_data_sha256
        return any(sha != task_data_sha256(task) for task, sha in recorded.get("data_sha256", {}).items())

    def rerun_command(self) -> str:
        return rerun_command(self.params, self.stage, self.out_dir)

    def uses_vllm(self) -> bool:
        """Whether its kernel may leave a vLLM engine core behind (the runner then looks for one)."""
        return self.params.engine == "vllm"

    def refusal(self, recorded: dict) -> str:
        """Why a notebook may not replace this finished stage made with other parameters, and how to keep
        both."""
        changed = self.changed_values(recorded)
        suffix = "".join(f"-{k}{b}" for k, (_, b) in list(changed.items())[:1]) or "-2"
        new_name = re.sub(r"[^A-Za-z0-9._-]", "_", f"{self.config}{suffix}")
        path = stage_dir(self.config, self.stage, self.out_dir)
        return (f"{path}: holds a finished {self.stage} made with other parameters ({self.differences(recorded)}); "
                f"to keep it, give this run its own name (config = '{new_name}' in the parameters cell, or -p config "
                f"{new_name} with papermill: the stages it shares are copied); to replace it, rerun it with the "
                f"runner: {self.rerun_command()}")

    def copy_missing_upstream(self) -> None:
        """A configuration run under a new name starts from the finished stages it shares with another
        configuration: each missing upstream stage is copied from the one holding it with the same key."""
        for stage in [s for s in RUN_ORDER if s in self.params.reading([self.stage]) and s != self.stage]:
            if (stage_dir(self.config, stage, self.out_dir) / "DONE").exists():
                continue
            src = find_stage_elsewhere(self.params, stage, self.out_dir, exclude=self.config)
            if src is not None:
                copy_stage(src, stage_dir(self.config, stage, self.out_dir), self.config, self.out_dir)
                print(f"[replaylib] config {self.config}: {stage} copied from {src} (same parameters)", flush=True)


class StageDir:
    """One stage's output directory: a configuration's stage (params, stage, out_dir), or any other
    definition (``definition=``: a campaign's statistics)."""

    def __init__(self, params: Params | None = None, stage: str | None = None, out_dir=None, *, definition=None):
        self.definition = d = definition or ConfigStage(params, stage, out_dir)
        self.params = getattr(d, "params", None)
        self.config, self.stage, self.out_dir = d.config, d.stage, d.out_dir
        self.root, self.path = config_dir(self.config, self.out_dir), stage_dir(self.config, self.stage, self.out_dir)
        self.lock = None
        self.key = d.key()
        self.inputs: dict[str, str] = {}
        self.started = time.time()
        self.resume_key: str | None = None
        self.shards: ShardStore | None = None

    def upstreams(self) -> dict[str, "StageDir"]:
        return self.definition.upstreams()

    def rerun_command(self) -> str:
        return self.definition.rerun_command()

    def uses_vllm(self) -> bool:
        return self.definition.uses_vllm()

    def differences(self, recorded: dict) -> str:
        return self.definition.differences(recorded)

    def upstream(self, stage: str) -> Path:
        return stage_dir(self.config, stage, self.out_dir)

    def resume_key_of(self, inputs: dict) -> str:
        return resume_key_of(self.key, inputs)

    def upstream_digests(self) -> dict:
        """The upstream outputs this stage would read, as check_upstream records them, without checking them:
        where a configuration's own upstream stage is not there yet (a renamed run a notebook previews before
        its run copies them), the finished stage of the same key elsewhere."""
        found = {}
        for name, up in self.upstreams().items():
            path = up.path
            if not (path / "DONE").exists() and up.params is not None:
                path = find_stage_elsewhere(up.params, up.stage, up.out_dir, exclude=up.config) or path
            try:
                outputs = json.loads((path / "manifest.json").read_text()).get("outputs", {})
            except (OSError, ValueError):
                outputs = {}
            found.update({f"{name}/{rel}": digest for rel, digest in outputs.items()})
        return found

    # -- reading other stages
    def check_upstream(self, name: str) -> Path:
        """Refuse an upstream stage that is unfinished, made with other parameters, or modified."""
        up = self.upstreams()[name]
        path, fix = up.path, up.rerun_command()
        if not (path / "DONE").exists():
            raise UpstreamError(f"{path}: stage not finished (no DONE); run it first: {fix}")
        recorded = json.loads((path / "params.json").read_text())
        if recorded.get("key") != up.key:
            raise UpstreamError(f"{path}: made with other parameters ({up.differences(recorded)}); "
                                f"rerun it: {fix}")
        outputs = json.loads((path / "manifest.json").read_text()).get("outputs", {})
        changed = changed_outputs(path, outputs)
        if changed:
            raise UpstreamError(f"{path / changed[0]}: changed or missing since the stage finished; rerun it: {fix}")
        self.inputs.update({f"{name}/{rel}": digest for rel, digest in outputs.items()})
        return path

    def changed_dependency(self, manifest: dict | None = None) -> str | None:
        """The first code or file this finished stage used that differs here (its manifest's dependencies), or
        None."""
        if manifest is None:
            manifest = json.loads((self.path / "manifest.json").read_text())
        changed = recording.changes(manifest.get("dependencies"), first_only=True)
        return changed[0] if changed else None

    def staleness(self, dependencies: bool = True) -> str | None:
        """Why the stage must run, or None when it is up to date: not finished, another key, other code,
        its outputs or products changed since it finished, or its upstream stages' outputs are not the
        ones it read. dependencies=False: the code and files it used left out (a run made on another
        machine, read as it is)."""
        if not (self.path / "DONE").exists():
            return "not run yet"
        try:
            recorded = json.loads((self.path / "params.json").read_text())
        except (OSError, json.JSONDecodeError):
            return "no readable params.json"
        if recorded.get("key") != self.key:
            return self.definition.why_key_differs(recorded)
        try:
            manifest = json.loads((self.path / "manifest.json").read_text())
        except (OSError, json.JSONDecodeError):
            return "no readable manifest"
        changed = self.changed_dependency(manifest) if dependencies else None
        if changed:
            return changed
        changed = changed_outputs(self.path, manifest.get("outputs", {}))
        if changed:
            return f"its output {changed[0]} changed or went missing since it finished"
        changed = changed_outputs(out_root(self.out_dir), manifest.get("products", {}))  # its tables and figures
        if changed:
            return f"its product {changed[0]} changed or went missing since it finished"
        for name, up in self.upstreams().items():
            try:
                outputs = json.loads((up.path / "manifest.json").read_text())["outputs"]
            except (OSError, json.JSONDecodeError, KeyError):
                return f"upstream {name} has no readable manifest"
            read = {k.removeprefix(f"{name}/"): v for k, v in manifest.get("inputs", {}).items()
                    if k.startswith(f"{name}/")}
            if read != outputs:
                return f"upstream {name} outputs changed since it ran"
        return None

    def _refuse_replacing(self) -> None:
        """A finished stage made with other parameters is replaced only by the runner (whose plan says
        so: its parameters changed, and which handed this process the stage's lock); a notebook or a direct
        papermill run with changed values stops and says how to keep both."""
        if not self.definition.refuses_replacing or self.lock.handed or not (self.path / "DONE").exists():
            return
        try:
            recorded = json.loads((self.path / "params.json").read_text())
        except (OSError, json.JSONDecodeError):
            return
        if recorded.get("key") != self.key:
            raise UpstreamError(self.definition.refusal(recorded))

    # -- writing this stage
    def begin(self) -> "StageDir":
        self.lock = StageLock(out_root(self.out_dir), self.config, self.stage).acquire(
            os.environ.get(LOCK_TOKEN_ENV), reentrant=True)
        try:
            self._refuse_replacing()
            self._begin()
        except BaseException:
            self.release()
            raise
        return self

    def release(self) -> None:
        if self.lock is not None:
            self.lock.release()

    def _begin(self) -> None:
        if self.definition.copies_upstream:
            self.definition.copy_missing_upstream()
        for name in self.upstreams():
            self.check_upstream(name)
        try:
            self.path.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise OSError(f"{self.path}: cannot create the run directory ({e.strerror or e}); fix the path "
                          f"or set REPLAYLIB_OUT") from None
        free = shutil.disk_usage(self.path).free
        if free < MIN_FREE_BYTES:
            raise OSError(f"{self.path}: only {free >> 20} MiB free on this disk; free space or set REPLAYLIB_OUT")
        probe = self.path / f".write-test-{os.getpid()}"
        try:
            probe.write_bytes(b"ok")
            probe.unlink()
        except OSError as e:
            raise OSError(f"{self.path}: run directory not writable ({e.strerror}); fix permissions "
                          f"or set REPLAYLIB_OUT") from None
        (self.path / "DONE").unlink(missing_ok=True)
        remove_links(self.path)  # the stage writes plain files: a link planted here is never written through
        for stale in self.path.rglob(".*.tmp"):  # half-written files of a killed run
            stale.unlink(missing_ok=True)
        self.resume_key = self.resume_key_of(self.inputs)
        self.shards = ShardStore(self.path, self.resume_key, RESUME_FILE)
        if not self.shards.fresh:
            # anything here was made from other parameters, inputs or code: never reuse it
            self.clear()
            self.shards.reset()
        atomic_write_json(self.path / "params.json", self.definition.recorded())

    def clear(self) -> None:
        """Remove every result in the stage directory (the executed notebook and logs stay). DONE goes
        first, so that a clear that stops midway never leaves a finished mark beside missing outputs; a
        symbolic link is removed, never followed."""
        try:
            (self.path / "DONE").unlink(missing_ok=True)
            for child in self.path.iterdir():
                if child.name.endswith(KEEP_SUFFIXES) and not child.is_symlink():
                    continue
                shutil.rmtree(child) if child.is_dir() and not child.is_symlink() else child.unlink()
        except OSError as e:
            where = e.filename or self.path
            raise OSError(e.errno, f"{where}: cannot remove it while clearing {self.path} ({e.strerror or e}); "
                                   f"remove it by hand and rerun") from None

    def file(self, rel: str) -> Path:
        p = self.path / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        return p

    def finish(self, outputs: list[str], extra: dict | None = None) -> dict:
        from ..core.files import sha256_file
        manifest = {
            "stage": self.stage, "config": self.config, "key": self.key,
            "git": git_state(), "versions": versions(), "device": device_info(),
            "started": time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(self.started)),
            "elapsed_s": round(time.time() - self.started, 1),
            "inputs": self.inputs,
            "outputs": {rel: sha256_file(self.path / rel) for rel in sorted(outputs)},
            **(extra or {}),
        }
        manifest["origin"] = origin(manifest)
        atomic_write_json(self.path / "manifest.json", manifest)
        atomic_write_bytes(self.path / "DONE", (time.strftime("%Y-%m-%dT%H:%M:%S") + "\n").encode())
        self.release()
        return manifest
