"""Where a stage's units of work run: one local engine, or engines on Ray actors.

A stage cuts its work into units fixed by its parameters (stage 01: the screening batches
of `sampling.screen_batches`; stage 03: one problem; stage 05: its one invariant batch) and
hands them to an executor with a function ``fn(engine, *args)``. The executor only decides
where each unit runs; what a unit computes, and with which other problems it is batched,
never depends on the executor or on the number of workers. The stage's process (the
driver) writes every result itself, atomically, as before.

``executor: local``: one engine, units in order: under the runner and campaigns a vLLM engine is
leased from the run's broker and lives in a process of its own, which the run's other stages of the
same engine settings use too (replaylib.runtime.engine_service; ``shared_engine: false`` starts one in this
process instead, as a notebook run alone does).
``executor: ray``: ``ray_workers`` actors, each owning one engine for its lifetime
(``make_engine`` inside the actor, so the model loads once per actor); a unit runs wholly on
one actor, so a problem's passes all run on the engine that holds its trunks. An actor that
dies is replaced by a fresh one and its unit retried once, on the next free actor; a
unit whose worker dies twice stops the stage with a one-line error naming it. Errors raised
by the unit's own code stop the stage as they would locally.

vLLM engines start one at a time, each only once the one before is up, and a killed actor's
process must have exited (its GPU memory freed) before another engine starts: vLLM measures the
free GPU memory while it starts, and another process allocating or releasing memory meanwhile
makes that start fail ("Error in memory profiling"). Transformers engines measure nothing at
start and load side by side, on a GPU too (``gpus_per_worker`` below 1 shares one GPU).
"""
from __future__ import annotations

import logging
import os
import socket
import time
from collections import deque
from pathlib import Path

from ..core import recording
from ..measure.engines import make_engine
from .params import Params
from .vllm_processes import EngineProcesses

log = logging.getLogger("replaylib")
# test hook: "<label>" makes the first attempt of that unit kill its worker (os._exit);
# "<label>!" kills every attempt. Read in the driver and passed to the actor with the unit.
CRASH_ENV = "REPLAYLIB_TEST_CRASH_UNIT"


class UnitFailed(RuntimeError):
    pass


class LocalExecutor:
    """One engine in this process, units in order. keep: a notebook's engine, kept for its next call (a
    preview, then the stage, then a rerun with another k) while the model and settings it was built with
    stay the same (``kept_engine``)."""
    name = "local"
    reports_progress = True  # the engine updates the stage's progress as it decodes
    lease_info = None
    keep = False

    def __init__(self, params: Params, invariant: bool = False, forcing: bool = False, keep: bool = False,
                 record: bool = False):
        """record: what builds the engine is recorded (replaylib.core.recording), for the units it runs."""
        self.keep = keep
        build = lambda: make_engine(params, invariant=invariant, lifecycle=EngineProcesses(), forcing=forcing)  # noqa: E731
        self.engine = kept_engine(params, invariant, forcing) if keep else recording.built(build) if record else build()

    def call(self, fn, *args):
        return fn(self.engine, *args)

    def map(self, fn, units: list[tuple[str, tuple]], ordered: bool = True):
        """Yield (label, fn(engine, *args)) for each (label, args), in order."""
        for label, args in units:
            yield label, fn(self.engine, *args)

    def close(self):
        engine, self.engine = self.engine, None
        if engine is not None and not self.keep:
            engine.close()  # a multi-process vLLM engine's core process exits before the stage goes on


_kept: dict = {}  # the notebook's engine: {"key": what it was built from, "engine": it}


def kept_engine(params: Params, invariant: bool, forcing: bool):
    """The engine this process keeps for a notebook, built anew (the old one closed) when the settings it is
    built from differ: the sampling stage's parameters (model, engine, device, dtype, trunk settings, vLLM's
    settings), the re-fed prefix precision, the mode, and the test hook that replaces engines."""
    import atexit
    import json

    from ..measure.engines import FACTORY_ENV
    key = json.dumps({"built": params.stage_params("01_sampling"), "prefix": params.prefix_precision,
                      "invariant": invariant, "forcing": forcing, "factory": os.environ.get(FACTORY_ENV)},
                     sort_keys=True, default=str)
    if _kept.get("key") != key:
        close_kept_engine()
        _kept["engine"] = recording.built(lambda: make_engine(params, invariant=invariant, lifecycle=EngineProcesses(),
                                                              forcing=forcing))
        _kept["key"] = key
        atexit.register(close_kept_engine)
    engine = _kept["engine"]
    if hasattr(engine, "configure"):  # a vLLM engine names the configuration in its messages
        engine.configure(params)
    return engine


def close_kept_engine() -> None:
    engine = _kept.pop("engine", None)
    _kept.pop("key", None)
    if engine is not None:
        engine.close()


def _crash_for(label: str, attempt: int) -> bool:
    want = os.environ.get(CRASH_ENV, "")
    return bool(want) and (want == f"{label}!" or (want == label and attempt == 0))


def _actor_class():
    import ray

    @ray.remote(max_restarts=0, max_task_retries=0)
    class EngineActor:
        def __init__(self, params: Params, invariant: bool, forcing: bool, threads: int | None):
            t0 = time.monotonic()
            if threads:  # as many as the driver's: on a CPU, how many threads a matmul splits over changes its sums
                import torch
                torch.set_num_threads(threads)
            self.engine = recording.built(lambda: make_engine(params, invariant=invariant,  # the driver's Params
                                                              lifecycle=EngineProcesses(), forcing=forcing))
            self.start_s = time.monotonic() - t0

        def ready(self) -> tuple[str, int, float]:
            """Where the engine lives (host, process id) and the seconds its start took: called
            once it has loaded."""
            return socket.gethostname(), os.getpid(), self.start_s

        def run(self, fn, args, crash: bool):
            if crash:  # the test hook: die as a killed worker would, mid-unit
                os._exit(1)
            return fn(self.engine, *args)

        def close(self) -> None:
            """Shut the engine down (a multi-process vLLM engine's core process with it) before the
            actor is killed: a killed actor would leave that process holding GPU memory."""
            engine, self.engine = self.engine, None
            if engine is not None:
                engine.close()

    return EngineActor


def cpu_threads() -> int:
    """The threads this process's torch computes with: a CPU engine on a Ray actor uses as many, so that its
    results are the local engine's bit for bit (Ray gives an actor of one CPU one thread, and a CPU's
    matrix products sum in another order over another number of threads)."""
    import torch
    return torch.get_num_threads()


def ray_token_available() -> bool:
    """Ray's token authentication can be used: a token in RAY_AUTH_TOKEN, in RAY_AUTH_TOKEN_PATH or in
    ~/.ray/auth_token (where `ray start --head` writes it)."""
    path = os.environ.get("RAY_AUTH_TOKEN_PATH")
    return bool(os.environ.get("RAY_AUTH_TOKEN")) or (Path(path) if path else
                                                       Path.home() / ".ray" / "auth_token").is_file()


def join_ray(address: str, config: str = "?") -> None:
    """Join a running Ray cluster. Ray 2.60 clusters started with `ray start` use token authentication by
    default, and a client joins them only in token mode: set it when a token is available and the mode is
    unset (RAY_AUTH_MODE set by the user wins). A cluster that cannot be joined is one line."""
    import ray
    why = unreachable(address)
    if why:  # Ray itself keeps retrying an address where nothing listens, for minutes and in silence
        raise RuntimeError(f"config '{config}': cannot join the Ray cluster at {address}: nothing answers there "
                           f"({why}); start it with `ray start --head` there, or fix ray_address")
    if "RAY_AUTH_MODE" not in os.environ and ray_token_available():
        os.environ["RAY_AUTH_MODE"] = "token"
        # Ray 2.60 caches its configuration when it is imported: refresh it, as its own
        # ray._private.authentication.authentication_token_setup._enable_token_auth does
        from ray._raylet import Config
        Config.initialize("")
    try:
        ray.init(address=address, log_to_driver=False)
    except (ConnectionError, RuntimeError, ValueError) as e:
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise RuntimeError(f"config '{config}': cannot join the Ray cluster at {address} ({first}); start it with "
                           f"`ray start --head` there and give this machine the cluster's token (~/.ray/auth_token "
                           f"or RAY_AUTH_TOKEN)") from None


def unreachable(address: str, timeout_s: float = 10.0) -> str | None:
    """Why no connection can be made to a HOST:PORT address (ray:// or not) within timeout_s, or None
    (also for addresses Ray resolves itself, such as auto)."""
    host, sep, port = address.removeprefix("ray://").rpartition(":")
    if not sep or not port.isdigit():
        return None
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s).close()
    except OSError as e:
        return e.strerror or str(e) or type(e).__name__
    return None


def ensure_ray(params: Params) -> bool:
    """Connect to Ray; True when this call started a local instance (the caller shuts it down). A local
    instance keeps Ray's token authentication on (its default): Ray 2.60 listens on every interface."""
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")  # no network: Ray's usage report stays off
    import ray
    if ray.is_initialized():
        return False
    if params.ray_address:
        join_ray(params.ray_address, params.config)
        return False
    start_local_ray(max(params.ray_workers, 1))
    return True


def start_local_ray(num_cpus: int) -> str:
    """A Ray instance on this machine (token authentication on, Ray's default; no dashboard, no usage
    report); returns its address, for other processes to join."""
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    import ray
    ray.init(address="local", num_cpus=num_cpus, include_dashboard=False, log_to_driver=False)  # never a RAY_ADDRESS
    return ray.get_runtime_context().gcs_address


class RayExecutor:
    name = "ray"
    reports_progress = False  # the driver counts finished units
    lease_info = None

    def __init__(self, params: Params, invariant: bool = False, workers: int | None = None, forcing: bool = False):
        import ray

        from ..core.paths import REPO
        from ..measure.engine import EngineUnavailable
        self.started = ensure_ray(params)
        on_gpu = params.engine == "vllm" or params.device == "cuda"
        gpus = ray.cluster_resources().get("GPU", 0)
        if on_gpu and gpus < params.gpus_per_worker:
            if self.started:
                ray.shutdown()
            raise EngineUnavailable(f"config '{params.config}': engine '{params.engine}' on device "
                                    f"'{params.device}' needs {params.gpus_per_worker:g} GPU per Ray worker, and the "
                                    f"Ray cluster has {gpus:g}; run on a GPU machine or set engine: hf, device: cpu")
        # the workers import this checkout's replaylib, whatever else is installed
        env = {"PYTHONPATH": os.pathsep.join([str(REPO)] + [p for p in [os.environ.get("PYTHONPATH", "")] if p])}
        if not on_gpu:  # CPU actors compute with the driver's thread count (cpu_threads), more threads than the
            # one CPU Ray gives each: idle OpenMP threads that sleep instead of spinning leave the cores to the
            # actors that compute (the same threads, so the same sums; a tiny campaign's replay: 38 s -> 1.7 s)
            env["OMP_WAIT_POLICY"] = os.environ.get("OMP_WAIT_POLICY", "PASSIVE")
        options = {"num_cpus": 1, "num_gpus": params.gpus_per_worker if on_gpu else 0, "runtime_env": {"env_vars": env}}
        actor = _actor_class()
        self.config, self.on_gpu, self.where = params.config, on_gpu, {}
        self.one_start_at_a_time = params.engine == "vllm"  # see the module's docstring
        threads = None if on_gpu else cpu_threads()
        self._new_actor = lambda: actor.options(**options).remote(params, invariant, forcing, threads)
        n = workers or params.ray_workers
        try:
            if self.one_start_at_a_time:
                self.actors = []
                for _ in range(n):
                    self.actors.append(self._started(self._new_actor()))
            else:
                self.actors = [self._new_actor() for _ in range(n)]
                for a in self.actors:
                    self._started(a)
        except BaseException:
            self.close()
            raise
        log.info("ray executor: %d engine actor(s), %s GPU each", len(self.actors), options["num_gpus"])

    def _started(self, actor):
        """Wait until the actor's engine has loaded; a failed start is one line naming its cause."""
        import ray
        from ray.exceptions import RayActorError
        try:
            host, pid, start_s = ray.get(actor.ready.remote())
        except RayActorError as e:
            lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
            cause = next((ln for ln in reversed(lines) if "Error" in ln.split(":")[0]), lines[-1] if lines else "")
            raise RuntimeError(f"config '{self.config}': a Ray engine actor failed to start: {cause} "
                               f"(see the Ray logs, /tmp/ray/session_latest/logs)") from None
        self.where[actor] = (host, pid)
        # the engine logs its own start in the actor's process, which the stage's notebook never shows
        log.info("ray executor: engine actor on %s (pid %d) started in %.1f s", host, pid, start_s)
        return actor

    def _kill(self, actor, timeout_s: float = 60.0):
        """Kill an actor; on a GPU, wait (bounded) until its process has exited on this host."""
        import ray
        ray.kill(actor)
        host, pid = self.where.pop(actor, (None, None))
        if not (self.on_gpu and pid and host == socket.gethostname()):
            return
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return
            except PermissionError:  # someone else's process now holds the number
                return
            time.sleep(0.2)
        log.warning("ray executor: the killed engine actor (pid %d) still runs after %.0f s", pid, timeout_s)

    def call(self, fn, *args):
        """One unit on one actor (retried once if its worker dies)."""
        return next(self.map(fn, [(fn.__name__, args)]))[1]

    def map(self, fn, units: list[tuple[str, tuple]], ordered: bool = True):
        """Yield (label, result) per unit: in order, or as they finish (ordered=False)."""
        import ray
        from ray.exceptions import ActorUnavailableError, RayActorError, RayTaskError
        units = list(units)
        waits = {}
        queue = deque((i, 0) for i in range(len(units)))
        free, pending, done, next_out = list(self.actors), {}, {}, 0
        while queue or pending:
            while queue and free:
                i, attempt = queue.popleft()
                actor = free.pop(0)
                label, args = units[i]
                pending[actor.run.remote(fn, args, _crash_for(label, attempt))] = (i, attempt, actor)
            ready, _ = ray.wait(list(pending), num_returns=1)
            i, attempt, actor = pending.pop(ready[0])
            label = units[i][0]
            try:
                result = ray.get(ready[0])
            except RayTaskError as e:  # the unit's own error: as it would be raised locally
                raise e.as_instanceof_cause() from None
            except ActorUnavailableError:  # restarting after a death: the unit never ran there, so
                free.append(actor)           # it is no attempt; wait, bounded by Ray declaring it dead
                waits[i] = waits.get(i, 0) + 1
                if waits[i] > 120:
                    raise UnitFailed(f"{label}: its Ray worker stayed unavailable for 2 minutes; see the Ray "
                                     f"logs (/tmp/ray/session_latest/logs)") from None
                time.sleep(1)
                queue.appendleft((i, attempt))
                continue
            except RayActorError as e:
                # a fresh actor (a new process, the model loaded again) replaces the dead one; the
                # retry goes to the next free actor first
                self._kill(actor)
                fresh = self._new_actor()
                if self.one_start_at_a_time:  # no unit starts on the other engines while this one loads
                    self._started(fresh)
                self.actors[self.actors.index(actor)] = fresh
                free.append(fresh)
                if attempt >= 1:
                    raise UnitFailed(f"{label} failed twice: its Ray worker died each time "
                                     f"({type(e).__name__}); see the Ray logs (/tmp/ray/session_latest/logs)") from None
                log.warning("%s: Ray worker died (%s); retrying it once", label, type(e).__name__)
                queue.appendleft((i, attempt + 1))
                continue
            free.insert(0, actor)
            if not ordered:
                yield label, result
                continue
            done[i] = result
            while next_out in done:
                yield units[next_out][0], done.pop(next_out)
                next_out += 1

    def close(self):
        import ray
        from ray.exceptions import GetTimeoutError, RayActorError
        for a in getattr(self, "actors", []):
            try:  # the engine first, so that its processes end with it; a dead actor's are reaped later
                ray.get(a.close.remote(), timeout=120)
            except (RayActorError, GetTimeoutError) as e:
                log.warning("ray executor: an engine actor did not close cleanly (%s)", type(e).__name__)
            self._kill(a)
        self.actors = []
        if self.started:
            ray.shutdown()


def make_executor(params: Params, invariant: bool = False, workers: int | None = None, stage: str = "",
                  forcing: bool = False, keep: bool = False, record: bool = False):
    """The executor a configuration asks for (``executor: local | ray``); stage: who asks, for the
    records of a shared engine; forcing: engines that can force given responses through their decode
    (the credit tool's; always engines of its own, never the run's shared one); keep: a local engine is
    kept for the process's next call (a notebook's); record: what builds a local engine is recorded for the
    units it runs (engines in processes of their own always are: they serve only stages and the tool)."""
    if params.executor == "ray":
        import importlib.util
        if importlib.util.find_spec("ray") is None:
            raise RuntimeError(f"config '{params.config}': executor 'ray' needs Ray (pip install -r requirements.lock)"
                               f" or set executor: local")
        if params.engine == "vllm":  # the same one-line error as a local run, before any actor starts
            if importlib.util.find_spec("vllm") is None:
                make_engine(params)
        return RayExecutor(params, invariant, workers, forcing)
    from .engine_service import ServedExecutor, served
    if served(params) and not forcing:
        return ServedExecutor(params, invariant, stage)
    return LocalExecutor(params, invariant, forcing, keep, record)


def lease_record(ex) -> dict:
    """What a stage's manifest records of a shared engine it leased (nothing for an engine of its own)."""
    return {"engine_lease": ex.lease_info} if ex.lease_info else {}
