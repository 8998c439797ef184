"""One vLLM engine per model and settings for all the stages of a run or a campaign.

A vLLM engine takes a minute or more to start (import, weights, torch.compile, CUDA graphs) and every stage runs in
a notebook kernel of its own, so under the runner (``python -m replaylib.run``) and campaigns the engines live in
processes of their own, *engine servers*, which the stages' kernels lease in turn from the run's *broker*:

- The broker runs in the runner's (or the campaign's) process. It listens on a Unix socket in a private directory
  (mode 0700) and admits only holders of its random key; the runner hands both to its kernels in the environment
  (``REPLAYLIB_ENGINE_BROKER``, ``REPLAYLIB_ENGINE_BROKER_KEY``). A notebook run alone has neither and starts its
  own engine, as ``shared_engine: false`` does. Each connection has a thread of its own and ``AUTH_TIMEOUT_S`` to
  prove it holds the key: a silent one delays no lease. A broker removes the private directories that brokers killed
  outright left.
- A lease names an engine *identity* (``engine_vllm.engine_identity``: everything the engine is built with: model,
  dtype, serving mode, batch invariance, attention backend, cache size). An idle server of that identity is leased;
  otherwise a new one starts. A configuration's stages 01 and 03, and configurations with the same model and
  settings, share servers; a batch-invariant engine or another serving mode is another identity, so another server.
- The stage configures the engine with its parameters (``VLLMEngine.configure``: the trunk settings a regeneration
  repeats, the config named in messages; another identity is refused on both sides), then sends its units (fn,
  args); the server runs ``fn(engine, *args)`` and sends back the result, with the unit's progress and log lines as
  they happen. One stage at a time per server.
- What a unit computes does not depend on which lease runs it or what ran before: each unit starts by resetting the
  prefix cache (sampling a problem's trunks and re-establishing them both do) and per-request seeds decide the
  sampling.
- Engine starts: the first start of a compilation (model and kernels) runs alone, later ones side by side, reusing
  its compiled graphs. Engines whose KV cache is sized by profiling the free GPU memory (``kv_cache_gib: 0``) are
  alone on the GPU: the broker stops idle ones and waits for busy ones before starting another. One with a fixed
  cache starts once it fits beside the engines still starting (``gpu_memory.room_to_start``; idle ones stop for
  room), and starts again where vLLM's start found the memory taken by another process, waiting at most
  ``vllm_memory_wait_s`` in all.
- Ends: the broker stops every server when the run ends (``close``); a server whose broker's process died stops
  itself (it watches its parent); a server killed outright leaves its engine core to the registry's reaper
  (``engine_vllm.reap_leftover_engines``). ``engines.json`` under ``runs/.engines/`` records every server's start,
  leases and stop.
"""
from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import pickle
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from multiprocessing import AuthenticationError
from multiprocessing.connection import Client, Listener
from pathlib import Path
from unittest import mock

from ..core import progress
from ..core.processes import remove_left_behind, stop_with_parent
from ..measure import gpu_memory, vllm_setup
from .socket_auth import authenticated

log = logging.getLogger("replaylib")

BROKER_ENV = "REPLAYLIB_ENGINE_BROKER"
BROKER_KEY_ENV = "REPLAYLIB_ENGINE_BROKER_KEY"
STOP_TIMEOUT_S = 120.0
AUTH_TIMEOUT_S = 30.0  # a connection to the broker that has not proved it holds the key by then is closed
PRIVATE_PREFIX = "replaylib-engines-"  # the broker's private directory: <prefix><its pid>-<random>


class EngineServiceError(RuntimeError):
    pass


def shares_engines(params) -> bool:
    """Whether this configuration's stages share vLLM engines under a runner or a campaign."""
    return params.engine == "vllm" and params.executor == "local" and params.shared_engine


def served(params) -> bool:
    """Whether a stage with these parameters leases its engine from the run's broker."""
    return shares_engines(params) and bool(os.environ.get(BROKER_ENV))


def wants_broker(params, stages) -> bool:
    """Whether a runner or campaign running these stages of this configuration should start a broker."""
    from .registry import stage as stage_entry
    return shares_engines(params) and any(stage_entry(s).engine for s in stages)


@contextlib.contextmanager
def run_broker(needed: bool, out_dir=None):
    """The engine broker of a run or a campaign, set in the environment its stages' processes inherit;
    None where it needs none, or where an enclosing run (a campaign's runner) has one already. Its engines
    stop when the run ends."""
    if os.environ.get(BROKER_ENV) or not needed:
        yield None
        return
    broker = EngineBroker(out_dir)
    try:
        with mock.patch.dict(os.environ, broker.env()):
            yield broker
    finally:
        broker.close()


def compile_key(identity: dict) -> str:
    """What an engine's compiled graphs depend on (a first start of a key compiles; later ones reuse)."""
    keep = ("engine", "model", "dtype", "batch_invariant", "attention_backend", "enforce_eager", "max_model_len")
    return json.dumps({k: identity.get(k) for k in keep}, sort_keys=True)


def profiled(identity: dict) -> bool:
    """An engine sized by profiling the free GPU memory, which another engine's start or stop disturbs."""
    return not identity.get("kv_cache_gib")


def sendable(exc: BaseException) -> BaseException:
    """An exception that survives pickling, carrying the server's traceback as a note."""
    note = "engine server traceback:\n" + "".join(traceback.format_exception(exc)).rstrip()
    try:
        copy = pickle.loads(pickle.dumps(exc))
    except Exception:  # noqa: BLE001 - an exception that cannot travel travels as its text
        copy = EngineServiceError(f"{type(exc).__name__}: {exc}")
    copy.add_note(note)
    return copy


def one_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[-1] if lines else ''}"


def _connect(address: str, key: bytes, what: str):
    try:
        return Client(address, family="AF_UNIX", authkey=key)
    except (OSError, EOFError, AuthenticationError) as e:
        raise EngineServiceError(f"cannot reach {what} at {address} ({type(e).__name__}: {e}); the runner or "
                                 f"campaign that started it has ended: run the stage through it again") from None


# --------------------------------------------------------------------------- the stage's side

class ServedExecutor:
    """A stage's units on an engine leased from the run's broker (executor ``local``, shared engine)."""

    name = "shared"
    reports_progress = True  # the server forwards the unit's progress as it happens

    def __init__(self, params, invariant: bool = False, stage: str = ""):
        from ..measure.vllm_setup import engine_identity
        self.config, self.conn, self.broker = params.config, None, None
        self.want = engine_identity(params, invariant)
        address, key = os.environ[BROKER_ENV], bytes.fromhex(os.environ.get(BROKER_KEY_ENV, ""))
        self.broker = _connect(address, key, "the run's engine broker")
        try:
            self.info = self._lease(params, invariant, stage)
            if self.info["identity"] != self.want:
                raise EngineServiceError(f"config '{params.config}': the broker leased an engine of another identity "
                                         f"({_difference(self.info['identity'], self.want)}); refusing it")
            self.conn = _connect(self.info["address"], bytes.fromhex(self.info["key"]), "the shared engine server")
            self._request(("configure", params), "configure")
        except BaseException:
            self.close()
            raise
        self.lease_info = {"server_pid": self.info["pid"], "started_for_this_stage": self.info["started"],
                           "start_s": self.info["start_s"], "log": self.info["log"]}

    def _lease(self, params, invariant: bool, stage: str) -> dict:
        self.broker.send(("lease", self.want, params, invariant, f"{params.config} {stage}".strip()))
        while True:
            try:
                kind, payload = self.broker.recv()
            except (EOFError, OSError):
                raise EngineServiceError(f"config '{params.config}': the run's engine broker went away while leasing "
                                         f"an engine (the runner or campaign ended)") from None
            if kind == "starting":
                log.info("config %s: starting a shared vLLM engine (pid %d, %s; its log: %s)", params.config,
                         payload["pid"], self.want["serving"], payload["log"])
            elif kind == "error":
                raise payload
            else:
                return payload

    def _request(self, message: tuple, label: str):
        self.conn.send(message)
        while True:
            try:
                kind, *payload = self.conn.recv()
            except (EOFError, OSError):
                raise EngineServiceError(f"config '{self.config}': the shared engine server (pid {self.info['pid']}) "
                                         f"ended while running {label}; its log: {self.info['log']}") from None
            if kind == "progress":
                progress.apply(payload[0])
            elif kind == "log":
                log.log(payload[0], "%s", payload[1])
            elif kind == "error":
                raise payload[0]
            else:
                return payload[0]

    def call(self, fn, *args):
        _check_unit(fn)
        return self._request(("call", fn, args), getattr(fn, "__name__", "a unit"))

    def map(self, fn, units: list, ordered: bool = True):
        """Yield (label, fn(engine, *args)) per unit, in order (one engine runs them one at a time)."""
        _check_unit(fn)
        for label, args in units:
            yield label, self._request(("call", fn, args), label)

    def close(self) -> None:
        """Give the engine back (it stays up for the run's next stage)."""
        for conn in (self.conn, self.broker):
            if conn is not None:
                with contextlib.suppress(OSError, EOFError):
                    conn.send(("release",))
                conn.close()
        self.conn = self.broker = None


def _check_unit(fn) -> None:
    """The server imports a unit by its module and name: a lambda or a notebook's own function cannot go."""
    if getattr(fn, "__module__", "__main__") == "__main__" or "<" in getattr(fn, "__qualname__", "<"):
        raise ValueError(f"{getattr(fn, '__qualname__', fn)!r}: a shared engine runs functions of an importable "
                         f"module (replaylib's stage units); define it in a module, or set shared_engine: false")


def _difference(have: dict, want: dict) -> str:
    return ", ".join(f"{k}: {have.get(k)!r} there, {want.get(k)!r} here"
                     for k in sorted(set(have) | set(want)) if have.get(k) != want.get(k))


# --------------------------------------------------------------------------- the broker

class _Server:
    """The broker's handle on one engine server process."""

    def __init__(self, number: int, identity: dict, params, invariant: bool, broker: "EngineBroker"):
        self.number, self.identity, self.params, self.invariant = number, identity, params, invariant
        self.address = str(broker.private / f"engine-{number}.sock")
        self.key = secrets.token_bytes(32)
        self.log = broker.log_dir / f"engine-{number}.log"
        self.state, self.proc = "starting", None
        self.events = {"identity": identity, "log": str(self.log), "leases": []}

    @functools.cached_property
    def need(self) -> int | None:
        """The GPU memory its engine takes (vllm_setup.engine_need), read once."""
        return vllm_setup.engine_need(self.params)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def launch(self, broker: "EngineBroker") -> None:
        """Start the server process (its engine then loads: wait_ready)."""
        spec = broker.private / f"engine-{self.number}.json"
        self.status = broker.private / f"engine-{self.number}.status"
        payload = {"address": self.address, "key": self.key.hex(), "invariant": self.invariant,
                   "owner": os.getpid(), "status": str(self.status), "params": self.params}
        fd = os.open(spec, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as f:
            pickle.dump(payload, f)
        from ..core.paths import REPO
        env = {k: v for k, v in os.environ.items() if k not in (BROKER_ENV, BROKER_KEY_ENV)}
        env["PYTHONPATH"] = os.pathsep.join([str(REPO)] + [p for p in [env.get("PYTHONPATH")] if p])
        env.setdefault("VLLM_CACHE_ROOT", str(broker.root / "runs" / ".vllm-cache"))
        self.log.parent.mkdir(parents=True, exist_ok=True)
        self.events["start_began"] = time.time()
        from ..core.files import open_new
        with open_new(self.log) as out:  # never through a link planted at its name
            self.proc = subprocess.Popen([sys.executable, "-m", "replaylib.runtime.engine_service", str(spec)], cwd=REPO,
                                         env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                         start_new_session=True)
        self.events["pid"] = self.proc.pid

    def wait_ready(self) -> None:
        """Wait until the server's engine is up, or raise its one-line error."""
        while True:
            if self.status.exists():
                result = json.loads(self.status.read_text())
                if "error" in result:
                    self.stop()
                    from ..measure.engine import EngineUnavailable
                    cls = EngineUnavailable if result.get("type") == "EngineUnavailable" else EngineServiceError
                    raise cls(result["error"])
                ready = time.time()
                self.events.update({"ready": ready, "start_s": round(ready - self.events["start_began"], 2),
                                    "engine": result["describe"]})
                return
            if self.proc.poll() is not None:
                raise EngineServiceError(f"the vLLM engine server (pid {self.proc.pid}) exited with code "
                                         f"{self.proc.returncode} while starting: {_last_line(self.log)} (its log: "
                                         f"{self.log})")
            time.sleep(0.2)

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> None:
        """SIGTERM (the server closes its engine and exits), then SIGKILL after timeout_s."""
        if self.proc is None or "stopped" in self.events:
            return
        began = time.time()
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                log.warning("vLLM engine server %d (pid %d) still ran %.0f s after SIGTERM; killed", self.number,
                            self.proc.pid, timeout_s)
                self.proc.kill()
                self.proc.wait()
        self.state = "stopped"
        self.events.update({"stop_began": began, "stopped": time.time(), "stop_s": round(time.time() - began, 2),
                            "exit_code": self.proc.returncode})

    def info(self, started: bool) -> dict:
        return {"address": self.address, "key": self.key.hex(), "pid": self.proc.pid, "identity": self.identity,
                "started": started, "start_s": self.events.get("start_s") if started else None,
                "log": str(self.log)}


def _last_line(path: Path) -> str:
    try:
        lines = [ln for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return "no log"
    return lines[-1][-300:] if lines else "no output"


class EngineBroker:
    """Leases engine servers to the stages of one run or campaign (see the module's docstring)."""

    def __init__(self, out_dir=None):
        from ..core.paths import out_root
        self.root = out_root(out_dir).resolve()
        remove_left_behind(PRIVATE_PREFIX)  # by brokers killed outright: a stale broker.sock in each
        # 0700, ours alone; named with our pid, so that a later broker knows it stale once we are gone
        self.private = Path(tempfile.mkdtemp(prefix=f"{PRIVATE_PREFIX}{os.getpid()}-"))
        self.key = secrets.token_bytes(32)
        self.address = str(self.private / "broker.sock")
        self.listener = Listener(self.address, family="AF_UNIX")  # each connection authenticates in its thread
        self.log_dir = self.root / "runs" / ".engines" / f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
        self.servers: list[_Server] = []
        self.cond = threading.Condition()
        self.compiled, self.compiling = set(), set()
        self.closed = False
        self.opened = time.time()
        threading.Thread(target=self._accept, name="engine-broker", daemon=True).start()

    def env(self) -> dict:
        return {BROKER_ENV: self.address, BROKER_KEY_ENV: self.key.hex()}

    def _accept(self) -> None:
        while not self.closed:
            try:
                conn = self.listener.accept()
            except OSError:
                continue
            threading.Thread(target=self._serve_lease, args=(conn,), name="engine-lease", daemon=True).start()

    def _serve_lease(self, conn) -> None:
        server, who = None, "?"
        if not authenticated(conn, self.key, AUTH_TIMEOUT_S):
            conn.close()
            return
        try:
            kind, identity, params, invariant, who = conn.recv()
            server, started = self._acquire(identity, params, invariant, who, conn)
            conn.send(("ok", server.info(started)))
            conn.recv()  # the stage's release, or its end
        except (EOFError, OSError):
            pass
        except Exception as e:  # noqa: BLE001 - the stage gets it as its own error
            with contextlib.suppress(OSError, EOFError):
                conn.send(("error", sendable(e)))
        finally:
            if server is not None:
                self._release(server)
            conn.close()

    def _acquire(self, identity: dict, params, invariant: bool, who: str, conn, deadline=None):
        """(the server leased, whether it started for this lease); deadline: of the waits for memory, all starts'."""
        key, said = compile_key(identity), False
        deadline = deadline or time.monotonic() + params.vllm_memory_wait_s
        with self.cond:
            while True:
                if self.closed:
                    raise EngineServiceError("the run is ending: no more engines are leased")
                for s in self.servers:
                    if s.state in ("idle", "busy") and not s.alive():
                        s.state = "dead"
                live = [s for s in self.servers if s.state in ("starting", "idle", "busy", "stopping")]
                idle = [s for s in live if s.state == "idle" and s.identity == identity]
                if idle:
                    self._lease_to(idle[0], who)
                    return idle[0], False
                exclusive = profiled(identity) or any(profiled(s.identity) for s in live)
                if key in self.compiling or (exclusive and any(s.state != "idle" for s in live)):
                    self.cond.wait()  # a first compilation, or an engine that must be alone on the GPU
                    continue
                to_stop = [s for s in live if s.state == "idle"] if exclusive else self._room_for(params, live)
                if to_stop is None and time.monotonic() < deadline:
                    if not said:
                        log.info("config %s: its engine waits for engines starting or busy to leave room (at most "
                                 "%g s)", params.config, params.vllm_memory_wait_s)
                        said = True
                    self.cond.wait(timeout=2.0)  # a start ending or an engine released: the memory changed
                    continue
                to_stop = to_stop or []
                for s in to_stop:
                    s.state = "stopping"
                server = _Server(len(self.servers) + 1, identity, params, invariant, self)
                self.servers.append(server)
                if key not in self.compiled:
                    self.compiling.add(key)
                break
        try:
            for s in to_stop:  # profiled engines do not share the GPU; others stop for room
                s.stop()
            with self.cond:
                self.cond.notify_all()
            server.launch(self)
            with contextlib.suppress(OSError, EOFError):
                conn.send(("starting", {"pid": server.proc.pid, "log": str(server.log)}))
            server.wait_ready()
        except BaseException as e:
            server.stop()
            with self.cond:
                server.state = "failed"
                self.compiling.discard(key)
                self.cond.notify_all()
            if gpu_memory.start_raced(str(e)) and time.monotonic() < deadline:  # another process took the memory
                log.info("config %s: its engine's start found the memory taken (%s); it starts again", params.config, e)
                return self._acquire(identity, params, invariant, who, conn, deadline)
            raise
        with self.cond:
            self.compiled.add(key)
            self.compiling.discard(key)
            self._lease_to(server, who)
            self.cond.notify_all()
        return server, True

    def _room_for(self, params, live: list[_Server]) -> list[_Server] | None:
        """gpu_memory.room_to_start for a new engine with a fixed KV cache beside the live ones: the idle servers
        to stop, or None to wait for starts to end and busy engines to be released."""
        if not live:  # alone on the GPU: no need to read it or the model's weights
            return []
        idle = sorted((s for s in live if s.state == "idle"), key=lambda s: s.events["leases"][-1].get("released", 0))
        stop = gpu_memory.room_to_start(vllm_setup.engine_need(params), gpu_memory.free_bytes_now(), idle,
                                        [s for s in live if s.state == "starting"], lambda s: s.need)
        for server in stop or []:
            server.events["stopped_for_room"] = True
        if stop:
            log.info("stopping %d idle vLLM engine(s) to make room for config %s's engine", len(stop), params.config)
        return stop

    def _lease_to(self, server: _Server, who: str) -> None:
        server.state = "busy"
        server.events["leases"].append({"stage": who, "leased": time.time()})

    def _release(self, server: _Server) -> None:
        with self.cond:
            if server.events["leases"] and "released" not in server.events["leases"][-1]:
                server.events["leases"][-1]["released"] = time.time()
            if server.state == "busy":
                server.state = "idle" if server.alive() else "dead"
            self.cond.notify_all()

    def close(self) -> None:
        """Stop every engine server (side by side) and write runs/.engines/<run>/engines.json."""
        with self.cond:
            if self.closed:
                return
            self.closed = True
            servers = list(self.servers)
            self.cond.notify_all()
        with contextlib.suppress(OSError):
            self.listener.close()
        threads = [threading.Thread(target=s.stop) for s in servers]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if any(s.identity.get("engine") == "vllm" for s in servers):
            from .vllm_processes import reap_leftover_engines
            reap_leftover_engines()  # the engine cores of a server that was killed outright
        if servers:
            self.write_record(servers)
        shutil.rmtree(self.private, ignore_errors=True)

    def write_record(self, servers) -> Path:
        from ..core.files import atomic_write_json
        path = self.log_dir / "engines.json"
        atomic_write_json(path, {"opened": self.opened, "closed": time.time(),
                                 "servers": [s.events for s in sorted(servers, key=lambda s: s.number)]})
        return path

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


# --------------------------------------------------------------------------- the server

def _terminate(signum, frame):
    raise SystemExit(0)  # asked to stop: the engine closes on the way out


@contextlib.contextmanager
def _forwarding(conn):
    """While a unit runs: its progress and its replaylib log lines go to the stage as they happen."""
    def send(message):
        with contextlib.suppress(OSError, EOFError, ValueError):
            conn.send(message)
    with progress.forwarding(send):
        yield


def _serve_stage(engine, conn) -> None:
    """One stage's requests, until it releases the engine or goes away."""
    while True:
        try:
            data = conn.recv_bytes()
        except (EOFError, OSError):
            return
        try:
            message = pickle.loads(data)  # a unit this process cannot import is the stage's error
            kind = message[0]
            if kind == "release":
                return
            if kind == "configure":
                engine.configure(message[1])
                reply = ("result", None)
            elif kind == "call":
                _, fn, args = message
                with _forwarding(conn):
                    reply = ("result", fn(engine, *args))
            else:
                raise EngineServiceError(f"unknown request {kind!r}")
        except Exception as e:  # noqa: BLE001 - the stage raises it as its own
            reply = ("error", sendable(e))
        try:
            conn.send(reply)
        except (OSError, EOFError):
            return
        except Exception as e:  # noqa: BLE001 - a result that cannot be pickled
            with contextlib.suppress(OSError, EOFError):
                conn.send(("error", sendable(EngineServiceError(f"the unit's result cannot be sent back: {e}"))))


def serve(spec_path: str) -> int:
    """The engine server: build the engine, say so, then serve stages one at a time until stopped."""
    with open(spec_path, "rb") as f:
        spec = pickle.load(f)
    os.unlink(spec_path)  # it holds the server's key
    stop_with_parent(spec["owner"])  # the broker's process, killed outright included
    signal.signal(signal.SIGTERM, _terminate)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the run stops its servers itself
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s [replaylib engine server] %(message)s"))
    logging.getLogger("replaylib").addHandler(handler)
    logging.getLogger("replaylib").setLevel(logging.INFO)
    params = spec["params"]
    from ..core.files import atomic_write_json
    try:
        from ..measure.engines import make_engine
        from .vllm_processes import EngineProcesses
        from ..core import recording
        engine = recording.built(lambda: make_engine(params, invariant=spec["invariant"], lifecycle=EngineProcesses()))
    except BaseException as e:  # noqa: BLE001 - the broker relays it to the stage in one line
        traceback.print_exc()
        message = str(e).strip().splitlines()[-1] if str(e).strip() else one_line(e)
        atomic_write_json(Path(spec["status"]), {"error": message, "type": type(e).__name__})
        return 1
    try:
        listener = Listener(spec["address"], family="AF_UNIX", authkey=bytes.fromhex(spec["key"]))
        log.info("engine up (config %s, %s): %s", params.config, engine.describe().get("serving"), engine.describe())
        atomic_write_json(Path(spec["status"]), {"ready": True, "pid": os.getpid(), "describe": engine.describe()})
        while True:
            try:
                conn = listener.accept()
            except (OSError, EOFError, AuthenticationError):
                continue
            with conn:
                _serve_stage(engine, conn)
    finally:
        engine.close()


if __name__ == "__main__":
    sys.exit(serve(sys.argv[1]))
