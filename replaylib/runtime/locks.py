"""One runner at a time per configuration and stage."""
from __future__ import annotations

import fcntl
import hashlib
import hmac
import json
import logging
import os
import time
from pathlib import Path

from ..core.files import FILE_MODE
from ..core.paths import config_dir
from ..core.processes import alive

log = logging.getLogger("replaylib")


class StageBusy(RuntimeError):
    pass


LOCK_TOKEN_ENV = "REPLAYLIB_STAGE_LOCK"  # set by the runner: it holds the stage's lock for its kernel
STOPS_WITH_ENV = "REPLAYLIB_STOPS_WITH"  # set by a campaign for its runners: the pid they stop with
# a runner whose campaign has ended stops its stage within this (its kernel's grace included): a rerun waits
STOPPING_WAIT_S = 120.0


def _token_digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


class StageLock:
    """One runner at a time per configuration and stage: an exclusive flock on
    runs/<config>/.locks/<stage>.lock, held from the stage's start to its end (released with the
    process, whatever kills it). The runner takes it before it clears or starts a stage and hands it
    to the stage's kernel by a token in the environment; the lock file records only the token's
    sha256, so reading the file gives no one the token."""

    def __init__(self, root: Path, config: str, stage: str):
        self.path = config_dir(config, root) / ".locks" / f"{stage}.lock"
        self.config, self.stage, self.fd = config, stage, None
        self.handed = False  # held for us by the runner that started this process

    def holder(self) -> dict:
        try:
            holder = json.loads(self.path.read_text() or "{}")
        except (OSError, ValueError):
            return {}
        return holder if isinstance(holder, dict) else {}

    def acquire(self, token: str | None = None, reentrant: bool = False) -> "StageLock":
        """Take the lock, or raise StageBusy naming who holds it; a lock its holder handed to us (the
        token the runner put in the environment) is ours already, and so, with reentrant, is one this
        process took already (a notebook cell run again after a failure). A holder that is stopping (a
        campaign's runner whose campaign has ended) is waited for, at most STOPPING_WAIT_S."""
        if str(self.path) in _HELD:
            if not reentrant:
                raise StageBusy(f"this process (pid {os.getpid()}) is running {self.stage} of {self.config} already "
                                f"({self.path})")
            self.fd = _HELD[str(self.path)]
            return self
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise OSError(f"{self.path.parent}: cannot create the run directory ({e.strerror or e}); fix the path "
                          f"or set REPLAYLIB_OUT") from None
        try:
            fd = open_lock(self.path)
        except OSError as e:
            raise OSError(f"{self.path}: cannot open the stage's lock ({e.strerror or e}); remove what is there "
                          f"(a lock is a plain file)") from None
        if not try_lock(fd):
            holder = self.holder()
            if token and hmac.compare_digest(str(holder.get("token_sha256", "")), _token_digest(token)):
                os.close(fd)
                self.handed = True  # the runner that started this kernel holds it for us
                return self
            stopping = _stopping(holder)
            if stopping:
                log.warning("%s of %s: waiting for runner pid %s to stop (its campaign, pid %s, has ended; at "
                            "most %.0f s)", self.stage, self.config, holder.get("pid"), holder["stops_with"],
                            STOPPING_WAIT_S)
            if not (stopping and try_lock(fd, wait_s=STOPPING_WAIT_S)):
                os.close(fd)
                raise StageBusy(self._busy(holder))
        os.ftruncate(fd, 0)
        stops_with = os.environ.get(STOPS_WITH_ENV, "")
        os.write(fd, json.dumps({"pid": os.getpid(), "token_sha256": _token_digest(token) if token else "",
                                 "started": time.time(),
                                 "stops_with": int(stops_with) if stops_with.isdigit() else None}).encode())
        self.fd = _HELD[str(self.path)] = fd
        return self

    def _busy(self, holder: dict) -> str:
        pid = holder.get("pid", "?")
        if _stopping(holder):
            return (f"runner pid {pid} still holds {self.stage} of {self.config} ({self.path}) {STOPPING_WAIT_S:.0f} s "
                    f"after its campaign (pid {holder['stops_with']}) ended; stop it (kill {pid}), then rerun")
        return (f"another runner (pid {pid}) is running {self.stage} of {self.config} ({self.path}); wait for it "
                f"to finish, or stop it (a notebook kernel that ran the stage holds it until the kernel ends)")

    def release(self) -> None:
        if self.fd is not None:
            _HELD.pop(str(self.path), None)
            fcntl.flock(self.fd, fcntl.LOCK_UN)
            os.close(self.fd)
            self.fd = None


_HELD: dict[str, int] = {}  # lock file -> descriptor, for the stage locks this process holds


def _stopping(holder: dict) -> bool:
    """Whether a lock's holder is a campaign's runner whose campaign has ended (it stops with it)."""
    return isinstance(holder.get("stops_with"), int) and not alive(holder["stops_with"])


def open_lock(path: Path, create: bool = True) -> int:
    """A lock file's descriptor (OSError if it cannot be opened). A lock is a plain file: a link planted at its
    path is replaced, not written through."""
    if create and path.is_symlink():
        path.unlink()
    return os.open(path, os.O_RDWR | os.O_NOFOLLOW | (os.O_CREAT if create else 0), FILE_MODE)


def try_lock(fd: int, wait_s: float = 0.0) -> bool:
    """Take the exclusive lock on fd, trying for up to wait_s; whether it was taken."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.2)
