"""The credit tool's output directory: never one holding files the tool did not write (a user's summary.json
or report.html stays theirs; --out at a repository's root is refused), and one run at a time in it (an
exclusive lock, released with the process whatever ends it)."""
from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
from pathlib import Path

from ..core.files import atomic_write_json
from ..runtime.locks import open_lock, try_lock
from .inputs import BadInput

MARKER = ".replaylib-credit"  # written first into every directory the tool writes to
LOCK = ".lock"


def check_out(out) -> Path:
    """--out as a directory the tool may write: new, empty, or one it wrote before; one line otherwise."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise BadInput(f"--out {out}: is a file, not a directory; give a directory for the results")
    if not out.exists():
        parent = next((p for p in out.parents if p.exists()), None)
        if parent is not None and not parent.is_dir():
            raise BadInput(f"--out {out}: {parent} is a file, not a directory; give a directory for the results")
        return out
    try:
        names = {p.name for p in out.iterdir() if not (p.name.startswith(".") and p.name.endswith(".tmp"))}
    except OSError as e:
        raise BadInput(f"--out {out}: cannot be read ({e.strerror or e}); give a directory you can write") from None
    if names and MARKER not in names:  # files named as the tool's outputs are not the tool's without its marker
        shown = ", ".join(sorted(names)[:3]) + (", ..." if len(names) > 3 else "")
        raise BadInput(f"--out {out}: holds files this tool did not write ({shown}); give a new or empty directory "
                       f"(the tool never writes over other files)")
    if LOCK in names:  # refused now, before a model is loaded, when another run holds it
        with _locked(out / LOCK, create=False):
            pass
    return out


@contextlib.contextmanager
def _locked(lock: Path, create: bool = True):
    """An exclusive flock on the lock file, or BadInput naming the run that holds it."""
    out = lock.parent
    try:
        fd = open_lock(lock, create)
    except OSError as e:
        raise BadInput(f"--out {out}: cannot be written ({e.strerror or e}); give a directory you can write") from None
    if not try_lock(fd):
        try:
            pid = json.loads(os.pread(fd, 4096, 0) or b"{}").get("pid", "?")
        except ValueError:
            pid = "?"
        os.close(fd)
        raise BadInput(f"--out {out}: another credit run (pid {pid}) is writing there; wait for it to finish or "
                       f"give another --out")
    try:
        yield fd
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


@contextlib.contextmanager
def holding(out: Path):
    """The directory made, marked as the tool's and locked for this run: a second run on it is refused in
    one line naming the holder's pid. A run that fails before writing anything leaves the directory as it
    found it (none, or empty)."""
    created = not out.exists()
    try:
        out.mkdir(parents=True, exist_ok=True)
        was_empty = not any(out.iterdir())
    except OSError as e:
        raise BadInput(f"--out {out}: cannot be written ({e.strerror or e}); give a directory you can write") from None
    if not (out / MARKER).exists():  # first: a directory holding anything of the tool's holds its marker
        atomic_write_json(out / MARKER, {"written_by": "python -m replaylib.credit"})
    with _locked(out / LOCK) as fd:
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps({"pid": os.getpid(), "started": time.time()}).encode(), 0)
        try:
            yield out
        except BaseException:
            if was_empty and set(os.listdir(out)) <= {MARKER, LOCK}:  # nothing of this run's to resume from
                _unmake(out, created)
            raise


def _unmake(out: Path, created: bool) -> None:
    """The marker and the lock removed (the lock still held), and the directory if this run made it."""
    for name in (MARKER, LOCK):
        (out / name).unlink(missing_ok=True)
    if created:
        with contextlib.suppress(OSError):  # another run's files appeared meanwhile: theirs to keep
            out.rmdir()
