"""Per-pivot records: loading, validation and pooling (docs/protocol.md section 6).

A record is one pivot with its three estimates (A_exact1, A_exact2, A_refeed) and,
where the run recorded them, cache instrumentation and greedy-probe fields. Two file
forms are read into one pandas DataFrame with the same columns:

* the published JSON schema: a dict with a ``pivots`` list (and ``config``), as in
  ``data/paper-records/``;
* this package's own records: Parquet (``.parquet``) or JSON lines (``.jsonl``), one
  record per row/line, same field names, possibly with extra columns (kept as they are).

Optional fields absent from a file stay missing (None/NaN); nothing is invented.
"""

from __future__ import annotations

import json
import math
import numbers
from pathlib import Path

import numpy as np
import pandas as pd

from ..core.text import short

REQUIRED = ("problem_id", "rollout", "abs_pos", "margin", "A_exact1", "A_exact2", "A_refeed")
OPTIONAL = (
    "gen_index",
    "rollout_correct",
    "cache_ok_exact1",
    "cache_ok_exact2",
    "greedy_first_exact1",
    "greedy_first_exact2",
    "greedy_first_refeed",
    "greedy_divergence_exact2",
    "greedy_divergence_refeed",
    "greedy_first_logprob_delta_exact2",
    "greedy_first_logprob_delta_refeed",
)
COLUMNS = REQUIRED[:3] + ("gen_index", "margin", "rollout_correct") + REQUIRED[4:] + OPTIONAL[2:]
KEY = ["problem_id", "rollout", "abs_pos"]

_INT_FIELDS = ("problem_id", "rollout", "abs_pos", "gen_index")
_NUM_FIELDS = ("margin", "greedy_first_logprob_delta_exact2", "greedy_first_logprob_delta_refeed")
_A_FIELDS = ("A_exact1", "A_exact2", "A_refeed")
_BOOL_FIELDS = ("cache_ok_exact1", "cache_ok_exact2", "greedy_divergence_exact2", "greedy_divergence_refeed")
_PROBE_FIRST = ("greedy_first_exact1", "greedy_first_exact2", "greedy_first_refeed")
_SCHEMA_HINT = "records need the published schema, docs/protocol.md section 6"
# settings that make records of different protocols: files that record different values are never pooled
PROTOCOL_SETTINGS = ("model", "k", "cont_temp", "max_cont_tokens", "temperature", "engine", "batch_invariant")

# Table 1 rows of the paper (docs/protocol.md section 5.1; files: data/paper-records/README.md).
# Model, K, continuation temperature and problems come from each file's ``config`` block
# (``stats.row_meta``); the literals here are only what the published files lack: which
# run used batch-invariant kernels, and the scan start of the first-campaign (2026-06-10)
# screened runs, whose configs have no ``scan_start`` (the paper prints them as "20 screened").
PAPER_ROWS = {
    "main pooled": {"files": ["2026-06-11/primary.json", "2026-06-11/screened.json"], "batch_invariant": False},
    "K=8": {"files": ["2026-06-11/k8.json"], "batch_invariant": False},
    "K=16": {"files": ["2026-06-11/k16.json"], "batch_invariant": False},
    "greedy continuations": {"files": ["2026-06-10/temp0.json"], "batch_invariant": False, "scan_start": 20},
    "GRPO checkpoint": {"files": ["2026-06-10/grpo.json"], "batch_invariant": False, "scan_start": 20},
    "Phi-4-mini": {"files": ["2026-06-11/phi.json"], "batch_invariant": False},
    "batch-invariant": {"files": ["2026-06-11/batchinv.json"], "batch_invariant": True},
}


def _fail(path, index, field, what):
    raise ValueError(f"{path}: pivot {index} {what} '{field}' ({_SCHEMA_HINT})")


def _is_number(v):
    return isinstance(v, numbers.Real) and not isinstance(v, (bool, np.bool_))


def _is_missing(v):
    return v is None or (isinstance(v, float) and math.isnan(v)) or v is pd.NA


def _check_record(path, i, rec):
    """Validate one record (a dict) in place; parse probe dicts given as JSON strings."""
    if not isinstance(rec, dict):
        raise ValueError(f"{path}: pivot {i} is not an object ({_SCHEMA_HINT})")
    for f in REQUIRED:
        if f not in rec or rec[f] is None or rec[f] is pd.NA:
            _fail(path, i, f, "has no field")
    for f in _INT_FIELDS:
        v = rec.get(f)
        if v is None or v is pd.NA or (f not in REQUIRED and _is_missing(v)):
            continue
        if not _is_number(v) or not math.isfinite(v) or v != int(v):
            _fail(path, i, f, f"has a non-integer value {v!r} in field")
        if not 0 <= v < 2**53:  # ids and positions: non-negative, and exact as any number type reads them
            _fail(path, i, f, f"has a value {v!r} outside [0, 2**53) in field")
        rec[f] = int(v)
    for f in _NUM_FIELDS + _A_FIELDS:
        v = rec.get(f)
        if _is_missing(v) and f not in REQUIRED:
            continue
        if not _is_number(v) or not math.isfinite(v):
            _fail(path, i, f, f"has a non-numeric value {v!r} in field")
        if f in _A_FIELDS and not -1.0 <= v <= 1.0:
            _fail(path, i, f, f"has a value {v!r} outside [-1, 1] in field")
    for f in _BOOL_FIELDS:
        v = rec.get(f)
        if not _is_missing(v) and not isinstance(v, bool):
            if isinstance(v, (numbers.Integral, np.bool_)) and v in (0, 1):
                rec[f] = bool(v)
            else:
                _fail(path, i, f, f"has a non-boolean value {v!r} in field")
    for f in _PROBE_FIRST:
        v = rec.get(f)
        if _is_missing(v):
            continue
        if isinstance(v, str):
            try:
                v = json.loads(v)
            except (json.JSONDecodeError, RecursionError):
                _fail(path, i, f, "has malformed JSON in field")
        if isinstance(v, (list, tuple)) and all(isinstance(x, tuple) and len(x) == 2 for x in v):
            v = dict(v)  # a Parquet map column arrives as (key, value) pairs
        if not isinstance(v, dict) or not v or not all(_is_probe(x) for x in v.values()):
            _fail(path, i, f, "needs {arm: [first token id, finite first logprob]} in field")
        rec[f] = {str(arm): [int(x[0]), float(x[1])] for arm, x in v.items()}


def _is_probe(x) -> bool:
    """[token id, logprob]: a non-negative integer id and a finite logprob."""
    return (isinstance(x, (list, tuple, np.ndarray)) and len(x) == 2 and _is_number(x[0]) and _is_number(x[1])
            and math.isfinite(x[0]) and x[0] == int(x[0]) and 0 <= x[0] < 2**53 and math.isfinite(x[1]))


# the types of the settings a records file's config holds (published files, or a run's params.json)
_CONFIG_TYPES = {"model": str, "k": numbers.Integral, "cont_temp": numbers.Real, "max_cont_tokens": numbers.Integral,
                 "temperature": numbers.Real, "engine": str, "batch_invariant": bool}


def _check_config(path, config: dict | None) -> None:
    """Each protocol setting the config records (null: not recorded) has its type, K an integer of at least
    1 (not 4.0 nor "4"), before the checks that rely on it."""
    for key, kind in _CONFIG_TYPES.items():
        v = (config or {}).get(key)
        if v is None:
            continue
        numeric = kind is not str and kind is not bool
        ok = isinstance(v, kind) and not (numeric and isinstance(v, bool)) and not (
            numeric and not math.isfinite(v)) and not (key == "k" and v < 1)
        if not ok:
            want = {str: "text", bool: "true or false", numbers.Integral: "an integer"}.get(kind, "a finite number")
            raise ValueError(f"{path}: config setting '{key}' is {short(v)} ({type(v).__name__}); it must be "
                             f"{want}{' of at least 1' if key == 'k' else ''} ({_SCHEMA_HINT})")


def _read_rows(path: Path):
    """Return (list of record dicts, config dict or None) for one file."""
    suffix = path.suffix.lower()
    if suffix not in (".json", ".jsonl", ".parquet"):
        raise ValueError(f"{path}: unknown records format '{suffix}' (use .json, .jsonl or .parquet)")
    if not path.is_file():
        raise ValueError(f"{path}: no such file")
    if suffix == ".parquet":
        try:
            return pd.read_parquet(path).to_dict(orient="records"), None
        except Exception as e:  # pyarrow / OS errors, reported on one line naming the file
            msg = " ".join(str(e).split()) or type(e).__name__
            raise ValueError(f"{path}: cannot read records ({msg})") from None
    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"{path}: cannot read records ({type(e).__name__})") from None
    if suffix == ".jsonl":
        rows = []
        for lineno, line in enumerate(text.splitlines(), 1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as e:
                    raise ValueError(f"{path}: line {lineno} is not valid JSON ({e.msg})") from None
                except RecursionError:
                    raise ValueError(f"{path}: line {lineno} is nested too deeply to read ({_SCHEMA_HINT})") from None
        return rows, None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not a readable JSON file ({e.msg} at line {e.lineno})") from None
    except RecursionError:
        raise ValueError(f"{path}: not a records file: its JSON is nested too deeply to read "
                         f"({_SCHEMA_HINT})") from None
    if not isinstance(data, dict) or not isinstance(data.get("pivots"), list):
        raise ValueError(
            f"{path}: not a published records file: expected a JSON object with a "
            f"'pivots' list ({_SCHEMA_HINT})"
        )
    return data["pivots"], data.get("config")


def load_records(path) -> pd.DataFrame:
    """Load one records file into a DataFrame (docs/protocol.md section 6).

    Columns: ``COLUMNS`` (optional ones all-missing when the file lacks them), any extra
    columns of the file, and ``source`` (the file stem). The published ``config`` (for
    this package's own records: the protocol read from the stage's params.json) is kept
    in ``df.attrs["configs"][source]``, the file in ``df.attrs["path"]``. Raises a
    one-line ``ValueError`` naming the file (and record index and field) on unreadable
    files, malformed records, or a (problem_id, rollout, abs_pos) that occurs twice.
    """
    path = Path(path)
    rows, config = _read_rows(path)
    if config is not None and not isinstance(config, dict):
        raise ValueError(f"{path}: 'config' must be an object of run settings ({_SCHEMA_HINT})")
    if not rows:
        raise ValueError(f"{path}: holds no records (an empty pivots list); nothing to compute")
    for i, rec in enumerate(rows):
        _check_record(path, i, rec)
    df = pd.DataFrame.from_records(rows)
    for col in COLUMNS:
        if col not in df.columns:
            df[col] = pd.Series([None] * len(df), dtype=object)
    extra = [c for c in df.columns if c not in COLUMNS and c != "source"]
    df = df[list(COLUMNS) + extra].copy()
    for col in ("problem_id", "rollout", "abs_pos"):
        df[col] = df[col].astype("int64")
    for col in ("margin",) + _A_FIELDS:
        df[col] = df[col].astype("float64")
    df["source"] = path.stem
    if path.suffix.lower() != ".json":  # this package's own records: no config block in the file
        config = _run_config(path, df)
    _check_config(path, config)
    _check_grid(path, df, (config or {}).get("k"))
    df.attrs["configs"] = {path.stem: config}
    df.attrs["path"] = str(path)
    _refuse_duplicates(df, str(path))
    return df


def _check_grid(path: Path, df: pd.DataFrame, k) -> None:
    """Every A is a difference of two success rates out of K: a multiple of 1/K (K from the file's
    config or params.json, checked by _check_config; unknown K: not checked)."""
    if k is None:
        return
    for col in _A_FIELDS:
        off = np.abs(df[col].to_numpy(dtype=float) * k - np.round(df[col].to_numpy(dtype=float) * k)) > 1e-6
        if off.any():
            i = int(off.nonzero()[0][0])
            raise ValueError(f"{path}: pivot {i} has {col} = {df[col].iloc[i]!r}, not a multiple of 1/K (K = {k}): "
                             f"no K continuations per arm give it ({_SCHEMA_HINT})")


def _run_config(path: Path, df: pd.DataFrame) -> dict | None:
    """The protocol of this package's own records: from the stage's params.json (beside the
    file, or two directories up for a shard), else batch-invariance from the ``config`` column."""
    for where in (path.parent / "params.json", path.parent.parent / "params.json"):
        try:
            recorded = json.loads(where.read_text())
        except (OSError, json.JSONDecodeError):
            continue
        except RecursionError:
            raise ValueError(f"{where}: nested too deeply to read; not a stage's params.json") from None
        p = recorded.get("params") if isinstance(recorded, dict) else None
        if not isinstance(p, dict):
            raise ValueError(f"{where}: not a stage's params.json (no 'params' mapping); rerun the stage")
        inv = recorded.get("stage") == "05_batch_invariant"
        return {"model": p.get("model"), "k": p.get("k"), "cont_temp": p.get("cont_temperature"),
                # stage 05's continuation limit; 0 there means max_cont_tokens (replay.settings)
                "max_cont_tokens": (inv and p.get("invariant_max_cont_tokens")) or p.get("max_cont_tokens"),
                "temperature": p.get("temperature"), "engine": p.get("engine"), "batch_invariant": inv,
                "problems": int(df["problem_id"].nunique())}
    if "config" in df.columns and df["config"].notna().all() and len(df):
        return {"batch_invariant": bool(df["config"].astype(str).str.endswith("(invariant)").all()),
                "problems": int(df["problem_id"].nunique())}
    return None


def _refuse_duplicates(df: pd.DataFrame, name: str) -> None:
    dup = df.duplicated(subset=KEY, keep="first")
    if dup.any():
        i = int(dup.to_numpy().nonzero()[0][0])
        key = ", ".join(f"{k}={int(df[k].iloc[i])}" for k in KEY)
        raise ValueError(f"{name}: duplicate record key ({key}) at record {i}; a file holds each pivot once: "
                         f"remove the repeated record")


def protocol(config: dict | None) -> dict:
    """The ``PROTOCOL_SETTINGS`` a file's config records (absent ones left out); a published
    ``cont_temp`` of null means the trunk temperature."""
    config = config or {}
    out = {k: config[k] for k in PROTOCOL_SETTINGS if config.get(k) is not None}
    if "cont_temp" in config and config["cont_temp"] is None and config.get("temperature") is not None:
        out["cont_temp"] = config["temperature"]
    return out


def _differs(a, b) -> bool:
    if _is_number(a) and _is_number(b):
        return float(a) != float(b)
    return a != b


def _name(frame: pd.DataFrame, i: int) -> str:
    if "path" in frame.attrs:
        return frame.attrs["path"]
    sources = frame["source"].dropna().unique() if "source" in frame.columns else []
    return str(sources[0]) if len(sources) == 1 else f"record frame {i}"


def pool(frames) -> pd.DataFrame:
    """Pool record frames of one protocol; deduplicate on (problem_id, rollout, abs_pos), keep first.

    Refuses (``ValueError``, one line) a frame with a repeated key, and two frames whose
    recorded ``PROTOCOL_SETTINGS`` differ (settings a file does not record are not compared).
    ``attrs["dropped"]`` maps each frame (its file) that lost records to an earlier frame's
    keys to ``(dropped, records it had)``.
    """
    frames = list(frames)
    if not frames:
        raise ValueError("pool: no record frames given")
    names = [_name(f, i) for i, f in enumerate(frames)]
    settings = []
    for f, name in zip(frames, names):
        _refuse_duplicates(f, name)
        settings.append({})
        for config in f.attrs.get("configs", {}).values():
            settings[-1].update(protocol(config))
    for i in range(len(frames)):
        for j in range(i):
            for k in PROTOCOL_SETTINGS:
                if k in settings[i] and k in settings[j] and _differs(settings[i][k], settings[j][k]):
                    raise ValueError(f"{names[j]} and {names[i]}: different protocols ({k} {settings[j][k]!r} vs "
                                     f"{settings[i][k]!r}); pool only records of one configuration, report the "
                                     f"others separately")
    configs = {}
    for f in frames:
        configs.update(f.attrs.get("configs", {}))
    out = pd.concat(frames, ignore_index=True)
    keep = ~out.duplicated(subset=KEY, keep="first")
    owner = np.repeat(np.arange(len(frames)), [len(f) for f in frames])
    dropped = {names[i]: (int((~keep.to_numpy() & (owner == i)).sum()), len(frames[i])) for i in range(len(frames))}
    out = out[keep.to_numpy()].reset_index(drop=True)
    out.attrs = {"configs": configs, "dropped": {k: v for k, v in dropped.items() if v[0]}}
    return out


def load_paper_row(label: str, root) -> pd.DataFrame:
    """Load and pool the record files of one Table 1 row; ``root`` is data/paper-records/."""
    if label not in PAPER_ROWS:
        raise ValueError(f"unknown Table 1 row {label!r} (one of: {', '.join(PAPER_ROWS)})")
    root = Path(root)
    return pool(load_records(root / f) for f in PAPER_ROWS[label]["files"])


BLOCKS = ("config", "aggregate", "per_problem", "elapsed_seconds")


def load_blocks(path) -> dict:
    """The run-level blocks of one published records file (docs/protocol.md section 6):
    ``config``, ``aggregate`` (the harness's pre-registered metrics), ``per_problem`` and
    ``elapsed_seconds``; None where the file has no such block."""
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{path}: cannot read the run blocks ({type(e).__name__})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: not a published records file ({_SCHEMA_HINT})")
    return {key: data.get(key) for key in BLOCKS}


# ---------------------------------------------------------------- a run's tables: every column's type

def _cells_are(column: pd.Series, kind: str, depth: int) -> bool:
    """Every cell of a list column (depth 1: a list; depth 2: a list of lists) holds numbers of the kind
    ("i": integers, "f": numbers)."""
    kinds = "iu" if kind == "i" else "iuf"
    for cell in column:
        if isinstance(cell, (str, bytes)) or not hasattr(cell, "__len__"):
            return False
        parts = [cell] if depth == 1 else list(cell)
        if any(isinstance(x, (str, bytes)) or not hasattr(x, "__len__") for x in parts):
            return False
        for a in map(np.asarray, parts):
            if a.size and (a.dtype.kind not in kinds or (kind == "f" and not np.isfinite(a).all())):
                return False
    return True


def check_columns(df: pd.DataFrame, path, columns: dict) -> pd.DataFrame:
    """A table read from a run, refused in one line naming the file and the column unless every column
    has its type (a received run's files can hold anything): columns maps a name to "id" (a
    non-negative integer), "int", "bool", "number", "text", "ids" (a list of integers), "ids per token"
    or "numbers per token" (a list of lists)."""
    for name, kind in columns.items():
        if name not in df.columns:
            raise ValueError(f"{path}: has no column '{name}'; rerun the stage that writes it")
        col = df[name]
        if kind in ("id", "int"):
            ok = col.dtype.kind in "iu" and (kind == "int" or not len(col) or col.min() >= 0)
        elif kind == "bool":
            ok = col.dtype.kind == "b"
        elif kind == "number":
            ok = col.dtype.kind in "iuf" and bool(np.isfinite(col.to_numpy(dtype=float)).all())
        elif kind == "text":
            ok = all(isinstance(x, str) for x in col)
        else:
            ok = _cells_are(col, "f" if kind.startswith("numbers") else "i", 2 if kind.endswith("per token") else 1)
        if not ok:
            want = {"id": "non-negative integers", "int": "integers", "bool": "true or false",
                    "number": "finite numbers", "text": "text"}.get(kind, kind.replace("ids", "lists of integers")
                                                                     .replace("numbers per", "lists of numbers per"))
            raise ValueError(f"{path}: column '{name}' must hold {want} ({col.dtype}); not a table its stage "
                             f"wrote: rerun the stage, or do not use this run")
    return df
