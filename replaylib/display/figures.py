"""A figure a notebook draws for display (not a stage's product), saved beside the products under
figures/<config>/: each file is rewritten only when its bytes change, so running the notebook again leaves
the files, and their modification times, as they were."""
from __future__ import annotations

import io
from pathlib import Path

import pandas as pd

from ..core.files import atomic_write_bytes


def save_if_changed(fig, name: str, figures_dir, data: pd.DataFrame | None = None) -> list[Path]:
    """Write ``name.pdf``, ``name.png`` (200 dpi) and, with ``data``, ``name.csv`` (the data the figure plots)
    under ``figures_dir``, each only where its bytes differ from the file there; returns the paths."""
    def pdf(buf):  # no creation date: the same figure gives the same bytes
        fig.savefig(buf, format="pdf", metadata={"CreationDate": None})

    writers = {"pdf": pdf, "png": lambda buf: fig.savefig(buf, format="png", dpi=200)}
    if data is not None:
        writers["csv"] = lambda buf: buf.write(data.to_csv(index=False).encode())
    paths = []
    for suffix, write in writers.items():
        buf = io.BytesIO()
        write(buf)
        path = Path(figures_dir) / f"{name}.{suffix}"
        # a link is replaced, never kept, even with the same bytes (core.files writes through none)
        if path.is_symlink() or not path.is_file() or path.read_bytes() != buf.getvalue():
            atomic_write_bytes(path, buf.getvalue())
        paths.append(path)
    return paths
