"""What a computation used, recorded while it runs: the definitions of this package that executed and the
files it read, as Shake and ``make -MD`` record what a build step used instead of guessing beforehand.

A ``session()`` records, in this process, every definition of the recorded modules (``RECORDED``: what
decides a stage's bytes, not the run layer or the displays) that ran, and every file read under the
repository's ``data/``, the models directory and the package's own data files. Its ``record()`` is
``{"code": {"module:name": digest}, "files": {path: {sha256, size, mtime_ns}}}``; ``changes(record)`` says
what is no longer as recorded. A process that computes for a stage (the notebook's kernel, the engine
service, a Ray actor) records its share and hands it back with the unit's parts (``Recorded``).

How the definitions that ran are seen: each function of a recorded module gets, once per process, code
compiled from its own source with a call of ``__replaylib_probe__(("module", "definition"))`` at its start (a
hook on every call, ``sys.settrace`` or ``sys.setprofile``, makes Python's interpreter run its unspecialised
path everywhere; its cost is in docs/log.md). Modules imported later are compiled that way as they are
imported; functions made before are found from their module's namespace. The probed code is kept in the
package's cache directory, so each process of a run compiles it once. Code that only ran while its module
was imported is followed statically (``definitions.closure``): the module-level values and class headers
that the code which ran reads, and what a third-party process runs by name. Files are seen by an audit hook
on ``open`` and by ``note_file`` where a library reads them in C (model weights).

A module changed on disk after this process loaded it is not what runs here: its definitions are recorded
as ``CHANGED`` (never current) and the session says to restart the process.
"""
from __future__ import annotations

import ast
import contextlib
import functools
import hashlib
import importlib.abc
import importlib.machinery
import logging
import marshal
import os
import sys
import types
from pathlib import Path

from . import definitions
from .paths import DATA, PACKAGE, REPO, cache_dir, models_dir, write_cached

log = logging.getLogger("replaylib")

DEPENDENCIES = "dependencies"  # the part a recorded unit's record travels in
CHANGED = "changed after this process loaded it"
PROBE = "__replaylib_probe__"
RECORDED = ("replaylib.measure.", "replaylib.analysis.", "replaylib.stages.", "replaylib.credit.",
            "replaylib.core.files", "replaylib.runtime.outputs")
NOT_RECORDED = ("replaylib.credit.cli", "replaylib.credit.report", "replaylib.credit.__main__",
                "replaylib.credit.trl", "replaylib.credit.timings", "replaylib.credit.diagnostics",
                "replaylib.credit.calibration", "replaylib.credit.tool", "replaylib.credit.estimator",
                "replaylib.credit.outdir", "replaylib.credit.export")


@functools.lru_cache(maxsize=None)
def recorded_module(name: str) -> bool:
    return name.startswith(RECORDED) and not name.startswith(NOT_RECORDED)


# ------------------------------------------------------------------ sessions

class _Session:
    __slots__ = ("ran", "files", "records", "changed", "extra_roots")

    def __init__(self):
        self.ran, self.files, self.records, self.changed, self.extra_roots = set(), set(), [], set(), set()

    def merge(self, other: "_Session") -> None:
        self.ran |= other.ran
        self.files |= other.files
        self.records += other.records
        self.changed |= other.changed
        self.extra_roots |= other.extra_roots

    def record(self) -> dict:
        """What this session used, with the digests it has now (see the module's docstring)."""
        return build_record(self)


_stack: list[_Session] = []
_armed: dict[str, int] = {}  # module -> its file's mtime when its code was compiled with probes
_changed: set[str] = set()  # modules whose code here is not their file's
_cached: dict = {}  # (module, definition) -> its lru_cache: what it computed before may serve a session
_installed = False
_START = None
_roots: tuple = ()  # where a file read counts: set when a session starts (the models directory may move)


def __replaylib_probe__(definition: tuple) -> None:
    if _stack:
        _stack[-1].ran.add(definition)


@contextlib.contextmanager
def session():
    """Record what runs in this process until the block ends; nested sessions hand theirs to the outer."""
    global _roots
    _arm()
    _roots = _read_roots()
    current = _Session()
    _stack.append(current)
    try:
        yield current
    finally:
        _stack.pop()
        current.changed |= _changed
        if _stack:
            _stack[-1].merge(current)


def note_file(path) -> None:
    """A file read where the audit hook cannot see it (read in C, as safetensors reads weights)."""
    if _stack:
        _stack[-1].files.add(os.path.realpath(path))


def note_dir(path) -> None:
    """Every file of a directory (a model's) as read."""
    if _stack and Path(path).is_dir():
        for p in sorted(Path(path).rglob("*")):
            if p.is_file():
                note_file(p)


def note_record(record: dict) -> None:
    """A record made earlier of something this session uses (a model built from code, kept on disk)."""
    if _stack and record:
        _stack[-1].records.append(record)


def note_definition(dotted: str, name: str) -> None:
    """A definition the session depends on that may not run in it (a stage's KERNEL)."""
    if _stack:
        _stack[-1].extra_roots.add((dotted, name))


class Recorded:
    """fn(engine, *args) recorded in the process that runs it: the unit's parts with its record (part
    DEPENDENCIES), including what built the engine (``built_with``)."""

    def __init__(self, fn, roots: tuple = ()):
        self.fn, self.roots = fn, tuple(roots)
        self.__module__, self.__qualname__ = fn.__module__, fn.__qualname__

    def __call__(self, engine, *args):
        with session() as s:
            for root in self.roots:
                note_definition(*root)
            note_record(getattr(engine, "built_with", None))
            parts = self.fn(engine, *args)
        return {**parts, DEPENDENCIES: s.record()} if isinstance(parts, dict) else parts


def built(make):
    """make() in a session; its result gets the record as ``built_with`` (an engine, for every unit it
    runs)."""
    with session() as s:
        made = make()
    with contextlib.suppress(AttributeError, TypeError):
        made.built_with = s.record()
    return made


# ------------------------------------------------------------------ probes

def _process_start() -> float:
    global _START
    if _START is None:
        try:
            import psutil
            _START = psutil.Process().create_time()
        except Exception:  # noqa: BLE001 - without psutil every module is compared with its file
            _START = 0.0
    return _START


def _located(new, like):
    """Give the nodes made here the location of the code they stand beside (the original nodes keep theirs)."""
    for n in ast.walk(new):
        if not hasattr(n, "lineno") and isinstance(n, (ast.expr, ast.stmt)):
            n.lineno, n.col_offset = like.lineno, like.col_offset
            n.end_lineno, n.end_col_offset = like.lineno, like.col_offset
    return new


def _probe_call(definition: tuple, like) -> ast.Call:
    """__replaylib_probe__(("module", "definition")): the constant names what ran, in any process."""
    return _located(ast.Call(ast.Name(PROBE, ast.Load()), [ast.Constant(definition)], []), like)


def _instrumented(tree: ast.Module, path: str, mod: definitions.Module) -> types.CodeType:
    """The module's code with a probe at the start of every function and lambda, and of the module's own
    statements (after its docstring and __future__ imports)."""
    def number(line: int) -> tuple:
        return mod.name, mod.at_line(line)

    for node in [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))]:
        if isinstance(node, ast.Lambda):  # (probe, body)[1]
            probe = _probe_call(number(node.lineno), node.body)
            node.body = _located(ast.Subscript(ast.Tuple([probe, node.body], ast.Load()), ast.Constant(1),
                                               ast.Load()), node.body)
        else:
            at = 1 if definitions._is_docstring(node.body[0]) else 0
            like = node.body[min(at, len(node.body) - 1)]
            node.body.insert(at, _located(ast.Expr(_probe_call(number(node.lineno), like)), like))
    at = 0
    while at < len(tree.body) and (definitions._is_docstring(tree.body[at]) or (
            isinstance(tree.body[at], ast.ImportFrom) and tree.body[at].module == "__future__")):
        at += 1
    if tree.body:
        like = tree.body[min(at, len(tree.body) - 1)]
        tree.body.insert(at, _located(ast.Expr(_probe_call((mod.name, definitions.TOPLEVEL), like)), like))
    return compile(tree, path, "exec", dont_inherit=True)


def _with_probes(path: str, dotted: str) -> types.CodeType:
    """A module's code with probes, from its source; kept in the package's cache directory (keyed by the
    source, the module's name, this interpreter and this module's own source), so that each process of a run,
    and each copy of the repository, compiles it once."""
    source = Path(path).read_bytes()
    key = hashlib.sha256(b"\0".join([source, dotted.encode(), _probes_key().encode()])).hexdigest()[:32]
    cached = cache_dir() / "probes" / f"{key}.marshal"
    try:
        return _at(marshal.loads(cached.read_bytes()), path)
    except (OSError, ValueError, EOFError, TypeError):
        pass
    text = source.decode("utf-8")
    tree = ast.parse(text, path)
    code = _instrumented(tree, path, definitions.parse(text, dotted, path.endswith("__init__.py"), tree))
    write_cached(cached, marshal.dumps(code))
    return code


def _at(code: types.CodeType, path: str) -> types.CodeType:
    """Code compiled from a file's source, as compiled at ``path`` (a copy of the file elsewhere)."""
    if code.co_filename == path:
        return code
    return code.replace(co_filename=path, co_consts=tuple(
        _at(c, path) if isinstance(c, types.CodeType) else c for c in code.co_consts))


@functools.lru_cache(maxsize=1)
def _probes_key() -> str:
    return hashlib.sha256(Path(__file__).read_bytes() + sys.version.encode()).hexdigest()[:12]


def _codes(code: types.CodeType, path: str, out: dict) -> dict:
    out[(path, code.co_qualname, code.co_firstlineno)] = code
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            _codes(c, path, out)
    return out


def _same_code(a: types.CodeType, b: types.CodeType) -> bool:
    if a.co_code != b.co_code or a.co_names != b.co_names or len(a.co_consts) != len(b.co_consts):
        return False
    return all(_same_code(x, y) if isinstance(x, types.CodeType) and isinstance(y, types.CodeType) else
               (type(x) is type(y) and x == y) for x, y in zip(a.co_consts, b.co_consts))


def _reachable(module) -> tuple[list, list]:
    """The functions a module's namespace reaches, and the lru caches among what it holds: its functions, its
    classes' methods, what decorators wrapped, closures' captured functions, and functions kept in its
    module-level values (dicts, lists, tuples, partials, instances of the package's classes)."""
    functions, caches, seen = [], [], set()
    todo = [(v, 0) for v in vars(module).values()]
    while todo:
        obj, depth = todo.pop()
        if depth > 4 or id(obj) in seen:
            continue
        seen.add(id(obj))
        more = ()
        if isinstance(obj, types.FunctionType):
            functions.append(obj)
            more = [c.cell_contents for c in obj.__closure__ or () if _filled(c)]
        elif isinstance(obj, functools._lru_cache_wrapper):
            caches.append(obj)
            more = [obj.__wrapped__]
        elif isinstance(obj, type):
            more = list(vars(obj).values()) if obj.__module__ == module.__name__ else ()
        elif isinstance(obj, (staticmethod, classmethod)):
            more = [obj.__func__]
        elif isinstance(obj, property):
            more = [obj.fget, obj.fset, obj.fdel]
        elif isinstance(obj, functools.partial):
            more = [obj.func, *obj.args, *obj.keywords.values()]
        elif isinstance(obj, dict):
            more = list(obj.values())
        elif isinstance(obj, (list, tuple, set, frozenset)):
            more = list(obj)
        elif type(obj).__module__.startswith("replaylib.") and hasattr(obj, "__dict__"):
            more = list(vars(obj).values())
        todo += [(m, depth + 1) for m in more if m is not None and not isinstance(m, (str, bytes, int, float))]
    return functions, caches


def _filled(cell) -> bool:
    try:
        cell.cell_contents
    except ValueError:
        return False
    return True


def _changed_since_loaded(module, path: str, source: str) -> bool:
    """Whether the functions this process loaded differ from what the file holds now (only looked at for a
    file written since the process started)."""
    if os.stat(path).st_mtime < _process_start() - 1:
        return False
    try:
        fresh = _codes(compile(source, path, "exec", dont_inherit=True), path, {})
    except SyntaxError:
        return True
    for fn in _reachable(module)[0]:
        code = fn.__code__
        other = fresh.get((code.co_filename, code.co_qualname, code.co_firstlineno))
        if code.co_filename == path and (other is None or not _same_code(code, other)):
            return True
    return False


def _instrument(module) -> dict:
    """Compile a loaded module's source with probes; returns its code objects by (file, qualname, line)."""
    name, path = module.__name__, getattr(module, "__file__", None)
    if not path or not path.endswith(".py") or not os.path.isfile(path):
        return {}
    source = Path(path).read_text(encoding="utf-8")
    mtime = os.stat(path).st_mtime_ns
    if _changed_since_loaded(module, path, source):
        _changed.add(name)
        _armed[name] = mtime
        log.warning("%s changed after this process imported it: what runs here is not the file; restart the "
                    "process (the notebook's kernel) to record what the file holds", path)
        return {}
    code = _with_probes(path, name)
    setattr(module, PROBE, __replaylib_probe__)
    _armed[name] = mtime
    return _codes(code, path, {})


class _Loader(importlib.machinery.SourceFileLoader):
    """A recorded module imported after recording began: compiled with probes (never cached as .pyc)."""

    def get_code(self, fullname):
        path = self.get_filename(fullname)
        _armed[fullname] = os.stat(path).st_mtime_ns
        return _with_probes(path, fullname)

    def exec_module(self, module):
        setattr(module, PROBE, __replaylib_probe__)
        super().exec_module(module)


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path, target=None):
        if not recorded_module(fullname):
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or not isinstance(spec.loader, importlib.machinery.SourceFileLoader):
            return spec
        spec.loader = _Loader(fullname, spec.origin)
        return spec


def _arm() -> None:
    """Probes in every recorded module loaded so far (once each); later imports get them as they load."""
    global _installed
    if not _installed:
        sys.addaudithook(_audit)
        sys.meta_path.insert(0, _Finder())
        _installed = True
    new = [m for n, m in list(sys.modules.items()) if recorded_module(n) and n not in _armed and m is not None]
    if not new:
        return
    codes, functions = {}, []
    for module in new:
        _armed[module.__name__] = 0  # looked at: a module without a source file is never compiled anew
        codes.update(_instrument(module))
        found, caches = _reachable(module)
        functions += found
        for cache in caches:
            wrapped = getattr(cache, "__wrapped__", None)
            dotted = definitions.module_name(getattr(getattr(wrapped, "__code__", None), "co_filename", ""))
            if dotted and recorded_module(dotted):
                _cached[(dotted, wrapped.__qualname__.split(".<locals>")[0])] = cache
    for fn in functions:  # functions made before: their code, with probes (closures they make get it too)
        code = fn.__code__
        swap = codes.get((code.co_filename, code.co_qualname, code.co_firstlineno))
        if swap is not None and len(swap.co_freevars) == len(code.co_freevars):
            fn.__code__ = swap


# ------------------------------------------------------------------ files

def _read_roots() -> tuple:
    """The directories whose files count, as written and as resolved (a path is resolved only once it is in
    one: resolving every file an import opens would cost more than the stage's own work)."""
    roots = (DATA, models_dir(), PACKAGE)
    return tuple(dict.fromkeys(os.path.join(p, "") for r in roots for p in (os.path.abspath(r), os.path.realpath(r))))


def _audit(event: str, args) -> None:
    if event != "open" or not _stack:
        return
    path, mode, flags = args
    if isinstance(path, int) or path is None:
        return
    path = os.fsdecode(os.fspath(path))
    if path.endswith((".py", ".pyc")) or f"{os.sep}__pycache__{os.sep}" in path:
        return  # code, recorded as definitions, and what is derived from it
    if mode is not None and any(c in str(mode) for c in "wax+"):
        return
    if mode is None and isinstance(flags, int) and flags & (os.O_WRONLY | os.O_RDWR):
        return
    if not path.startswith(os.sep):
        path = os.path.abspath(path)
    if path.startswith(_roots):
        _stack[-1].files.add(os.path.realpath(path))


@functools.lru_cache(maxsize=1024)
def _sha256(path: str, size: int, mtime_ns: int) -> str:
    from .files import sha256_file
    return sha256_file(path)


def file_key(path: str) -> str:
    """How a record names a file: models:<path> under the models directory, a path relative to the
    repository, else the absolute path."""
    models = os.path.realpath(models_dir()) + os.sep
    if path.startswith(models):
        return "models:" + path[len(models):]
    repo = os.path.realpath(REPO) + os.sep
    return path[len(repo):] if path.startswith(repo) else path


def file_path(key: str) -> Path:
    if key.startswith("models:"):
        return models_dir() / key[len("models:"):]
    return Path(key) if os.path.isabs(key) else REPO / key


def file_entry(path) -> dict | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return {"sha256": _sha256(str(path), st.st_size, st.st_mtime_ns), "size": st.st_size, "mtime_ns": st.st_mtime_ns}


# ------------------------------------------------------------------ records

def build_record(s: _Session) -> dict:
    ran = s.ran | s.extra_roots
    ran |= {d for d, cache in _cached.items() if cache.cache_info().currsize}  # its results may have served
    code = {}
    for dotted, name in definitions.closure(ran, values_only=True, within=recorded_module):
        entry = f"{dotted}:{name}"
        code[entry] = CHANGED if _edited_since_loaded(dotted) else definitions.digest(entry)
    for dotted in s.changed:  # not recorded as it ran: never current
        code[f"{dotted}:{definitions.TOPLEVEL}"] = CHANGED
    files = {}
    for path in sorted(s.files):
        entry = file_entry(path)
        if entry is not None:
            files[file_key(path)] = entry
    record = {"code": code, "files": files}
    for earlier in s.records:
        record = merged(record, earlier)
    definitions.save_cache()
    return record


def _edited_since_loaded(dotted: str) -> bool:
    """Whether a module's file is not what this process runs (edited after its probes were compiled)."""
    if dotted in _changed:
        return True
    path = definitions.module_file(dotted)
    try:
        if dotted not in _armed or path is None or os.stat(path).st_mtime_ns == _armed[dotted]:
            return False
    except OSError:  # gone since
        pass
    _changed.add(dotted)
    log.warning("%s changed after this process imported it: what runs here is not the file; restart the process (the "
                "notebook's kernel) to record what the file holds", path)
    return True


def merged(*records) -> dict:
    """One record of several (a definition or file recorded with two digests keeps CHANGED: never current)."""
    out = {"code": {}, "files": {}}
    for r in records:
        if not r:
            continue
        for kind in ("code", "files"):
            for k, v in r.get(kind, {}).items():
                out[kind][k] = v if out[kind].get(k, v) == v else (CHANGED if kind == "code" else {"sha256": CHANGED})
    return out


def _where(entry: str) -> str:
    """module:name as a user reads it: the module's file, then the name (replaylib/core/files.py: atomic_save)."""
    if entry.startswith(definitions.NOTEBOOK):
        return f"notebooks/{entry[len(definitions.NOTEBOOK):]}.ipynb (its compute cell)"
    dotted, _, name = entry.partition(":")
    path = definitions.module_file(dotted)
    shown = path.relative_to(REPO).as_posix() if path is not None else dotted.replace(".", "/") + ".py"
    return f"{shown}: {'the module' if name == definitions.TOPLEVEL else name}"


def changes(record: dict | None, first_only: bool = False) -> list[str]:
    """What is no longer as a record says, in words ([] when every definition and file is as recorded)."""
    if not isinstance(record, dict) or not isinstance(record.get("code"), dict):
        return ["no record of the code it used (made by an older replaylib)"]
    try:
        return _changes(record, first_only)
    finally:
        definitions.save_cache()


def _changes(record: dict, first_only: bool) -> list[str]:
    found = []
    for entry, digest in sorted(record["code"].items()):
        now = definitions.digest(entry)
        if now != digest:
            found.append(f"{_where(entry)} " + ("is gone" if now is None else "ran as it was before an edit"
                                                if digest == CHANGED else "changed"))
            if first_only:
                return found
    for key, was in sorted(record.get("files", {}).items()):
        path = file_path(key)
        try:
            st = path.stat()
        except OSError:
            found.append(f"{key} is gone")
        else:
            if not isinstance(was, dict) or (st.st_size, st.st_mtime_ns) != (was.get("size"), was.get("mtime_ns")) \
                    and _sha256(str(path), st.st_size, st.st_mtime_ns) != was.get("sha256"):
                found.append(f"{key} changed")
        if first_only and found:
            return found
    return found

