"""An experiment: the same workload run under several rollout strategies.

``run(config)`` runs one *arm* per strategy.  Every arm gets a fresh engine,
trainer, buffer and prompt stream over the same prompts, the same sampling
seeds and the same per-(prompt, sample) draws, so arms differ in the strategy
alone.  A step is rollout, then train, then weight sync, timed on the arm's
clock (virtual for the simulator, ``time.monotonic`` for real engines).
Held-out evaluations happen between steps and are excluded from that clock,
so "equal wall-clock" compares training time only.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from tqdm import tqdm

from april_bench.algorithms import ALGORITHMS
from april_bench.backends.resolve import resolve_engine
from april_bench.config import BaseConfig, ConfigError, param
from april_bench.engines import ENGINES, WeightUpdate
from april_bench.results.records import EvalRecord, Fate, RunRecorder
from april_bench.rollout.loop import RolloutConfig, RolloutLoop
from april_bench.strategies import STRATEGIES, build_strategy
from april_bench.vtime import run_real, run_virtual

__all__ = ["OFF_POLICY_MODES", "Components", "ExperimentConfig", "RunResult", "build_components", "run"]

#: Off-policy treatments of tokens from older policies (see april_bench.algorithms.losses).
OFF_POLICY_MODES = ("as-is", "mask", "tis")


@dataclass(kw_only=True, slots=True, frozen=True)
class ExperimentConfig(BaseConfig):
    hardware: str = param("h100", help="hardware: cpu, h100, h200, mi300x")
    algorithm: str = param("grpo", help="grpo, dapo (adds dynamic sampling) or gspo")
    dataset: str = param("dapo-math-17k", help="synthetic, dapo-math-17k, deepscaler or deepmath-103k")
    model: str = param("qwen3-4b", help="policy model (a named architecture, or a checkpoint for hf)")
    engine: str = param("auto", help="auto (real engine if present, else sim), or an engine name")
    strategies: tuple[str, ...] = param(("sync", "oversample-discard", "april"), help="arms to compare")
    steps: int = param(20, help="training steps per arm")
    seed: int = param(0, help="seed of the workload draws and of sampling")
    rollout: RolloutConfig = param(help="rollout batch settings", default_factory=RolloutConfig)
    dynamic_sampling: bool | None = param(None, help="override the algorithm's DAPO dynamic sampling")
    max_version_span: int | None = param(
        None, help="APRIL cap: restart samples older than this many versions"
    )
    max_aborts_per_sample: int | None = param(None, help="APRIL cap: restart samples aborted more often")
    num_gpus: int | None = param(None, help="GPUs (default: one node of the hardware)")
    eval_every: int | None = param(
        None, help="held-out evaluation every this many steps (and at 0 and the end)"
    )
    off_policy: str = param("as-is", help="tokens of older policies in the loss: as-is (paper), mask or tis")
    engine_args: Mapping[str, Any] = param(
        help="native engine arguments, passed through", default_factory=dict
    )
    workload_args: Mapping[str, Any] = param(help="simulated-workload overrides", default_factory=dict)
    trainer_args: Mapping[str, Any] = param(
        help="trainer settings (lr, mini_batches, ...)", default_factory=dict
    )
    task_args: Mapping[str, Any] = param(
        help="task settings: the synthetic task's, or a math run's (grader, template, eval_samples ...)",
        default_factory=dict,
    )
    data_paths: Mapping[str, str] = param(
        help="local copies of data sets, by name (else the hub): the training set and evaluation sets",
        default_factory=dict,
    )
    eval_datasets: tuple[str, ...] = param(
        (), help="evaluation sets of a math run (aime-2024, aime-2025, math-500), avg@k every --eval-every"
    )
    warmstart_args: Mapping[str, Any] = param(help="warm-start (SFT) settings", default_factory=dict)

    def __post_init__(self) -> None:
        ALGORITHMS.get(self.algorithm)
        if not self.strategies:
            raise ConfigError("--strategies needs at least one strategy, e.g. sync,april")
        for name in self.strategies:
            STRATEGIES.get(name)
        if len(set(self.strategies)) != len(self.strategies):
            raise ConfigError(f"--strategies lists a strategy twice: {','.join(self.strategies)}")
        if self.steps < 1:
            raise ConfigError(f"--steps must be >= 1, got {self.steps}")
        if self.engine != "auto":
            ENGINES.get(self.engine)
        if self.off_policy not in OFF_POLICY_MODES:
            raise ConfigError(
                f"--off-policy must be one of {', '.join(OFF_POLICY_MODES)}, got {self.off_policy!r}"
            )
        if self.eval_every is not None and self.eval_every < 1:
            raise ConfigError(f"--eval-every must be >= 1, got {self.eval_every}")
        from april_bench.data import DATASETS as DATA_SETS  # light: no pyarrow or datasets on import

        for name in (*self.data_paths, *self.eval_datasets):
            if name not in DATA_SETS:
                raise ConfigError(
                    f"unknown data set {name!r} in --data-path/--eval-datasets; known: {', '.join(DATA_SETS)}"
                )

    @property
    def dynamic_sampling_on(self) -> bool:
        if self.dynamic_sampling is not None:
            return self.dynamic_sampling
        return ALGORITHMS.get(self.algorithm).dynamic_sampling

    def rollout_config(self) -> RolloutConfig:
        return self.rollout.replace(dynamic_sampling=self.dynamic_sampling_on, seed=self.seed)


@dataclass(slots=True)
class RunResult:
    config: ExperimentConfig
    engine: str
    simulated: bool
    recorder: RunRecorder
    notes: list[str] = field(default_factory=list)


@dataclass(slots=True)
class Components:
    engine: Callable[[], Any]
    trainer: Callable[[], Any]
    workload: Any
    evaluator: Any = None


def run(
    config: ExperimentConfig,
    *,
    progress: bool = True,
    echo: Callable[[str], None] | None = None,
) -> RunResult:
    """Run every arm of ``config`` and return the tidy records."""
    engine_name, note = resolve_engine(config.engine, config.hardware)
    notes = [note] if note else []
    if note and echo:
        echo(note)
    components = build_components(config, engine_name, progress=progress)
    recorder = RunRecorder()
    simulated = True
    for name in config.strategies:
        engine = components.engine()
        simulated = engine.info.simulated
        runner = run_virtual if engine.info.virtual_time else run_real
        bar = tqdm(total=config.steps, desc=f"{name:>18}", unit="step", disable=not progress, file=sys.stderr)
        try:
            runner(_run_arm(config, name, engine, components, recorder, bar))
        finally:
            bar.close()
    return RunResult(config=config, engine=engine_name, simulated=simulated, recorder=recorder, notes=notes)


def build_components(config: ExperimentConfig, engine_name: str, *, progress: bool = False) -> Components:
    """Factories for the engine and trainer, the workload shared by every arm, and the evaluator."""
    if engine_name == "sim":
        return _sim_components(config)
    if engine_name == "hf":
        from april_bench.hf_components import hf_components

        return hf_components(config, progress=progress)
    raise ConfigError(f"engine {engine_name!r} cannot run experiments yet; use --engine sim or hf")


def _sim_components(config: ExperimentConfig) -> Components:
    from april_bench.sim.engine import SimEngine
    from april_bench.sim.trainer import SimTrainer

    engine_fields = SimEngine.Config.field_help()
    unknown = sorted(set(config.engine_args) - set(engine_fields))
    if unknown:
        raise ConfigError(
            f"unknown --engine-arg {', '.join(unknown)} for the simulator; it understands: "
            + ", ".join(k for k in engine_fields if k not in ("hardware", "model", "num_gpus"))
        )
    engine_config = SimEngine.Config(
        hardware=config.hardware, model=config.model, num_gpus=config.num_gpus, **dict(config.engine_args)
    )
    trainer_config = SimTrainer.Config(hardware=config.hardware, model=config.model, num_gpus=config.num_gpus)
    workload = sim_workload(config)
    if config.dynamic_sampling_on and not workload.has_rewards:
        raise ConfigError("dynamic sampling needs rewards: add a 'reward' column to the length trace")
    return Components(engine=engine_config.build, trainer=trainer_config.build, workload=workload)


def sim_workload(config: ExperimentConfig, *, token_ids: bool = False) -> Any:
    """The simulated workload of ``config``: the data set's length profile, with prompt lengths measured
    from its ``--data-path`` file when one is given (``token_ids``: random prompt ids for a real engine)."""
    from april_bench.sim.workload import SimWorkload

    workload_args = dict(config.workload_args)
    if config.dataset in config.data_paths:
        workload_args.setdefault("data_path", config.data_paths[config.dataset])
    return SimWorkload.Config(
        dataset=config.dataset, model=config.model, seed=config.seed, **workload_args
    ).build(n_samples_per_prompt=config.rollout.n_samples_per_prompt, token_ids=token_ids)


async def _run_arm(
    config: ExperimentConfig,
    name: str,
    engine: Any,
    components: Components,
    recorder: RunRecorder,
    bar: tqdm,
) -> None:
    loop = asyncio.get_running_loop()
    await engine.start()
    try:
        trainer = components.trainer()
        strategy = build_strategy(
            name,
            over_sampling_batch_size=config.rollout.over_sampling_batch_size,
            max_version_span=config.max_version_span,
            max_aborts_per_sample=config.max_aborts_per_sample,
        )
        clock = _TrainingClock(loop.time())
        rollout = config.rollout_config().build(
            arm=name,
            engine=engine,
            strategy=strategy,
            workload=components.workload,
            prompts=components.workload.prompt_stream(),
            recorder=recorder,
            t0=clock.origin,
        )
        evaluate = _evaluation(config, name, engine, components, recorder, clock, rollout)
        await evaluate(0)
        for step in range(config.steps):
            version = step  # one policy update per step
            outcome = await rollout.run_step(step, version)
            t_train = loop.time()
            result = await trainer.train(outcome.batch, step=step, policy_version=version)
            t_sync = loop.time()
            await engine.update_weights(WeightUpdate(version=version + 1, weights=trainer.weights()))
            t_end = loop.time()
            record = outcome.record
            record.train_time_s = t_sync - t_train
            record.weight_sync_time_s = t_end - t_sync
            record.step_time_s = t_end - (clock.origin + record.t_start)
            record.train_metrics = dict(getattr(result, "metrics", {}) or {})
            recorder.steps.append(record)
            recorder.sample_fates(
                name, outcome.batch, step=step, fate=Fate.TRAINED, reason="accepted", train_version=version
            )
            record.accuracy = await evaluate(step + 1)
            bar.update(1)
        recorder.sample_fates(
            name, list(rollout.buffer), step=config.steps, fate=Fate.BUFFERED, reason="end_of_run"
        )
    finally:
        await engine.close()


@dataclass(slots=True)
class _TrainingClock:
    """The arm's clock origin; moved forward by every evaluation so it measures training time only."""

    origin: float


def _evaluation(
    config: ExperimentConfig,
    arm: str,
    engine: Any,
    components: Components,
    recorder: RunRecorder,
    clock: _TrainingClock,
    rollout: RolloutLoop,
) -> Callable[[int], Any]:
    async def evaluate(done: int) -> float | None:
        evaluator = components.evaluator
        due = done in (0, config.steps) or (config.eval_every is not None and done % config.eval_every == 0)
        if evaluator is None or not due:
            return None
        loop = asyncio.get_running_loop()
        start = loop.time()
        result = await evaluator.evaluate(engine)
        elapsed = loop.time() - start
        recorder.evals.append(
            EvalRecord(
                arm=arm,
                step=done,
                policy_version=done,
                train_time_s=start - clock.origin,
                accuracy=result.accuracy,
                accuracy_stderr=result.stderr,
                n=result.n,
                mean_response_len=result.mean_response_len,
                eval_time_s=elapsed,
                by_dataset={name: dict(d) for name, d in result.by_dataset.items()},
            )
        )
        clock.origin += elapsed
        rollout.shift_clock(elapsed)
        return result.accuracy

    return evaluate


def load_config(data: Mapping[str, Any]) -> ExperimentConfig:
    """Rebuild an :class:`ExperimentConfig` from its ``to_dict()`` form (a run's config.json)."""
    data = dict(data)
    data["rollout"] = RolloutConfig(**data.get("rollout", {}))
    data["strategies"] = tuple(data.get("strategies", ()))
    data["eval_datasets"] = tuple(data.get("eval_datasets", ()))
    return ExperimentConfig(**data)
