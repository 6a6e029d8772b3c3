"""The ``lengths`` task: a data set's length profile, on the simulator or replayed on a real engine.

On a real engine (a named architecture, no checkpoint) the prompts get random ids and the drawn response
lengths are replayed (EOS ignored until then): the standard way to measure engine throughput without a
checkpoint.  No accuracy.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from april_bench.config import ConfigError, config_from
from april_bench.tasks.base import Task, check_loaded, random_checkpoint

if TYPE_CHECKING:
    from april_bench.experiment_config import ExperimentConfig

__all__ = ["build", "sim_workload"]


def sim_workload(config: ExperimentConfig, *, model: str | None = None, token_ids: bool = False) -> Any:
    """The simulated workload of ``config`` for ``model`` (default ``config.model``): the data set's length
    profile, with prompt lengths measured from its ``--data-path`` file when one is given (``token_ids``:
    random prompt ids for a real engine)."""
    from april_bench.sim.agent_workload import AgentToolEpisodes, ToolShape
    from april_bench.sim.workload import SimWorkload

    args = dict(config.workload_args)
    tools = ToolShape.from_args(args)  # agent_* arguments: tool-calling episodes (docs/calibration.md)
    if config.dataset in config.data_paths:
        args.setdefault("data_path", config.data_paths[config.dataset])
    options = {"dataset": config.dataset, "model": model or config.model, "seed": config.seed, **args}
    settings = config_from(SimWorkload.Config, options, where="--workload-arg")
    workload = settings.build(n_samples_per_prompt=config.rollout.n_samples_per_prompt, token_ids=token_ids)
    return workload if tools is None else AgentToolEpisodes(workload, tools, seed=config.seed)


def build(config: ExperimentConfig, model: str, *, produces_tokens: bool, progress: bool = False) -> Task:
    """The lengths task of ``config`` for ``model`` (``produces_tokens``: on a real engine, replayed)."""
    if produces_tokens:
        from april_bench.models.zoo import model_config

        model_config(model)  # an unknown architecture fails here, before anything runs
    workload = sim_workload(config, model=model, token_ids=produces_tokens)
    notes: list[str] = []
    if workload.load_report is not None:
        check_loaded(config.dataset, workload.load_report, notes=notes)
    if config.dynamic_sampling_on and not workload.has_rewards:
        raise ConfigError("dynamic sampling needs rewards: add a 'reward' column to the length trace")
    checkpoint = None
    if produces_tokens:

        def checkpoint() -> str:
            return random_checkpoint(model, seed=config.seed)

    return Task(
        kind="lengths",
        workload=workload,
        evaluator=None,
        longest_prompt=workload.longest_prompt(),
        replay_lengths=produces_tokens,
        checkpoint=checkpoint,
        notes=notes,
    )
