"""The shards of a stage's units (or the credit tool's groups): each unit's parts written as it finishes,
reused by a rerun only when they were recorded under the same resume key, their bytes are still the ones
written, and the code and files the unit used are as they were (its record, replaylib.core.recording).
The record (resume.json) holds, per unit, each part's path and sha256, what it used and the seconds it
took; it is rewritten atomically after every unit, so a run killed at any moment leaves either a unit
fully recorded or not at all."""
from __future__ import annotations

import json
from pathlib import Path

from ..core import recording
from ..core.files import atomic_write_json, sha256_file
from ..measure.units import Unit, read_part, write_output


class ShardStore:
    def __init__(self, root: Path, key: str, record: str = "resume.json"):
        self.root, self.key, self.record_file = Path(root), key, Path(root) / record
        try:
            recorded = json.loads(self.record_file.read_text())
        except (OSError, ValueError):
            recorded = {}
        self.fresh = isinstance(recorded, dict) and recorded.get("resume_key") == key
        units = recorded.get("units") if self.fresh else None
        self.units: dict = units if isinstance(units, dict) else {}

    def reset(self) -> None:
        """Forget every unit (the caller has cleared what they wrote)."""
        self.units = {}
        self._write()

    def _write(self) -> None:
        atomic_write_json(self.record_file, {"resume_key": self.key, "units": self.units})

    def load(self, unit: Unit) -> dict | None:
        """A unit's parts as recorded, or None when it is not recorded, any part's bytes changed, or what it
        used (its code, the files it read) is no longer as it was."""
        entry = self.units.get(unit.name)
        if not isinstance(entry, dict) or recording.changes(entry.get("dependencies"), first_only=True):
            return None
        parts = {}
        for name, (rel, digest) in entry.get("parts", {}).items():
            path = self.root / rel
            if not path.is_file() or path.is_symlink() or sha256_file(path) != digest:
                return None
            parts[name] = read_part(path)
        return parts

    def seconds(self, unit: Unit) -> dict:
        return dict(self.units.get(unit.name, {}).get("seconds", {}))

    def dependencies(self, unit: Unit) -> dict | None:
        return self.units.get(unit.name, {}).get("dependencies")

    def save(self, unit: Unit, parts: dict, shard, seconds: dict | None = None, used: dict | None = None) -> dict:
        """Write a unit's parts (``shard(unit, part, value)``: each one's path), record them with what the
        unit used, and return them as read back (what a rerun that reuses them would get)."""
        recorded = {}
        for name, value in parts.items():
            rel = shard(unit, name, value)
            write_output(self.root / rel, value)
            recorded[name] = [rel, sha256_file(self.root / rel)]
        self.record(unit, recorded, seconds or {}, used)
        return {name: read_part(self.root / rel) for name, (rel, _) in recorded.items()}

    def record(self, unit: Unit, parts: dict, seconds: dict, used: dict | None = None) -> None:
        """Record a unit whose parts are written (their paths and sha256): from now on it is reused."""
        self.units[unit.name] = {"parts": parts, "seconds": {k: round(v, 3) for k, v in seconds.items()},
                                 "dependencies": used}
        self._write()

    def changed(self) -> list[str]:
        """The recorded parts whose bytes are no longer the ones written (or that are gone)."""
        return [rel for entry in self.units.values() for rel, digest in entry.get("parts", {}).values()
                if not (self.root / rel).is_file() or sha256_file(self.root / rel) != digest]

    def paths(self) -> list[str]:
        """Every part recorded, relative to the root."""
        return sorted(rel for entry in self.units.values() for rel, _ in entry.get("parts", {}).values())
