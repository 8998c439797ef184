"""vLLM engine processes on this machine.

A multi-process engine's core is a child process that vLLM does not stop when its parent dies: a
process killed with SIGKILL would leave it holding GPU memory. Every engine core is registered here
(one JSON file per process, in a directory of this user's alone) and removed when its engine closes;
an engine start first stops the registered engine cores whose engine's process is gone, and only a
process that is still the one registered and still carries vLLM's engine-core title. Engine starts
and shutdowns on one GPU also take a lock: vLLM measures the free GPU memory while it starts an engine
whose KV cache it sizes itself, and fails when another process allocates or releases memory meanwhile
("Error in memory profiling"); an engine of a fixed cache size measures nothing.
"""
from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import signal
import stat
import tempfile
from pathlib import Path

from ..measure.vllm_setup import serving_in_env

log = logging.getLogger("replaylib")

REGISTRY_ENV = "REPLAYLIB_ENGINE_REGISTRY"


def registry_dir() -> Path:
    """This user's registry of engine cores and GPU locks: created with mode 0700, and refused (one
    line) when it is a link, another user's, or open to others, since its entries decide what is
    stopped."""
    path = Path(os.environ.get(REGISTRY_ENV) or Path(tempfile.gettempdir()) / f"replaylib-vllm-engines-{os.getuid()}")
    try:
        path.mkdir(mode=0o700, parents=True)
    except FileExistsError:
        pass
    except OSError as e:
        raise RuntimeError(f"{path}: cannot create the engine registry ({e.strerror or e}); set {REGISTRY_ENV} to a "
                           f"directory of your own") from None
    st = path.lstat()
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
        raise RuntimeError(f"{path}: the engine registry must be a directory of this user's alone (mode 0700, not a "
                           f"link); it is not, so nothing is registered or stopped; remove it or set {REGISTRY_ENV} "
                           f"to a private directory")
    return path


@contextlib.contextmanager
def gpu_lifecycle_lock(config: str = "?", exclusive: bool = True):
    """Hold the lock of this process's GPUs (CUDA_VISIBLE_DEVICES) while an engine starts or stops:
    exclusive for a start that profiles the free memory, shared for the others (they change the free
    memory, but measure none)."""
    devices = os.environ.get("CUDA_VISIBLE_DEVICES", "all").replace(",", "_") or "none"
    path = registry_dir() / f"gpu-{devices}.lock"
    mode = fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH
    with open(path, "a") as f:
        try:
            fcntl.flock(f, mode | fcntl.LOCK_NB)
        except BlockingIOError:
            log.info("config %s: waiting for another vLLM engine on this GPU to finish starting or stopping", config)
            fcntl.flock(f, mode)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _is_engine_core(title: str) -> bool:
    return "VLLM::" in title or "EngineCore" in title


def _title(proc) -> str:
    import psutil
    try:
        return proc.name() + " " + " ".join(proc.cmdline())
    except psutil.Error:
        return ""


def engine_processes(exclude=()) -> list:
    """This process's descendants that vLLM named (setproctitle: VLLM::EngineCore and its workers)."""
    return [proc for proc in _children() if proc.pid not in exclude and _is_engine_core(_title(proc))]


def _children() -> list:
    import psutil
    return psutil.Process().children(recursive=True)


def register_engine_processes(procs, config: str) -> list[Path]:
    """Record engine cores this process started (its descendants, with vLLM's title), for the reaper."""
    import psutil
    me = psutil.Process()
    ours = {p.pid for p in _children()}
    files = []
    for proc in procs:
        title = _title(proc)
        if proc.pid not in ours or not _is_engine_core(title):
            continue
        entry = {"pid": proc.pid, "create_time": proc.create_time(), "parent_pid": me.pid,
                 "parent_create_time": me.create_time(), "config": config, "title": title[:200]}
        path = registry_dir() / f"engine-{proc.pid}.json"
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(json.dumps(entry))
        os.replace(tmp, path)
        files.append(path)
    return files


def _alive(pid: int, create_time: float):
    import psutil
    try:
        proc = psutil.Process(pid)
        return proc if abs(proc.create_time() - create_time) < 1e-3 and proc.status() != psutil.STATUS_ZOMBIE \
            else None
    except (psutil.Error, TypeError, ValueError):
        return None


def reap_leftover_engines(timeout_s: float = 60.0) -> list[dict]:
    """Stop the registered engine cores whose engine's process has died; returns what was stopped.
    A registered process is stopped only while it is still the one registered (its start time) and
    still carries vLLM's engine-core title; any other entry is dropped."""
    import psutil
    stopped = []
    for path in sorted(registry_dir().glob("engine-*.json")):
        try:
            entry = json.loads(path.read_text())
            pid, created = int(entry["pid"]), float(entry["create_time"])
            parent, parent_created = int(entry["parent_pid"]), float(entry["parent_create_time"])
        except (OSError, ValueError, KeyError, TypeError):
            path.unlink(missing_ok=True)
            continue
        proc = _alive(pid, created)
        if proc is None or not _is_engine_core(_title(proc)):
            path.unlink(missing_ok=True)
            continue
        if _alive(parent, parent_created) is not None:
            continue  # another engine, still running: not ours to stop
        for p in [proc] + proc.children(recursive=True):
            with contextlib.suppress(psutil.Error):
                p.send_signal(signal.SIGKILL)
        gone, alive = psutil.wait_procs([proc], timeout=timeout_s)
        log.warning("stopped a leftover vLLM engine core (pid %d, config %s): the process that ran its engine (pid %d) "
                    "had died without shutting it down%s", pid, entry.get("config"), parent,
                    "" if not alive else f"; it still runs after {timeout_s:.0f} s")
        if not alive:
            path.unlink(missing_ok=True)
        stopped.append({**entry, "stopped": not alive})
    return stopped


class EngineProcesses:
    """The lifecycle hook of a vLLM engine (``VLLMEngine.from_params(lifecycle=)``) that manages its
    engine-core processes: a start stops the leftovers of dead engines first, then starts the LLM under
    the GPU lock and registers the engine cores it started; a stop shuts the LLM down under the lock,
    waits for its engine cores (killing and naming one that outlives the shutdown) and unregisters them."""

    def start(self, build, config: str, exclusive: bool) -> tuple:
        reap_leftover_engines()
        with gpu_lifecycle_lock(config, exclusive=exclusive):
            before = {p.pid for p in engine_processes()}
            llm = build()
            procs = engine_processes(exclude=before)
            files = register_engine_processes(procs, config)
        if serving_in_env() == "multiprocess" and not procs:
            log.warning("config %s: no vLLM engine-core process was found beside this one in the multiprocess "
                        "mode; a killed stage's engine could not be stopped by the next one", config)
        return llm, procs, files

    def stop(self, shutdown, config: str, processes: list, registered: list, timeout_s: float) -> list:
        import psutil
        with gpu_lifecycle_lock(config, exclusive=False):
            shutdown()
            procs = list(processes) + [p for p in engine_processes() if p.pid not in {q.pid for q in processes}]
            gone, alive = psutil.wait_procs(procs, timeout=timeout_s)
            for proc in alive:
                log.warning("config %s: vLLM engine process %d still ran %.0f s after shutdown; killed", config,
                            proc.pid, timeout_s)
                with contextlib.suppress(psutil.Error):
                    proc.kill()
            psutil.wait_procs(alive, timeout=10)
            for path in registered:
                path.unlink(missing_ok=True)
        return procs
