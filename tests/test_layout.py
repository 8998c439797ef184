"""The package's layout is its architecture: subpackages by layer, imports only downward, no import
circles, no module over 600 lines (docs/development.md, "Layout")."""
import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "replaylib"
# lowest first; the top-level modules (the commands) and bench are above every subpackage
LAYERS = ["core", "measure", "analysis", "runtime", "stages", "display"]
MAX_LINES = 600


def layer(module: str) -> int:
    parts = module.split(".")
    return LAYERS.index(parts[1]) if len(parts) > 1 and parts[1] in LAYERS else len(LAYERS)


def dotted(path: Path) -> str:
    parts = ["replaylib", *path.relative_to(PACKAGE).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def is_module(name: str) -> bool:
    base = PACKAGE.joinpath(*name.split(".")[1:])
    return name.startswith("replaylib.") and (base.with_suffix(".py").is_file() or (base / "__init__.py").is_file())


def imports() -> dict[str, set[str]]:
    """module -> the package's modules it imports (at any depth, type-checking blocks included)."""
    graph = {}
    for path in PACKAGE.rglob("*.py"):
        me = dotted(path)
        package = me.split(".") if path.name == "__init__.py" else me.split(".")[:-1]
        found = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom):
                mod = ".".join((package[:len(package) - node.level + 1] if node.level else [])
                               + ([node.module] if node.module else []))
                found |= {mod} | {f"{mod}.{a.name}" for a in node.names}
        graph[me] = {m for m in found if is_module(m) and m != me and not me.startswith(m + ".")}
    return graph


def test_imports_go_only_downward():
    upward = [f"{a} imports {b}" for a, bs in sorted(imports().items()) for b in sorted(bs) if layer(b) > layer(a)]
    assert not upward, "\n".join(upward)


def test_no_import_circles():
    graph, circles, done = imports(), [], set()

    def visit(module, path):
        for nxt in sorted(graph.get(module, ())):
            if nxt in path:
                circles.append(" -> ".join(path[path.index(nxt):] + [nxt]))
            elif nxt not in done:
                visit(nxt, path + [nxt])
        done.add(module)

    for module in sorted(graph):
        if module not in done:
            visit(module, [module])
    assert not circles, "\n".join(circles)


def test_stage_drivers_do_not_import_each_other():
    crossing = [f"{a} imports {b}" for a, bs in imports().items() if a.startswith("replaylib.stages.")
                for b in bs if b.startswith("replaylib.stages.")]
    assert not crossing, "\n".join(crossing)


def test_no_module_over_600_lines():
    long = {str(p.relative_to(PACKAGE)): n for p in PACKAGE.rglob("*.py")
            if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long, long


def test_the_checks_can_fail(tmp_path, monkeypatch):
    """An upward import, a circle and a long module are each found."""
    fake = tmp_path / "replaylib"
    for sub in ("core", "measure"):
        (fake / sub).mkdir(parents=True)
        (fake / sub / "__init__.py").write_text("")
    (fake / "__init__.py").write_text("")
    (fake / "core" / "a.py").write_text("from ..measure import b\n")
    (fake / "measure" / "b.py").write_text("from ..core import a\n" + "x = 1\n" * MAX_LINES)
    monkeypatch.setitem(globals(), "PACKAGE", fake)
    graph = imports()
    assert graph["replaylib.core.a"] == {"replaylib.measure", "replaylib.measure.b"}
    assert layer("replaylib.measure.b") > layer("replaylib.core.a")
    for check in (test_imports_go_only_downward, test_no_import_circles, test_no_module_over_600_lines):
        try:
            check()
        except AssertionError:
            continue
        raise AssertionError(f"{check.__name__} passed on a package that breaks it")
