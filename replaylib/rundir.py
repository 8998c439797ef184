"""Run directories: runs/<config>/<NN_stage>/ with params.json, manifest.json and DONE.

A stage opens its directory with `StageDir.begin`, which checks every upstream stage
(finished, same parameter key, files unchanged) and removes a stale DONE. Files are
written to a temporary name and renamed, and `finish` writes the manifest, then DONE.
"""
from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from importlib import metadata
from pathlib import Path

from .data import sha256_file  # noqa: F401  (re-exported: stats and tests use rundir.sha256_file)
from .params import STAGES, Params

REPO = Path(__file__).resolve().parents[1]
DEFAULT_OUT = Path(os.environ.get("REPLAYLIB_OUT", REPO))
MIN_FREE_BYTES = 200 * 2**20


def out_root(out_dir: str | Path | None = None) -> Path:
    return Path(out_dir) if out_dir else DEFAULT_OUT


def figures_dir(config: str, out_dir=None) -> Path:
    return out_root(out_dir) / "figures" / config


def tables_dir(config: str, out_dir=None) -> Path:
    return out_root(out_dir) / "tables" / config


def atomic_write_bytes(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_json(path: Path, obj) -> None:
    atomic_write_bytes(path, (json.dumps(obj, indent=2, default=str) + "\n").encode())


def atomic_save(path: Path, writer) -> None:
    """Call writer(tmp_path) (e.g. DataFrame.to_parquet) and rename the result into place."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        writer(tmp)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def git_state() -> dict:
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True,
                                timeout=10).stdout.strip()
        dirty = bool(subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO,
                                    capture_output=True, text=True, timeout=10).stdout.strip())
        return {"commit": commit or None, "dirty": dirty}
    except (OSError, subprocess.SubprocessError):
        return {"commit": None, "dirty": None}


def versions() -> dict:
    out = {"python": sys.version.split()[0]}
    for pkg in ["replaylib", "torch", "transformers", "vllm", "numpy", "pandas", "safetensors"]:
        try:
            out[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            pass
    return out


def device_info() -> dict:
    info = {"platform": platform.platform(), "processor": platform.processor() or platform.machine(),
            "cpus": os.cpu_count()}
    try:
        import torch
        info["torch_threads"] = torch.get_num_threads()
        if torch.cuda.is_available():
            info["cuda_device"] = torch.cuda.get_device_name(0)
    except ImportError:
        pass
    return info


class UpstreamError(RuntimeError):
    pass


class StageDir:
    """One stage's output directory for one configuration."""

    def __init__(self, params: Params, stage: str, out_dir=None):
        assert stage in STAGES, stage
        self.params, self.stage = params, stage
        self.root = out_root(out_dir) / "runs" / params.config
        self.path = self.root / stage
        self.key = params.stage_key(stage)
        self.inputs: dict[str, str] = {}
        self.started = time.time()

    # -- reading other stages
    def upstream(self, stage: str) -> Path:
        return self.root / stage

    def check_upstream(self, stage: str) -> Path:
        """Refuse an upstream stage that is unfinished, made with other parameters, or modified."""
        path = self.upstream(stage)
        fix = f"python -m replaylib.run params/{self.params.config}.yaml {stage}"
        if not (path / "DONE").exists():
            raise UpstreamError(f"{path}: stage not finished (no DONE); run it first: {fix}")
        recorded = json.loads((path / "params.json").read_text())
        want = self.params.stage_key(stage)
        if recorded.get("key") != want:
            mine = {k: getattr(self.params, k) for k in Params.keys_for(stage) if k != "config"}
            theirs = recorded.get("params", {})
            diff = [f"{k}: {theirs.get(k)!r} there, {v!r} here" for k, v in mine.items() if theirs.get(k) != v]
            raise UpstreamError(f"{path}: made with other parameters ({'; '.join(diff) or 'upstream key differs'}); "
                                f"rerun it: {fix}")
        manifest = json.loads((path / "manifest.json").read_text())
        for rel, digest in manifest.get("outputs", {}).items():
            f = path / rel
            if not f.exists() or sha256_file(f) != digest:
                raise UpstreamError(f"{f}: changed or missing since the stage finished; rerun it: {fix}")
            self.inputs[f"{stage}/{rel}"] = digest
        return path

    # -- writing this stage
    def begin(self) -> "StageDir":
        for stage in self.params.data_upstream(self.stage):
            self.check_upstream(stage)
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
        for stale in self.path.rglob(".*.tmp"):  # half-written files of a killed run
            stale.unlink(missing_ok=True)
        recorded = self.path / "params.json"
        if recorded.exists() and json.loads(recorded.read_text()).get("key") != self.key:
            # results of other parameters must not be mixed with these (per-problem shards)
            for child in self.path.iterdir():
                if child.name.endswith(".ipynb") or child.name == "run.log":  # the runner writes both
                    continue
                shutil.rmtree(child) if child.is_dir() else child.unlink()
        atomic_write_json(recorded, {"stage": self.stage, "key": self.key,
                                     "params": {k: getattr(self.params, k) for k in Params.keys_for(self.stage)},
                                     "config": self.params.config})
        return self

    def file(self, rel: str) -> Path:
        p = self.path / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        return p

    def finish(self, outputs: list[str], extra: dict | None = None) -> dict:
        manifest = {
            "stage": self.stage, "config": self.params.config, "key": self.key,
            "git": git_state(), "versions": versions(), "device": device_info(),
            "started": time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(self.started)),
            "elapsed_s": round(time.time() - self.started, 1),
            "inputs": self.inputs,
            "outputs": {rel: sha256_file(self.path / rel) for rel in sorted(outputs)},
            **(extra or {}),
        }
        atomic_write_json(self.path / "manifest.json", manifest)
        atomic_write_bytes(self.path / "DONE", (time.strftime("%Y-%m-%dT%H:%M:%S") + "\n").encode())
        return manifest


def is_done(params: Params, stage: str, out_dir=None) -> bool:
    """Finished with the parameters `params` asks for."""
    path = out_root(out_dir) / "runs" / params.config / stage
    if not (path / "DONE").exists():
        return False
    try:
        return json.loads((path / "params.json").read_text()).get("key") == params.stage_key(stage)
    except (OSError, json.JSONDecodeError):
        return False


def verify_run(run_dir: str | Path) -> list[str]:
    """Re-check every finished stage's output hashes; returns the problems found."""
    run_dir = Path(run_dir)
    problems = []
    stages = [p for p in sorted(run_dir.iterdir()) if p.is_dir() and p.name in STAGES] if run_dir.is_dir() else []
    if not stages:
        return [f"{run_dir}: no stage directories found"]
    for path in stages:
        if not (path / "DONE").exists():
            problems.append(f"{path}: not finished (no DONE)")
            continue
        manifest = json.loads((path / "manifest.json").read_text())
        for rel, digest in manifest["outputs"].items():
            f = path / rel
            if not f.exists():
                problems.append(f"{f}: missing")
            elif sha256_file(f) != digest:
                problems.append(f"{f}: sha256 differs from the manifest")
    return problems
