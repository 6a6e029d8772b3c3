"""The build backend: setuptools', plus mypy in the build requirements when ``APRIL_BENCH_COMPILE`` asks
for the compiled core (``setup.py``), so that a plain install downloads nothing more."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from setuptools import build_meta as _setuptools
from setuptools.build_meta import *  # noqa: F403  (every hook setuptools defines, unchanged)

#: The mypy that compiles the core (its mypyc); the same major version the type check runs.
MYPYC = "mypy>=2.4,<3"


def _requires(hook: Callable[[Any], list[str]], config_settings: Any) -> list[str]:
    """``hook``'s requirements, plus mypy when the compiled core is asked for.  setuptools' hook runs
    ``setup.py`` to collect them, before mypy is installed: it runs without the request."""
    asked = os.environ.pop("APRIL_BENCH_COMPILE", None)
    try:
        requires = hook(config_settings)
    finally:
        if asked is not None:
            os.environ["APRIL_BENCH_COMPILE"] = asked
    wanted = (asked or "").strip().lower() in ("1", "true", "yes")
    return [*requires, MYPYC] if wanted else requires


def get_requires_for_build_wheel(config_settings: dict[str, Any] | None = None) -> list[str]:
    return _requires(_setuptools.get_requires_for_build_wheel, config_settings)


def get_requires_for_build_editable(config_settings: dict[str, Any] | None = None) -> list[str]:
    return _requires(_setuptools.get_requires_for_build_editable, config_settings)
