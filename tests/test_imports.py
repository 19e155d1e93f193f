"""The shape of the house: imports run one way (data → model → fast → decode → train, serve, export; documents, beside
data, used by decode and on; commands on top), with no circle, whether an import sits at the top of a file, inside
a function or under TYPE_CHECKING."""

import ast
from pathlib import Path

MT = Path(__file__).resolve().parents[1] / "mt"
# Top-level rooms every package may use: they import none of the packages themselves.
FOUNDATION = {"mt.config", "mt.errors", "mt.device", "mt.checkpoint", "mt.runlock", "mt.options", "mt.memory",
              "mt.shapes", "mt.vocab"}
# What each package may import besides itself and the foundation.
MAY_IMPORT = {
    "data": set(),
    "documents": set(),
    "model": {"data"},
    "fast": {"data", "model"},
    "decode": {"documents", "data", "model", "fast"},
    "train": {"documents", "data", "model", "fast", "decode"},
    "serve": {"documents", "data", "model", "fast", "decode"},
    "export": {"documents", "data", "model", "fast", "decode"},
}


def module_name(path: Path) -> str:
    parts = path.relative_to(MT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(path): path for path in MT.rglob("*.py")}


def imported(path: Path, known: set[str]) -> set[str]:
    """Every mt module that `path` imports, anywhere in the file."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [f"{node.module}.{alias.name}" for alias in node.names] + [node.module]
        else:
            continue
        for name in names:
            while name and name not in known:
                name = name.rpartition(".")[0]
            if name.startswith("mt."):
                found.add(name)
    found.discard(module_name(path))
    return found


def graph() -> dict[str, set[str]]:
    known = modules()
    return {name: imported(path, set(known)) for name, path in known.items()}


def circles(arrows: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for other in arrows.get(node, ()):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                other = stack.pop()
                component.append(other)
                if other == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(arrows):
        if node not in index:
            visit(node)
    return found


def test_no_module_imports_itself_back_through_others():
    assert circles(graph()) == []


def test_circles_are_found_where_there_is_one():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_each_package_imports_only_the_ones_below_it_and_the_foundation():
    wrong = []
    for name, targets in graph().items():
        parts = name.split(".")
        if len(parts) < 2 or parts[1] not in MAY_IMPORT:
            if name in FOUNDATION:
                wrong += [f"{name} -> {t}" for t in targets if t not in FOUNDATION and t != "mt"]
            continue
        package = parts[1]
        for target in targets:
            other = target.split(".")[1] if target.count(".") else ""
            if target in FOUNDATION or other == package or other in MAY_IMPORT[package]:
                continue
            wrong.append(f"{name} -> {target}")
    assert wrong == []


def test_a_package_opens_with_what_it_holds_and_re_exports_nothing():
    for package in MAY_IMPORT:
        tree = ast.parse((MT / package / "__init__.py").read_text(encoding="utf-8"))
        assert ast.get_docstring(tree), f"mt/{package}/__init__.py: say what the package holds"
        assert len(tree.body) == 1, f"mt/{package}/__init__.py: a docstring only, no imports or names"
