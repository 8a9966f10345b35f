"""The layering holds: specs <- calculators <- engine <- server <- ui <- pages (an arrow points at what may import
it), no module imports streamlit below ui, and no two modules import each other, directly or around a circle.
Imports inside functions count: a lazy import still ties the two modules together."""
import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LAYERS = ["specs", "calculators", "engine", "server", "ui", "pages"]   # each may import only those before it
PACKAGES = ("specs", "calculators", "engine", "server", "ui")


def layer_of(module: str) -> str | None:
    top = module.split(".")[0]
    if top == "app":
        return "pages"
    return top if top in LAYERS else None


def module_name(path: Path, root: Path = ROOT) -> str:
    rel = path.relative_to(root).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def project_modules() -> dict[str, Path]:
    files = [p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")]
    files += sorted((ROOT / "pages").glob("*.py")) + [ROOT / "app.py"]
    return {module_name(p): p for p in files}


def imports_of(path: Path, known: set[str], module: str = "", type_only: bool = False) -> set[str]:
    """Project modules this file imports (resolving `from pkg import submodule` to the submodule, and relative
    imports against `module`, the file's own name). Imports inside functions count; those under
    `if TYPE_CHECKING:` count only with `type_only` (they never run, but a reader of one file must read the
    other: for circles they count)."""
    is_package = path.name == "__init__.py"
    found = set()
    for node in walk(ast.parse(path.read_text(), str(path)), type_only):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [f"{node.module}.{a.name}" for a in node.names] + [node.module]
        elif isinstance(node, ast.ImportFrom):               # relative: from . import x, from ..pkg import y
            parts = module.split(".") if is_package else module.split(".")[:-1]
            base = ".".join(parts[:len(parts) - node.level + 1] + ([node.module] if node.module else []))
            names = [f"{base}.{a.name}" for a in node.names] + [base]
        else:
            continue
        for n in names:
            while n and n not in known:
                n = n.rpartition(".")[0]
            if n:
                found.add(n)
    return found


def walk(tree, type_only: bool = False):
    """Every node, except those under `if TYPE_CHECKING:` unless `type_only` (imports for type hints only never
    run)."""
    todo = [tree]
    while todo:
        node = todo.pop()
        yield node
        for child in ast.iter_child_nodes(node):
            if not type_only and isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                todo.extend(child.orelse)
                continue
            todo.append(child)


def import_graph(type_only: bool = False) -> dict[str, set[str]]:
    mods = project_modules()
    return {m: imports_of(p, set(mods), m, type_only) - {m} for m, p in mods.items()}


def is_entry_point(module: str) -> bool:
    return module.endswith("__main__")          # `python -m engine serve` may start the server


def test_every_import_points_down_the_layers():
    graph = import_graph()
    wrong = []
    for mod, deps in graph.items():
        here = LAYERS.index(layer_of(mod))
        for d in deps:
            if LAYERS.index(layer_of(d)) > here and not is_entry_point(mod):
                wrong.append(f"{mod} imports {d}")
    assert not wrong, "imports that reach up a layer:\n" + "\n".join(sorted(wrong))


def test_the_core_never_imports_streamlit():
    wrong = []
    for mod, path in project_modules().items():
        if layer_of(mod) in ("specs", "calculators", "engine", "server"):
            tree = ast.parse(path.read_text())
            for node in ast.walk(tree):
                names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                         [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
                if any(n.split(".")[0] == "streamlit" for n in names):
                    wrong.append(mod)
    assert not wrong, f"streamlit imported in the core: {wrong}"


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]; counter[0] += 1
        stack.append(v); on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w); low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop(); on.discard(w); comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def import_circles(modules: dict[str, Path]) -> list[list[str]]:
    """The rule: every circle among `modules` (name -> file), counting lazy imports and imports for type hints.
    A package's __init__ re-exporting its modules is not a circle of meaning: packages are left out."""
    known = set(modules)
    graph = {m: {d for d in imports_of(p, known, m, type_only=True) - {m} if modules[d].name != "__init__.py"}
             for m, p in modules.items() if p.name != "__init__.py"}
    return cycles(graph)


def test_no_import_circle():
    assert import_circles(project_modules()) == []


def test_the_circle_finder_finds_a_circle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_the_rule_sees_a_circle_planted_in_a_package(tmp_path):
    """A temporary package with the two kinds of circle the project once had: a -> b at the top, b -> c inside a
    function (a lazy import), c -> a under TYPE_CHECKING; and a second circle through relative imports
    (d -> e, e -> d). Without any one of those edges there is no circle."""
    pkg = tmp_path / "planted"
    pkg.mkdir()
    files = {"__init__": "from planted import a\n",
             "a": "from planted.b import thing\n",
             "b": "def thing():\n    from planted import c\n    return c\n",
             "c": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from planted.a import thing\n",
             "d": "from . import e\n",
             "e": "from .d import x\n"}
    for name, text in files.items():
        (pkg / f"{name}.py").write_text(text)
    modules = {module_name(p, tmp_path): p for p in sorted(pkg.glob("*.py"))}
    assert import_circles(modules) == [["planted.a", "planted.b", "planted.c"], ["planted.d", "planted.e"]]
    (pkg / "c.py").write_text("import typing\n")                       # cut a -> b -> c -> a at c
    (pkg / "e.py").write_text("x = 1\n")                               # cut d -> e -> d at e
    assert import_circles(modules) == []
