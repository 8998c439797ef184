"""Writing files safely: atomically (a reader sees the old bytes or the new ones), never through a link, with one-line errors naming the file."""
from __future__ import annotations

import errno
import hashlib
import json
import os
import tempfile
from pathlib import Path

_UMASK = os.umask(0)
os.umask(_UMASK)  # read, not changed: importing the package leaves the process's umask as it was


FILE_MODE = 0o666 & ~_UMASK  # what open() would give: a shared results directory keeps its group's access


def _no_space(path: Path, e: OSError, tmp=None) -> OSError:
    """A write error naming the file written (a full disk names none by itself; a temporary file is not
    what the user knows)."""
    if e.errno == errno.ENOSPC or "No space left" in str(e):
        return OSError(errno.ENOSPC, f"{path}: no space left on the disk; free space or set REPLAYLIB_OUT (or "
                                     f"--out) to another disk")
    detail = e.strerror or str(e)
    if tmp is not None:
        detail = detail.replace(str(tmp), str(path))
    return OSError(e.errno, f"{path}: cannot write ({detail})")


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write to a temporary file beside path, then rename it over path: a reader sees the old bytes or the
    new ones, and a symbolic link at path is replaced, never written through."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        os.fchmod(fd, FILE_MODE)  # mkstemp creates 0600
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as e:
        if tmp:
            Path(tmp).unlink(missing_ok=True)
        raise _no_space(path, e, tmp) from None
    except BaseException:
        if tmp:
            Path(tmp).unlink(missing_ok=True)
        raise


def atomic_copy(src: Path, dst: Path) -> None:
    """Copy a file's bytes to dst as atomic_write_bytes writes them (a link at dst is replaced)."""
    atomic_write_bytes(Path(dst), Path(src).read_bytes())


def open_new(path: Path):
    """A text file opened for writing from empty, for a log: whatever is at path (a symbolic link
    included) is replaced, never written through."""
    try:
        path.unlink(missing_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, FILE_MODE)
    except OSError as e:
        raise _no_space(path, e) from None
    return os.fdopen(fd, "w")


def atomic_write_json(path: Path, obj) -> None:
    atomic_write_bytes(path, (json.dumps(obj, indent=2, default=str) + "\n").encode())


def atomic_save(path: Path, writer) -> None:
    """Call writer(tmp_path) (e.g. DataFrame.to_parquet) and rename the result into place."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.unlink(missing_ok=True)  # the writer opens the name: nothing may stand there, a link least of all
        writer(tmp)
        os.chmod(tmp, FILE_MODE)  # some writers (safetensors) create 0600
        os.replace(tmp, path)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise _no_space(path, e, tmp) from None
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def sha256_file(path: Path | str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
