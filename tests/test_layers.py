"""The import layering of docs/architecture.md, checked on the source (ast): lazy imports, imports
only for type checking, ``"module:attr"`` registry strings (an import made later by
:func:`april_bench.registry.load`) and module names in strings (``importlib.import_module``) all
count, and ``from package import module`` is an import of the module (and of the package, whose
``__init__`` runs first)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "april_bench"
#: The packages whose modules the graph holds: the library and the strategy zoo.
PACKAGES = ("april_bench", "baselines", "april_impl")
#: A registry entry ``"module:Attr"`` naming a module of these packages, or a module's name alone
#: (``importlib.import_module("april_bench.engines.vllm.engine")``, a server's launch module).
REGISTRY_STRING = re.compile(r"^((?:april_bench|baselines|april_impl)(?:\.\w+)+)(?::\w+)?$")


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(
    path: Path, *, name: str | None = None, type_only: bool = False, strings: bool = True
) -> set[str]:
    """Every module of :data:`PACKAGES` this file (module ``name``) imports, at top level or inside
    functions, or (``strings``) names in a registry string; with ``type_only``, also those under
    ``if TYPE_CHECKING:``."""
    name = name or _module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    tree = ast.parse(path.read_text(), str(path))
    for node in ast.walk(tree) if type_only else _runtime_nodes(tree):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.split(".")[0] in PACKAGES)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            if target.split(".")[0] in PACKAGES:
                found.add(target)
                found.update(m for a in node.names if (m := _submodule(target, a.name)))
        elif strings and isinstance(node, ast.Constant) and isinstance(node.value, str):
            match = REGISTRY_STRING.match(node.value)
            if match and (":" in node.value or _is_module(match.group(1))):
                found.add(match.group(1))
    return found


def _is_module(name: str) -> bool:
    path = ROOT.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def _submodule(package: str, name: str) -> str | None:
    """``package.name`` when ``from package import name`` imports a module (a file or a package), not
    an attribute of the package."""
    folder = ROOT.joinpath(*package.split("."))
    if (folder / f"{name}.py").is_file() or (folder / name / "__init__.py").is_file():
        return f"{package}.{name}"
    return None


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


FILES = [p for package in PACKAGES for p in (ROOT / package).rglob("*.py")]
#: Imports at run time and for type checking, and registry strings: what the layering rules hold.
GRAPH = {_module_name(p): _imports(p, type_only=True) for p in FILES}
#: Imports alone, at run time and for type checking: what must hold no circle.
IMPORT_GRAPH = {_module_name(p): _imports(p, strings=False) for p in FILES}
TYPED_GRAPH = {_module_name(p): _imports(p, type_only=True, strings=False) for p in FILES}

#: What a module outside ``april_bench.engines`` may import of it: the registry, the protocol and the
#: helpers engines share (a stream of completions, routing over replicas), and an engine package's
#: face (its ``__init__``), never a module inside an engine package (``engines.hf.engine``, ...).
ENGINE_SURFACE: tuple[str, ...] = (
    "april_bench.engines",
    "april_bench.engines.protocol",
    "april_bench.engines.stream",
)
ENGINE_SURFACE += ("april_bench.engines.routing",)

# (importer prefix, imported prefix, why it is forbidden)
FORBIDDEN = [
    ("april_bench.engines", "april_bench.rollout", "engines do not know the rollout loop"),
    ("april_bench.engines", "april_bench.experiment", "engines do not know the driver"),
    ("april_bench.engines", "april_bench.backends", "engines do not know the wiring"),
    ("april_bench.engines.hf", "april_bench.sim", "real engines do not import the simulator"),
    ("april_bench.engines.sglang", "april_bench.sim", "real engines do not import the simulator"),
    ("april_bench.engines.vllm", "april_bench.sim", "real engines do not import the simulator"),
    ("april_bench.engines.hf", "april_bench.engines.sim", "real engines do not import the simulator"),
    ("april_bench.engines.sglang", "april_bench.engines.sim", "real engines do not import the simulator"),
    ("april_bench.engines.vllm", "april_bench.engines.sim", "real engines do not import the simulator"),
    ("april_bench.sim", "april_bench.engines", "the simulator's models are below the engines"),
    ("april_bench.sim", "april_bench.trainers", "the simulator's models are below the trainers"),
    ("april_bench.tasks", "april_bench.rollout", "tasks do not import the loop"),
    ("april_bench.results", "april_bench.engines", "results are computed from rows only"),
    ("april_bench.results", "april_bench.rollout", "results are computed from rows only"),
    ("april_bench.results", "april_bench.trainers", "results are computed from rows only"),
    ("april_bench.results", "april_bench.tasks", "results are computed from rows only"),
    ("april_bench.results", "april_bench.backends", "results are computed from rows only"),
    ("april_bench.results", "april_bench.runner", "results are computed from rows only"),
    ("april_bench.results", "april_bench.cli", "results are computed from rows only"),
    ("april_bench.profiles", "april_bench.sim", "profiles are facts the simulator reads"),
    ("april_bench.seeding", "april_bench.rollout", "seeds are a neutral fact"),
    ("april_bench.machine", "april_bench.engines", "accelerator detection is a neutral fact"),
    ("april_bench.models", "april_bench.engines", "models are below the engines"),
    ("april_bench.models", "april_bench.trainers", "models are below the trainers"),
    ("april_bench.models", "april_bench.tasks", "models are below the tasks"),
    ("april_bench.trainers", "april_bench.engines", "trainers and engines are siblings above models"),
    ("april_bench.engines", "april_bench.trainers", "trainers and engines are siblings above models"),
    ("april_bench.engines", "april_bench.tasks", "engines do not know the task"),
    ("april_bench.tasks", "april_bench.backends", "tasks build themselves; the wiring chooses them"),
    ("april_bench.tasks", "april_bench.experiment", "tasks do not know the driver"),
    ("april_bench.data", "april_bench.graders", "data sets are below the graders that score them"),
    ("april_bench.data", "april_bench.tasks", "data sets are below the tasks"),
    ("april_bench.backends", "april_bench.experiment", "the wiring does not know the driver"),
    ("april_bench.backends", "april_bench.runner", "the wiring does not know the run directory"),
    ("april_bench.experiment", "april_bench.runner", "the driver does not know the run directory"),
    ("april_bench.experiment", "april_bench.cli", "the driver does not know the CLI"),
    ("april_bench.runner", "april_bench.cli", "the run lifecycle does not know the CLI"),
    ("april_bench.results", "april_bench.experiment", "results are computed from rows only"),
    ("april_bench.experiment_config", "april_bench.backends", "the run's config is below the wiring"),
    ("april_bench.experiment_config", "april_bench.experiment", "the run's config is below the wiring"),
    ("april_bench.experiment_config", "april_bench.runner", "the run's config is below the wiring"),
    ("april_bench.experiment_config", "april_bench.cli", "the run's config is below the wiring"),
    ("april_bench.recipes", "april_bench.backends", "the run's config is below the wiring"),
    ("april_bench.recipes", "april_bench.experiment", "the run's config is below the wiring"),
    ("april_bench.recipes", "april_bench.runner", "the run's config is below the wiring"),
    ("april_bench.recipes", "april_bench.cli", "the run's config is below the wiring"),
    ("april_bench.config_files", "april_bench.backends", "the run's config is below the wiring"),
    ("april_bench.config_files", "april_bench.experiment", "the run's config is below the wiring"),
    ("april_bench.config_files", "april_bench.runner", "the run's config is below the wiring"),
    ("april_bench.config_files", "april_bench.cli", "the run's config is below the wiring"),
    ("april_bench.cli", "april_bench.backends", "the CLI parses and prints: it calls the runner"),
    ("april_bench.cli", "april_bench.experiment", "the CLI parses and prints: it calls the runner"),
    ("april_bench.cli", "april_bench.models", "the CLI parses and prints: it calls the runner"),
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


def _engine_internals(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    """Imports from outside ``april_bench.engines`` of anything in it but :data:`ENGINE_SURFACE` and an
    engine package's face (``engines.sim``, ``engines.hf``: a folder's ``__init__``)."""
    return sorted(
        (mod, dep)
        for mod, deps in graph.items()
        if not mod.startswith("april_bench.engines")
        for dep in deps
        if dep.startswith("april_bench.engines.")
        and dep not in ENGINE_SURFACE
        and not ROOT.joinpath(*dep.split("."), "__init__.py").is_file()
    )


def test_no_module_outside_the_engines_imports_an_engines_internals() -> None:
    bad = _engine_internals(GRAPH)
    assert not bad, f"import the engine through ENGINES, the protocol or its package, not its modules: {bad}"


def test_an_injected_import_of_the_replica_router_is_caught() -> None:
    """``engines.replicas`` is not the surface (the fault protocols a session reads are in the
    protocol), nor is a module inside an engine package; ``engines.sim`` (a package's face) is."""
    graph = {
        **GRAPH,
        "april_bench.experiment.session": {"april_bench.engines.replicas", "april_bench.engines.sim"},
    }
    assert _engine_internals(graph) == [("april_bench.experiment.session", "april_bench.engines.replicas")]
    graph["april_bench.experiment.session"] = {"april_bench.engines.sim.engine"}
    assert _engine_internals(graph) == [("april_bench.experiment.session", "april_bench.engines.sim.engine")]


#: docs/architecture.md's facts and records: they import nothing of the package but one another.
FACTS: tuple[str, ...] = (
    "april_bench.config",
    "april_bench.types",
    "april_bench.profiles",
    "april_bench.seeding",
)
FACTS += ("april_bench.machine", "april_bench.vtime", "april_bench.registry", "april_bench.data.specs")
FACTS += ("april_bench.compiled",)  # the compiled core's list and mypyc's decorator: nothing of the package
FACTS += ("april_bench.results.records", "april_bench.telemetry.records", "april_bench.quantiles")


def _is_fact(module: str) -> bool:
    return any(module == f or module.startswith(f + ".") for f in FACTS)


def _facts_importing_more(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    return sorted(
        (mod, dep) for mod, deps in graph.items() if _is_fact(mod) for dep in deps if not _is_fact(dep)
    )


def test_facts_and_records_import_only_one_another() -> None:
    """Lazy, type-only and registry-string imports counted: ``results/records.py`` holds the records
    (the recorder that summarizes them is ``results/recorder.py``), ``machine.py`` what the machine
    has (the GPUs' own facts are ``telemetry/gpu_facts.py``'s)."""
    assert not _facts_importing_more(FULL_GRAPH), _facts_importing_more(FULL_GRAPH)
    looped = {**FULL_GRAPH, "april_bench.results.records": {"april_bench.results.summary"}}
    assert _facts_importing_more(looped) == [("april_bench.results.records", "april_bench.results.summary")]


def _within(module: str, prefixes: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


#: The helpers that sit with the facts: whole-file I/O, bounded reading, redaction, torch threads, the
#: C allocator's thresholds, hub model ids and the weight group.
HELPERS: tuple[str, ...] = (
    "april_bench.fsio",
    "april_bench.bounded",
    "april_bench.redact",
    "april_bench.threads",
)
HELPERS += ("april_bench.allocator", "april_bench.hub", "april_bench.collective")
#: The protocols every layer above implements or calls.
PROTOCOLS: tuple[str, ...] = (
    "april_bench.engines.protocol",
    "april_bench.engines.requests",  # the protocol's request and completion types (re-exported by it)
    "april_bench.trainers.protocol",
    "april_bench.workload",
)
PROTOCOLS += ("april_bench.evaluation", "april_bench.rollout.strategy", "april_bench.envs")
#: docs/architecture.md's "imports only ..." claims, one per layer: (the layer's modules, what it may
#: import besides its own modules, the claim).
ONLY = [
    (HELPERS, FACTS, "the I/O helpers import only the facts"),
    (("april_bench.data",), FACTS, "data sets import only the facts"),
    (("april_bench.graders",), (*FACTS, "april_bench.data"), "graders import only data/ and the facts"),
    (PROTOCOLS, FACTS, "the protocols import only the facts and one another"),
    (
        ("april_bench.models",),
        (*FACTS, "april_bench.fsio"),
        "models import only the facts and fsio (atomic writes)",
    ),
    (("april_bench.algorithms",), FACTS, "algorithms import only the facts"),
    (("april_bench.telemetry",), FACTS, "telemetry imports only the facts"),
    (("april_bench.trace",), (*FACTS, *HELPERS), "the trace format imports only the facts and helpers"),
    (
        ("april_bench.engines",),
        (*FACTS, *HELPERS, "april_bench.models"),
        "engines import only their own modules, models/, the helpers and the facts",
    ),
    (
        ("april_bench.trainers",),
        (*FACTS, *HELPERS, "april_bench.models", "april_bench.algorithms"),
        "trainers import only their own modules, models/, algorithms/, the helpers and the facts",
    ),
    (
        ("april_bench.sim",),
        (*FACTS, *HELPERS, *PROTOCOLS, "april_bench.data", "april_bench.trace"),
        "the simulator's workload models import only data/, trace/, the protocols, helpers and facts",
    ),
    (
        ("april_bench.rollout",),
        (*FACTS, *PROTOCOLS, "april_bench.algorithms", "april_bench.results.recorder"),
        "the loop imports only the protocols, algorithms/, the recorder and the facts",
    ),
    (
        ("baselines", "april_impl"),
        (*FACTS, "april_bench.rollout.strategy"),
        "the strategy zoo imports only rollout.strategy and the facts",
    ),
]


def _imports_beyond(
    graph: dict[str, set[str]], layer: tuple[str, ...], allowed: tuple[str, ...]
) -> list[tuple[str, str]]:
    return sorted(
        (mod, dep)
        for mod, deps in graph.items()
        if _within(mod, layer)
        for dep in deps
        if not _within(dep, layer + allowed)
    )


@pytest.mark.parametrize(("layer", "allowed", "claim"), ONLY, ids=[claim for _, _, claim in ONLY])
def test_each_layer_imports_only_what_the_doc_says(
    layer: tuple[str, ...], allowed: tuple[str, ...], claim: str
) -> None:
    assert not _imports_beyond(GRAPH, layer, allowed), f"{claim}: {_imports_beyond(GRAPH, layer, allowed)}"
    # The check can fail: the layer's first module importing the CLI is caught.
    first = min(mod for mod in GRAPH if _within(mod, layer))
    injected = {**GRAPH, first: GRAPH[first] | {"april_bench.cli.commands"}}
    assert _imports_beyond(injected, layer, allowed) == [(first, "april_bench.cli.commands")]


#: The folders of ``engines/`` that are engine packages (``server/`` is shared by the adapters).
ENGINE_PACKAGES = tuple(
    f"april_bench.engines.{d.name}"
    for d in sorted((PACKAGE / "engines").iterdir())
    if (d / "__init__.py").is_file() and d.name != "server"
)


def _engine_packages_crossing(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    """An engine package's module importing another engine package (its face or its modules)."""
    return sorted(
        (mod, dep)
        for mod, deps in graph.items()
        for dep in deps
        for own in ENGINE_PACKAGES
        if _within(mod, (own,)) and _within(dep, ENGINE_PACKAGES) and not _within(dep, (own,))
    )


def test_no_engine_package_imports_another() -> None:
    assert {"april_bench.engines.hf", "april_bench.engines.sim", "april_bench.engines.vllm"} <= set(
        ENGINE_PACKAGES
    )
    assert not _engine_packages_crossing(GRAPH), _engine_packages_crossing(GRAPH)
    injected = {**GRAPH, "april_bench.engines.vllm.engine": {"april_bench.engines.sglang.wire"}}
    assert _engine_packages_crossing(injected) == [
        ("april_bench.engines.vllm.engine", "april_bench.engines.sglang.wire")
    ]


def _naming(graph: dict[str, set[str]], module: str, outside: str) -> list[str]:
    return sorted(mod for mod, deps in graph.items() if module in deps and not _within(mod, (outside,)))


def test_only_the_registry_names_the_simulators_engine() -> None:
    """Outside ``engines/sim/``, only ``ENGINES`` (a registry string) names ``engines.sim.engine``;
    the tools that read the cost curve import the package's face."""
    sim_engine = "april_bench.engines.sim.engine"
    assert _naming(GRAPH, sim_engine, "april_bench.engines.sim") == ["april_bench.engines"]
    injected = {**GRAPH, "april_bench.whatif": GRAPH["april_bench.whatif"] | {sim_engine}}
    assert _naming(injected, sim_engine, "april_bench.engines.sim") == [
        "april_bench.engines",
        "april_bench.whatif",
    ]


#: A composite and the registry that names it: it is handed its parts (``Spec.parts``) or builds them
#: itself, and never looks up the registry.
COMPOSITES = [
    ("april_bench.engines.ray_pool", "april_bench.engines"),
    ("april_bench.engines.fake_pool", "april_bench.engines"),
    ("april_bench.trainers.ray_actor", "april_bench.trainers.registry"),
]


def _composites_importing_their_registry(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    return [(composite, registry) for composite, registry in COMPOSITES if registry in graph[composite]]


def test_a_composite_never_imports_the_registry_that_names_it() -> None:
    assert all(composite in GRAPH[registry] for composite, registry in COMPOSITES)  # named by string
    assert not _composites_importing_their_registry(GRAPH), _composites_importing_their_registry(GRAPH)
    pool = "april_bench.engines.ray_pool"
    injected = {**GRAPH, pool: GRAPH[pool] | {"april_bench.engines"}}
    assert _composites_importing_their_registry(injected) == [(pool, "april_bench.engines")]


def _upward(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    return [
        (mod, dep)
        for importer, imported, _ in FORBIDDEN
        for mod, deps in graph.items()
        if mod == importer or mod.startswith(importer + ".")
        for dep in deps
        if dep == imported or dep.startswith(imported + ".")
    ]


def test_an_injected_upward_import_is_caught(tmp_path: Path) -> None:
    """The checks above can fail: a model module that imports an engine (lazily, or by a registry
    string) is an arrow going back up, and a circle is found."""
    source = tmp_path / "zoo.py"
    source.write_text(
        "def build():\n    from april_bench.engines.hf.engine import HFEngine\n    return HFEngine\n"
        "FACTORY = 'april_bench.rollout.loop:RolloutLoop'\n"
        "LAZY = importlib.import_module('april_bench.trainers.sim')\nNOTE = 'april_bench.no_such_module'\n"
    )
    injected = "april_bench.models.injected"
    found = _imports(source, name=injected)
    assert found == {"april_bench.engines.hf.engine", "april_bench.rollout.loop", "april_bench.trainers.sim"}
    graph = {**GRAPH, injected: found}
    assert _upward(GRAPH) == []
    assert (injected, "april_bench.engines.hf.engine") in _upward(graph)
    assert _cycle(IMPORT_GRAPH) is None
    looped = {
        **IMPORT_GRAPH,
        "april_bench.tasks.base": IMPORT_GRAPH["april_bench.tasks.base"] | {"april_bench.backends.task"},
    }
    assert _cycle(looped) is not None


def test_from_package_import_module_is_an_import_of_the_module(tmp_path: Path) -> None:
    """``from april_bench.rollout import episodes`` (and ``from . import episodes`` inside the package)
    imports the module ``episodes`` after the package; a name that is not a module stays the package's."""
    source = tmp_path / "probe.py"
    source.write_text(
        "from april_bench.rollout import episodes, loop\nfrom . import strategy\n"
        "from april_bench.engines import ENGINES\n"
    )
    found = _imports(source, name="april_bench.rollout.probe")
    assert found == {
        "april_bench.rollout",
        "april_bench.rollout.episodes",
        "april_bench.rollout.loop",
        "april_bench.rollout.strategy",
        "april_bench.engines",
    }
    assert "april_bench.rollout.episodes" in GRAPH["april_bench.rollout.loop"]


def test_an_injected_type_only_episodes_to_loop_import_is_a_circle(tmp_path: Path) -> None:
    """The circle issue 30 found: ``rollout/loop.py`` imports ``episodes`` (``from april_bench.rollout
    import episodes``) and ``episodes`` imported ``RolloutLoop`` for its annotations only.  Injected
    into ``episodes``, that type-only import closes a circle the checks report; episodes now reach the
    loop through its public members (``rollout.episodes.Host``) and import nothing of it."""
    episodes = "april_bench.rollout.episodes"
    assert not any(d.startswith("april_bench.rollout.loop") for d in FULL_GRAPH[episodes])
    source = tmp_path / "episodes.py"
    source.write_text(
        "from __future__ import annotations\nfrom typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from april_bench.rollout.loop import RolloutLoop\n"
    )
    injected = _imports(source, name=episodes, type_only=True, strings=False)
    assert injected == {"april_bench.rollout.loop"}
    assert _imports(source, name=episodes, strings=False) == set()  # not at run time
    looped = {**TYPED_GRAPH, episodes: TYPED_GRAPH[episodes] | injected}
    cycle = _cycle(looped)
    assert cycle is not None and {episodes, "april_bench.rollout.loop"} <= set(cycle)
    full = {**FULL_GRAPH, episodes: FULL_GRAPH[episodes] | injected}
    graph = {m: {d for d in deps if d in full and d != m} for m, deps in full.items()}
    assert frozenset({episodes, "april_bench.rollout.loop"}) in _circles(graph)


def _cycle(graph_in: dict[str, set[str]]) -> list[str] | None:
    """Depth-first search for a cycle over module-to-module imports (a package's ``__init__`` counts as
    the package)."""
    graph = {mod: {d for d in deps if d in graph_in and d != mod} for mod, deps in graph_in.items()}
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
            return cycle
    return None


@pytest.mark.parametrize("graph", [IMPORT_GRAPH, TYPED_GRAPH], ids=["run-time", "with-type-only"])
def test_no_import_circle_between_modules(graph: dict[str, set[str]]) -> None:
    cycle = _cycle(graph)
    assert cycle is None, "import circle: " + " -> ".join(cycle or [])


#: Imports at run time, for type checking and by registry string: the strictest graph.
FULL_GRAPH = GRAPH


def _folder(module: str) -> str:
    """The folder a module lives in, as a layer: ``april_bench.engines.hf.engine`` ->
    ``april_bench.engines``; a top-level module is its own (``april_bench.runner``); the strategy zoo's
    packages are theirs (``baselines``)."""
    parts = module.split(".")
    return ".".join(parts[:2]) if parts[0] == "april_bench" else parts[0]


def _folder_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    folders: dict[str, set[str]] = {}
    for mod, deps in graph.items():
        folders.setdefault(_folder(mod), set()).update(
            _folder(d) for d in deps if d in graph and _folder(d) != _folder(mod)
        )
    return folders


def _circles(graph: dict[str, set[str]]) -> set[frozenset[str]]:
    """Every strongly connected group of more than one node (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: set[frozenset[str]] = set()

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for dep in sorted(graph.get(node, ())):
            if dep not in index:
                visit(dep)
                low[node] = min(low[node], low[dep])
            elif dep in stack:
                low[node] = min(low[node], index[dep])
        if low[node] == index[node]:
            group = set()
            while True:
                member = stack.pop()
                group.add(member)
                if member == node:
                    break
            if len(group) > 1:
                found.add(frozenset(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_registry_strings_close_no_module_circle() -> None:
    """With registry strings counted as imports (and type-only imports too), no module circle: a
    composite (the Ray engine pool, the Ray trainer actor) gets the specs it builds from as ``parts``
    from the registry that names it, and never looks that registry up."""
    graph = {mod: {d for d in deps if d in FULL_GRAPH and d != mod} for mod, deps in FULL_GRAPH.items()}
    assert not _circles(graph), sorted(map(sorted, _circles(graph)))


def test_no_folder_loop() -> None:
    """Folders as layers, with run-time, type-only and registry-string imports: no loop (a registry
    string that names a module importing back into the registry's folder is a loop: ``STRATEGIES``
    lives in ``april_bench/strategies.py``, above ``rollout/``, ``baselines/`` and ``april_impl/``, and
    the simulator's engine and trainer live in ``engines/sim/`` and ``trainers/sim.py``, above the
    models of ``sim/``, for that reason)."""
    loops = _circles(_folder_graph(FULL_GRAPH))
    assert not loops, sorted(map(sorted, loops))


def test_an_injected_loop_is_caught() -> None:
    """The two checks above can fail: a registry string in ``rollout/`` naming a strategy (which imports
    ``rollout.strategy``) is a folder loop, and a protocol module importing its registry back is a
    module circle."""
    folder_looped = {
        **FULL_GRAPH,
        "april_bench.rollout.loop": FULL_GRAPH["april_bench.rollout.loop"] | {"baselines.sync"},
    }
    assert _circles(_folder_graph(folder_looped))
    module_looped = {
        **FULL_GRAPH,
        "april_bench.engines.protocol": FULL_GRAPH["april_bench.engines.protocol"] | {"april_bench.engines"},
    }
    graph = {m: {d for d in deps if d in module_looped and d != m} for m, deps in module_looped.items()}
    assert _circles(graph)


#: Objects a ``getattr`` may ask for a member an engine capability also names: they are no engine.
NOT_ENGINES = {"done.train_result": "a trainer's step result (its metrics)"}


def _capability_probes(path: Path) -> list[tuple[str, str]]:
    """Calls in ``path`` that probe an engine for an optional protocol: ``isinstance``/``issubclass``
    with the protocol, or ``getattr``/``hasattr`` with one of its members' names."""
    from april_bench.engines.protocol import CAPABILITIES

    protocols = {c.protocol.__name__ for c in CAPABILITIES}
    members = {
        name
        for c in CAPABILITIES
        for name, member in vars(c.protocol).items()
        if not name.startswith("_") and (callable(member) or isinstance(member, property))
    }
    found: list[tuple[str, str]] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and len(node.args) >= 2):
            continue
        if node.func.id in ("isinstance", "issubclass"):
            kinds = node.args[1].elts if isinstance(node.args[1], ast.Tuple) else [node.args[1]]
            for kind in kinds:
                name = kind.attr if isinstance(kind, ast.Attribute) else getattr(kind, "id", "")
                if name in protocols:
                    found.append((f"{path.name}:{node.lineno}", name))
        elif (
            node.func.id in ("getattr", "hasattr")
            and isinstance(node.args[1], ast.Constant)
            and node.args[1].value in members
            and ast.unparse(node.args[0]) not in NOT_ENGINES
        ):
            found.append((f"{path.name}:{node.lineno}", str(node.args[1].value)))
    return found


def test_capabilities_are_read_from_the_info_never_probed(tmp_path: Path) -> None:
    """docs/architecture.md: an engine's optional capabilities are declared once in
    ``EngineInfo.capabilities`` and read there (``ACCOUNTING.of(engine)``), never probed with
    ``isinstance``, ``getattr`` or ``hasattr`` (the conformance suite, in tests/, checks that the
    declarations match what each engine implements)."""
    probes = [probe for path in FILES for probe in _capability_probes(path)]
    assert not probes, f"read the capability from engine.info (ACCOUNTING.of(engine)): {probes}"
    source = tmp_path / "probe.py"
    source.write_text(
        "from april_bench.engines import protocol\n"
        "def work(engine):\n    return isinstance(engine, (int, protocol.EngineAccounting))\n"
        "def preempted(engine):\n    return getattr(engine, 'metrics', None)\n"
    )
    assert _capability_probes(source) == [("probe.py:3", "EngineAccounting"), ("probe.py:5", "metrics")]
