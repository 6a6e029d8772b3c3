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
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tqdm import tqdm

from april_bench.backends import Components, build_components
from april_bench.backends.weights import WeightSync, choose_weight_sync
from april_bench.engines.protocol import Engine, EngineMetrics
from april_bench.experiment_config import ExperimentConfig, load_config
from april_bench.results.records import EngineMetricRecord, EvalRecord, Fate, RunRecorder
from april_bench.rollout.loop import RolloutLoop
from april_bench.rollout.registry import ArmSpec, build_strategy
from april_bench.vtime import run_real, run_virtual

__all__ = ["ExperimentConfig", "RunResult", "load_config", "run"]


@dataclass(slots=True)
class RunResult:
    config: ExperimentConfig
    engine: str
    simulated: bool
    recorder: RunRecorder
    notes: list[str] = field(default_factory=list)
    #: The engine package's version (``None`` for april-bench's own engines).
    engine_version: str | None = None


def run(
    config: ExperimentConfig,
    *,
    progress: bool = True,
    echo: Callable[[str], None] | None = None,
    recorder: RunRecorder | None = None,
    components: Components | None = None,
) -> RunResult:
    """Run every arm of ``config`` and return the tidy records (also streamed to ``recorder``'s sink)."""
    components = components or build_components(config, progress=progress)
    for note in components.notes:
        if echo:
            echo(note)
    recorder = recorder if recorder is not None else RunRecorder()
    simulated, version = True, None
    for arm in config.arms:
        engine = components.engine()
        simulated, version = engine.info.simulated, engine.info.version
        runner = run_virtual if engine.info.virtual_time else run_real
        bar = tqdm(
            total=config.steps, desc=f"{arm.label:>18}", unit="step", disable=not progress, file=sys.stderr
        )
        try:
            runner(_run_arm(config, arm, engine, components, recorder, bar))
        finally:
            bar.close()
    return RunResult(
        config=config,
        engine=components.engine_name,
        simulated=simulated,
        recorder=recorder,
        notes=list(components.notes),
        engine_version=version,
    )


async def _run_arm(
    config: ExperimentConfig,
    arm: ArmSpec,
    engine: Engine,
    components: Components,
    recorder: RunRecorder,
    bar: tqdm,
) -> None:
    loop = asyncio.get_running_loop()
    await engine.start()
    try:
        with tempfile.TemporaryDirectory(prefix="april-bench-weights-") as scratch:
            trainer = components.trainer()
            sync = choose_weight_sync(engine, trainer, Path(scratch))
            clock = _TrainingClock(loop.time())
            rollout_config = config.rollout_config()
            if components.task.replay_lengths:
                rollout_config = rollout_config.replace(replay_lengths=True)
            rollout = rollout_config.build(
                arm=arm.label,
                engine=engine,
                strategy=build_strategy(arm, config.strategy_args),
                workload=components.workload,
                prompts=components.workload.prompt_stream(),
                recorder=recorder,
                t0=clock.origin,
            )
            evaluate = _evaluation(config, arm.label, engine, components, recorder, clock, rollout)
            await evaluate(0)
            for step in range(config.steps):
                await _step(step, arm.label, engine, trainer, sync, rollout, recorder, clock, evaluate)
                bar.update(1)
            recorder.sample_fates(
                arm.label, list(rollout.buffer), step=config.steps, fate=Fate.BUFFERED, reason="end_of_run"
            )
    finally:
        await engine.close()


async def _step(
    step: int,
    arm: str,
    engine: Engine,
    trainer: Any,
    sync: WeightSync,
    rollout: RolloutLoop,
    recorder: RunRecorder,
    clock: _TrainingClock,
    evaluate: Callable[[int], Any],
) -> None:
    """One training step: rollout, train, weight sync; then the rows and the due evaluation."""
    loop = asyncio.get_running_loop()
    version = step  # one policy update per step
    outcome = await rollout.run_step(step, version)
    t_train = loop.time()
    _engine_metrics(engine, recorder, arm, step, "rollout_end", t_train - clock.origin)
    result = await trainer.train(outcome.batch, step=step, policy_version=version)
    t_sync = loop.time()
    await sync.push(trainer, engine, version + 1)
    t_end = loop.time()
    record = outcome.record
    record.train_time_s = t_sync - t_train
    record.weight_sync_time_s = t_end - t_sync
    record.step_time_s = t_end - (clock.origin + record.t_start)
    record.train_metrics = dict(getattr(result, "metrics", {}) or {})
    recorder.sample_fates(
        arm, outcome.batch, step=step, fate=Fate.TRAINED, reason="accepted", train_version=version
    )
    record.accuracy = await evaluate(step + 1)
    recorder.add(record)


def _engine_metrics(engine: Engine, recorder: RunRecorder, arm: str, step: int, phase: str, t: float) -> None:
    if isinstance(engine, EngineMetrics):
        recorder.add(EngineMetricRecord(arm=arm, step=step, phase=phase, t=t, metrics=engine.metrics()))


@dataclass(slots=True)
class _TrainingClock:
    """The arm's clock origin; moved forward by every evaluation so it measures training time only."""

    origin: float


def _evaluation(
    config: ExperimentConfig,
    arm: str,
    engine: Engine,
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
        recorder.add(
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
