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

from april_bench.tasks import TASKS
from april_bench.tasks.base import Task, check_data_claims, check_model, check_options_used

if TYPE_CHECKING:
    from april_bench.experiment_config import ExperimentConfig

__all__ = ["Task", "build_task"]


def build_task(
    config: ExperimentConfig,
    model: str,
    *,
    produces_tokens: bool,
    simulated: bool = False,
    progress: bool = False,
) -> Task:
    """The task of ``config`` with the policy ``model`` (``config.model`` resolved: a hub id's local
    snapshot) on an engine that produces tokens (or lengths only), from a model or not (``simulated``: a
    fake engine's tokens are not a model's, so they replay lengths)."""
    model = check_model(model)
    if config.dataset in ("synthetic", "synthetic-agent") and produces_tokens and not simulated:
        kind = config.dataset
    elif config.dataset == "synthetic-agent":
        kind = "synthetic-agent-replayed"  # the simulator or the fake engine: episodes, no model
    elif produces_tokens and not simulated and Path(model).expanduser().is_dir():
        kind = "math"
    else:
        kind = "lengths"
    # options this task never reads, and a data set's name it would not read (a claim): refused before
    # any work
    check_options_used(config, kind)
    check_data_claims(config, model, kind=kind, simulated=simulated, produces_tokens=produces_tokens)
    build: Any = TASKS.get(kind)
    task: Task = build(config, model, produces_tokens=produces_tokens, progress=progress)
    if config.length_oracle is not None:  # forced lengths and rewards over any task's prompts
        from april_bench.tasks.forced import force_lengths

        task = force_lengths(task, config)
    return task
