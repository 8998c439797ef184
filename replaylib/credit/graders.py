"""Graders: this package's gsm8k rule, math-verify's ``math``, or a user's MODULE:FUNCTION with verl's
signature ``compute_score(data_source, solution_str, ground_truth, extra_info=None)`` returning a number
or a dict with ``score``. Success is score > success_above."""
from __future__ import annotations

import importlib
import numbers

from ..measure.grading import grade_gsm8k
from .inputs import BadInput


class GraderFailed(RuntimeError):
    """The grader raised or returned something that is not a score."""


def _math_verify(data_source, solution_str, ground_truth, extra_info=None) -> float:
    from math_verify import parse, verify
    gold = parse(ground_truth if "$" in ground_truth or "\\boxed" in ground_truth else f"${ground_truth}$")
    return float(verify(gold, parse(solution_str)))


def _gsm8k(data_source, solution_str, ground_truth, extra_info=None) -> float:
    return float(grade_gsm8k(solution_str, ground_truth))


BUILT_IN = {"gsm8k": _gsm8k, "math": _math_verify}


def load(spec: str):
    """The scoring function of a grader spec, or BadInput in one line."""
    if spec in BUILT_IN:
        if spec == "math":
            try:
                import math_verify  # noqa: F401
            except ImportError:
                raise BadInput("--grader math: the math-verify library is not installed; "
                               "pip install math-verify==0.9.0") from None
        return BUILT_IN[spec]
    module, _, name = spec.partition(":")
    if not module or not name:
        raise BadInput(f"--grader {spec!r}: give gsm8k, math or MODULE:FUNCTION")
    try:
        fn = getattr(importlib.import_module(module), name)
    except Exception as e:  # noqa: BLE001 - any failure to import is the user's grader's, named in one line
        raise BadInput(f"--grader {spec}: cannot import it ({e.__class__.__name__}: {str(e)[:120]}); "
                       f"check the module is on PYTHONPATH and defines {name}") from None
    if not callable(fn):
        raise BadInput(f"--grader {spec}: {name} is not a function")
    return fn


def scorer(fn, spec: str, success_above: float):
    """grade(text, rollout) -> 0 or 1, with GraderFailed naming the grader when it fails."""
    def grade(text: str, rollout) -> int:
        try:
            score = fn(rollout.data_source, text, rollout.ground_truth, None)
        except Exception as e:  # noqa: BLE001 - the user's grader: reported, not trusted
            raise GraderFailed(f"--grader {spec} raised {e.__class__.__name__}: {str(e)[:120]}") from None
        if isinstance(score, dict):
            score = score.get("score")
        if not isinstance(score, numbers.Real):
            raise GraderFailed(f"--grader {spec} returned {type(score).__name__}, not a number or a dict with "
                               f"'score'")
        return int(float(score) > success_above)
    return grade
