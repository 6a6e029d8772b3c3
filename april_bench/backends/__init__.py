"""Wiring: build the components of an experiment from its config.

Three independent choices, each from a registry:

* the **engine** (``--engine``): :data:`april_bench.engines.ENGINES`, built from
  :class:`~april_bench.engines.protocol.EngineSettings` (one context-length
  formula: the longest prompt plus the response limit);
* the **task** (data set and model): :func:`april_bench.backends.task.build_task`
  - workload, evaluator, stop tokens, starting weights;
* the **trainer** (``--trainer``): :data:`april_bench.trainers.registry.TRAINERS`.

Any engine pairs with any trainer that fits it; the weight-sync seam
(:mod:`april_bench.backends.weights`) carries weights between them in the form
both accept.  The driver (:mod:`april_bench.experiment`) only sees
:class:`Components`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from april_bench.backends.resolve import resolve_engine
from april_bench.backends.task import Task, build_task
from april_bench.config import ConfigError
from april_bench.engines import ENGINES, EngineSpec
from april_bench.engines.protocol import Engine, EngineSettings
from april_bench.evaluation import Evaluator
from april_bench.trainers.protocol import Trainer
from april_bench.trainers.registry import TrainerSettings, TrainerSpec, resolve_trainer
from april_bench.workload import Workload

if TYPE_CHECKING:
    from april_bench.experiment_config import ExperimentConfig
    from april_bench.rollout.loop import RolloutConfig

__all__ = ["Components", "build_components", "check_drivers", "resolve_engine"]


@dataclass(slots=True)
class Components:
    """What every arm of an experiment is built from (engines and trainers fresh per arm)."""

    engine_name: str
    engine: Callable[[], Engine]
    trainer: Callable[[], Trainer]
    workload: Workload
    evaluator: Evaluator | None
    task: Task
    engine_spec: EngineSpec
    trainer_spec: TrainerSpec
    engine_settings: EngineSettings
    trainer_settings: TrainerSettings
    engine_args: Mapping[str, Any]
    trainer_args: Mapping[str, Any]
    #: Every session's rollout loop settings: the config's, with its seed and dynamic sampling, and the
    #: workload's lengths replayed where the task says (resolved once, here).
    rollout: RolloutConfig
    #: The simulator's GPUs (``--num-gpus``, else one node of the hardware), looked up once here: an
    #: asynchronous arm splits them (:meth:`split`); ``None`` on other engines.
    sim_gpus: int | None

    @property
    def virtual_time(self) -> bool:
        return self.engine_spec.virtual_time

    #: One line per choice made for the user (``--engine auto`` fell back to the simulator ...).
    notes: list[str]

    def split(self, train_gpus: int | None) -> tuple[Callable[[], Engine], Callable[[], Trainer], str | None]:
        """Engine and trainer factories for an asynchronous arm.  On the simulator, rollout and
        training overlap on disjoint GPUs (``train_gpus`` for the trainer, default a quarter of the
        node, the rest in whole engine replicas for rollout), as verl's and AReaL's disaggregated
        setups run; other engines run as they are (a real engine and trainer share what they share,
        and the timing measures it).  Also a note saying which split was made (``None``: none)."""
        total = self.sim_gpus
        if total is None:
            return self.engine, self.trainer, None
        tp = int(self.engine_args.get("tp_size") or min(2, total))
        # default: a quarter of the node for the trainer, the rest (whole engine replicas) for rollout
        train = train_gpus if train_gpus is not None else total - tp * ((total - max(1, total // 4)) // tp)
        if not 1 <= train < total:
            raise ConfigError(
                f"an asynchronous arm on the simulator needs GPUs for rollout and for training: "
                f"train_gpus={train} of {total}; set train_gpus between 1 and {total - 1} or raise --num-gpus"
            )
        engine_settings = dataclasses.replace(self.engine_settings, num_gpus=total - train)
        trainer_settings = dataclasses.replace(self.trainer_settings, num_gpus=train)
        engine_spec, trainer_spec = self.engine_spec, self.trainer_spec
        engine_args, trainer_args = self.engine_args, self.trainer_args
        return (
            lambda: engine_spec.build(engine_settings, engine_args),
            lambda: trainer_spec.build(trainer_settings, trainer_args),
            f"rollout on {total - train} GPUs, training on {train} (disaggregated)",
        )

    def check(self) -> None:
        """Raise ``ConfigError`` for any engine or trainer option ``run`` would reject (no heavy work)."""
        self.engine_spec.check(self.engine_settings, self.engine_args)
        self.trainer_spec.check(self.trainer_settings, self.trainer_args)


def build_components(config: ExperimentConfig, *, progress: bool = False) -> Components:
    """The run's one validation, in the order of what each step needs: resolve the engine and check
    every arm's driver on it (:func:`check_drivers`), resolve the trainer, check the telemetry option,
    assemble the task (its own checks), resolve the rollout settings, prepare engine and trainer
    factories and check their options (:meth:`Components.check`).  Raises ``ConfigError`` naming the
    fix.

    Nothing heavy happens here (no warm start, no model load): ``validate`` calls it too.
    """
    engine_name, note = resolve_engine(config.engine, config.hardware, config.model)
    spec = ENGINES.get(engine_name)
    missing = spec.missing()
    if missing:
        raise ConfigError(missing)
    check_drivers(config, engine_name, spec)  # every arm's driver on this engine, before anything is built
    trains = spec.produces_tokens and not spec.simulated  # a model's tokens: something to train on
    trainer_spec = resolve_trainer(config.trainer, engine=engine_name, produces_tokens=trains)
    sim_gpus = None  # the simulator's GPUs, which an asynchronous arm splits (Components.split)
    if engine_name == "sim":
        from april_bench.profiles.hardware import hardware_profile

        sim_gpus = config.num_gpus or hardware_profile(config.hardware).gpus_per_node
    telemetry_note = None  # a measured run's telemetry: checked before any download or task is built
    if config.telemetry is not None and not spec.virtual_time:
        from april_bench.telemetry.sampler import check_backend

        telemetry_note = check_backend(config.telemetry)  # what telemetry will sample
    model = config.model  # resolved once here: the task, the engine and the trainer all load this one
    if trains:  # after the trainer's check: a hub id may download
        from april_bench.hub import resolve_model

        model = resolve_model(model)  # a hub id: its local snapshot
    task = build_task(
        config, model, produces_tokens=spec.produces_tokens, simulated=spec.simulated, progress=progress
    )
    engine_settings = EngineSettings(
        model=model,
        hardware=config.hardware,
        max_context_len=task.longest_prompt + config.rollout.max_response_len,
        seed=config.seed,
        eos_token_ids=task.eos_token_ids,
        vocab_size=task.vocab_size,
        num_gpus=config.num_gpus,
        initial_weights=task.initial_weights,
        checkpoint=task.checkpoint,
        colocate=config.colocate,
    )
    trainer_settings = TrainerSettings(
        algorithm=config.algorithm,
        off_policy=config.off_policy,
        temperature=config.rollout.temperature,
        max_response_len=config.rollout.max_response_len,
        model=model,
        hardware=config.hardware,
        seed=config.seed,
        pad_token_id=task.pad_token_id,
        vocab_size=task.vocab_size,
        num_gpus=config.num_gpus,
        initial_weights=task.initial_weights,
    )
    # every session's rollout loop: the config's settings, the workload's lengths replayed if the task says
    rollout = config.rollout_config(replay_lengths=task.replay_lengths)
    components = Components(
        engine_name=engine_name,
        engine=lambda: spec.build(engine_settings, config.engine_args),
        trainer=lambda: trainer_spec.build(trainer_settings, config.trainer_args),
        workload=task.workload,
        evaluator=task.evaluator,
        task=task,
        engine_spec=spec,
        trainer_spec=trainer_spec,
        engine_settings=engine_settings,
        trainer_settings=trainer_settings,
        engine_args=config.engine_args,
        trainer_args=config.trainer_args,
        rollout=rollout,
        sim_gpus=sim_gpus,
        notes=([note] if note else []) + task.notes + ([telemetry_note] if telemetry_note else []),
    )
    components.check()  # every engine and trainer option, with the settings the task decided
    return components


def check_drivers(config: ExperimentConfig, engine_name: str, spec: EngineSpec) -> None:
    """Refuse, before any engine starts, an arm that updates weights in flight on an engine that
    cannot (SGLang's adapters, vLLM's server adapter: use weight_update=drain or one-step-off), and
    a consistent-rollout arm on an engine that holds one weight version (vLLM, SGLang)."""
    from april_bench.rollout.driver_config import WeightUpdateMode
    from april_bench.strategies import STRATEGIES

    if config.colocate and not spec.sleeps:
        raise ConfigError(
            f"--colocate: engine {engine_name!r} cannot release its memory for the trainer; "
            "use vllm (on a GPU), sglang, or ray with engine=vllm or sglang"
        )
    for arm in config.arms:
        driver = arm.driver
        if config.colocate and driver.asynchronous:
            raise ConfigError(
                f"arm {arm.label!r}: --colocate time-shares the accelerators, so rollout and training "
                "cannot overlap; drop the arm's driver= (or --colocate)"
            )
        strategy = STRATEGIES.get(arm.strategy)
        partial = bool(strategy.partial_rollout)
        if strategy.pins_versions and not spec.holds_versions:
            raise ConfigError(
                f"arm {arm.label!r} finishes each partial on the policy version that began it, which needs "
                f"two weight versions in one engine; engine {engine_name!r} cannot: "
                f"{spec.versions_missing}; use --engine sim or hf"
            )
        if (
            driver.asynchronous
            and driver.update_mode(partial) is WeightUpdateMode.INFLIGHT
            and not spec.updates_in_flight(config.engine_args)
        ):
            raise ConfigError(
                f"arm {arm.label!r}: engine {engine_name!r} cannot update weights with requests "
                "in flight (pause, install, continue); add weight_update=drain or use driver=one-step-off"
            )
