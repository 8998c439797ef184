"""A stage's code fingerprint: a hash of the code that computes its outputs, and of nothing else.

A stage's computation is its kernel (``KERNEL`` in the module the stage table names: its plan, unit and
assemble functions, replaylib.measure.units) and, for a stage that runs on an engine, the engine class the
configuration names (``measure.engines.ENGINES``), not the other engines. The fingerprint covers
- the notebook's cells tagged ``compute`` (the call of the stage; cells that show results, the parameters
  cell and the prose are outside: the parameters are in the stage key), and
- every definition that code reaches, followed name by name through the modules of the computing
  subpackages (``measure``, ``analysis``): a function, a module-level value, a class's header (its bases,
  decorators and fields), its special methods and each of its methods whose name the reached code uses
  as an attribute (``engine.sample_trunks``, ``self._decode``), and the statements a reached module runs
  when it is imported. A name given as text (``"replaylib.measure.x:Name"``) is followed too; a name that
  cannot be found among the definitions brings in its whole module.

So adding a pass to the pass table reruns the passes and not the sampling, editing the vLLM engine leaves
a transformers configuration fresh, and the run layer (run directories, executors, progress, locks), the
display modules and the notebooks' previews are outside.

Each definition counts as its normalised code (``ast.unparse``): docstrings, comments, logging and
progress calls and the messages of raised errors are taken out first (and names used only there are not
followed), so rewording a message or a comment reruns nothing, while any change to what is computed does.
"""
from __future__ import annotations

import ast
import copy
import functools
import hashlib
import re
from dataclasses import dataclass, field
from pathlib import Path

from ..core.paths import PACKAGE, notebook_path
from .registry import stage as stage_entry

COMPUTING = ("replaylib.measure.", "replaylib.analysis.")
QUIET = {"log", "logger", "logging", "warnings", "progress"}  # calls that only report
WRITERS = ("replaylib.measure.units", "write_output")  # how every part and output becomes bytes
NAMED = re.compile(r"replaylib(?:\.\w+)+:\w+")  # module:name (a bare module's name, as the engine table
# gives it, is not followed: the configured engine's class is a root of its own)
TOPLEVEL = "<module>"


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


def normalised(node: ast.AST) -> ast.AST:
    """A copy of the code without docstrings, comments, reporting calls and the messages of raised errors."""
    tree = copy.deepcopy(node)
    for n in ast.walk(tree):
        body = getattr(n, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr) \
                and isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str):
            n.body = body[1:] or [ast.Pass()]
        for name in ("body", "orelse", "finalbody", "handlers"):
            stmts = getattr(n, name, None)
            if isinstance(stmts, list):
                kept = [s for s in stmts if not _reports(s)]
                setattr(n, name, kept or ([ast.Pass()] if name == "body" else []))
        if isinstance(n, ast.Raise) and isinstance(n.exc, ast.Call):
            n.exc.args, n.exc.keywords = [], []
        if isinstance(n, ast.Call) and (_receiver(n.func) in QUIET  # progress.bar(...) assigned to a name
                                        or _called(n.func).endswith(("Error", "Exception"))):  # an error's message
            n.args, n.keywords = [], []
    return tree


def _receiver(func) -> str | None:
    while isinstance(func, ast.Attribute):
        func = func.value
    return func.id if isinstance(func, ast.Name) else None


def _called(func) -> str:
    return func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""


def _reports(stmt) -> bool:
    return isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call) and _receiver(stmt.value.func) in QUIET


@dataclass
class Module:
    """One module's definitions, by name ("f", "Class", "Class.method", "VALUE", TOPLEVEL), and what its
    names bind to among the package's modules ({name: (module, attribute or None)})."""
    name: str
    package: list = field(default_factory=list)
    defs: dict = field(default_factory=dict)
    methods: dict = field(default_factory=dict)  # class -> its method names
    binds: dict = field(default_factory=dict)


def _binds(node, package: list[str]) -> dict:
    """What an import statement binds among the package's modules: {name: (module, attribute or None)}."""
    found = {}
    if isinstance(node, ast.Import):
        for a in node.names:
            if _module_file(a.name):
                found[a.asname or a.name.split(".")[0]] = (a.name if a.asname else a.name.split(".")[0], None)
        return found
    base = ".".join((package[:len(package) - node.level + 1] if node.level else []) +
                    ([node.module] if node.module else []))
    for a in node.names:
        if _module_file(f"{base}.{a.name}"):
            found[a.asname or a.name] = (f"{base}.{a.name}", None)
        elif _module_file(base):
            found[a.asname or a.name] = (base, a.name)
    return found


@functools.lru_cache(maxsize=256)
def _parse(path: str, mtime_ns: int, dotted: str) -> Module:
    package = dotted.split(".") if path.endswith("__init__.py") else dotted.split(".")[:-1]
    mod = Module(dotted, package)
    toplevel = []
    for node in ast.parse(Path(path).read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            mod.defs[node.name] = node
        elif isinstance(node, ast.ClassDef):
            header = copy.copy(node)
            header.body = [s for s in node.body if not isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef))]
            mod.defs[node.name] = header
            mod.methods[node.name] = []
            for s in node.body:
                if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    mod.defs[f"{node.name}.{s.name}"] = s
                    mod.methods[node.name].append(s.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names = [n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)]
            for name in names:
                mod.defs[name] = node
            if not names:
                toplevel.append(node)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            mod.binds.update(_binds(node, package))
        elif not (isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)):
            toplevel.append(node)  # run at import: it may set what the definitions compute with
    mod.defs[TOPLEVEL] = ast.Module(body=toplevel, type_ignores=[])
    return mod


def module(dotted: str) -> Module | None:
    path = _module_file(dotted)
    if path is None:
        return None
    return _parse(str(path), path.stat().st_mtime_ns, dotted)


class Closure:
    """The definitions reached from some roots, within the computing subpackages."""

    def __init__(self, within: tuple = COMPUTING):
        self.within = within
        self.reached: dict[tuple[str, str], str] = {}  # (module, name) -> its normalised code
        self.attributes: set[str] = set()
        self.classes: set[tuple[str, str]] = set()
        self.todo: list[tuple[str, str]] = []

    def add(self, mod_name: str, name: str) -> None:
        if mod_name.startswith(self.within):
            self.todo.append((mod_name, name))

    def run(self) -> "Closure":
        while self.todo:
            mod_name, name = self.todo.pop()
            if (mod_name, name) in self.reached:
                continue
            mod = module(mod_name)
            if mod is None:
                continue
            if name not in mod.defs and name in mod.binds:  # re-exported: follow the import
                self.add(*self._bound(mod.binds[name], None))
                continue
            if name not in mod.defs:  # made at run time (or unknown): the whole module counts
                self.reached[(mod_name, name)] = ""
                for other in mod.defs:
                    self.add(mod_name, other)
                continue
            code = normalised(mod.defs[name])
            self.reached[(mod_name, name)] = ast.unparse(code)
            self.add(mod_name, TOPLEVEL)
            self._follow(mod, code)
            if name in mod.methods:  # a class: its special methods, and the others as they are used
                self.classes.add((mod_name, name))
                for m in mod.methods[name]:
                    if m.startswith("__") or m in self.attributes:
                        self.add(mod_name, f"{name}.{m}")
        return self

    def _bound(self, bind: tuple, attr: str | None) -> tuple[str, str]:
        target, name = bind
        return (target, name) if name else (target, attr or TOPLEVEL)

    def _use_attribute(self, attr: str) -> None:
        if attr in self.attributes:
            return
        self.attributes.add(attr)
        for mod_name, cls in self.classes:
            if attr in module(mod_name).methods[cls]:
                self.add(mod_name, f"{cls}.{attr}")

    def _follow(self, mod: Module, code: ast.AST) -> None:
        binds = dict(mod.binds)
        for n in ast.walk(code):  # imports inside functions bind names too
            if isinstance(n, (ast.Import, ast.ImportFrom)):
                local = _binds(n, mod.package)
                binds.update(local)
                for target, name in local.values():
                    if name:
                        self.add(target, name)
        for n in ast.walk(code):
            if isinstance(n, ast.Name):
                if n.id in binds and binds[n.id][1]:
                    self.add(*binds[n.id])
                elif n.id in mod.defs:
                    self.add(mod.name, n.id)
            elif isinstance(n, ast.Attribute):
                self._use_attribute(n.attr)
                if isinstance(n.value, ast.Name) and n.value.id in binds and not binds[n.value.id][1]:
                    target = binds[n.value.id][0]
                    sub = f"{target}.{n.attr}"
                    self.add(*((sub, TOPLEVEL) if _module_file(sub) else (target, n.attr)))
            elif isinstance(n, ast.Constant) and isinstance(n.value, str):
                if NAMED.fullmatch(n.value):  # a definition named by text, as vLLM takes a logits processor
                    target, _, attr = n.value.partition(":")
                    self.add(target, attr)
                elif n.value.isidentifier():  # getattr(x, "name"), hasattr(...)
                    self._use_attribute(n.value)


def kernel_roots(stage: str) -> list[tuple[str, str]]:
    """Where a stage's computation starts: its kernel, and how parts and outputs are written."""
    return [(stage_entry(stage).kernel, "KERNEL"), WRITERS]


def engine_roots(engine: str | None) -> list[tuple[str, str]]:
    """The engine class a configuration uses: its header, its construction and, through the attributes
    the kernel uses, the methods it calls."""
    if not engine:
        return []
    from ..measure.engines import ENGINES
    entry = ENGINES[engine]
    return [(entry.module, entry.cls), (entry.module, f"{entry.cls}.from_params")]


def closure(roots: list[tuple[str, str]], within: tuple = COMPUTING) -> dict[tuple[str, str], str]:
    """The definitions reached from the roots, following names into the modules under ``within``."""
    c = Closure(within)
    for root in roots:
        c.add(*root)
    return c.run().reached


def digest(roots: list[tuple[str, str]], cells: list[str] = (), within: tuple = COMPUTING) -> str:
    """Hash of the code reached from the roots (and of the given notebook cells)."""
    h = hashlib.sha256()
    h.update(b"cells\0" + "\0".join(cells).encode())
    for (mod_name, name), code in sorted(closure(roots, within).items()):
        h.update(f"{mod_name}:{name}\0{code}\0".encode())
    return h.hexdigest()[:16]


def code_fingerprint(stage: str, engine: str | None = None) -> str:
    """Hash of what computes a stage's outputs (see the module's docstring); engine: the configuration's
    (``params.engine``), for a stage that runs on one."""
    uses = engine if stage_entry(stage).engine else None
    return digest(kernel_roots(stage) + engine_roots(uses), compute_cells(stage))


def stage_definitions(stage: str, engine: str | None = None) -> list[str]:
    """The definitions in a stage's fingerprint, as module:name (for the tests and for curious readers)."""
    uses = engine if stage_entry(stage).engine else None
    return sorted(f"{m}:{n}" for m, n in closure(kernel_roots(stage) + engine_roots(uses)))
