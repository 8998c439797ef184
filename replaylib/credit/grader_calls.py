"""How a grader is called, in the tool's process (the built-in ones) or in a grader process of its own (a
user's): its kind's signature, and what it returned as one finite score or an error naming what was wrong."""
from __future__ import annotations

import math
import numbers

from ..core.text import short


class GraderFailed(RuntimeError):
    """The grader raised, ended, hung or returned something that is not a finite score."""


def describe_failure(e: BaseException) -> str:
    if isinstance(e, GraderFailed):
        return str(e)
    if isinstance(e, SystemExit):
        return f"called sys.exit({short(e.code)})"
    text = " ".join(str(e).split())  # one line
    return f"raised {e.__class__.__name__}: {text[:160]}"


def as_score(value) -> float:
    """A grader's return value as a finite float: a number, or a dict with 'score'."""
    if isinstance(value, dict):
        value = value.get("score")
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise GraderFailed(f"returned {type(value).__name__}, not a number or a dict with 'score'")
    value = float(value)
    if not math.isfinite(value):
        raise GraderFailed(f"returned {value}, not a finite score")
    return value


def call_grader(fn, kind: str, request: dict) -> float:
    """One grade. request: data_source, solution_str, ground_truth (as the rollout gives them)."""
    return as_score(fn(request["data_source"], request["solution_str"], request["ground_truth"], None))
