"""The package's layers: every module of every subpackage (integrations included) imports only its own
package or the layers below it, counting imports inside functions; no import cycle; and no module
imports an underscore name from another package."""
import ast
from pathlib import Path

import pytest

import torchmover

PACKAGE = Path(torchmover.__file__).parent

# Bottom to top. A module may import its own package and any package of a lower layer; packages of one
# layer do not import each other. (The package's face, __init__, gathers the public names of them all.)
LAYERS = [
    {"_version", "_internal", "runtime"},
    {"functional"},
    {"text"},
    {"scorer"},
    {"reward", "evaluation"},
    {"integrations"},
    {"cli"},
    {"__main__"},
]


def modules(package: Path = PACKAGE) -> dict[str, Path]:
    """``{dotted name under the package: file}`` of every module; a subpackage is its ``__init__``."""
    found = {}
    for path in sorted(package.rglob("*.py")):
        parts = list(path.relative_to(package).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def imports(package: Path = PACKAGE) -> dict[str, set[tuple[str, str | None]]]:
    """``{module: {(imported module, imported name or None)}}`` from every import statement anywhere in
    each file (module level, functions, ``TYPE_CHECKING`` blocks); names are resolved to the modules
    they are (``from . import x`` with a module ``x`` imports the module ``x``). The package itself is
    ``""``."""
    known = modules(package)
    graph = {}
    for name, path in known.items():
        here = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        here = [p for p in here if p]
        edges = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.split(".")[0] == package.name:
                        edges.add((alias.name.partition(".")[2], None))
            elif isinstance(node, ast.ImportFrom):
                if node.level == 0:
                    if (node.module or "").split(".")[0] != package.name:
                        continue
                    base = (node.module or "").split(".")[1:]
                else:
                    base = here[:len(here) - (node.level - 1)] + ((node.module or "").split(".") if node.module else [])
                target = ".".join(base)
                for alias in node.names:
                    submodule = ".".join([*base, alias.name])
                    edges.add((submodule, None) if submodule in known else (target, alias.name))
        graph[name] = {(target, imported) for target, imported in edges if target != name}
    return graph


def package_of(module: str) -> str:
    return module.split(".")[0] if module else "__init__"


def layer_of(package: str) -> int:
    return next(k for k, layer in enumerate(LAYERS) if package in layer)


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


def test_every_package_has_a_layer():
    packages = {package_of(m) for m in modules()} - {"__init__"}
    assert packages <= set().union(*LAYERS), packages - set().union(*LAYERS)


def test_the_package_has_no_import_cycle():
    graph = {m: {t for t, _ in edges} for m, edges in imports().items()}
    assert find_cycle(graph) is None


def test_imports_point_down_the_layers():
    wrong = []
    for module, edges in imports().items():
        source = package_of(module)
        if source == "__init__":
            continue
        for target, _ in edges:
            target_package = package_of(target)
            if target_package == "__init__" or (target_package != source and
                                                layer_of(target_package) >= layer_of(source)):
                wrong.append(f"{module} -> {target or 'torchmover'}")
    assert not wrong


def test_the_face_imports_no_command_line():
    assert not {package_of(t) for t, _ in imports()[""]} & {"cli", "__main__"}


def test_no_private_name_crosses_a_package():
    crossing = [f"{module} imports {target}.{name}" for module, edges in imports().items()
                for target, name in edges
                if name and name.startswith("_") and not name.startswith("__") and package_of(target) != package_of(module)]
    assert not crossing


def test_the_graph_sees_function_level_imports_subpackages_and_private_names(tmp_path):
    package = tmp_path / "torchmover"
    (package / "low").mkdir(parents=True)
    (package / "__init__.py").write_text("from .low.a import f\n__version__ = '0'\n")
    (package / "low" / "__init__.py").write_text("")
    (package / "low" / "a.py").write_text("def f():\n    from ..high import g\n    return g()\n")
    (package / "high.py").write_text("from .low.a import _private\nimport torchmover.low\n\ndef g():\n    return 1\n")
    graph = imports(package)
    assert graph == {"": {("low.a", "f")}, "low": set(), "low.a": {("high", "g")},
                     "high": {("low.a", "_private"), ("low", None)}}
    cycle = find_cycle({m: {t for t, _ in e} for m, e in graph.items()})
    assert cycle[0] == cycle[-1] and set(cycle) == {"high", "low.a"} and len(cycle) == 3
    assert find_cycle({"a": {"b"}, "b": set()}) is None


@pytest.mark.parametrize("path", ["torchmover.integrations.trl", "torchmover.integrations.verl",
                                  "torchmover.integrations.openrlhf"])
def test_framework_config_paths_import(path):
    """verl and OpenRLHF configs name these modules by path: they must keep importing."""
    import importlib

    assert importlib.import_module(path)
