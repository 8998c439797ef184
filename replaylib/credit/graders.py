"""Graders: this package's gsm8k rule (a GSM8K answer column, "... #### 72", is read as its number),
math-verify's ``math``, or a user's MODULE:FUNCTION of one of three kinds, told from its parameters or
given (--grader-kind): verl's ``compute_score(data_source, solution_str, ground_truth, extra_info)``
returning a number or a dict with ``score``; a TRL reward function ``(prompts, completions, **kwargs)``
returning a list of floats; an OpenRLHF-style ``reward_func(queries, prompts, labels)`` returning a
tensor or list (or a dict with ``rewards``). Success is score > success_above.

The built-in graders run in the tool's process, and so does a function given from Python, on a thread per
call so that the timeout holds (``grader_calls.call_in_process``). A user's MODULE:FUNCTION runs in a
process of its own (``grader_worker``), one call at a time. A call that takes longer than the timeout,
calls sys.exit, raises, ends its process or returns something that is not a finite score is an error
naming the grader and the rollout; what a grader process prints is counted, never shown."""
from __future__ import annotations

import importlib
import json
import os
import secrets
import selectors
import subprocess
import sys
import time
from pathlib import Path

from ..core import recording
from ..measure.data import gsm8k_gold
from ..measure.grading import grade_gsm8k
from .grader_calls import KINDS, GraderFailed, as_score, call_grader, call_in_process, describe_failure, \
    kind_of  # noqa: F401
from .inputs import BadInput

DEFAULT_TIMEOUT = 60.0  # seconds per call of a user's grader (--grader-timeout)
START_TIMEOUT = 120.0  # seconds its process may take to start and import it (at least the call's timeout)
REPO_ROOT = Path(__file__).resolve().parents[2]


def _math_verify(data_source, solution_str, ground_truth, extra_info=None) -> float:
    from math_verify import parse, verify
    gold = parse(ground_truth if "$" in ground_truth or "\\boxed" in ground_truth else f"${ground_truth}$")
    return float(verify(gold, parse(solution_str)))


def _gsm8k(data_source, solution_str, ground_truth, extra_info=None) -> float:
    """GSM8K's rule; a ground truth in GSM8K's own answer format (reasoning, then "#### 72") is its number."""
    return float(grade_gsm8k(solution_str, gsm8k_gold(ground_truth) or ground_truth))


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
    except (Exception, SystemExit) as e:  # noqa: BLE001 - any failure to import is the user's grader's, in one line
        raise BadInput(f"--grader {spec}: cannot import it ({describe_failure(e)}); check the module is on "
                       f"PYTHONPATH and defines {name}") from None
    if not callable(fn):
        raise BadInput(f"--grader {spec}: {name} is not a function")
    return fn


def importable_name(fn) -> str:
    """A grader given as a function, as the MODULE:FUNCTION it is imported by: the name a run's files record
    and resume by, its code's file among what a shard records (as for --grader MODULE:FUNCTION); BadInput
    when it cannot be imported by that name (a lambda, a nested function, one defined in __main__)."""
    module, name = getattr(fn, "__module__", None), getattr(fn, "__qualname__", None)
    try:
        found = module != "__main__" and getattr(importlib.import_module(module), name) is fn
    except (Exception, SystemExit):  # noqa: BLE001 - not importable by its name, however it fails
        found = False
    if not found:
        shown = getattr(fn, "__name__", type(fn).__name__)
        raise BadInput(f"grader {shown}: a function written to an output directory must be importable by its name "
                       f"(the directory records and resumes by it); define it at the top of a module, give "
                       f"grader='MODULE:FUNCTION', or leave out out")
    return f"{module}:{name}"


def check_kind(kind: str) -> None:
    if kind not in ("auto", *KINDS):
        raise BadInput(f"--grader-kind {kind}: choose auto, {', '.join(KINDS)}")


class GraderProcess:
    """A user's grader in a process of its own, started on first use and again after it was stopped."""

    def __init__(self, spec: str, kind: str, timeout: float):
        self.spec, self.kind, self.timeout, self.proc = spec, kind, timeout, None
        self.files: set = set()  # the grader's sources and what it read, as its replies list them

    def _start(self) -> None:
        # the grader is imported as this process imported it: this package, the working directory, and the
        # entries of sys.path that are not the interpreter's own
        own = tuple(p for p in {sys.prefix, sys.base_prefix} if p)
        paths = [str(REPO_ROOT), os.getcwd(), *(p for p in sys.path if p and not p.startswith(own))]
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(dict.fromkeys(paths)))
        self.proc = subprocess.Popen([sys.executable, "-m", "replaylib.credit.grader_worker", self.spec, self.kind],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                     env=env)
        ready = self._reply("starting", max(self.timeout, START_TIMEOUT))
        self.files.update(ready.get("files", []))
        if not ready.get("ready"):
            self.stop()
            raise GraderFailed(f"cannot be imported in its process ({ready.get('error')})")

    def _reply(self, doing: str, timeout: float | None = None, call: str | None = None) -> dict:
        timeout = self.timeout if timeout is None else timeout
        with selectors.DefaultSelector() as sel:
            sel.register(self.proc.stdout, selectors.EVENT_READ)
            if not sel.select(timeout):
                self.stop()
                raise GraderFailed(f"took longer than {timeout:g} s {doing} (stopped; raise --grader-timeout if "
                                   f"it needs longer)")
        line = self.proc.stdout.readline()
        if not line:
            code = self.proc.wait()
            self.proc = None
            raise GraderFailed(f"ended its process while {doing} (exit status {code})")
        try:
            answer = json.loads(line)
        except ValueError:
            answer = None
        if not isinstance(answer, dict) or answer.get("call") != call:  # not this call's reply: never a grade
            self.stop()
            raise GraderFailed(f"its process answered {doing} with something other than this call's reply "
                               f"(stopped)")
        return answer

    def __call__(self, request: dict) -> tuple[float, int, str]:
        """(score, bytes printed, their first characters), or GraderFailed."""
        if self.proc is None:
            self._start()
        call = secrets.token_hex(8)
        try:
            self.proc.stdin.write((json.dumps(dict(request, call=call)) + "\n").encode())
            self.proc.stdin.flush()
        except BrokenPipeError:  # it ended since its last call: its exit status is the error
            pass
        answer = self._reply("grading", call=call)
        self.files.update(answer.get("files", []))
        for path in self.files:  # what this grade was computed with (a shard's record)
            recording.note_file(path)
        if answer.get("error"):
            raise GraderFailed(answer["error"])
        return as_score(answer["score"]), answer["printed"], answer["head"]

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None


_PROCESSES: dict = {}  # (spec, kind, timeout) -> the grader process this process uses


class Grader:
    """grade(text, rollout) -> 0 or 1, with GraderFailed naming the grader when it fails; stats counts the
    calls, their seconds and what the grader printed. decode(ids) -> text gives TRL- and OpenRLHF-style
    graders the prompt's text."""

    def __init__(self, spec, success_above: float, timeout: float = DEFAULT_TIMEOUT, kind: str = "auto",
                 decode=None):
        """spec: gsm8k, math or MODULE:FUNCTION; or, from Python, the function itself (a trainer's reward
        function), which is called in this process (grader_calls.call_in_process)."""
        given = callable(spec) and not isinstance(spec, str)
        self.spec = getattr(spec, "__name__", type(spec).__name__) if given else spec
        self.success_above, self.decode, self.given, self.timeout = success_above, decode, given, timeout
        self.fn = spec if given else load(spec)
        check_kind(kind)
        self.kind = "verl" if self.spec in BUILT_IN and not given else kind_of(self.fn) if kind == "auto" else kind
        if given or spec in BUILT_IN:
            self.process = None
        else:
            key = (spec, self.kind, timeout)
            self.process = _PROCESSES.get(key) or _PROCESSES.setdefault(key, GraderProcess(spec, self.kind, timeout))
        self.stats = {"calls": 0, "seconds": 0.0, "printed_bytes": 0, "printed_head": ""}
        self._prompts: dict = {}

    def request(self, text: str, rollout) -> dict:
        request = {"data_source": rollout.data_source, "solution_str": text, "ground_truth": rollout.ground_truth,
                   "extra_info": rollout.extra_info}
        if self.kind != "verl":
            key = tuple(rollout.prompt_ids)
            if key not in self._prompts:
                self._prompts[key] = self.decode(rollout.prompt_ids) if self.decode else ""
            request.update(prompt=self._prompts[key], columns=rollout.columns or {},
                           ground_truth_name=rollout.ground_truth_name)
        return request

    def __call__(self, text: str, rollout) -> int:
        request = self.request(text, rollout)
        started = time.perf_counter()
        try:
            if self.given:
                score = call_in_process(self.fn, self.kind, request, self.timeout)
            elif self.process is None:
                score = call_grader(self.fn, self.kind, request)
            else:
                score, printed, head = self.process(request)
                self.stats["printed_bytes"] += printed
                self.stats["printed_head"] = self.stats["printed_head"] or head
        except GraderFailed as e:
            raise GraderFailed(f"--grader {self.spec} {e}") from None
        except (Exception, SystemExit) as e:  # noqa: BLE001 - an in-process grader's failure, sys.exit included
            raise GraderFailed(f"--grader {self.spec} {describe_failure(e)}") from None
        finally:
            self.stats["calls"] += 1
            self.stats["seconds"] += time.perf_counter() - started
        return int(score > self.success_above)


def for_settings(settings, decode=None) -> Grader:
    return Grader(settings.grader, settings.success_above, settings.grader_timeout, settings.grader_kind, decode)
