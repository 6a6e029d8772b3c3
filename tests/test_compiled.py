"""The compiled core (``april_bench/compiled.py``): its modules compile, and compiled they give the same
results as pure Python.

The ``compiled`` tests run in ``tox -e compiled``, which builds the core with mypyc and sets
``APRIL_BENCH_EXPECT_COMPILED=1`` so that nothing there skips; elsewhere they skip unless the installed
core is compiled.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from april_bench.compiled import MODULES, VARIABLE, compiled_modules, core_compiled, requested

ROOT = Path(__file__).resolve().parents[1]

#: Three small cells of the paper table (benchmarks/paper_table.py): an agent cell (tool turns: every
#: compiled module on its path), a DAPO cell (dynamic sampling, relaunch waves) and a GRPO one, printed
#: as JSON with what the process imported.
_CELLS = """
import json, sys
sys.path.insert(0, {benchmarks!r})
import paper_table as pt
from april_bench.compiled import compiled_modules
from april_bench.sim.paper_settings import paper_setting
cells = [
    pt.simulate_agent("h100", 2.0, 1.0, steps=3),
    pt.simulate_setting(paper_setting("dapo-math"), "mi300x", steps=3),
    pt.simulate_setting(paper_setting("deepscaler"), "h100", steps=3),
]
print(json.dumps({{"compiled": compiled_modules(), "cells": cells}}, sort_keys=True, default=repr))
"""


def test_every_listed_module_is_a_source_file_of_the_package() -> None:
    for path in MODULES:
        assert path.startswith("april_bench/") and path.endswith(".py"), path
        assert (ROOT / path).is_file(), path


def test_the_core_is_compiled_whole_or_not_at_all() -> None:
    # a partial build (one module left pure by a failed compile) would run, but slower than claimed
    assert len(set(compiled_modules().values())) == 1, compiled_modules()
    assert core_compiled() == all(compiled_modules().values())


@pytest.mark.parametrize(
    ("value", "asked"),
    [("1", True), ("true", True), (" YES ", True), ("0", False), ("", False), ("no", False), (None, False)],
)
def test_what_asks_the_build_for_the_compiled_core(value: str | None, asked: bool) -> None:
    # setup.py and the build backend (_build/april_build.py) both read the variable through requested()
    environ = {} if value is None else {VARIABLE: value}
    assert requested(environ) is asked


@pytest.mark.compiled
def test_the_core_is_compiled() -> None:
    assert all(compiled_modules().values()), compiled_modules()


@pytest.mark.compiled
def test_compiled_requests_and_completions_pickle_and_copy() -> None:
    # compiled, a frozen dataclass is a native class: pickling it the default way fails
    from test_requests import check_round_trips

    check_round_trips()


@pytest.mark.compiled
@pytest.mark.slow
def test_compiled_and_pure_python_give_the_same_cells(tmp_path: Path) -> None:
    script = _CELLS.format(benchmarks=str(ROOT / "benchmarks"))

    def cells(pythonpath: str | None) -> dict[str, object]:
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        if pythonpath is not None:
            env["PYTHONPATH"] = pythonpath
        # from tmp_path: `python -c` puts the working directory first on sys.path
        out = subprocess.run(
            [sys.executable, "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True, check=True
        )
        return dict(json.loads(out.stdout.splitlines()[-1]))

    compiled = cells(None)  # the installed (compiled) package
    pure = cells(str(ROOT))  # the source tree, before the installed package
    assert all(compiled["compiled"].values())  # type: ignore[attr-defined]
    assert not any(pure["compiled"].values())  # type: ignore[attr-defined]
    assert compiled["cells"] == pure["cells"]
