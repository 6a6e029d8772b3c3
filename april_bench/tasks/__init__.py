"""Tasks: what the run trains and evaluates on, each building itself from the experiment's config.

:data:`TASKS` names each kind's ``build(config, model, *, produces_tokens, progress) -> Task``
(:class:`april_bench.tasks.base.Task`); which kind a run gets is the wiring's choice
(:func:`april_bench.backends.task.build_task`).  Importing this package imports no task module.
"""

from __future__ import annotations

from april_bench.registry import Registry

__all__ = ["TASKS"]

TASKS: Registry[object] = Registry("task")
TASKS.register(
    "synthetic",
    "april_bench.tasks.workload:build",
    "the embedded task: generated problems, a character tokenizer and a cached warm start (no download)",
)
TASKS.register(
    "synthetic-agent",
    "april_bench.tasks.agent:build",
    "the embedded task as multi-turn episodes: the policy calls a calculator tool (docs/agents.md)",
)
TASKS.register(
    "synthetic-agent-replayed",
    "april_bench.tasks.agent:build_replayed",
    "the agent task's episodes replayed without a model (--engine sim or fake): turns, tool calls, latency",
)
TASKS.register(
    "math",
    "april_bench.tasks.math:build",
    "a checkpoint on a math data set: its chat template, the recipe's grader, avg@k on --eval-datasets",
)
TASKS.register(
    "lengths",
    "april_bench.tasks.lengths:build",
    "a data set's length profile: the simulator, or replayed lengths on a real engine (no accuracy)",
)
