"""Run directories: runs/<config>/<NN_stage>/ with params.json, manifest.json and DONE.

A stage opens its directory with `StageDir.begin`, which checks every upstream stage
(finished, same parameter key, files unchanged) and removes a stale DONE. Files are
written to a temporary name and renamed, and `finish` writes the manifest, then DONE.

Partial results (per-problem shards) survive a crash and are reused only when they were
made from the same parameters, the same upstream files and the same code: `begin` keeps
a resume key (the stage key, the sha256 of every upstream output read, the code
fingerprint) in resume.json with the sha256 of every shard written under it, and clears
the directory when the key differs.
"""
from __future__ import annotations

import functools
import hashlib
import hmac
import json
import os
import platform
import re
import secrets
import shutil
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path

from ..core.files import (
    _UMASK,
    _no_space,
    atomic_copy,
    atomic_write_bytes,
    atomic_write_json,
    sha256_file,
)
from ..core.paths import DEFAULT_OUT, PARAMS, REPO, config_dir, out_root, stage_dir
from .fingerprint import code_fingerprint
from .locks import LOCK_TOKEN_ENV, StageLock
from .params import Params
from .registry import RUN_ORDER, STAGES
from .registry import stage as stage_entry

MIN_FREE_BYTES = 200 * 2**20
RESUME_FILE = "resume.json"
KEEP_SUFFIXES = (".ipynb", ".log")  # the runner's executed notebook and log, written while the stage runs


os.umask(_UMASK)


def execute_notebook(notebook: Path, output: Path, parameters: dict) -> None:
    """Execute a notebook with papermill into ``output``, which holds a whole notebook or is left as it
    was: papermill writes a hidden copy beside it as the cells run, and that copy replaces ``output`` (a
    link there included) once it reads back as JSON, whether the notebook failed or not."""
    import papermill
    running = output.with_name(f".{output.stem}.running.ipynb")
    running.unlink(missing_ok=True)
    try:
        papermill.execute_notebook(str(notebook), str(running), parameters=parameters, cwd=str(REPO),
                                   kernel_name="python3", progress_bar=False, log_output=False)
    except OSError as e:
        if e.filename is not None:
            raise
        raise _no_space(output, e, running) from None  # papermill's own write of the notebook names no file
    finally:
        try:
            json.loads(running.read_text())
            os.replace(running, output)
        except (OSError, ValueError):
            running.unlink(missing_ok=True)


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
    for pkg in ["replaylib", "torch", "transformers", "vllm", "numpy", "pandas", "safetensors", "matplotlib", "seaborn",
                "pypdfium2"]:
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
            info["cuda_device"] = gpu_name(torch)
    except ImportError:
        pass
    return info


def gpu_name(torch) -> str:
    """The first GPU's name, without creating a CUDA context in a process that has none (a stage whose
    engine runs in another process): NVML where it is installed."""
    if torch.cuda.is_initialized():
        return torch.cuda.get_device_name(0)
    try:
        import pynvml
        pynvml.nvmlInit()
        name = pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(0))
        return name.decode() if isinstance(name, bytes) else str(name)
    except Exception:  # noqa: BLE001 - no NVML: the name is worth a context
        return torch.cuda.get_device_name(0)


def product_digests(paths, out_dir=None) -> dict:
    """sha256 of files a stage writes outside its directory (tables, figures), named relative to the
    out root so that a moved or copied run still verifies (manifest key ``products``)."""
    root = out_root(out_dir).resolve()
    return {Path(p).resolve().relative_to(root).as_posix(): sha256_file(p) for p in sorted(set(paths))}


def changed_outputs(path: Path, outputs: dict) -> list[str]:
    """The outputs (file: sha256, as a stage's manifest records them) missing or changed in ``path``."""
    return [rel for rel, digest in outputs.items() if not (path / rel).exists() or sha256_file(path / rel) != digest]


class UpstreamError(RuntimeError):
    pass


PARAMS_FILE_ENV = "REPLAYLIB_PARAMS_FILE"  # the runner's params file, for the commands errors suggest


def rerun_command(params: Params, stage: str, out_dir=None) -> str:
    """The command that reruns a stage of this configuration: its params file (the runner's, else
    params/<config>.yaml where it exists) and the output root when it is not the default."""
    src = os.environ.get(PARAMS_FILE_ENV)
    if not src:
        guess = PARAMS / f"{params.config}.yaml"
        src = f"params/{params.config}.yaml" if guess.exists() else "PARAMS.yaml (the file of this configuration)"
    out = "" if out_dir is None or Path(out_dir).resolve() == DEFAULT_OUT.resolve() else f" --out {out_dir}"
    return f"python -m replaylib.run {src} {stage}{out}"


# this user's secret: a stage they ran has its manifest signed with it, so that a run received from someone
# else (which cannot carry a valid signature) is never copied into one of theirs
ORIGIN_KEY = Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config") / "replaylib" / "origin.key"


@functools.lru_cache(maxsize=1)
def _origin_key() -> bytes | None:
    """The key, made on first use (readable by this user alone); None where it cannot be made."""
    try:
        return ORIGIN_KEY.read_bytes()
    except FileNotFoundError:
        pass
    except OSError:
        return None
    try:
        ORIGIN_KEY.parent.mkdir(parents=True, exist_ok=True)
        tmp = ORIGIN_KEY.with_name(f".{ORIGIN_KEY.name}.{os.getpid()}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(secrets.token_bytes(32))
        try:
            os.link(tmp, ORIGIN_KEY)  # the first process to make one wins
        except FileExistsError:
            pass
        finally:
            tmp.unlink()
        return ORIGIN_KEY.read_bytes()
    except OSError:
        return None


def origin(manifest: dict) -> str | None:
    """The signature of a manifest (all of it but ``origin``, as JSON reads it back) under this user's key."""
    key = _origin_key()
    if key is None:
        return None
    body = json.loads(json.dumps({k: v for k, v in manifest.items() if k != "origin"}, default=str))
    return hmac.new(key, json.dumps(body, sort_keys=True).encode(), "sha256").hexdigest()


def made_here(manifest: dict) -> bool:
    """The manifest was written by a stage this user ran (or copied), and not changed since."""
    signature = origin(manifest)
    return signature is not None and hmac.compare_digest(str(manifest.get("origin", "")), signature)


def find_stage_elsewhere(params: Params, stage: str, out_dir=None, exclude: str = "") -> Path | None:
    """A finished, unchanged stage with the key `params` asks for, under another configuration's name
    (the first one in name order) and made by this user (made_here), so that a renamed run can start
    from it."""
    runs = config_dir(params.config, out_dir).parent
    key = params.stage_key(stage)
    for candidate in sorted(runs.glob(f"*/{stage}")) if runs.is_dir() else []:
        if candidate.parent.name == exclude or not (candidate / "DONE").exists():
            continue
        try:
            if json.loads((candidate / "params.json").read_text()).get("key") != key:
                continue
            manifest = json.loads((candidate / "manifest.json").read_text())
        except (OSError, ValueError):
            continue
        if isinstance(manifest, dict) and made_here(manifest) and not changed_outputs(
                candidate, manifest.get("outputs", {})):
            return candidate
    return None


class StageDir:
    """One stage's output directory for one configuration."""

    def __init__(self, params: Params, stage: str, out_dir=None):
        self.params = params
        self._open(params.config, stage, out_dir)

    def _open(self, config: str, stage: str, out_dir) -> None:
        stage_entry(stage)  # a registered stage
        self.config, self.stage, self.out_dir = config, stage, out_dir
        self.root, self.path = config_dir(self.config, out_dir), stage_dir(self.config, stage, out_dir)
        self.lock = None
        self.key = self.stage_key()
        self.inputs: dict[str, str] = {}
        self.started = time.time()
        self.resume_key: str | None = None

    # -- what defines the stage (a campaign's statistics define their own: runtime.campaigns.CampaignDir)
    def stage_key(self) -> str:
        return self.params.stage_key(self.stage)

    def upstreams(self) -> dict[str, "StageDir"]:
        """The stages whose outputs this one reads, by the name its manifest's inputs give them."""
        return {s: StageDir(self.params, s, self.out_dir) for s in self.params.data_upstream(self.stage)}

    def recorded_params(self) -> dict:
        """params.json: what the key is made of."""
        from .params import task_data_sha256
        return {"stage": self.stage, "key": self.key, "config": self.config,
                "params": {k: getattr(self.params, k) for k in Params.keys_for(self.stage)},
                "data_sha256": {self.params.task: task_data_sha256(self.params.task)}}

    def why_key_differs(self, recorded: dict) -> str:
        """Why a finished stage's recorded key (params.json) is not this one's, in a few words."""
        from .params import task_data_sha256
        same = {k: getattr(self.params, k) for k in Params.keys_for(self.stage) if k != "config"} == \
            {k: v for k, v in recorded.get("params", {}).items() if k != "config"}
        moved = any(sha != task_data_sha256(t) for t, sha in recorded.get("data_sha256", {}).items())
        return "the task's data file changed" if same and moved else "parameters changed"

    def rerun_command(self) -> str:
        return rerun_command(self.params, self.stage, self.out_dir)

    def uses_vllm(self) -> bool:
        """Whether its kernel may leave a vLLM engine core behind (the runner then looks for one)."""
        return self.params.engine == "vllm"

    # -- reading other stages
    def upstream(self, stage: str) -> Path:
        return stage_dir(self.config, stage, self.out_dir)

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

    def staleness(self) -> str | None:
        """Why the stage must run, or None when it is up to date: not finished, another key, other code,
        its outputs or products changed since it finished, or its upstream stages' outputs are not the
        ones it read."""
        if not (self.path / "DONE").exists():
            return "not run yet"
        try:
            recorded = json.loads((self.path / "params.json").read_text())
        except (OSError, json.JSONDecodeError):
            return "no readable params.json"
        if recorded.get("key") != self.key:
            return self.why_key_differs(recorded)
        try:
            manifest = json.loads((self.path / "manifest.json").read_text())
        except (OSError, json.JSONDecodeError):
            return "no readable manifest"
        if manifest.get("code") != code_fingerprint(self.stage):
            return "notebook or library code changed"
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

    def changed_values(self, recorded: dict) -> dict:
        """The parameters whose value differs between this stage's recorded params.json and these."""
        theirs = recorded.get("params", {})
        return {k: (theirs.get(k), getattr(self.params, k)) for k in Params.keys_for(self.stage)
                if k != "config" and theirs.get(k) != getattr(self.params, k)}

    def differences(self, recorded: dict) -> str:
        """What differs between this stage's recorded params.json and these parameters, in words."""
        from .params import task_data_sha256
        diff = [f"{k}: {a!r} there, {b!r} here" for k, (a, b) in self.changed_values(recorded).items()]
        if any(sha != task_data_sha256(task) for task, sha in recorded.get("data_sha256", {}).items()):
            diff.append("the task's data file changed since it ran")
        return "; ".join(diff) or "its key differs: made by another version of replaylib"

    def _copy_missing_upstream(self) -> None:
        """A configuration run under a new name (a parameter changed in a notebook, with config renamed
        to keep the finished run) starts from the finished stages it shares with another configuration:
        each missing upstream stage is copied from the one holding it with the same key."""
        for stage in [s for s in RUN_ORDER if s in self.params.reading([self.stage]) and s != self.stage]:
            if (self.upstream(stage) / "DONE").exists():
                continue
            src = find_stage_elsewhere(self.params, stage, self.out_dir, exclude=self.params.config)
            if src is not None:
                copy_stage(src, self.upstream(stage), self.params.config, self.out_dir)
                print(f"[replaylib] config {self.params.config}: {stage} copied from {src} (same parameters)",
                      flush=True)

    def _refuse_replacing(self) -> None:
        """A finished stage made with other parameters is replaced only by the runner (whose plan says
        so: its parameters changed, and which handed this process the stage's lock); a notebook or a direct
        papermill run with changed values stops and says how to keep both."""
        if self.lock.handed or not (self.path / "DONE").exists():
            return
        try:
            recorded = json.loads((self.path / "params.json").read_text())
        except (OSError, json.JSONDecodeError):
            return
        if recorded.get("key") == self.key:
            return
        changed = self.changed_values(recorded)
        suffix = "".join(f"-{k}{b}" for k, (_, b) in list(changed.items())[:1]) or "-2"
        new_name = re.sub(r"[^A-Za-z0-9._-]", "_", f"{self.params.config}{suffix}")
        raise UpstreamError(
            f"{self.path}: holds a finished {self.stage} made with other parameters ({self.differences(recorded)}); "
            f"to keep it, give this run its own name (config = '{new_name}' in the parameters cell, or -p config "
            f"{new_name} with papermill: the stages it shares are copied); to replace it, rerun it with the "
            f"runner: {rerun_command(self.params, self.stage, self.out_dir)}")

    # -- writing this stage
    def begin(self) -> "StageDir":
        self.lock = StageLock(out_root(self.out_dir), self.config, self.stage).acquire(
            os.environ.get(LOCK_TOKEN_ENV), reentrant=True)
        try:
            self._refuse_replacing()
            self._begin()
        except BaseException:
            self.lock.release()
            raise
        return self

    def _begin(self) -> None:
        self._copy_missing_upstream()
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
        self.resume_key = hashlib.sha256(json.dumps(
            {"key": self.key, "inputs": self.inputs, "code": code_fingerprint(self.stage)},
            sort_keys=True).encode()).hexdigest()[:16]
        if self._recorded_resume().get("resume_key") != self.resume_key:
            # anything here was made from other parameters, inputs or code: never reuse it
            self.clear()
            atomic_write_json(self.path / RESUME_FILE, {"resume_key": self.resume_key, "shards": {}})
        atomic_write_json(self.path / "params.json", self.recorded_params())

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

    def _recorded_resume(self) -> dict:
        try:
            return json.loads((self.path / RESUME_FILE).read_text())
        except (OSError, json.JSONDecodeError):
            return {}

    def has_shard(self, rel: str) -> bool:
        """A shard written under this resume key whose bytes are still the ones written."""
        digest = self._recorded_resume().get("shards", {}).get(rel)
        return digest is not None and (self.path / rel).exists() and sha256_file(self.path / rel) == digest

    def add_shard(self, rel: str) -> None:
        """Record a shard just written (atomically) as reusable under this resume key."""
        recorded = self._recorded_resume()
        assert recorded.get("resume_key") == self.resume_key, "begin() first"
        recorded["shards"][rel] = sha256_file(self.path / rel)
        atomic_write_json(self.path / RESUME_FILE, recorded)

    def file(self, rel: str) -> Path:
        p = self.path / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        return p

    def finish(self, outputs: list[str], extra: dict | None = None) -> dict:
        manifest = {
            "stage": self.stage, "config": self.config, "key": self.key,
            "git": git_state(), "versions": versions(), "device": device_info(),
            "started": time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(self.started)),
            "elapsed_s": round(time.time() - self.started, 1),
            "inputs": self.inputs,
            "code": code_fingerprint(self.stage),
            "outputs": {rel: sha256_file(self.path / rel) for rel in sorted(outputs)},
            **(extra or {}),
        }
        manifest["origin"] = origin(manifest)
        atomic_write_json(self.path / "manifest.json", manifest)
        atomic_write_bytes(self.path / "DONE", (time.strftime("%Y-%m-%dT%H:%M:%S") + "\n").encode())
        if self.lock is not None:
            self.lock.release()
        return manifest


def remove_links(directory: Path) -> None:
    """Remove every symbolic link under a directory (not following any)."""
    for where, dirs, files in os.walk(directory):
        for name in dirs + files:
            if os.path.islink(os.path.join(where, name)):
                os.unlink(os.path.join(where, name))


def copy_stage(src: Path, dst: Path, dst_config: str, out_dir=None) -> None:
    """Give another configuration a finished stage made with the same parameters and inputs: a copy
    of the stage directory whose params.json and manifest name the new configuration (manifest
    ``copied_from``), with its products (figures, tables) and the figures its notebook drew copied
    under the new configuration's name.
    The caller checks that the keys and inputs are the same; the copy appears whole or not at all."""
    root = out_root(out_dir)
    src_config = src.parent.name
    tmp = dst.parent / f".{dst.name}.copy-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(src, tmp, symlinks=True, ignore=shutil.ignore_patterns(".*.tmp", ".write-test-*"))
    remove_links(tmp)  # a stage holds plain files: nothing a link points to is copied in
    recorded = json.loads((tmp / "params.json").read_text())
    atomic_write_json(tmp / "params.json", {**recorded, "config": dst_config})
    manifest = json.loads((tmp / "manifest.json").read_text())
    products = {}
    for rel, digest in manifest.get("products", {}).items():
        parts = rel.split("/")
        if len(parts) > 2 and parts[0] in ("figures", "tables") and parts[1] == src_config:
            parts[1] = dst_config
            atomic_copy(root / rel, root / "/".join(parts))
        products["/".join(parts)] = digest
    for name in stage_entry(src.name).figures:  # what the stage's notebook drew, as the copy's own
        for f in (root / "figures" / src_config).glob(f"{name}.*"):
            atomic_copy(f, root / "figures" / dst_config / f.name)
    manifest.update({"config": dst_config, "copied_from": src.resolve().relative_to(root.resolve()).as_posix(),
                     **({"products": products} if products else {})})
    manifest["origin"] = origin(manifest)  # the copy is this user's
    atomic_write_json(tmp / "manifest.json", manifest)
    old = dst.parent / f".{dst.name}.old-{os.getpid()}"
    if dst.exists():
        dst.rename(old)
    tmp.rename(dst)
    shutil.rmtree(old, ignore_errors=True)


def _manifest(path: Path, problems: list) -> dict | None:
    try:
        return json.loads((path / "manifest.json").read_text())
    except (OSError, json.JSONDecodeError) as e:
        problems.append(f"{path / 'manifest.json'}: unreadable ({type(e).__name__}); rerun the stage")
        return None


def _check_file(f: Path, digest: str, what: str, problems: list) -> None:
    if not f.exists():
        problems.append(f"{f}: missing ({what})")
    elif sha256_file(f) != digest:
        problems.append(f"{f}: sha256 differs from the manifest ({what})")


def verify_run(run_dir: str | Path) -> list[str]:
    """Re-check a run (runs/<config>); returns the problems found, one line each.

    For every finished stage: its outputs against its manifest; stage 04's products (the
    tables and figures, manifest ``products``; paths absolute or relative to the out root,
    the directory holding ``runs/``); and every recorded input (``<stage>/<file>``) against
    the output that upstream stage's manifest records now.
    """
    run_dir = Path(run_dir)
    problems = []
    stages = [p for p in sorted(run_dir.iterdir()) if p.is_dir() and p.name in STAGES] if run_dir.is_dir() else []
    if not stages:
        return [f"{run_dir}: no stage directories found"]
    manifests = {}
    for path in stages:
        if not (path / "DONE").exists():
            problems.append(f"{path}: not finished (no DONE)")
            continue
        manifest = manifests[path.name] = _manifest(path, problems)
        if manifest is None:
            continue
        for rel, digest in manifest.get("outputs", {}).items():
            _check_file(path / rel, digest, "output", problems)
        for product, digest in manifest.get("products", {}).items():
            _check_file(run_dir.parent.parent / product, digest, f"product of {path.name}", problems)
    for stage, manifest in manifests.items():
        if manifest is None:
            continue
        for ref, digest in manifest.get("inputs", {}).items():
            upstream, _, rel = ref.partition("/")
            recorded = (manifests.get(upstream) or {}).get("outputs", {}).get(rel)
            if recorded != digest:
                why = ("has another sha256 there now" if recorded is not None else
                       "is not among its recorded outputs" if manifests.get(upstream) else
                       "has no finished manifest to check against")
                problems.append(f"{run_dir / upstream / rel}: input of {stage} {why} (upstream {upstream} changed "
                                f"since {stage} read it; rerun {stage})")
    return problems
