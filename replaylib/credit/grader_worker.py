"""A user's grader in a process of its own (python -m replaylib.credit.grader_worker MODULE:FUNCTION KIND): one
JSON request a line on the pipe that was stdin, one JSON reply a line on the pipe that was stdout, each
reply carrying its request's ``call`` (a nonce). Both pipes are moved to descriptors far above those a
grader opens and closed in any process it starts, so that its code cannot read a request or write a reply by
accident (a stale descriptor, a hard-coded 3); its stdin is /dev/null. What the grader prints, to either
stream or from C code, goes to a file the worker counts and empties after each call, so it never reaches the
terminal; sys.exit inside it is a reply, not the end of the run; the process ends with its parent. Each
reply lists the files the grader's code came from and the files it read (``files``: its module, what it
imports outside the interpreter's own library, its data), so that a change to any of them recomputes the
grades made with them (replaylib.core.recording)."""
from __future__ import annotations

import fcntl
import importlib
import json
import os
import resource
import sys
import tempfile

from ..core.processes import stop_with_parent

HEAD = 300  # characters of a call's printed output kept for the summary
_read: set = set()  # files opened for reading outside the interpreter's own directories


def _system_dirs() -> tuple:
    import sysconfig
    dirs = {sys.prefix, sys.base_prefix, sys.exec_prefix, *sysconfig.get_paths().values(), "/proc", "/sys", "/dev",
            "/etc", "/usr", os.path.dirname(os.path.dirname(os.path.abspath(__file__)))}  # and this package
    return tuple(os.path.realpath(d) + os.sep for d in dirs if d)


SYSTEM = _system_dirs()


def _audit(event, args) -> None:
    if event == "open" and isinstance(args[0], (str, bytes, os.PathLike)):
        mode, flags = args[1], args[2]
        if (mode is None and isinstance(flags, int) and flags & (os.O_WRONLY | os.O_RDWR)) or \
                (mode is not None and any(c in str(mode) for c in "wax+")):
            return
        path = os.path.realpath(os.fsdecode(args[0]))
        if not path.startswith(SYSTEM) and os.path.isfile(path):
            _read.add(path)


def _used() -> list[str]:
    """The grader's files so far: its modules' sources (outside the interpreter's and this package's) and what
    it read."""
    for module in list(sys.modules.values()):
        path = getattr(module, "__file__", None)
        if isinstance(path, str) and path.endswith(".py"):
            real = os.path.realpath(path)
            if not real.startswith(SYSTEM) and os.path.isfile(real):
                _read.add(real)
    return sorted(_read)


def _printed(sink) -> tuple[int, str]:
    """Bytes the grader printed since the last call, and their first characters; the file emptied."""
    sys.stdout.flush()
    sys.stderr.flush()
    size = os.fstat(sink.fileno()).st_size
    head = os.pread(sink.fileno(), HEAD, 0).decode("utf-8", "replace") if size else ""
    os.ftruncate(sink.fileno(), 0)
    os.lseek(1, 0, os.SEEK_SET)
    os.lseek(2, 0, os.SEEK_SET)
    return size, head


def _hidden(fd: int) -> int:
    """A copy of fd at a descriptor number far above the lowest free ones (those a grader's files get),
    closed on exec."""
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    ceiling = 4096 if soft == resource.RLIM_INFINITY else min(soft, 4096)
    return fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, ceiling // 2)


def main(spec: str, kind: str) -> None:
    requests = os.fdopen(_hidden(0), "r", encoding="utf-8")
    replies = os.fdopen(_hidden(1), "w", encoding="utf-8")
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    sink = tempfile.TemporaryFile()
    os.dup2(sink.fileno(), 1)
    os.dup2(sink.fileno(), 2)
    stop_with_parent(os.getppid())

    def reply(**fields):
        replies.write(json.dumps(fields) + "\n")
        replies.flush()

    from .grader_calls import call_grader, describe_failure
    sys.addaudithook(_audit)  # this process runs only the user's grader
    module, _, name = spec.partition(":")
    try:
        fn = getattr(importlib.import_module(module), name)
    except BaseException as e:  # noqa: BLE001 - any failure to import is the user's, named in one line
        reply(error=describe_failure(e), printed=_printed(sink)[0])
        return
    reply(ready=True, printed=_printed(sink)[0], files=_used())
    for line in requests:
        request = json.loads(line)
        try:
            score, error = call_grader(fn, kind, request), None
        except BaseException as e:  # noqa: BLE001 - the user's grader: reported, not trusted
            score, error = None, describe_failure(e)
        printed, head = _printed(sink)
        reply(call=request["call"], score=score, error=error, printed=printed, head=head, files=_used())


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
