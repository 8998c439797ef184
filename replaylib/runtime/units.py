"""The one runner of every stage's kernel (plan, unit, assemble: replaylib.measure.units), and of the credit
tool's groups.

``compute`` takes a kernel's units from its plan, reuses those a shard store holds, runs the rest on an
executor (one local engine, an engine leased from the run's broker, or engines on Ray actors; none for a
stage without an engine), writes each unit's parts as it finishes, counts progress and time, and returns
every unit's parts. ``run_stage`` wraps it in a stage directory: begin (locks, upstream checks, resume
key), compute, assemble, write the outputs, finish (manifest, DONE).

A declared stage (``Declared``, what replaylib/stages/*.py are) offers three calls to a notebook or a
script: ``run(params, out_dir)``; ``plan(params, out_dir)``, the units it would run (the first ones, for a
stage whose plan grows as units finish); and ``preview(params, unit, out_dir)``, one unit run on an engine
of its own, writing nothing under the output root: its rows are the full run's rows for that unit.
"""
from __future__ import annotations

import logging
import os
import shutil
import sys
import time
from dataclasses import dataclass, field

import pandas as pd

from ..core import progress
from ..measure.units import Kernel, Unit, write_output
from .executor import LocalExecutor, lease_record, make_executor
from .provenance import product_digests
from .registry import stage as stage_entry
from .stagedir import StageDir

log = logging.getLogger("replaylib")


class NoEngine:
    """The executor of a stage that starts no engine: its units run here, in order."""
    name = "none"
    reports_progress = False
    lease_info = None

    def map(self, fn, units, ordered: bool = True):
        for label, args in units:
            yield label, fn(None, *args)

    def close(self) -> None:
        pass


class Lent:
    """An executor the caller closes (compute leaves it open)."""

    def __init__(self, executor):
        self.executor = executor

    def __getattr__(self, name):
        return getattr(self.executor, name)

    def close(self) -> None:
        pass


@dataclass
class Computed:
    done: dict  # unit name -> its parts
    ran: list = field(default_factory=list)  # the units this call computed (the others were reused)
    seconds: dict = field(default_factory=dict)  # this run's: engine start and stop, the units, their phases
    unit_seconds: dict = field(default_factory=dict)  # unit name -> its own seconds (reused units' as recorded)
    lease: dict = field(default_factory=dict)


def compute(kernel: Kernel, params, inputs, open_executor, store=None, where=None, prefix: str = "",
            only: list[Unit] | None = None, show: bool = True) -> Computed:
    """Every unit of a kernel's plan (or only the given ones), reused from ``store`` where it holds them;
    ``open_executor(n_units)`` is called once, when the first unit must run; where: the stage directory
    the progress file goes to (None: the screen only; nowhere with show False); prefix: the stage, in the
    units' labels."""
    out = Computed({})
    ex, bar = None, None
    progress.in_stage(where)
    try:
        while True:
            planned = only if only is not None else kernel.plan(params, inputs, out.done)
            todo, reused = [], False
            for u in planned:
                if u.name in out.done:
                    continue
                parts = store.load(u) if store is not None else None
                if parts is None:
                    todo.append(u)
                else:
                    out.done[u.name], out.unit_seconds[u.name], reused = parts, store.seconds(u), True
            if not todo:
                if reused and only is None:  # what it reused may tell the plan its next units
                    continue
                break
            if ex is None:
                started = time.perf_counter()
                ex = open_executor(len(todo))
                out.seconds["engine start"] = round(time.perf_counter() - started, 2)
                if ex.lease_info is None and ex.name != "none":
                    config = getattr(params, "config", None)
                    log.info("%s, executor %s: %d unit(s) to run", f"config {config}, {prefix}" if config else prefix,
                             ex.name, len(todo))
                bar = progress.bar(where, kernel.progress[0], 0, kernel.progress[1],
                                   count_rows=kernel.count_rows and ex.reports_progress, show=show)
            bar.add_total(sum(u.size for u in todo))
            by_label = {f"{prefix} {u.label}".strip(): u for u in todo}
            started = time.perf_counter()
            for label, parts in ex.map(kernel.unit, [(lb, (params, *u.args)) for lb, u in by_label.items()],
                                       ordered=False):
                u = by_label[label]
                spent = parts.pop("seconds", {})
                for what, secs in spent.items():
                    out.seconds[what] = round(out.seconds.get(what, 0.0) + secs, 2)
                out.unit_seconds[u.name] = spent
                out.done[u.name] = store.save(u, parts, kernel.shard, spent) if store is not None else parts
                out.ran.append(u.name)
                if not ex.reports_progress:
                    bar.update(u.size)
            out.seconds[kernel.progress[0]] = round(out.seconds.get(kernel.progress[0], 0.0)
                                                    + time.perf_counter() - started, 2)
            if only is not None:
                break
    finally:
        progress.finish()
        progress.in_stage(None)
        if ex is not None:
            started = time.perf_counter()
            ex.close()
            out.seconds["engine stop"] = round(time.perf_counter() - started, 2)
            out.lease = lease_record(ex)
    return out


def stage_executor(params, stage: str, kernel: Kernel, keep: bool = False):
    """How a stage opens its executor: an engine where the stage table says it starts one (as many Ray
    workers as there are units, at most ray_workers), else none; keep: a notebook's own engine, kept for its
    next call (LocalExecutor)."""
    if not stage_entry(stage).engine:
        return lambda n: NoEngine()
    return lambda n: make_executor(params, invariant=kernel.invariant, workers=max(1, min(n, params.ray_workers)),
                                   stage=stage, keep=keep)


def in_notebook() -> bool:
    """A Jupyter kernel the runner does not drive: the engine is kept for the notebook's next call."""
    return "ipykernel" in sys.modules and not os.environ.get(progress.RUNNER_ENV)


def run_stage(sd: StageDir, kernel: Kernel, params, read_inputs, open_executor=None):
    """Run a stage in its directory: begin, compute its units (resuming from its shards), assemble and write
    its outputs, finish; returns what the kernel's assembly gives its notebook."""
    sd.begin()
    try:
        inputs = read_inputs()
        computed = compute(kernel, params, inputs, open_executor or stage_executor(params, sd.stage, kernel,
                                                                                   in_notebook()),
                           sd.shards if kernel.shard else None, sd.path, sd.stage)
        missing = [u.label for u in kernel.plan(params, inputs, computed.done) if u.name not in computed.done]
        if missing:  # never assemble around a hole
            raise RuntimeError(f"{sd.path}: {missing[0]} has no result; rerun the stage: {sd.rerun_command()}")
        outputs = kernel.assemble(params, inputs, computed.done)
        for rel, value in outputs.files.items():
            write_output(sd.file(rel), value)
        written = list(outputs.files)
        if kernel.shard and kernel.keep_shards:
            changed = sd.shards.changed()
            if changed:  # the outputs hold what was written: shards changed since are not theirs
                raise RuntimeError(f"{sd.path / changed[0]}: not the shard this run recorded (changed or written by "
                                   f"another run); rerun the stage: {sd.rerun_command()}")
            written += sd.shards.paths()
        elif kernel.shard:  # scratch for a resume: what the outputs took from them is written
            shutil.rmtree(sd.path / "shards", ignore_errors=True)
            sd.shards.reset()
        if outputs.failure is not None:
            raise outputs.failure
        extra = {**outputs.extra, "seconds": computed.seconds, **computed.lease}
        if outputs.products:
            extra["products"] = product_digests(outputs.products, sd.out_dir)
        sd.finish(written, extra)
    finally:
        sd.release()
    return outputs.result


def pick(units: list[Unit], unit) -> Unit:
    """A unit of a plan: the first (None), by position (int), by name (str), or the unit itself."""
    if isinstance(unit, Unit):
        return unit
    if not units:
        raise ValueError("the plan has no units")
    if unit is None:
        return units[0]
    if isinstance(unit, int):
        return units[unit]
    found = [u for u in units if u.name == unit]
    if not found:
        raise ValueError(f"no unit named {unit!r} in the plan (its units: {', '.join(u.name for u in units[:5])}"
                         f"{', ...' if len(units) > 5 else ''})")
    return found[0]


class Declared:
    """A stage declared by its kernel and how it reads its inputs (``inputs(params, out_dir) -> dict``)."""

    def __init__(self, stage: str, kernel: Kernel, inputs):
        self.stage, self.kernel, self.inputs = stage, kernel, inputs

    def run(self, params, out_dir=None):
        """Run the stage (resuming from its shards where nothing it depends on changed)."""
        sd = StageDir(params, self.stage, out_dir)
        return run_stage(sd, self.kernel, params, lambda: self.inputs(params, out_dir))

    def plan(self, params, out_dir=None) -> list[Unit]:
        """The units the stage would run (for a stage whose plan grows as units finish, the first ones)."""
        return self.kernel.plan(params, self.inputs(params, out_dir), {})

    def preview(self, params, unit=None, out_dir=None) -> pd.DataFrame:
        """One unit (the first, a position, a name or a Unit of ``plan``) run on an engine of this process
        (kept for the notebook's next call), writing nothing under the output root; returns the frame it
        computed, the rows the full run writes for that unit."""
        inputs = self.inputs(params, out_dir)
        chosen = pick(self.kernel.plan(params, inputs, {}), unit)
        engine = stage_entry(self.stage).engine
        opener = (lambda n: LocalExecutor(params, self.kernel.invariant, keep=in_notebook())) if engine \
            else (lambda n: NoEngine())
        parts = compute(self.kernel, params, inputs, opener, only=[chosen], prefix=self.stage).done[chosen.name]
        if self.kernel.preview is not None:
            return self.kernel.preview(parts)
        return next(v for v in parts.values() if isinstance(v, pd.DataFrame))
