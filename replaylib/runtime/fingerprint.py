"""A stage's code fingerprint: a hash of the code that computes its outputs, and of nothing else.

It covers
- the notebook's cells tagged ``compute`` (the call of the stage's driver; cells that show results,
  the parameters cell and the prose are outside: the parameters are in the stage key), and
- the modules of the stage's computing subpackages (``Stage.computes``: ``measure`` for the stages
  that measure, ``analysis`` for the statistics) that its driver imports, and theirs, transitively,
  following imports only within those subpackages. The driver itself, the run layer (parameters, run
  directories, executors, progress, locks), the display modules and logging are outside.

Each module counts as its normalised code (``ast.unparse``): docstrings, comments, logging calls
(``log.*`` / ``logging.*``) and the messages of raised errors are taken out first, so rewording a
message or a comment reruns nothing, while any change to what is computed does.
"""
from __future__ import annotations

import ast
import hashlib
from pathlib import Path

from ..core.paths import PACKAGE, notebook_path
from .registry import stage as stage_entry

LOGGERS = {"log", "logger", "logging", "warnings"}


def compute_cells(stage: str) -> list[str]:
    """The notebook's code cells tagged ``compute``, without shell or magic lines."""
    import nbformat
    nb = nbformat.read(notebook_path(stage), as_version=4)
    return ["\n".join(line for line in c.source.splitlines() if not line.lstrip().startswith(("%", "!")))
            for c in nb.cells if c.cell_type == "code" and "compute" in c.metadata.get("tags", [])]


def _module_file(dotted: str) -> Path | None:
    """replaylib.a.b -> its file, or None when it is not a module of this package."""
    if not dotted.startswith("replaylib."):
        return None
    base = PACKAGE.joinpath(*dotted.split(".")[1:])
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


def _dotted(path: Path) -> str:
    rel = path.relative_to(PACKAGE).with_suffix("")
    parts = ["replaylib", *rel.parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported(source: str, module: str) -> set[str]:
    """replaylib modules that a piece of code (of module ``module``, dotted) imports, at any depth
    (imports inside functions count): ``from .x import y`` names module x, or x.y where y is a module."""
    package = module.split(".")[:-1] if not module.endswith("__init__") else module.split(".")
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = package[:len(package) - node.level + 1] if node.level else []
            mod = ".".join(base + ([node.module] if node.module else []))
            found.add(mod)
            found |= {f"{mod}.{a.name}" for a in node.names}
    return {m for m in found if _module_file(m)}


def normalised(source: str) -> str:
    """Code without docstrings, comments, logging calls and the messages of raised errors."""
    tree = ast.parse(source)
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr) \
                and isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str):
            node.body = body[1:] or [ast.Pass()]
        for field in ("body", "orelse", "finalbody", "handlers"):
            stmts = getattr(node, field, None)
            if isinstance(stmts, list):
                kept = [s for s in stmts if not _is_log_call(s)]
                setattr(node, field, kept or ([ast.Pass()] if field == "body" else []))
        if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call):
            node.exc.args, node.exc.keywords = [], []
    return ast.unparse(tree)


def _is_log_call(stmt) -> bool:
    if not (isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call)):
        return False
    func = stmt.value.func
    return isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id in LOGGERS


def stage_modules(stage: str) -> list[str]:
    """The modules that compute a stage's outputs (dotted names): those of its computing subpackages
    that its driver and its notebook's compute cells import, and theirs, within those subpackages."""
    entry = stage_entry(stage)
    inside = tuple(f"replaylib.{sub}." for sub in entry.computes)
    driver = f"replaylib.stages.{entry.driver}"
    roots = imported(_module_file(driver).read_text(), driver)
    if entry.engine:  # its units run on the engines the executor makes from their table
        from ..measure.engines import ENGINES
        roots |= {"replaylib.measure.engines"} | {e.module for e in ENGINES.values()}
    for cell in compute_cells(stage):
        roots |= imported(cell, "replaylib.notebook")
    todo, seen = {m for m in roots if m.startswith(inside)}, set()
    while todo:
        mod = todo.pop()
        seen.add(mod)
        todo |= {m for m in imported(_module_file(mod).read_text(), mod) if m.startswith(inside)} - seen
    return sorted(seen)


def code_fingerprint(stage: str) -> str:
    """Hash of what computes a stage's outputs (see the module's docstring)."""
    h = hashlib.sha256()
    h.update(b"cells\0" + "\0".join(compute_cells(stage)).encode())
    for mod in stage_modules(stage):
        h.update(mod.encode() + b"\0" + normalised(_module_file(mod).read_text()).encode())
    return h.hexdigest()[:16]
