"""april-bench: the reference implementation and benchmark harness for APRIL.

``import april_bench`` is light: engines, torch and the simulator load only
when used.  The library entry point is :func:`april_bench.run`::

    from april_bench import ExperimentConfig, run
    result = run(ExperimentConfig(hardware="mi300x", algorithm="dapo", steps=10))
    result = run(ExperimentConfig(steps=2), out="runs/mine")  # the run directory `run --out` writes
    result.out, result.gains(), result.summary()  # its directory, gains and per-arm metrics
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"
__all__ = ["ExperimentConfig", "RunResult", "__version__", "run"]

if TYPE_CHECKING:
    from april_bench.experiment import ExperimentConfig, RunResult
    from april_bench.runner import run


def __getattr__(name: str) -> Any:
    if name == "run":
        from april_bench import runner

        return runner.run
    if name in ("ExperimentConfig", "RunResult"):
        from april_bench import experiment

        return getattr(experiment, name)
    raise AttributeError(f"module 'april_bench' has no attribute {name!r}")
