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

import json
import logging
import os
import shutil
import sys
import time
from dataclasses import dataclass, field

import pandas as pd

from ..core import progress, recording
from ..measure.units import Kernel, Unit, read_part, write_output
from .executor import LocalExecutor, lease_record, make_executor
from .provenance import product_digests
from .registry import stage as stage_entry
from .shards import ShardStore
from .stagedir import RESUME_FILE, StageDir

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
    used: dict = field(default_factory=dict)  # unit name -> what it used (replaylib.core.recording), when recorded
    previewed: list = field(default_factory=list)  # the units taken from a preview of this process


def compute(kernel: Kernel, params, inputs, open_executor, store=None, where=None, prefix: str = "",
            only: list[Unit] | None = None, show: bool = True, record: bool = False, roots: tuple = (),
            previewed: dict | None = None) -> Computed:
    """Every unit of a kernel's plan (or only the given ones), reused from ``store`` where it holds them (and
    what they used is as it was), or from ``previewed`` ({unit name: (parts, record)}: units a preview
    computed); ``open_executor(n_units)`` is called once, when the first unit must run; where: the stage
    directory the progress file goes to (None: the screen only; nowhere with show False); prefix: the stage,
    in the units' labels; record: each unit's record of what it used, made where it runs, with ``roots``
    (definitions it depends on without running them: the kernel's own); always with a store, which reuses a
    unit only while what it used is as it was."""
    out = Computed({})
    ex, bar = None, None
    unit_fn = recording.Recorded(kernel.unit, roots) if record or store is not None else kernel.unit
    progress.in_stage(where)
    try:
        while True:
            planned = only if only is not None else kernel.plan(params, inputs, out.done)
            todo, reused = [], False
            for u in planned:
                if u.name in out.done:
                    continue
                parts = store.load(u) if store is not None else None
                if parts is not None:
                    out.done[u.name], out.unit_seconds[u.name], reused = parts, store.seconds(u), True
                    out.used[u.name] = store.dependencies(u)
                elif u.name in (previewed or {}) and not recording.changes(previewed[u.name][1], first_only=True):
                    parts, used = previewed.pop(u.name)
                    out.done[u.name] = store.save(u, parts, kernel.shard, {}, used) if store is not None else parts
                    out.used[u.name], reused = used, True
                    out.previewed.append(u.name)
                else:
                    todo.append(u)
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
            for label, parts in ex.map(unit_fn, [(lb, (params, *u.args)) for lb, u in by_label.items()],
                                       ordered=False):
                u = by_label[label]
                spent = parts.pop("seconds", {})
                used = parts.pop(recording.DEPENDENCIES, None)
                for what, secs in spent.items():
                    out.seconds[what] = round(out.seconds.get(what, 0.0) + secs, 2)
                out.unit_seconds[u.name], out.used[u.name] = spent, used
                out.done[u.name] = store.save(u, parts, kernel.shard, spent, used) if store is not None else parts
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
    next call (LocalExecutor). What builds the engine is recorded with every unit it runs."""
    if not stage_entry(stage).engine:
        return lambda n: NoEngine()
    return lambda n: make_executor(params, invariant=kernel.invariant, workers=max(1, min(n, params.ray_workers)),
                                   stage=stage, keep=keep, record=True)


def in_notebook() -> bool:
    """A Jupyter kernel the runner does not drive: the engine is kept for the notebook's next call."""
    return "ipykernel" in sys.modules and not os.environ.get(progress.RUNNER_ENV)


def kernel_roots(stage: str) -> tuple:
    """What a stage's units depend on without running it: its kernel's declaration (KERNEL: how shards are
    named and kept, the engine's mode)."""
    return ((stage_entry(stage).kernel, "KERNEL"),)


def run_stage(sd: StageDir, kernel: Kernel, params, read_inputs, open_executor=None):
    """Run a stage in its directory: begin, compute its units (resuming from its shards, or from what a preview
    of this process computed), assemble and write its outputs, finish with the record of what it used (the
    code that ran and the files it read, here and where its units ran); returns what the kernel's assembly
    gives its notebook."""
    sd.begin()
    try:
        with recording.session() as here:
            recording.note_definition(*kernel_roots(sd.stage)[0])
            inputs = read_inputs()
            previewed = PREVIEWED.pop(sd.stage, (None, {}))
            computed = compute(kernel, params, inputs, open_executor or stage_executor(params, sd.stage, kernel,
                                                                                       in_notebook()),
                               sd.shards if kernel.shard else None, sd.path, sd.stage, record=True,
                               roots=kernel_roots(sd.stage),
                               previewed=previewed[1] if previewed[0] == sd.resume_key else None)
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
        extra = {**outputs.extra, "seconds": computed.seconds, **computed.lease,
                 "units": {"computed": len(computed.ran), "from_preview": len(computed.previewed),
                           "reused": len(computed.done) - len(computed.ran) - len(computed.previewed)},
                 "result": result_entry(outputs),
                 "dependencies": recording.merged(here.record(), *computed.used.values(), sd.definition.notebook())}
        if outputs.products:
            extra["products"] = product_digests(outputs.products, sd.out_dir)
        sd.finish(written, extra)
    finally:
        sd.release()
    return outputs.result


def result_entry(outputs) -> dict | None:
    """How the manifest gives back what the stage's run returns: the output file that holds it, or the value."""
    for rel, value in outputs.files.items():
        if value is outputs.result:
            return {"file": rel}
    try:
        return {"value": json.loads(json.dumps(outputs.result))}
    except (TypeError, ValueError):
        return None


def finished_result(sd: StageDir):
    """What a finished stage's run returned, read from its files (its manifest's ``result``)."""
    entry = json.loads((sd.path / "manifest.json").read_text()).get("result") or {}
    return read_part(sd.path / entry["file"]) if "file" in entry else entry.get("value")


def pick(units: list[Unit], unit) -> Unit:
    """A unit of a plan: the first (None), by position (int), by name (str), or the unit itself."""
    if isinstance(unit, Unit):
        return unit
    if not units:
        raise ValueError("the plan has no units")
    if unit is None:
        return units[0]
    if isinstance(unit, bool) or (isinstance(unit, int) and not 0 <= unit < len(units)):
        raise ValueError(f"unit {unit!r} is not in the plan: give a position from 0 to {len(units) - 1}, a unit's "
                         f"name or None (the first)")
    if isinstance(unit, int):
        return units[unit]
    found = [u for u in units if u.name == unit]
    if not found:
        raise ValueError(f"no unit named {unit!r} in the plan (its units: {', '.join(u.name for u in units[:5])}"
                         f"{', ...' if len(units) > 5 else ''})")
    return found[0]


# stage -> (resume key, {unit name: (parts, record)}): units a preview of this process computed, which the
# stage's run then takes instead of computing them again (only under the same resume key)
PREVIEWED: dict = {}


class Declared:
    """A stage declared by its kernel and how it reads its inputs (``inputs(params, out_dir) -> dict``);
    ``finished_rows(params, out_dir, unit) -> frame``: a finished stage's rows for one unit, as its preview
    shows them (a stage that keeps its shards reads them there)."""

    def __init__(self, stage: str, kernel: Kernel, inputs, finished_rows=None):
        self.stage, self.kernel, self.inputs, self.finished_rows = stage, kernel, inputs, finished_rows

    def run(self, params, out_dir=None):
        """Run the stage where it is stale (resuming from its shards where what they used is unchanged); an
        up-to-date stage is read, not recomputed, and nothing under its directory is written. Returns what the
        run gives, read from its files."""
        sd = StageDir(params, self.stage, out_dir)
        why = sd.staleness()
        if why is None:
            print(f"[replaylib] {self.stage}: up to date in {sd.path}; its outputs are read, nothing is computed",
                  flush=True)
        else:
            run_stage(sd, self.kernel, params, lambda: self.inputs(params, out_dir))
        return finished_result(sd)

    def plan(self, params, out_dir=None) -> list[Unit]:
        """The units the stage would run (for a stage whose plan grows as units finish, the first ones)."""
        return self.kernel.plan(params, self.inputs(params, out_dir), {})

    def preview(self, params, unit=None, out_dir=None) -> pd.DataFrame:
        """One unit (the first, a position, a name or a Unit of ``plan``), writing nothing under the output root:
        read from the finished stage where it is up to date, else computed on an engine of this process (kept
        for the notebook's next call) and kept in memory, so that the stage's run in this process takes it
        instead of computing it again. Returns the rows the full run writes for that unit, with
        ``attrs["preview"]``: the stage, its key and values, and where the rows come from."""
        inputs = self.inputs(params, out_dir)
        chosen = pick(self.kernel.plan(params, inputs, {}), unit)
        sd = StageDir(params, self.stage, out_dir)
        if sd.staleness() is None:
            frame, source = self._finished(sd, params, out_dir, chosen), "finished run"
            print(f"[replaylib] {self.stage}: {chosen.label} read from the finished stage in {sd.path} (up to date; "
                  f"nothing is computed)", flush=True)
        else:
            key = sd.resume_key_of(sd.upstream_digests())
            kept = PREVIEWED.get(self.stage, (None, {}))
            earlier = kept[1].get(chosen.name) if kept[0] == key else None
            if earlier is None or recording.changes(earlier[1], first_only=True):
                engine = stage_entry(self.stage).engine
                opener = (lambda n: LocalExecutor(params, self.kernel.invariant, keep=in_notebook(), record=True)) \
                    if engine else (lambda n: NoEngine())
                computed = compute(self.kernel, params, inputs, opener, only=[chosen], prefix=self.stage, record=True,
                                   roots=kernel_roots(self.stage))
                earlier = (computed.done[chosen.name], computed.used[chosen.name])
                print(f"[replaylib] {self.stage}: {chosen.label} computed here (nothing written); the stage's run in "
                      f"this process takes it instead of computing it again", flush=True)
                PREVIEWED[self.stage] = (key, {**(kept[1] if kept[0] == key else {}), chosen.name: earlier})
            frame, source = self._shown(earlier[0]), "computed"
        frame = frame.copy()
        frame.attrs["preview"] = {"stage": self.stage, "key": params.stage_key(self.stage), "source": source,
                                  "unit": chosen.name,
                                  "values": {k: getattr(params, k) for k in type(params).keys_for(self.stage)}}
        return frame

    def _shown(self, parts: dict) -> pd.DataFrame:
        if self.kernel.preview is not None:
            return self.kernel.preview(parts)
        return next(v for v in parts.values() if isinstance(v, pd.DataFrame))

    def _finished(self, sd: StageDir, params, out_dir, unit: Unit) -> pd.DataFrame:
        """A finished stage's rows for one unit: from its shards where it keeps them, else its own reader."""
        if self.kernel.shard and self.kernel.keep_shards:
            parts = ShardStore(sd.path, sd.resume_key_of(sd.upstream_digests()), RESUME_FILE).load(unit)
            if parts is not None:
                return self._shown(parts)
        return self.finished_rows(params, out_dir, unit)
