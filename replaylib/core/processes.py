"""Processes that end with the process that started them, and what processes killed outright leave."""
from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import tempfile
import threading
import time
from pathlib import Path


def stop_with_parent(parent: int, poll_s: float = 0.5) -> None:
    """SIGTERM this process once its parent, ``parent``, is gone (at once when it is gone already): a parent
    killed outright tells its children nothing, and they would run on."""
    def watch():
        while os.getppid() == parent:
            time.sleep(poll_s)
        os.kill(os.getpid(), signal.SIGTERM)
    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def alive(pid: int) -> bool:
    """Whether process ``pid`` is running (a zombie, dead but not yet reaped, is not)."""
    import psutil
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def remove_left_behind(prefix: str) -> None:
    """Remove this user's temporary directories <prefix><pid>-* whose process is gone: a process killed
    outright cannot remove its own."""
    for d in Path(tempfile.gettempdir()).glob(prefix + "*"):
        owner = re.fullmatch(re.escape(prefix) + r"(\d+)-\w+", d.name)
        with contextlib.suppress(OSError):
            if owner and not d.is_symlink() and d.stat().st_uid == os.getuid() and not alive(int(owner[1])):
                shutil.rmtree(d)
