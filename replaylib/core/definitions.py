"""The package's code as definitions, the unit in which a stage records the code it used
(replaylib.core.recording): a function, a method (``Class.method``), a class's header (its bases, decorators
and body without its methods), a module-level value with every statement that binds it, and the statements
a module runs on import that bind no name (``<module>``).

Each definition counts as its normalised code: docstrings, comments, annotations of functions, the messages
of raised errors and asserts, statements that only report (a call of ``print``, of a logger, of ``logging``,
``warnings`` or the package's progress module, when the name is not rebound where it is used), string
variables used only in such messages, and a ``Kernel``'s progress label, row counting and preview are taken
out. So rewording a message or a comment changes no digest, while any change to what is computed does.

``closure`` follows names statically; the recorder uses it only where running cannot tell: the module-level
values and class headers the code that ran reads, and code a third-party process runs by name
(``"replaylib.measure.vllm_forcing:ForcedTokens"``, as vLLM loads a logits processor).
"""
from __future__ import annotations

import ast
import copy
import functools
import hashlib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from .paths import PACKAGE, cache_dir, notebook_path, write_cached

TOPLEVEL = "<module>"
NAMED = re.compile(r"replaylib(?:\.\w+)+:\w+")  # module:name, a definition a third-party process loads by name
REPORTING_MODULES = {"logging", "warnings", "replaylib.core.progress"}
KERNEL_DISPLAY = ("progress", "count_rows", "preview")  # a Kernel's fields that only show


@functools.lru_cache(maxsize=4096)
def module_file(dotted: str) -> Path | None:
    """replaylib.a.b -> its file, or None when it is not a module of this package."""
    if dotted != "replaylib" and not dotted.startswith("replaylib."):
        return None
    base = PACKAGE.joinpath(*dotted.split(".")[1:])
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


def module_name(path) -> str | None:
    """A file of this package -> its module's dotted name (None outside the package)."""
    try:
        rel = Path(path).resolve().relative_to(PACKAGE)
    except ValueError:
        return None
    if rel.suffix != ".py":
        return None
    parts = ["replaylib", *rel.with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


# ------------------------------------------------------------------ normalising

def _bound_names(node) -> set[str]:
    """Every name bound anywhere inside a definition: its arguments, assignments, loop targets, imports."""
    names = set()
    for n in ast.walk(node):
        if isinstance(n, ast.Name) and isinstance(n.ctx, (ast.Store, ast.Del)):
            names.add(n.id)
        elif isinstance(n, ast.arg):
            names.add(n.arg)
        elif isinstance(n, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in n.names)
        elif isinstance(n, ast.ExceptHandler) and n.name:
            names.add(n.name)
    return names


def _receiver(func) -> str | None:
    while isinstance(func, ast.Attribute):
        func = func.value
    return func.id if isinstance(func, ast.Name) else None


def _called(func) -> str:
    return func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""


def _is_docstring(stmt) -> bool:
    return isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant) and isinstance(stmt.value.value, str)


def _stringy(value) -> bool:
    """An expression that builds a text: a string, an f-string, their sums and %-formats, str.format."""
    if isinstance(value, ast.Constant):
        return isinstance(value.value, str)
    if isinstance(value, ast.JoinedStr):
        return True
    if isinstance(value, ast.BinOp):
        return _stringy(value.left)
    if isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute) and value.func.attr == "format":
        return _stringy(value.func.value)
    return False


class _Normaliser(ast.NodeTransformer):
    def __init__(self, reporters: set[str]):
        self.reporters = reporters

    def reports(self, stmt) -> bool:
        if not (isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call)):
            return False
        call = stmt.value
        if isinstance(call.func, ast.Name) and call.func.id == "print":
            return not any(k.arg == "file" for k in call.keywords)  # print(..., file=f) may write an output
        return _receiver(call.func) in self.reporters

    def visit_FunctionDef(self, node):
        node.returns = None
        for a in node.args.posonlyargs + node.args.args + node.args.kwonlyargs + [node.args.vararg,
                                                                                 node.args.kwarg]:
            if a is not None:
                a.annotation = None
        return self.generic_visit(node)

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_Lambda(self, node):
        return self.generic_visit(node)

    def generic_visit(self, node):
        super().generic_visit(node)
        for name in ("body", "orelse", "finalbody"):
            stmts = getattr(node, name, None)
            if isinstance(stmts, list) and stmts and isinstance(stmts[0], ast.stmt):
                if name == "body" and isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef,
                                                        ast.Module)) and _is_docstring(stmts[0]):
                    stmts = stmts[1:]
                kept = [s for s in stmts if not self.reports(s)]
                setattr(node, name, kept or ([ast.Pass()] if name == "body" else []))
        return node

    def visit_Raise(self, node):
        self.generic_visit(node)
        if isinstance(node.exc, ast.Call):
            node.exc.args, node.exc.keywords = [], []
        return node

    def visit_Assert(self, node):
        self.generic_visit(node)
        node.msg = None
        return node

    def visit_Call(self, node):
        self.generic_visit(node)
        called = _called(node.func)
        if _receiver(node.func) in self.reporters or called.endswith(("Error", "Exception", "Warning")):
            node.args, node.keywords = [], []  # a reporting call whose result is kept, an error's message
        elif called == "Kernel":
            node.keywords = [k for k in node.keywords if k.arg not in KERNEL_DISPLAY]
        return node


def _drop_message_variables(tree) -> None:
    """Inside functions, remove assignments of a text to a name that nothing left reads (a message built
    before the raise or log call that was taken out)."""
    for fn in [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]:
        while True:
            read = {n.id for n in ast.walk(fn) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
            dropped = False
            for holder in ast.walk(fn):
                for name in ("body", "orelse", "finalbody"):
                    stmts = getattr(holder, name, None)
                    if not (isinstance(stmts, list) and stmts and isinstance(stmts[0], ast.stmt)):
                        continue
                    kept = [s for s in stmts if not (
                        isinstance(s, (ast.Assign, ast.AnnAssign)) and s.value is not None and _stringy(s.value)
                        and all(isinstance(t, ast.Name) and t.id not in read
                                for t in (s.targets if isinstance(s, ast.Assign) else [s.target])))]
                    if len(kept) != len(stmts):
                        setattr(holder, name, kept or ([ast.Pass()] if name == "body" else []))
                        dropped = True
            if not dropped:
                break


def canonical(node) -> str:
    """Code as text that says what it computes and nothing of how this Python prints it: its syntax tree's
    nodes and values, no positions, fields left empty left out (a newer Python's added fields, such as 3.12's
    type_params, are empty in code that does not use them). Not ast.unparse's text, which differs between
    Pythons (3.12 prints some f-strings with other quotes than 3.11), so a run made under one would read as
    changed code under the other."""
    if isinstance(node, ast.AST):
        fields = ", ".join(f"{name}={canonical(value)}" for name, value in ast.iter_fields(node)
                           if value is not None and value != [])
        return f"{type(node).__name__}({fields})"
    if isinstance(node, list):
        return "[" + ", ".join(canonical(v) for v in node) + "]"
    return repr(node)


def normalised(node: ast.AST, reporters: frozenset | set = frozenset()) -> ast.AST:
    """A copy of a definition without what only reports (see the module's docstring); reporters: the
    module-level names that only report, minus those the definition rebinds."""
    tree = copy.deepcopy(node)
    _Normaliser(set(reporters) - _bound_names(tree)).visit(tree)
    _drop_message_variables(tree)
    return tree


# ------------------------------------------------------------------ modules

@dataclass
class Module:
    """One module's definitions ({name: [statements]}), its classes' methods, what its names bind to among the
    package's modules ({name: (module, attribute or None)}), the module-level names that only report, and
    where each definition is ([(first line, last line, name)], methods before their class)."""
    name: str
    package: list = field(default_factory=list)
    defs: dict = field(default_factory=dict)
    methods: dict = field(default_factory=dict)
    binds: dict = field(default_factory=dict)
    reporters: frozenset = frozenset()
    spans: list = field(default_factory=list)

    def kind(self, name: str) -> str:
        """function, class or value."""
        first = self.defs[name][0]
        return "function" if isinstance(first, (ast.FunctionDef, ast.AsyncFunctionDef)) else \
            "class" if isinstance(first, ast.ClassDef) else "value"

    def at_line(self, line: int) -> str:
        """The definition holding a line (a method before its class); the module's own statements else."""
        for first, last, name in self.spans:
            if first <= line <= last:
                return name
        return TOPLEVEL


def _binds(node, package: list[str]) -> dict:
    """What an import statement binds: {name: (module, attribute or None)} (modules outside the package too)."""
    found = {}
    if isinstance(node, ast.Import):
        for a in node.names:
            found[a.asname or a.name.split(".")[0]] = (a.name if a.asname else a.name.split(".")[0], None)
        return found
    base = ".".join((package[:len(package) - node.level + 1] if node.level else []) +
                    ([node.module] if node.module else []))
    for a in node.names:
        if module_file(f"{base}.{a.name}") or (not module_file(base) and not base.startswith("replaylib")):
            found[a.asname or a.name] = (f"{base}.{a.name}", None)
        else:
            found[a.asname or a.name] = (base, a.name)
    return found


def _stored(node) -> set[str]:
    """The names a module-level statement binds (not those of its comprehensions and lambdas, which are
    their own scopes)."""
    if isinstance(node, (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp, ast.Lambda)):
        return set()
    found = {node.id} if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store) else set()
    for child in ast.iter_child_nodes(node):
        found |= _stored(child)
    return found


def _first_line(node) -> int:
    return min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])


def parse(source: str, dotted: str, is_package: bool = False, tree: ast.Module | None = None) -> Module:
    """A module's definitions (tree: its source already parsed, left as it is)."""
    package = dotted.split(".") if is_package else dotted.split(".")[:-1]
    mod = Module(dotted, package)
    toplevel, reporters, spans = [], set(), []
    for node in (tree or ast.parse(source)).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            mod.defs.setdefault(node.name, []).append(node)
            spans.append((_first_line(node), node.end_lineno, node.name))
        elif isinstance(node, ast.ClassDef):
            header = copy.copy(node)
            header.body = [s for s in node.body if not isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef))]
            mod.defs.setdefault(node.name, []).append(header)
            mod.methods[node.name] = []
            for s in node.body:
                if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    mod.defs[f"{node.name}.{s.name}"] = [s]
                    mod.methods[node.name].append(s.name)
                    spans.append((_first_line(s), s.end_lineno, f"{node.name}.{s.name}"))
            spans.append((_first_line(node), node.end_lineno, node.name))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            bound = _binds(node, package)
            mod.binds.update(bound)
            reporters.update(n for n, (target, _) in bound.items() if target in REPORTING_MODULES)
        elif _is_docstring(node):
            continue
        else:
            names = sorted(_stored(node))
            for name in names:  # every statement that binds a name is part of it: X = 2; X = int(X)
                mod.defs.setdefault(name, []).append(node)
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call) and \
                    _called(node.value.func) == "getLogger":
                reporters.update(names)
            if names:
                spans.append((node.lineno, node.end_lineno, names[0]))
            if not names or not isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
                toplevel.append(node)  # run at import: it may set what the definitions compute with
    mod.defs[TOPLEVEL] = [ast.Module(body=toplevel, type_ignores=[])]
    mod.reporters = frozenset(reporters)
    mod.spans = sorted(spans, key=lambda s: s[1] - s[0])  # the innermost span first
    return mod


@functools.lru_cache(maxsize=512)
def _parsed(path: str, mtime_ns: int, size: int, dotted: str) -> Module:
    return parse(Path(path).read_text(encoding="utf-8"), dotted, path.endswith("__init__.py"))


def module(dotted: str) -> Module | None:
    """A package module's definitions as its file holds them now (None when there is no such module)."""
    path = module_file(dotted)
    try:
        st = path.stat()
    except (AttributeError, OSError):
        return None
    return _parsed(str(path), st.st_mtime_ns, st.st_size, dotted)


def code_of(mod: Module, name: str) -> str:
    return "\n".join(ast.unparse(normalised(n, mod.reporters)) for n in mod.defs[name])


def compute_cells(stage: str) -> str:
    """A stage notebook's cells tagged ``compute``, normalised (comments, shell and magic lines out), as
    ``canonical`` text."""
    cells = json.loads(notebook_path(stage).read_text(encoding="utf-8"))["cells"]
    out = []
    for c in cells:
        if c.get("cell_type") == "code" and "compute" in c.get("metadata", {}).get("tags", []):
            source = "".join(c["source"]) if isinstance(c["source"], list) else c["source"]
            kept = "\n".join(line for line in source.splitlines() if not line.lstrip().startswith(("%", "!")))
            out.append(canonical(normalised(ast.parse(kept))))
    return "\n".join(out)


NOTEBOOK = "notebook:"  # a stage notebook's compute cells: notebook:<stage>


def digest(entry: str) -> str | None:
    """The digest of a definition (``module:name``) or of a stage's compute cells (``notebook:<stage>``) as
    the files hold them now; None when it is gone."""
    if entry.startswith(NOTEBOOK):
        try:
            return hashlib.sha256(compute_cells(entry[len(NOTEBOOK):]).encode()).hexdigest()[:16]
        except (OSError, ValueError, KeyError):
            return None
    dotted, _, name = entry.partition(":")
    return fact(dotted, name)[0]


# ------------------------------------------------------------------ following names

@dataclass(frozen=True)
class Edges:
    """What one definition's code refers to: (module, name, runs) for each name it reads (runs: it is called
    where a value is made, so it ran at import), the attributes it uses, and the definitions it names as text
    for a third-party process to run."""
    refs: tuple = ()
    attributes: tuple = ()
    named: tuple = ()


def fact(dotted: str, name: str) -> tuple[str | None, Edges]:
    """A definition's digest (None when it is gone) and what its code refers to, as its file holds it now."""
    path = module_file(dotted)
    try:
        st = path.stat()
    except (AttributeError, OSError):  # not a module of the package, or gone
        return None, Edges()
    return _fact(str(path), dotted, name, st.st_mtime_ns, st.st_size)


def edges(dotted: str, name: str) -> Edges:
    return fact(dotted, name)[1]


@functools.lru_cache(maxsize=8192)
def _fact(path: str, dotted: str, name: str, mtime_ns: int, size: int) -> tuple[str | None, Edges]:
    known = _disk.get(path, mtime_ns, size, dotted, name)
    if known is not None:
        return known
    mod = module(dotted)
    if name not in mod.defs:
        found = (None, Edges())
    else:
        nodes = [normalised(n, mod.reporters) for n in mod.defs[name]]
        code = "\n".join(canonical(n) for n in nodes)
        found = (hashlib.sha256(code.encode()).hexdigest()[:16], _edges_of(mod, name, nodes))
    _disk.put(path, mtime_ns, size, dotted, name, found)
    return found


def _edges_of(mod: Module, name: str, nodes: list) -> Edges:
    refs, attributes, named = [], set(), []
    is_value = mod.kind(name) == "value"
    for code in nodes:
        binds = dict(mod.binds)
        for n in ast.walk(code):  # imports inside functions bind names too
            if isinstance(n, (ast.Import, ast.ImportFrom)):
                binds.update(_binds(n, mod.package))
        calls = {id(n.func) for n in ast.walk(code) if isinstance(n, ast.Call)}
        for n in ast.walk(code):
            runs = is_value and id(n) in calls  # in a value's statement a called name runs at import
            if isinstance(n, ast.Name):
                if n.id in binds and binds[n.id][1]:
                    refs.append((*binds[n.id], runs))
                elif n.id in mod.defs and n.id != TOPLEVEL:
                    refs.append((mod.name, n.id, runs))
            elif isinstance(n, ast.Attribute):
                attributes.add(n.attr)
                if isinstance(n.value, ast.Name) and n.value.id in binds and not binds[n.value.id][1]:
                    target = binds[n.value.id][0]
                    sub = f"{target}.{n.attr}"
                    refs.append(((sub, TOPLEVEL) if module_file(sub) else (target, n.attr)) + (runs,))
            elif isinstance(n, ast.Call) and _called(n.func) == "getattr" and len(n.args) >= 2 \
                    and isinstance(n.args[1], ast.Constant) and isinstance(n.args[1].value, str):
                owner = n.args[0]  # getattr(module, "NAME"): that module's definition
                if isinstance(owner, ast.Name) and owner.id in binds and not binds[owner.id][1]:
                    refs.append((binds[owner.id][0], n.args[1].value, False))
            elif isinstance(n, ast.Constant) and isinstance(n.value, str):
                if NAMED.fullmatch(n.value):
                    named.append(tuple(n.value.split(":")))
                elif n.value.isidentifier():  # getattr(x, "name"), globals()["NAME"]
                    attributes.add(n.value)
                    if n.value in mod.defs and mod.kind(n.value) != "function":
                        refs.append((mod.name, n.value, False))
    return Edges(tuple(dict.fromkeys(refs)), tuple(sorted(attributes)), tuple(dict.fromkeys(named)))


class _DiskCache:
    """Digests and references of definitions, kept in the package's cache directory (core.paths.cache_dir) so
    that the processes of a run, and copies of the repository, normalise each definition once: a file per
    source file's content, keyed too by its module's name, the package's modules (a name may resolve to a
    submodule) and this module's own source (a change to how code is normalised starts afresh)."""

    def __init__(self):
        self.keys, self.entries, self.dirty = {}, {}, set()

    def _key(self, path: str, mtime_ns: int, size: int, dotted: str) -> str:
        at = (path, mtime_ns, size, dotted)
        if at not in self.keys:
            try:
                content = Path(path).read_bytes()
            except OSError:
                content = b""
            self.keys[at] = hashlib.sha256(b"\0".join(
                [content, dotted.encode(), _layout_digest().encode(), _normaliser_digest().encode()])).hexdigest()[:32]
        return self.keys[at]

    def _of(self, key: str) -> dict:
        if key not in self.entries:
            try:
                self.entries[key] = json.loads((cache_dir() / "definitions" / f"{key}.json").read_text())
            except (OSError, ValueError):
                self.entries[key] = {}
        return self.entries[key]

    def get(self, path: str, mtime_ns: int, size: int, dotted: str, name: str):
        try:
            d, refs, attributes, named = self._of(self._key(path, mtime_ns, size, dotted))[name]
        except (KeyError, TypeError, ValueError):
            return None
        return d, Edges(tuple(map(tuple, refs)), tuple(attributes), tuple(map(tuple, named)))

    def put(self, path: str, mtime_ns: int, size: int, dotted: str, name: str, found) -> None:
        key = self._key(path, mtime_ns, size, dotted)
        d, e = found
        self._of(key)[name] = [d, [list(r) for r in e.refs], list(e.attributes), [list(n) for n in e.named]]
        self.dirty.add(key)

    def save(self) -> None:
        for key in sorted(self.dirty):
            write_cached(cache_dir() / "definitions" / f"{key}.json", json.dumps(self.entries[key]).encode())
        self.dirty.clear()


@functools.lru_cache(maxsize=1)
def _normaliser_digest() -> str:
    return hashlib.sha256(Path(__file__).read_bytes()).hexdigest()[:16]


@functools.lru_cache(maxsize=1)
def _layout_digest() -> str:
    return hashlib.sha256("\n".join(sorted(str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py"))).encode()
                          ).hexdigest()[:16]


_disk = _DiskCache()


def save_cache() -> None:
    """Keep what this process worked out for the next one."""
    _disk.save()


class Closure:
    """Definitions reached from roots by following names. ``values_only``: from a function or method follow
    only to module-level values and class headers (the functions that run are recorded as they run), and
    from a value to what it reads and to the functions it calls while its module is imported; what a
    third-party process runs by name is followed whole."""

    def __init__(self, values_only: bool = False, within=None):
        self.values_only, self.within = values_only, within
        self.reached: set[tuple[str, str]] = set()
        self.attributes: set[str] = set()
        self.classes: set[tuple[str, str]] = set()
        self.todo: list[tuple[str, str, bool]] = []
        self.by_name = Closure(within=within) if values_only else None  # what runs by name, followed whole

    def add(self, mod_name: str, name: str, called: bool = True) -> None:
        """called: the definition runs (a root, or called where it is reached), not only named."""
        if module_file(mod_name) and (self.within is None or self.within(mod_name)):
            self.todo.append((mod_name, name, called))

    def run(self) -> set[tuple[str, str]]:
        while self.todo:
            mod_name, name, called = self.todo.pop()
            mod = module(mod_name)
            if mod is None or (mod_name, name) in self.reached:
                continue
            if name not in mod.defs and name in mod.binds:  # re-exported: follow the import
                target, attr = mod.binds[name]
                self.add(target, attr or TOPLEVEL, called)
                continue
            if name not in mod.defs:  # made at run time (or unknown): the whole module counts
                self.reached.add((mod_name, name))
                for other in mod.defs:
                    self.add(mod_name, other)
                continue
            if self.values_only and not called and mod.kind(name) == "function":
                continue  # named, not run: if it runs, it is recorded as it runs
            self.reached.add((mod_name, name))
            self.add(mod_name, TOPLEVEL)
            found = edges(mod_name, name)
            for target, attr, runs in found.refs:
                self.add(target, attr, runs or not self.values_only)
            for target, attr in found.named:  # run by name in a process of a third party: its whole closure
                if self.values_only:
                    self.by_name.add(target, attr)
                else:
                    self.add(target, attr)
            for attr in found.attributes:
                self._use_attribute(attr)
            if "." in name:
                self.add(mod_name, name.split(".")[0])  # a method's class header
            if name in mod.methods:  # a class: its special methods, and the others as they are used
                self.classes.add((mod_name, name))
                if not self.values_only:
                    for m in mod.methods[name]:
                        if m.startswith("__") or m in self.attributes:
                            self.add(mod_name, f"{name}.{m}")
        if self.by_name is not None:
            self.reached |= self.by_name.run()
        return self.reached

    def _use_attribute(self, attr: str) -> None:
        if attr in self.attributes or self.values_only:
            return
        self.attributes.add(attr)
        for mod_name, cls in self.classes:
            if attr in module(mod_name).methods[cls]:
                self.add(mod_name, f"{cls}.{attr}")


def closure(roots, values_only: bool = False, within=None) -> set[tuple[str, str]]:
    """The definitions reached from roots ((module, name) pairs), in the modules ``within(name)`` accepts."""
    c = Closure(values_only, within)
    for root in roots:
        c.add(*root)
    return c.run()
