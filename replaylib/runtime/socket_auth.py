"""A Unix-socket peer's proof that it holds a key, with a deadline."""
from __future__ import annotations

import contextlib
import os
import socket
import threading
from multiprocessing import AuthenticationError
from multiprocessing.connection import answer_challenge, deliver_challenge


def authenticated(conn, key: bytes, timeout_s: float) -> bool:
    """Whether the peer proves within timeout_s that it holds the key (multiprocessing's challenge both ways,
    as Listener(authkey=) does in accept(), but with a deadline: a silent peer's socket is shut down)."""
    lock, finished = threading.Lock(), []

    def hang_up():
        with lock, contextlib.suppress(OSError):
            if not finished:
                with socket.socket(fileno=os.dup(conn.fileno())) as s:
                    s.shutdown(socket.SHUT_RDWR)  # wakes the read waiting for the peer
    timer = threading.Timer(timeout_s, hang_up)
    timer.start()
    try:
        deliver_challenge(conn, key)
        answer_challenge(conn, key)
        return True
    except (OSError, EOFError, AuthenticationError):
        return False
    finally:
        with lock:
            finished.append(True)
        timer.cancel()
