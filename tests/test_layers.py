"""The import layering of docs/architecture.md, checked on the source (ast), lazy imports included."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "april_bench"


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> set[str]:
    """Every april_bench module this file imports, at top level or inside functions."""
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in _runtime_nodes(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("april_bench"))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            if target.startswith("april_bench"):
                found.add(target)
    return found


def _runtime_nodes(tree: ast.AST) -> list[ast.AST]:
    """All nodes but those under ``if TYPE_CHECKING:`` (annotations only, never imported at run time)."""
    nodes: list[ast.AST] = []
    todo = [tree]
    while todo:
        node = todo.pop()
        nodes.append(node)
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            todo.extend(node.orelse)
            continue
        todo.extend(ast.iter_child_nodes(node))
    return nodes


GRAPH = {_module_name(p): _imports(p) for p in PACKAGE.rglob("*.py")}

# (importer prefix, imported prefix, why it is forbidden)
FORBIDDEN = [
    ("april_bench.engines", "april_bench.rollout", "engines do not know the rollout loop"),
    ("april_bench.engines", "april_bench.experiment", "engines do not know the driver"),
    ("april_bench.engines", "april_bench.backends", "engines do not know the wiring"),
    ("april_bench.engines.hf", "april_bench.sim", "real engines do not import the simulator"),
    ("april_bench.engines.sglang", "april_bench.sim", "real engines do not import the simulator"),
    ("april_bench.engines.vllm", "april_bench.sim", "real engines do not import the simulator"),
    ("april_bench.tasks", "april_bench.rollout.loop", "tasks do not import the loop"),
    ("april_bench.results", "april_bench.engines", "results are computed from rows only"),
    ("april_bench.results", "april_bench.rollout.loop", "results are computed from rows only"),
    ("april_bench.profiles", "april_bench.sim", "profiles are facts the simulator reads"),
    ("april_bench.seeding", "april_bench.rollout", "seeds are a neutral fact"),
    ("april_bench.machine", "april_bench.engines", "accelerator detection is a neutral fact"),
]


@pytest.mark.parametrize(
    ("importer", "imported", "why"), FORBIDDEN, ids=[f"{a}->{b}" for a, b, _ in FORBIDDEN]
)
def test_no_arrow_goes_back_up(importer: str, imported: str, why: str) -> None:
    bad = sorted(
        (mod, dep)
        for mod, deps in GRAPH.items()
        if mod == importer or mod.startswith(importer + ".")
        for dep in deps
        if dep == imported or dep.startswith(imported + ".")
    )
    assert not bad, f"{why}: {bad}"


def test_no_import_circle_between_modules() -> None:
    """Depth-first search for a cycle over module-to-module imports (a package's ``__init__`` counts as
    the package)."""
    graph = {mod: {d for d in deps if d in GRAPH and d != mod} for mod, deps in GRAPH.items()}
    state: dict[str, int] = {}
    path: list[str] = []

    def visit(mod: str) -> list[str] | None:
        state[mod] = 1
        path.append(mod)
        for dep in sorted(graph[mod]):
            if state.get(dep) == 1:
                return [*path[path.index(dep) :], dep]
            if dep not in state and (cycle := visit(dep)):
                return cycle
        state[mod] = 2
        path.pop()
        return None

    for mod in sorted(graph):
        if mod not in state and (cycle := visit(mod)):
            pytest.fail("import circle: " + " -> ".join(cycle))
