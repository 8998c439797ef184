"""How a grader is called, in the tool's process (the built-in ones, and a function given from Python) or
in a grader process of its own (a user's MODULE:FUNCTION): its kind's signature, and what it returned as one
finite score or an error naming what was wrong."""
from __future__ import annotations

import copy
import math
import numbers
import threading

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


_STUCK: dict = {}  # id of a grader function -> (it, the thread still running its call that timed out)
_MAIN_THREAD_ONLY: dict = {}  # id of a grader function -> it, when it installs signal handlers


def _needs_main_thread(e: BaseException | None) -> bool:
    """Whether a grader failed on installing a signal handler outside the main thread (an alarm-based
    timeout, as math-verify's), in its exception or the chain of their causes."""
    for _ in range(8):
        if e is None:
            return False
        if isinstance(e, ValueError) and "signal only works in main thread" in str(e):
            return True
        e = e.__cause__ or e.__context__
    return False


def call_in_process(fn, kind: str, request: dict, timeout: float) -> float:
    """A grader function called in this process on its own copy of the request (what it changes in its
    extra_info or columns reaches no other call), in a thread of its own so that the timeout holds. A call
    past the timeout cannot be stopped (nothing ends a thread from outside): it is reported, runs on in the
    background, and the function is not called again while it does (two calls at once could corrupt what
    they share). A grader that installs signal handlers, which only the main thread may (math-verify's
    alarm-based timeouts), is called in the caller's thread instead, under its own timeout alone."""
    if id(fn) in _MAIN_THREAD_ONLY:
        return call_grader(fn, kind, copy.deepcopy(request))
    stuck = _STUCK.get(id(fn))
    if stuck is not None and stuck[1].is_alive():
        raise GraderFailed(f"is still running a call that took longer than {timeout:g} s, in a thread of this "
                           f"process that cannot be stopped; it is not called again until that call returns")
    outcome: dict = {}

    def grade() -> None:
        try:
            outcome["score"] = call_grader(fn, kind, copy.deepcopy(request))
        except BaseException as e:  # noqa: BLE001 - the caller's thread reports it
            outcome["error"] = e

    thread = threading.Thread(target=grade, name="credit grader", daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        _STUCK[id(fn)] = (fn, thread)
        raise GraderFailed(f"took longer than {timeout:g} s grading (it runs on in a thread of this process, which "
                           f"cannot stop it, and is not called again until it returns; raise grader_timeout if it "
                           f"needs longer)")
    if _needs_main_thread(outcome.get("error")):
        _MAIN_THREAD_ONLY[id(fn)] = fn
        return call_in_process(fn, kind, request, timeout)
    if "error" in outcome:
        raise outcome["error"]
    return outcome["score"]
