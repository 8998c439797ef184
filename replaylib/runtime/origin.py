"""Signing manifests: a stage this user ran has its manifest signed with a secret of theirs, so that a run
received from someone else (which cannot carry a valid signature) is never copied into one of theirs."""
from __future__ import annotations

import functools
import hmac
import json
import os
import secrets
from pathlib import Path

ORIGIN_KEY = Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config") / "replaylib" / "origin.key"


@functools.lru_cache(maxsize=1)
def _origin_key() -> bytes | None:
    """The key, made on first use (readable by this user alone); None where it cannot be made."""
    try:
        return ORIGIN_KEY.read_bytes()
    except FileNotFoundError:
        pass
    except OSError:
        return None
    try:
        ORIGIN_KEY.parent.mkdir(parents=True, exist_ok=True)
        tmp = ORIGIN_KEY.with_name(f".{ORIGIN_KEY.name}.{os.getpid()}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(secrets.token_bytes(32))
        try:
            os.link(tmp, ORIGIN_KEY)  # the first process to make one wins
        except FileExistsError:
            pass
        finally:
            tmp.unlink()
        return ORIGIN_KEY.read_bytes()
    except OSError:
        return None


def origin(manifest: dict) -> str | None:
    """The signature of a manifest (all of it but ``origin``, as JSON reads it back) under this user's key."""
    key = _origin_key()
    if key is None:
        return None
    body = json.loads(json.dumps({k: v for k, v in manifest.items() if k != "origin"}, default=str))
    return hmac.new(key, json.dumps(body, sort_keys=True).encode(), "sha256").hexdigest()


def made_here(manifest: dict) -> bool:
    """The manifest was written by a stage this user ran (or copied), and not changed since."""
    signature = origin(manifest)
    return signature is not None and hmac.compare_digest(str(manifest.get("origin", "")), signature)
