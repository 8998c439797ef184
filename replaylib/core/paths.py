"""Where things are: the repository, the output root and every path in them that more than one module
names. Each path is built here, once."""
from __future__ import annotations

import os
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1]
REPO = PACKAGE.parent
DATA = REPO / "data"
PAPER_RECORDS = DATA / "paper-records"
PAPER_FIGURES = DATA / "paper-figures"
NOTEBOOKS = REPO / "notebooks"
PARAMS = REPO / "params"
# absolute from the start: a stage's kernel runs in the repository, not in the directory the runner was started in
DEFAULT_OUT = Path(os.path.abspath(os.environ.get("REPLAYLIB_OUT", REPO)))


def out_root(out_dir: str | Path | None = None) -> Path:
    """The output root as an absolute path (a relative one is taken from the working directory, once)."""
    return Path(os.path.abspath(out_dir)) if out_dir else DEFAULT_OUT


def config_dir(config: str, out_dir=None) -> Path:
    """runs/<config>/: a configuration's (or a campaign's) run directory."""
    return out_root(out_dir) / "runs" / config


def stage_dir(config: str, stage: str, out_dir=None) -> Path:
    """runs/<config>/<stage>/."""
    return config_dir(config, out_dir) / stage


def figures_dir(config: str, out_dir=None) -> Path:
    return out_root(out_dir) / "figures" / config


def tables_dir(config: str, out_dir=None) -> Path:
    return out_root(out_dir) / "tables" / config


def models_dir() -> Path:
    """Where models are kept (fetched, converted, built): REPLAYLIB_MODELS, else models/ in the repository."""
    env = os.environ.get("REPLAYLIB_MODELS")
    return Path(env) if env else REPO / "models"


def cache_dir() -> Path:
    """Where the package keeps what it derives from its own sources to save work between processes (the code
    of its functions with recording probes, its definitions' digests): REPLAYLIB_CACHE, else the user's cache
    directory (XDG_CACHE_HOME or ~/.cache) / replaylib. Nothing there is a result: deleting it only costs time."""
    env = os.environ.get("REPLAYLIB_CACHE")
    if env:
        return Path(env)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "replaylib"


def write_cached(path: Path, data: bytes, most: int = 4000) -> None:
    """Write one file of a cache_dir() folder whole (a reader sees the old file or the new one), keeping the
    folder to its ``most`` most recently written files. A cache that cannot be written is only slower. Not
    core.files.atomic_write_bytes: that is code stages record, and the recorder writes here while recording."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_bytes(data)
        os.replace(tmp, path)
        entries = list(os.scandir(path.parent))
        if len(entries) > most:
            entries.sort(key=lambda e: e.stat().st_mtime_ns)
            for old in entries[:len(entries) - most // 2]:
                os.unlink(old.path)
    except OSError:
        tmp.unlink(missing_ok=True)


def notebook_path(stage: str) -> Path:
    return NOTEBOOKS / f"{stage}.ipynb"
