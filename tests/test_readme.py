"""The README quotes no number by hand: its tables are the generated files (tools/readme_tables.py); the package
and its documents name only modules that exist."""
import re
from pathlib import Path

import readme_tables

REPO = Path(__file__).resolve().parents[1]


def test_the_readme_tables_are_the_generated_ones():
    from replaylib.analysis import records, tables
    blocks = readme_tables.blocks((REPO / "README.md").read_text())
    assert set(blocks) == {"tables/paper/tab1_main.md", "docs/gpu-h200/lease8/campaign/tab1_main.md"}
    # Table 1 of the published records, as the statistics stage writes it (params/paper.yaml)
    rows = {label: records.load_paper_row(label, REPO / "data" / "paper-records") for label in records.PAPER_ROWS}
    assert blocks["tables/paper/tab1_main.md"] == tables._markdown(tables.table1(rows))
    lease = "docs/gpu-h200/lease8/campaign/tab1_main.md"
    assert blocks[lease] == (REPO / lease).read_text()


def test_the_readme_reads_in_minutes():
    assert len((REPO / "README.md").read_text().splitlines()) <= 200


def test_every_module_the_package_and_its_documents_name_exists():
    """A `replaylib/...py` path written in the package, the params files, the docs, the README or the notebooks
    is a file. The GPU lease records (docs/gpu-h200.md, docs/gpu-h200/) keep the paths of their time."""
    named = re.compile(r"(?<![\w./-])replaylib/[\w/]*\w\.py")
    places = [REPO / "README.md"] + [p for d in ("replaylib", "params", "docs", "notebooks")
                                     for p in sorted((REPO / d).rglob("*")) if p.is_file()]
    missing = []
    for place in places:
        rel = place.relative_to(REPO).as_posix()
        if rel.startswith("docs/gpu-h200") or place.suffix == ".pyc":
            continue
        for path in set(named.findall(place.read_text(errors="replace"))):
            if not (REPO / path).is_file():
                missing.append(f"{rel} names {path}")
    assert not missing, "\n".join(sorted(missing))
