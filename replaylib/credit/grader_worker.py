"""A user's grader in a process of its own (python -m replaylib.credit.grader_worker MODULE:FUNCTION KIND):
one JSON request a line on stdin, one JSON reply a line on the descriptor stdout had. What the grader prints,
to either stream or from C code, goes to a file the worker counts and empties after each call, so it never
reaches the terminal; sys.exit inside it is a reply, not the end of the run; the process ends with its
parent."""
from __future__ import annotations

import importlib
import json
import os
import sys
import tempfile

from ..core.processes import stop_with_parent

HEAD = 300  # characters of a call's printed output kept for the summary


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


def main(spec: str, kind: str) -> None:
    replies = os.fdopen(os.dup(1), "w", encoding="utf-8")
    sink = tempfile.TemporaryFile()
    os.dup2(sink.fileno(), 1)
    os.dup2(sink.fileno(), 2)
    stop_with_parent(os.getppid())

    def reply(**fields):
        replies.write(json.dumps(fields) + "\n")
        replies.flush()

    from .grader_calls import call_grader, describe_failure
    module, _, name = spec.partition(":")
    try:
        fn = getattr(importlib.import_module(module), name)
    except BaseException as e:  # noqa: BLE001 - any failure to import is the user's, named in one line
        reply(error=describe_failure(e), printed=_printed(sink)[0])
        return
    reply(ready=True, printed=_printed(sink)[0])
    for line in sys.stdin:
        request = json.loads(line)
        try:
            score, error = call_grader(fn, kind, request), None
        except BaseException as e:  # noqa: BLE001 - the user's grader: reported, not trusted
            score, error = None, describe_failure(e)
        printed, head = _printed(sink)
        reply(score=score, error=error, printed=printed, head=head)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
