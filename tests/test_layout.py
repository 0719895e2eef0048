"""The package's dependencies point one way (issue 11.4): no import cycle between torchmover's modules,
counting imports inside functions, and only the command line's entry point imports the command line."""
import ast
from pathlib import Path

import torchmover

PACKAGE = Path(torchmover.__file__).parent


def import_graph(package: Path = PACKAGE) -> dict[str, set[str]]:
    """``{module: modules of the package it imports}`` over every ``*.py`` of ``package``, from every
    import statement anywhere in the file (module level, functions, ``TYPE_CHECKING`` blocks). The
    package itself is the module ``__init__``; ``from . import x`` names the module ``x`` if there is one."""
    modules = {path.stem for path in package.glob("*.py")}
    graph = {}
    for module in modules:
        edges = set()
        for node in ast.walk(ast.parse((package / f"{module}.py").read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names if a.name.split(".")[0] == package.name]
                edges |= {(n.split(".") + ["__init__"])[1] for n in names}
            elif isinstance(node, ast.ImportFrom):
                if node.level == 0 and (node.module or "").split(".")[0] != package.name:
                    continue
                path = (node.module or "").split(".")[1 if node.level == 0 else 0:]
                if path and path[0]:
                    edges.add(path[0])
                else:  # from . import x, y
                    edges |= {a.name if a.name in modules else "__init__" for a in node.names}
        graph[module] = edges - {module}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as a list of modules (first = last), or None (depth-first search)."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node):
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_the_package_has_no_import_cycle():
    assert find_cycle(import_graph()) is None


def test_only_the_entry_point_imports_the_command_line():
    importers = sorted(m for m, edges in import_graph().items() if "cli" in edges)
    assert importers == ["__main__"]


def test_the_graph_sees_function_level_and_package_imports(tmp_path):
    package = tmp_path / "torchmover"
    package.mkdir()
    (package / "__init__.py").write_text("from .a import f\n__version__ = '0'\n")
    (package / "a.py").write_text("def f():\n    from .b import g\n    return g()\n")
    (package / "b.py").write_text("from . import __version__\nimport torchmover.c\n\ndef g():\n    return 1\n")
    (package / "c.py").write_text("from torchmover import a\n")
    graph = import_graph(package)
    assert graph == {"__init__": {"a"}, "a": {"b"}, "b": {"__init__", "c"}, "c": {"a"}}
    assert find_cycle(graph) in (["__init__", "a", "b", "__init__"], ["a", "b", "__init__", "a"])
    assert find_cycle({"a": {"b"}, "b": set()}) is None
