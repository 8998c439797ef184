"""Finished stages shared between configurations: a stage made with the same parameters under another
configuration's name is found (made by this user, unchanged) and copied, so that a renamed run or a
campaign starts from it."""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from ..core.files import atomic_copy, atomic_write_json
from ..core.paths import config_dir, out_root
from .origin import made_here, origin
from .provenance import changed_outputs
from .registry import stage as stage_entry


def find_stage_elsewhere(params, stage: str, out_dir=None, exclude: str = "") -> Path | None:
    """A finished, unchanged stage with the key `params` asks for, under another configuration's name
    (the first one in name order) and made by this user (made_here), so that a renamed run can start
    from it."""
    runs = config_dir(params.config, out_dir).parent
    key = params.stage_key(stage)
    for candidate in sorted(runs.glob(f"*/{stage}")) if runs.is_dir() else []:
        if candidate.parent.name == exclude or not (candidate / "DONE").exists():
            continue
        try:
            if json.loads((candidate / "params.json").read_text()).get("key") != key:
                continue
            manifest = json.loads((candidate / "manifest.json").read_text())
        except (OSError, ValueError):
            continue
        if isinstance(manifest, dict) and made_here(manifest) and not changed_outputs(
                candidate, manifest.get("outputs", {})):
            return candidate
    return None


def remove_links(directory: Path) -> None:
    """Remove every symbolic link under a directory (not following any)."""
    for where, dirs, files in os.walk(directory):
        for name in dirs + files:
            if os.path.islink(os.path.join(where, name)):
                os.unlink(os.path.join(where, name))


def copy_stage(src: Path, dst: Path, dst_config: str, out_dir=None) -> None:
    """Give another configuration a finished stage made with the same parameters and inputs: a copy
    of the stage directory whose params.json and manifest name the new configuration (manifest
    ``copied_from``), with its products (figures, tables) and the figures its notebook drew copied
    under the new configuration's name.
    The caller checks that the keys and inputs are the same; the copy appears whole or not at all."""
    root = out_root(out_dir)
    src_config = src.parent.name
    tmp = dst.parent / f".{dst.name}.copy-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(src, tmp, symlinks=True, ignore=shutil.ignore_patterns(".*.tmp", ".write-test-*"))
    remove_links(tmp)  # a stage holds plain files: nothing a link points to is copied in
    recorded = json.loads((tmp / "params.json").read_text())
    atomic_write_json(tmp / "params.json", {**recorded, "config": dst_config})
    manifest = json.loads((tmp / "manifest.json").read_text())
    products = {}
    for rel, digest in manifest.get("products", {}).items():
        parts = rel.split("/")
        if len(parts) > 2 and parts[0] in ("figures", "tables") and parts[1] == src_config:
            parts[1] = dst_config
            atomic_copy(root / rel, root / "/".join(parts))
        products["/".join(parts)] = digest
    for name in stage_entry(src.name).figures:  # what the stage's notebook drew, as the copy's own
        for f in (root / "figures" / src_config).glob(f"{name}.*"):
            atomic_copy(f, root / "figures" / dst_config / f.name)
    manifest.update({"config": dst_config, "copied_from": src.resolve().relative_to(root.resolve()).as_posix(),
                     **({"products": products} if products else {})})
    manifest["origin"] = origin(manifest)  # the copy is this user's
    atomic_write_json(tmp / "manifest.json", manifest)
    old = dst.parent / f".{dst.name}.old-{os.getpid()}"
    if dst.exists():
        dst.rename(old)
    tmp.rename(dst)
    shutil.rmtree(old, ignore_errors=True)
