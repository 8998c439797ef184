"""Seeds hashed from what they identify (problem, rollout, position, arm, k), never from call order."""
from __future__ import annotations

import hashlib


def stable_seed(*parts) -> int:
    """A 31-bit seed from what it identifies (problem, rollout, position, arm, k), never call order."""
    digest = hashlib.sha256("|".join(map(str, parts)).encode()).digest()
    return int.from_bytes(digest[:4], "little") & 0x7FFFFFFF


def trunk_seed(problem_id: int, rollout: int) -> int:
    return stable_seed(problem_id, "trunk", rollout)


def continuation_seed(problem_id: int, rollout: int, abs_pos: int, arm: str, k: int) -> int:
    return stable_seed(problem_id, rollout, abs_pos, arm, k)
