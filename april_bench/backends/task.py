"""Which task a run gets: the choice by data set, model and engine, and the options check.

Three kinds of task (:data:`april_bench.tasks.TASKS`, each building itself):

* ``synthetic`` (``--dataset synthetic`` on a token engine): the embedded task.
* ``math`` (a math data set and ``--model`` a checkpoint directory).
* ``lengths`` (the simulator, a fake engine, or a named architecture on a real engine).

Everything here is decided once per experiment and shared by every arm.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from april_bench.config import ConfigError
from april_bench.tasks import TASKS
from april_bench.tasks.base import Task, looks_like_path

if TYPE_CHECKING:
    from april_bench.experiment_config import ExperimentConfig

__all__ = ["Task", "build_task"]

#: The options each kind of task reads; any other kind given them is a mistake worth an error.
_TASK_OPTIONS = {
    "synthetic": ("task_args", "warmstart_args"),
    "math": ("task_args",),
    "lengths": ("workload_args",),
}
_FLAG = {"task_args": "--task-arg", "warmstart_args": "--warmstart-arg", "workload_args": "--workload-arg"}


def build_task(
    config: ExperimentConfig, *, produces_tokens: bool, simulated: bool = False, progress: bool = False
) -> Task:
    """The task of ``config`` on an engine that produces tokens (or lengths only), from a model or not
    (``simulated``: a fake engine's tokens are not a model's, so they replay lengths)."""
    model = config.model
    if looks_like_path(model) and not Path(model).expanduser().is_dir():
        raise ConfigError(
            f"--model {model}: no such checkpoint directory (a named architecture is one of "
            "`python -m april_bench ls models`)"
        )
    if config.dataset == "synthetic" and produces_tokens and not simulated:
        kind = "synthetic"
    elif produces_tokens and not simulated and Path(model).expanduser().is_dir():
        kind = "math"
    else:
        kind = "lengths"
    build: Any = TASKS.get(kind)
    task: Task = build(config, produces_tokens=produces_tokens, progress=progress)
    _check_options_used(config, task.kind)
    return task


def _check_options_used(config: ExperimentConfig, kind: str) -> None:
    """Options the chosen task never reads are a mistake: say which task reads them."""
    for name, flag in _FLAG.items():
        if getattr(config, name) and name not in _TASK_OPTIONS[kind]:
            readers = [k for k, used in _TASK_OPTIONS.items() if name in used]
            raise ConfigError(
                f"{flag} is not used by this run's {kind} task (it applies to the {' and '.join(readers)} "
                f"task{'s' if len(readers) > 1 else ''}); drop it"
            )
    used = {config.dataset, *config.eval_datasets}
    unused = sorted(set(config.data_paths) - used)
    if unused:
        raise ConfigError(
            f"--data-path {', '.join(unused)} is not used: the run trains on {config.dataset}"
            + (f" and evaluates on {', '.join(config.eval_datasets)}" if config.eval_datasets else "")
            + "; add it to --eval-datasets or drop it"
        )
