"""Copy generated tables into README.md: every block between `<!-- begin FILE -->` and `<!-- end FILE -->`
becomes FILE's content (a path from the repository root), so the README quotes no number by hand.

    python tools/readme_tables.py [--check]

tables/paper/ comes from `python -m replaylib.run params/paper.yaml` (the published records); the GPU
tables are committed evidence under docs/. `--check` changes nothing and exits 1 when a block differs.
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BLOCK = re.compile(r"(<!-- begin (?P<file>\S+) -->\n)(?P<body>.*?)(<!-- end (?P=file) -->)", re.S)


def refreshed(text: str, root: Path = REPO) -> str:
    def sub(m):
        path = root / m.group("file")
        if not path.is_file():
            raise SystemExit(f"{path}: missing; generate it first (see this tool's docstring)")
        return m.group(1) + path.read_text() + m.group(4)
    return BLOCK.sub(sub, text)


def blocks(text: str) -> dict:
    return {m.group("file"): m.group("body") for m in BLOCK.finditer(text)}


def main(argv) -> int:
    readme = REPO / "README.md"
    text = readme.read_text()
    new = refreshed(text)
    if "--check" in argv:
        if new != text:
            print("README.md: a generated table differs from its file; run python tools/readme_tables.py")
            return 1
        return 0
    readme.write_text(new)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
