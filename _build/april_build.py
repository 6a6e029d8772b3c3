"""The build backend: setuptools', plus mypy in the build requirements when ``APRIL_BENCH_COMPILE`` asks
for the compiled core (``setup.py``), so that a plain install downloads nothing more."""

from __future__ import annotations

import os
import runpy
from collections.abc import Callable
from typing import Any

from setuptools import build_meta as _setuptools
from setuptools.build_meta import *  # noqa: F403  (every hook setuptools defines, unchanged)

#: The mypy that compiles the core (its mypyc); the same major version the type check runs.
MYPYC = "mypy>=2.4,<3"


def _requires(hook: Callable[[Any], list[str]], config_settings: Any) -> list[str]:
    """``hook``'s requirements, plus mypy when the compiled core is asked for.  setuptools' hook runs
    ``setup.py`` to collect them, before mypy is installed: it runs without the request."""
    core = runpy.run_path(os.path.join("april_bench", "compiled.py"))
    asked = os.environ.pop(core["VARIABLE"], None)
    try:
        requires = hook(config_settings)
    finally:
        if asked is not None:
            os.environ[core["VARIABLE"]] = asked
    return [*requires, MYPYC] if core["requested"]({core["VARIABLE"]: asked or ""}) else requires


def get_requires_for_build_wheel(config_settings: dict[str, Any] | None = None) -> list[str]:
    return _requires(_setuptools.get_requires_for_build_wheel, config_settings)


def get_requires_for_build_editable(config_settings: dict[str, Any] | None = None) -> list[str]:
    return _requires(_setuptools.get_requires_for_build_editable, config_settings)
