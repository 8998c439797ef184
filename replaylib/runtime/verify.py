"""Re-checking a finished run against its manifests (``python -m replaylib.report --verify``)."""
from __future__ import annotations

import json
from pathlib import Path

from ..core.files import sha256_file
from .registry import STAGES


def _manifest(path: Path, problems: list) -> dict | None:
    try:
        return json.loads((path / "manifest.json").read_text())
    except (OSError, json.JSONDecodeError) as e:
        problems.append(f"{path / 'manifest.json'}: unreadable ({type(e).__name__}); rerun the stage")
        return None


def _check_file(f: Path, digest: str, what: str, problems: list) -> None:
    if not f.exists():
        problems.append(f"{f}: missing ({what})")
    elif sha256_file(f) != digest:
        problems.append(f"{f}: sha256 differs from the manifest ({what})")


def verify_run(run_dir: str | Path) -> list[str]:
    """Re-check a run (runs/<config>); returns the problems found, one line each.

    For every finished stage: its outputs against its manifest; stage 04's products (the
    tables and figures, manifest ``products``; paths absolute or relative to the out root,
    the directory holding ``runs/``); and every recorded input (``<stage>/<file>``) against
    the output that upstream stage's manifest records now.
    """
    run_dir = Path(run_dir)
    problems = []
    stages = [p for p in sorted(run_dir.iterdir()) if p.is_dir() and p.name in STAGES] if run_dir.is_dir() else []
    if not stages:
        return [f"{run_dir}: no stage directories found"]
    manifests = {}
    for path in stages:
        if not (path / "DONE").exists():
            problems.append(f"{path}: not finished (no DONE)")
            continue
        manifest = manifests[path.name] = _manifest(path, problems)
        if manifest is None:
            continue
        for rel, digest in manifest.get("outputs", {}).items():
            _check_file(path / rel, digest, "output", problems)
        for product, digest in manifest.get("products", {}).items():
            _check_file(run_dir.parent.parent / product, digest, f"product of {path.name}", problems)
    for stage, manifest in manifests.items():
        if manifest is None:
            continue
        for ref, digest in manifest.get("inputs", {}).items():
            upstream, _, rel = ref.partition("/")
            recorded = (manifests.get(upstream) or {}).get("outputs", {}).get(rel)
            if recorded != digest:
                why = ("has another sha256 there now" if recorded is not None else
                       "is not among its recorded outputs" if manifests.get(upstream) else
                       "has no finished manifest to check against")
                problems.append(f"{run_dir / upstream / rel}: input of {stage} {why} (upstream {upstream} changed "
                                f"since {stage} read it; rerun {stage})")
    return problems
