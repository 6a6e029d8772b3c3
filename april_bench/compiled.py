"""The simulator's compiled core: which modules an opt-in build compiles with mypyc, and whether they are.

The simulator's cost is Python's cost per event (a tool-calling episode is a request per turn, and each
passes through the engine's scheduler, the rollout loop and the episode's bookkeeping).  These modules
are where that time goes; a build with ``APRIL_BENCH_COMPILE=1`` (``setup.py``; ``tox -e compiled``)
compiles them to C extensions with mypyc, which runs the same code on the same floats, so every result
is the same (``tests/test_compiled.py`` compares a compiled and a pure run of the same cells).  The
default install is pure Python: nothing needs a compiler, and editing a module takes effect at once.

This module imports nothing of the package: ``setup.py`` reads :data:`MODULES` from it before the
package can import.
"""

from __future__ import annotations

import importlib
import importlib.machinery
from collections.abc import Mapping
from typing import Any

try:  # mypy's own package (installed with mypy, so always where the core is compiled)
    from mypy_extensions import mypyc_attr
except ImportError:  # pure Python without mypy: the decorator marks nothing

    def mypyc_attr(*attrs: str, **kwattrs: object) -> Any:  # type: ignore[misc]
        return lambda cls: cls


__all__ = ["MODULES", "compiled_modules", "core_compiled", "mypyc_attr", "requested"]

#: The environment variable that asks a build for the compiled core, and the values that mean yes.
VARIABLE = "APRIL_BENCH_COMPILE"
_YES = ("1", "true", "yes")

#: The modules compiled, as paths from the repository's root (what mypyc takes).  A class whose base is
#: not compiled (``Configurable``, ``ConfigError``, ``BaseConfig``) is marked
#: ``@mypyc_attr(native_class=False)``: an ordinary Python class whose methods are compiled.
MODULES: tuple[str, ...] = (
    "april_bench/engines/sim/cost.py",
    "april_bench/engines/sim/replica.py",
    "april_bench/engines/stream.py",
    "april_bench/sim/agent_workload.py",
    "april_bench/rollout/episodes.py",
    "april_bench/results/accumulate.py",
    "april_bench/types.py",
    "april_bench/rollout/loop.py",
    "april_bench/rollout/step.py",
    "april_bench/results/recorder.py",
    "april_bench/engines/requests.py",
    "april_bench/engines/sim/engine.py",
)


def requested(environ: Mapping[str, str]) -> bool:
    """Whether ``environ`` asks the build for the compiled core (``APRIL_BENCH_COMPILE=1``, ``true`` or
    ``yes``): the one reading of the variable, shared by ``setup.py`` and the build backend."""
    return environ.get(VARIABLE, "").strip().lower() in _YES


def compiled_modules() -> dict[str, bool]:
    """Each of :data:`MODULES` (its dotted name), and whether it was imported from a compiled extension
    (imports them)."""
    suffixes = tuple(importlib.machinery.EXTENSION_SUFFIXES)
    names = [path.removesuffix(".py").replace("/", ".") for path in MODULES]
    return {name: str(importlib.import_module(name).__file__).endswith(suffixes) for name in names}


def core_compiled() -> bool:
    """Whether every module of the core was imported compiled (imports them)."""
    return all(compiled_modules().values())
