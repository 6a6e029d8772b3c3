"""Build hook: the project's metadata is in pyproject.toml; this file only adds the opt-in compiled core.

``APRIL_BENCH_COMPILE=1 pip install .`` (or ``tox -e compiled``) compiles the modules that
``april_bench/compiled.py`` lists with mypyc (it needs a C compiler; the build backend in ``_build/`` adds
mypy to the build requirements then).  Without the variable the package is pure Python.
"""

from __future__ import annotations

import os
import runpy
import shutil
import sys
import sysconfig

from setuptools import setup


def _ext_modules() -> list:
    core = runpy.run_path(os.path.join("april_bench", "compiled.py"))
    if not core["requested"](os.environ):
        return []
    compiler = (sysconfig.get_config_var("CC") or "cc").split()[0]
    if shutil.which(compiler) is None:
        sys.exit(
            f"APRIL_BENCH_COMPILE=1 needs a C compiler ({compiler!r} is not on PATH): install one "
            "(e.g. apt install gcc), or unset APRIL_BENCH_COMPILE for the pure-Python build"
        )
    from mypyc.build import mypycify

    paths = [os.path.join(*path.split("/")) for path in core["MODULES"]]
    # The build environment holds mypy alone: the third-party packages the modules reach (numpy,
    # torch) are not there (so the ignores their types need go unused), and these modules do not need them.
    return mypycify(["--ignore-missing-imports", "--no-warn-unused-ignores", *paths], opt_level="3")


setup(ext_modules=_ext_modules())
