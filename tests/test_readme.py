"""The README quotes no number by hand: its tables are the generated files (tools/readme_tables.py)."""
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
