"""Live progress of a stage, in a notebook and in the terminal of `python -m replaylib.run`.

The runner of a stage (replaylib.runtime.units) opens a bar for its work, `progress.bar(stage_dir,
"replay", total, unit)`; a unit with phases of its own opens each with `progress.phase("trunks", total,
unit)` (in the stage's directory, or only on the screen for a preview that writes nothing); its loops call
`progress.update(n)`, and the engines report every decode step with `progress.tokens(n_tokens,
rows_finished)`. The bar is a tqdm.auto bar (a widget in Jupyter where ipywidgets is installed, else
text) and is also written, at most twice a second, to `<stage_dir>/progress.json`. A stage runs
inside a papermill kernel whose output the terminal never sees, so the runner polls that
file and draws the stage's line itself; under the runner (REPLAYLIB_RUNNER set) the notebook
keeps no bar of its own. A stage whose engine runs in another process (replaylib.runtime.engine_service)
gets that process's progress as events (`forward_to` there, `apply` here).
"""
from __future__ import annotations

import contextlib
import importlib.util
import json
import logging
import os
import time
import warnings
from pathlib import Path

FILE = "progress.json"
RUNNER_ENV = "REPLAYLIB_RUNNER"
WRITE_EVERY_S = 0.5
_current: "Bar | None" = None
_stage_dir: "Path | None" = None  # where a phase's bar is written (None: on the screen only)
_forward = None  # in an engine server, while a unit runs: sends each progress event to its stage

if importlib.util.find_spec("ipywidgets") is None:
    # tqdm.auto's widget needs ipywidgets: without it, tqdm.auto in a kernel warns "IProgress not found" when
    # first imported (by this module, or by transformers' and the hub's bars in a preview) and gives the text
    # bar. Imported once here with that warning off, every later import gets the text bar quietly.
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="IProgress not found")
        importlib.import_module("tqdm.auto")


class Bar:
    """One phase of a stage: `n` of `total` units done, plus decoded tokens."""

    def __init__(self, stage_dir, desc: str, total: int, unit: str, count_rows: bool = False, show: bool = True):
        self.path = Path(stage_dir) / FILE if stage_dir is not None else None
        self.desc, self.total, self.unit, self.count_rows = desc, int(total), unit, count_rows
        self.n, self.n_tokens, self.started, self._written = 0, 0, time.time(), 0.0
        if os.environ.get(RUNNER_ENV) or not show:  # the runner draws the line (tqdm.auto would warn in a kernel
            # without widgets), or the caller wants none (a trainer's loop)
            from tqdm import tqdm
            self.tqdm = tqdm(total=self.total, disable=True)
        else:
            from tqdm.auto import tqdm
            self.tqdm = tqdm(total=self.total, desc=desc, unit=unit)
        self._write(force=True)

    def update(self, n: int = 1) -> None:
        self.n += n
        self.tqdm.update(n)
        self._write()

    def add_total(self, n: int) -> None:
        self.total += n
        self.tqdm.total = self.total
        self.tqdm.refresh()
        self._write(force=True)

    def add_tokens(self, n: int, rows_finished: int = 0) -> None:
        self.n_tokens += n
        if self.count_rows and rows_finished:
            self.n += rows_finished
            self.tqdm.update(rows_finished)
        if self._write():
            self.tqdm.set_postfix_str(f"{self.n_tokens:,} tok, {self.tokens_per_s():.1f} tok/s")

    def tokens_per_s(self) -> float:
        return self.n_tokens / max(time.time() - self.started, 1e-9)

    def close(self) -> None:
        global _current
        self.tqdm.close()
        self._write(force=True, done=True)
        if _current is self:
            _current = None

    def _write(self, force: bool = False, done: bool = False) -> bool:
        now = time.time()
        if not force and now - self._written < WRITE_EVERY_S:
            return False
        if self.path is None:
            self._written = now
            return True
        self._written = now
        state = {"desc": self.desc, "unit": self.unit, "n": self.n, "total": self.total, "tokens": self.n_tokens,
                 "started": self.started, "updated": now, "done": done}
        tmp = self.path.with_name(f".{FILE}.{os.getpid()}.tmp")
        try:
            tmp.write_text(json.dumps(state))
            os.replace(tmp, self.path)
        except OSError:  # progress is a display: a full or read-only disk must not stop the stage
            tmp.unlink(missing_ok=True)
        return True


class _ForwardedBar:
    """A bar opened by a unit in an engine server: its stage draws it."""

    def update(self, n: int = 1) -> None:
        _forward(("update", n))

    def add_total(self, n: int) -> None:
        _forward(("add_total", n))

    def add_tokens(self, n: int, rows_finished: int = 0) -> None:
        _forward(("tokens", n, rows_finished))

    def close(self) -> None:
        _forward(("close",))


def bar(stage_dir, desc: str, total: int, unit: str, count_rows: bool = False, show: bool = True) -> Bar:
    """Start a phase (closing the previous one) written to stage_dir's progress file (None: on the screen
    only, or nowhere with show False); count_rows: finished decode rows advance it."""
    global _current
    if _forward is not None:
        _forward(("bar", None if stage_dir is None else str(stage_dir), desc, total, unit, count_rows))
        return _ForwardedBar()
    if _current is not None:
        _current.close()
    _current = Bar(stage_dir, desc, total, unit, count_rows, show)
    return _current


def phase(desc: str, total: int, unit: str, count_rows: bool = False):
    """A unit's own phase of work, in the directory of the stage it runs for."""
    return bar(_stage_dir, desc, total, unit, count_rows)


def in_stage(stage_dir) -> None:
    """Where phases are written from now on (None: on the screen only)."""
    global _stage_dir
    _stage_dir = None if stage_dir is None else Path(stage_dir)


def finish() -> None:
    """Close the phase that is open, if any."""
    if _current is not None:
        _current.close()


def update(n: int = 1) -> None:
    if _forward is not None:
        _forward(("update", n))
    elif _current is not None:
        _current.update(n)


def tokens(n: int, rows_finished: int = 0) -> None:
    """An engine decoded n tokens (one step of n rows, or a whole request batch)."""
    if _forward is not None:
        _forward(("tokens", n, rows_finished))
    elif _current is not None:
        _current.add_tokens(n, rows_finished)


def forward_to(send) -> None:
    """Send progress events to send(event) instead of drawing them (None: draw them here again)."""
    global _forward
    _forward = send


class _ForwardLog(logging.Handler):
    def __init__(self, send):
        super().__init__(logging.INFO)
        self.send = send

    def emit(self, record: logging.LogRecord) -> None:
        self.send(("log", record.levelno, record.getMessage()))


@contextlib.contextmanager
def forwarding(send):
    """While a unit runs in another process than its stage: its progress events, as ("progress", event), and its
    replaylib log lines, as ("log", level, message), go to send(message) as they happen."""
    handler = _ForwardLog(send)
    logger = logging.getLogger("replaylib")
    logger.addHandler(handler)
    forward_to(lambda event: send(("progress", event)))
    try:
        yield
    finally:
        forward_to(None)
        logger.removeHandler(handler)


def apply(event: tuple) -> None:
    """An event a unit sent from another process (forward_to there), drawn here."""
    kind, *args = event
    if kind == "bar":
        bar(args[0] if args[0] is not None else _stage_dir, *args[1:])
    elif kind == "update":
        update(*args)
    elif kind == "tokens":
        tokens(*args)
    elif kind == "add_total" and _current is not None:
        _current.add_total(*args)
    elif kind == "close" and _current is not None:
        _current.close()


def read(stage_dir) -> dict | None:
    """The last state a stage wrote, or None (not started, or a half-written file)."""
    try:
        return json.loads((Path(stage_dir) / FILE).read_text())
    except (OSError, ValueError):
        return None
