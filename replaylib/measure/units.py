"""A stage's computation as three functions, and what they hand each other.

``plan(params, inputs, done) -> [Unit]``: the stage's work list, as far as it is known from the units
already done (``done``: unit name -> its parts). Most stages know every unit at once; the sampling
stage's screen decides how many problems the next batch scans from what the last one kept, so its plan
grows as units finish. The runner calls it until every unit it returns is done.

``unit(engine, params, *unit.args) -> parts``: one unit's work, everything that decides the bytes of its
rows: ``{name: DataFrame | dict | bytes}`` (engine None for a stage that starts none). What it computes
never depends on where it runs or on what ran before it.

``assemble(params, inputs, done) -> Outputs``: the stage's files, from every unit's parts.

The runner (replaylib.runtime.units) does the rest for every stage and for the credit tool: the run
directory, the engine, the executor, the shards a killed run resumes from, progress and timing. Parts and
outputs become bytes here, in ``write_output``, so that how they are written is part of the code that
computes them (recorded as it runs: replaylib.core.recording).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import pandas as pd


@dataclass(frozen=True)
class Unit:
    name: str  # unique within its stage; names its shards
    label: str  # how progress lines and errors name it
    args: tuple = ()  # what the kernel's unit function receives after (engine, params)
    size: int = 1  # its share of the stage's progress total

    def __repr__(self) -> str:  # not its args: frames, a screenful each (a notebook shows units[0])
        return f"Unit(name={self.name!r}, label={self.label!r}, size={self.size!r})"


@dataclass
class Outputs:
    """What a stage writes: files in its directory ({path: DataFrame, dict, bytes, or the Path of a file
    whose bytes it takes}), the manifest's extra entries, the paths of the products it wrote outside its
    directory (the statistics' tables and figures), an error to raise once everything is written (a check
    that failed, whose evidence is kept), and what its run() returns."""
    files: dict
    extra: dict = field(default_factory=dict)
    products: list = field(default_factory=list)
    failure: Exception | None = None
    result: object = None  # what the stage's run() returns to its notebook


@dataclass(frozen=True)
class Kernel:
    plan: Callable
    unit: Callable
    assemble: Callable
    shard: Callable | None = None  # (unit, part name, value) -> the shard's path; None: units kept in memory
    keep_shards: bool = True  # shards are outputs of the stage (else removed once it has finished)
    invariant: bool = False  # its engine runs in the batch-invariant mode
    preview: Callable | None = None  # (parts) -> the frame a preview shows (default: the first table)
    progress: tuple = ("units", "unit")  # the progress bar's description and unit
    count_rows: bool = False  # an engine's finished rows advance the bar (else its progress.update calls)


def write_output(path: Path, value) -> None:
    """Write a part or an output atomically: a frame as Parquet (or CSV), a mapping as JSON, bytes as they
    are, a Path as that file's bytes (a hard link where the disk allows)."""
    from ..core.files import atomic_save, atomic_write_bytes, atomic_write_json
    path = Path(path)
    if isinstance(value, pd.DataFrame):
        if path.suffix == ".csv":
            atomic_save(path, lambda tmp: value.to_csv(tmp, index=False))
        else:
            atomic_save(path, lambda tmp: value.to_parquet(tmp, index=False))
    elif isinstance(value, (dict, list)):
        atomic_write_json(path, value)
    elif isinstance(value, bytes):
        atomic_write_bytes(path, value)
    elif isinstance(value, Path):
        atomic_save(path, lambda tmp: _link_or_copy(value, tmp))
    else:
        raise TypeError(f"{path}: cannot write a {type(value).__name__}")


def _link_or_copy(src: Path, dst: Path) -> None:
    import os
    import shutil
    try:
        os.link(src, dst)
    except OSError:
        shutil.copyfile(src, dst)


def read_part(path: Path):
    """A part as write_output wrote it: a frame, a mapping, or (any other file) its path."""
    path = Path(path)
    if path.suffix == ".parquet":
        return pd.read_parquet(path)
    if path.suffix == ".json":
        return json.loads(path.read_text())
    return path
