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
    """A grader's return value as a finite float: a number (a one-element tensor or array too), or a dict
    with 'score'."""
    if isinstance(value, dict):
        value = value.get("score")
    if hasattr(value, "item") and not isinstance(value, numbers.Real):  # a tensor or array of one number
        try:
            value = value.item()
        except (ValueError, RuntimeError):
            pass
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise GraderFailed(f"returned {type(value).__name__}, not a number or a dict with 'score'")
    value = float(value)
    if not math.isfinite(value):
        raise GraderFailed(f"returned {value}, not a finite score")
    return value


KINDS = ("verl", "trl", "openrlhf")


def kind_of(fn) -> str:
    """A grader's kind from its parameters: TRL's reward functions take `completions`, OpenRLHF's
    `queries`; anything else is called as verl's compute_score."""
    import inspect
    try:
        names = set(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return "verl"
    return "trl" if "completions" in names else "openrlhf" if "queries" in names else "verl"


def _first(values, kind: str):
    """The one score of a batch-style grader called on one completion (a list, a tensor, an array, or
    OpenRLHF's dict with 'rewards')."""
    if isinstance(values, dict) and kind == "openrlhf":
        values = values.get("rewards", values.get("scores"))
    if hasattr(values, "tolist"):
        values = values.tolist()
    if not isinstance(values, (list, tuple)) or len(values) != 1:
        raise GraderFailed(f"returned {type(values).__name__} {short(values)}, not a list of one score for one "
                           f"completion")
    return values[0]


def call_grader(fn, kind: str, request: dict) -> float:
    """One grade, the grader called as its kind calls it (docs/credit.md). request: data_source,
    solution_str (the graded text), ground_truth, extra_info, prompt (the prompt's text), columns (the
    rollout's other fields) and ground_truth_name (the field the ground truth was read from)."""
    text, gold = request["solution_str"], request["ground_truth"]
    if kind == "trl":
        columns = {k: [v] for k, v in (request.get("columns") or {}).items()}
        columns[request.get("ground_truth_name") or "ground_truth"] = [gold]
        return as_score(_first(fn(prompts=[request.get("prompt", "")], completions=[text], **columns), kind))
    if kind == "openrlhf":
        prompt = request.get("prompt", "")
        return as_score(_first(fn([prompt + text], [prompt], [gold]), kind))
    return as_score(fn(request["data_source"], text, gold, request.get("extra_info")))
