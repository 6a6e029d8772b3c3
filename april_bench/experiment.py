"""An experiment: the same workload run under several rollout strategies.

``run(config)`` runs one *session* per arm (and per repetition with
``repeats``).  Every session gets a fresh engine, trainer, buffer and prompt
stream over the same prompts, the same sampling seeds and the same
per-(prompt, sample) draws, so arms differ in the strategy alone.  A step is
rollout, then train, then weight sync, timed on the session's clock (virtual
for the simulator, ``time.monotonic`` for real engines).  Held-out
evaluations, and the time other sessions run, are excluded from that clock,
so "equal wall-clock" compares training time only.

Measured (real-time) sessions run interleaved on one event loop in blocks of
``block_steps`` steps, in ABBA order (A B, then B A, ...), so a burst of load
on a shared machine falls on every arm alike.  Simulated sessions run one
after another, each on its own virtual clock.

An arm's driver (:mod:`april_bench.rollout.driver`) may overlap rollout and
training (``one-step-off``, ``stale``).  Such a session's step rows still hold
each phase's own duration, and its ``step_time_s`` is the time from the end of
the previous step to the end of this one, so the sum over steps is the
session's time for every driver and throughput is computed the same way.  Its
pipeline drains at the end of every block of steps and before every held-out
evaluation (so evaluations never see rollout requests in flight).

With a ``state_dir``, every session writes a checkpoint after each completed
step and ``resume=True`` continues from them (:mod:`april_bench.results.resume`).
An asynchronous arm has requests in flight and batches rolled out ahead at
every step boundary but the last, which a checkpoint does not hold: it writes
its checkpoint when it completes, and an interrupted one restarts from step 0.
"""

from __future__ import annotations

import asyncio
import json
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tqdm import tqdm

from april_bench.backends import Components, build_components
from april_bench.backends.weights import WeightSync, choose_weight_sync
from april_bench.config import ConfigError
from april_bench.engines.protocol import Engine, EngineMetrics, EngineState
from april_bench.experiment_config import ExperimentConfig, load_config
from april_bench.results.records import EngineMetricRecord, EvalRecord, EventRecord, Fate, RunRecorder
from april_bench.results.resume import RunStatus, state_path
from april_bench.results.store import write_json_atomic
from april_bench.rollout.driver import Pipeline, StepDone, WeightUpdateMode
from april_bench.rollout.loop import RolloutLoop
from april_bench.rollout.registry import ArmSpec, build_strategy
from april_bench.telemetry.records import ListSink, TelemetryRecord
from april_bench.trainers.protocol import ClosableTrainer, Trainer, TrainerState
from april_bench.vtime import VirtualTimeLoop, run_real, run_virtual

__all__ = ["ExperimentConfig", "RunResult", "check_drivers", "load_config", "run", "schedule"]


@dataclass(slots=True)
class RunResult:
    config: ExperimentConfig
    engine: str
    simulated: bool
    recorder: RunRecorder
    notes: list[str] = field(default_factory=list)
    #: The engine package's version (``None`` for april-bench's own engines).
    engine_version: str | None = None
    #: The dtype the engine computed in (``None``: not reported).
    engine_dtype: str | None = None


def run(
    config: ExperimentConfig,
    *,
    progress: bool = True,
    echo: Callable[[str], None] | None = None,
    recorder: RunRecorder | None = None,
    components: Components | None = None,
    status: RunStatus | None = None,
) -> RunResult:
    """Run every session of ``config`` and return the tidy records (also streamed to ``recorder``'s
    sink).  With ``status`` (a run directory's), sessions checkpoint after every step and continue
    from the steps ``status`` says they completed."""
    components = components or build_components(config, progress=progress)
    check_drivers(config, components)
    for note in components.notes:
        if echo:
            echo(note)
    recorder = recorder if recorder is not None else RunRecorder()
    if status is not None and echo is not None and (status.completed or status.finished):
        for arm in config.arms:  # a resumed run: say what an asynchronous arm cannot continue
            unfinished = any(
                status.completed.get(f"{arm.label}#{r}", 0) < config.steps for r in range(config.repeats)
            )
            if arm.driver.asynchronous and unfinished:
                echo(
                    f"arm {arm.label}: driver={arm.driver.driver.value} keeps requests in flight across "
                    "steps, which a checkpoint does not hold; its unfinished sessions restart from step 0"
                )
    sessions = [
        ArmSession(config, arm, repeat, components, recorder, status)
        for repeat in range(config.repeats)
        for arm in config.arms
    ]
    bars = _Bars(sessions, config.steps, progress, status)
    try:
        if components.virtual_time:
            for session in sessions:  # virtual time: each session alone, on its own clock
                run_virtual(session.run_alone(bars))
        else:
            run_real(_interleaved(sessions, config, bars))
    finally:
        bars.close()
    first = sessions[0]
    return RunResult(
        config=config,
        engine=components.engine_name,
        simulated=first.simulated,
        recorder=recorder,
        notes=list(components.notes),
        engine_version=first.engine_version,
        engine_dtype=first.engine_dtype,
    )


def check_drivers(config: ExperimentConfig, components: Components) -> None:
    """Refuse, before any engine starts, an arm that updates weights in flight on an engine that
    cannot (SGLang's adapters, vLLM's server adapter: use weight_update=drain or one-step-off)."""
    from april_bench.rollout.registry import STRATEGIES

    for arm in config.arms:
        driver = arm.driver
        partial = bool(getattr(STRATEGIES.get(arm.strategy), "partial_rollout", False))
        if (
            driver.asynchronous
            and driver.update_mode(partial) is WeightUpdateMode.INFLIGHT
            and not components.engine_spec.updates_in_flight(components.engine_args)
        ):
            raise ConfigError(
                f"arm {arm.label!r}: engine {components.engine_name!r} cannot update weights with requests "
                "in flight (pause, install, continue); add weight_update=drain or use driver=one-step-off"
            )


def schedule(sessions: int, steps: int, block: int) -> Iterator[tuple[int, range]]:
    """``(session, steps)`` blocks in ABBA order: block 0 runs sessions 0..S-1, block 1 runs them
    backwards, and so on, so sessions alternate who goes first."""
    for b, start in enumerate(range(0, steps, block)):
        order = range(sessions) if b % 2 == 0 else range(sessions - 1, -1, -1)
        for s in order:
            yield s, range(start, min(start + block, steps))


async def _interleaved(sessions: list[ArmSession], config: ExperimentConfig, bars: _Bars) -> None:
    """Measured sessions on one loop and one run clock, with one GPU telemetry sampler for the run."""
    loop = asyncio.get_running_loop()
    origin = loop.time() - max(s.saved_run_elapsed() for s in sessions)  # a resumed run's clock continues
    buffer: ListSink[TelemetryRecord] = ListSink()
    sampler = config.telemetry.build(sink=buffer, clock=lambda: loop.time() - origin)
    recorder = sessions[0].recorder

    def drain() -> None:  # telemetry rows join the run's tables on the loop's thread
        recorder.extend(buffer.drain())

    opened: list[ArmSession] = []
    sampler.start()
    try:
        for session in sessions:
            session.run_origin = origin
            session.after_step = drain
            await session.open()
            opened.append(session)
        block = config.block_steps or config.steps
        for index, steps in schedule(len(sessions), config.steps, block):
            await sessions[index].run_steps(steps, bars)
        for session in sessions:
            await session.finish()
    finally:
        sampler.stop()
        drain()
        for session in opened:
            await session.close()


class _Bars:
    """One progress bar per session."""

    def __init__(
        self, sessions: list[ArmSession], steps: int, progress: bool, status: RunStatus | None = None
    ) -> None:
        self._bars = [
            tqdm(
                total=steps,
                initial=_resumed_steps(s, steps, status),
                desc=f"{s.name:>18}",
                unit="step",
                disable=not progress,
                file=sys.stderr,
            )
            for s in sessions
        ]
        self._index = {id(s): i for i, s in enumerate(sessions)}

    def advance(self, session: ArmSession, n: int = 1) -> None:
        bar = self._bars[self._index[id(session)]]
        bar.update(max(n, session._done - bar.n))  # a resumed session counts from its saved step

    def close(self) -> None:
        for bar in self._bars:
            bar.close()


def _resumed_steps(session: ArmSession, steps: int, status: RunStatus | None) -> int:
    """Steps a resumed session starts from: its checkpoint's, except an unfinished asynchronous arm,
    which restarts from step 0."""
    done = 0 if status is None else status.completed.get(f"{session.arm.label}#{session.repeat}", 0)
    if session.arm.driver.asynchronous and done < steps:
        return 0
    return done


class ArmSession:
    """One arm (one repetition of it): engine, trainer, rollout loop and clock, run step by step.

    The session clock measures the arm's own training time: evaluations and the time other sessions
    run are cut out (``_pause`` / ``_unpause``), so rows of interleaved sessions read as if each ran
    alone.
    """

    def __init__(
        self,
        config: ExperimentConfig,
        arm: ArmSpec,
        repeat: int,
        components: Components,
        recorder: RunRecorder,
        status: RunStatus | None,
    ) -> None:
        self.config = config
        self.arm = arm
        self.repeat = repeat
        self.components = components
        self.recorder = recorder
        self.status = status
        self.name = arm.label if config.repeats == 1 else f"{arm.label} #{repeat}"
        self.simulated = True
        self.engine_version: str | None = None
        self.engine_dtype: str | None = None
        self._engine: Engine | None = None
        self._trainer: Trainer | None = None
        self._sync: WeightSync | None = None
        self._rollout: RolloutLoop | None = None
        self._scratch: tempfile.TemporaryDirectory[str] | None = None
        self._origin = 0.0  # the session clock's zero on the loop's clock
        #: The run's zero on the loop's clock: events and telemetry samples are stamped from it.
        self.run_origin: float | None = None
        #: Called after every completed step, before its checkpoint (the run drains telemetry here).
        self.after_step: Callable[[], None] | None = None
        self._paused_at: float | None = None
        self._done = 0  # steps completed
        #: The asynchronous driver's pipeline (``None``: the synchronous driver, step by step).
        self._pipeline: Pipeline | None = None
        #: Session-clock end of the last completed step of a pipelined arm.
        self._last_end: float | None = None

    # ------------------------------------------------------------------ lifecycle
    async def run_alone(self, bars: _Bars) -> None:
        await self.open()
        try:
            await self.run_steps(range(self.config.steps), bars)
            await self.finish()
        finally:
            await self.close()

    async def open(self) -> None:
        loop = asyncio.get_running_loop()
        saved = self._load_checkpoint()
        if saved is not None and isinstance(loop, VirtualTimeLoop):
            loop.set_time(saved["clock_now"])  # a simulated run continues on the same virtual clock
        if self.run_origin is None:  # alone on its own (virtual) clock
            self.run_origin = loop.time() if saved is None else loop.time() - saved["run_elapsed"]
        driver = self.arm.driver
        make_engine, make_trainer = self.components.engine, self.components.trainer
        if driver.asynchronous:
            make_engine, make_trainer, _ = self.components.split(driver.train_gpus)
        engine = self._engine = make_engine()
        await engine.start()
        info = engine.info  # known once started
        self.simulated, self.engine_version, self.engine_dtype = info.simulated, info.version, info.dtype
        self._trainer = make_trainer()
        self._scratch = tempfile.TemporaryDirectory(prefix="april-bench-weights-")
        self._sync = choose_weight_sync(engine, self._trainer, Path(self._scratch.name))
        rollout_config = self.config.rollout_config()
        if self.components.task.replay_lengths:
            rollout_config = rollout_config.replace(replay_lengths=True)
        self._rollout = rollout_config.build(
            arm=self.arm.label,
            engine=engine,
            strategy=build_strategy(self.arm, self.config.strategy_args),
            workload=self.components.workload,
            prompts=self.components.workload.prompt_stream(),
            recorder=self.recorder,
            repeat=self.repeat,
        )
        if saved is None:
            self._set_origin(loop.time())
            self._event(0, "arm_start")
            await self._evaluate(0)
        else:
            await self._restore(saved)
        if driver.asynchronous:
            self._pipeline = self._build_pipeline()
        self._pause()  # other sessions may open or run before this one's first block

    def _build_pipeline(self) -> Pipeline:
        assert self._engine is not None and self._trainer is not None and self._sync is not None
        assert self._rollout is not None
        engine, trainer, sync = self._engine, self._trainer, self._sync
        partial = bool(getattr(self._rollout.strategy, "partial_rollout", False))
        driver = self.arm.driver
        if driver.update_mode(partial) is WeightUpdateMode.INFLIGHT and not engine.info.inflight_updates:
            raise ConfigError(
                f"arm {self.arm.label!r}: engine {engine.info.name!r} cannot update weights with requests "
                "in flight (pause, install, continue); add weight_update=drain or use driver=one-step-off"
            )

        async def push(version: int) -> None:
            await sync.push(trainer, engine, version)

        return driver.build(
            rollout=self._rollout,
            trainer=trainer,
            push=push,
            total_steps=self.config.steps,
            partial_rollout=partial,
            version=self._done,
        )

    async def run_steps(self, steps: range, bars: _Bars) -> None:
        if self._pipeline is not None:
            await self._run_pipelined(steps, bars)
            return
        self._unpause()
        for step in steps:
            if step < self._done:
                continue  # completed before an interruption
            await self._step(step)
            self._done = step + 1
            if self.after_step is not None:
                self.after_step()
            self._checkpoint()
            bars.advance(self)
        self._pause()

    async def finish(self) -> None:
        """The end-of-run rows: groups still buffered (every launched prompt has a fate)."""
        assert self._rollout is not None
        key_done = self.status is not None and f"{self.arm.label}#{self.repeat}" in self.status.finished
        if not key_done:
            self.recorder.sample_fates(
                self.arm.label,
                list(self._rollout.buffer),
                step=self.config.steps,
                fate=Fate.BUFFERED,
                reason="end_of_run",
                repeat=self.repeat,
            )
            self._event(self.config.steps, "arm_end")
            if self.status is not None:
                self._flush()
                self.status.session_finished(self.arm.label, self.repeat)

    async def close(self) -> None:
        if self._engine is not None:
            await self._engine.close()
            self._engine = None
        if isinstance(self._trainer, ClosableTrainer):
            self._trainer.close()  # e.g. the fsdp trainer's rank processes
        if self._scratch is not None:
            self._scratch.cleanup()
            self._scratch = None

    # ------------------------------------------------------------------ one step
    async def _step(self, step: int) -> None:
        """Rollout, train, weight sync; then the rows and the evaluation that is due."""
        assert self._engine is not None and self._trainer is not None and self._sync is not None
        assert self._rollout is not None
        loop = asyncio.get_running_loop()
        version = step  # one policy update per step
        self._event(step, "rollout_start")
        outcome = await self._rollout.run_step(step, version)
        t_train = loop.time()
        record = outcome.record
        self._event(step, "rollout_stop", t_train - record.drain_time_s)
        self._event(step, "rollout_end", t_train)
        self._engine_metrics(step, "rollout_end", t_train - self._origin)
        self._event(step, "train_start", t_train)
        result = await self._trainer.train(outcome.batch, step=step, policy_version=version)
        t_sync = loop.time()
        self._event(step, "train_end", t_sync)
        self._event(step, "weight_sync_start", t_sync)
        await self._sync.push(self._trainer, self._engine, version + 1)
        t_end = loop.time()
        self._event(step, "weight_sync_end", t_end)
        record.train_time_s = t_sync - t_train
        record.weight_sync_time_s = t_end - t_sync
        record.step_time_s = t_end - (self._origin + record.t_start)
        record.train_metrics = dict(getattr(result, "metrics", {}) or {})
        record.warmup = step < self.config.warmup_steps
        self.recorder.sample_fates(
            self.arm.label,
            outcome.batch,
            step=step,
            fate=Fate.TRAINED,
            reason="accepted",
            train_version=version,
            repeat=self.repeat,
        )
        record.accuracy = await self._evaluate(step + 1)
        self.recorder.add(record)

    async def _run_pipelined(self, steps: range, bars: _Bars) -> None:
        """Steps of an asynchronous arm: the pipeline runs up to each due evaluation, drains, and
        the evaluation runs on an idle engine (its time cut out of the clock, as for every arm)."""
        assert self._pipeline is not None
        todo = [step for step in steps if step >= self._done]
        if not todo:
            return
        self._unpause()
        start = todo[0]
        while start <= todo[-1]:
            stop = next(s + 1 for s in range(start, todo[-1] + 1) if self._eval_due(s + 1) or s == todo[-1])
            held: list[StepDone] = []

            async def on_step(done: StepDone, last: int = stop - 1, held: list[StepDone] = held) -> None:
                self._time_pipelined(done)  # now: the evaluation below moves the session clock
                if done.step == last:
                    held.append(done)  # its row waits for the evaluation after the drain
                else:
                    self._complete_pipelined(done, None, bars)

            await self._pipeline.run(range(start, stop), on_step)
            self._complete_pipelined(held[0], await self._evaluate(stop), bars)
            start = stop
        self._pause()

    def _time_pipelined(self, done: StepDone) -> None:
        """A pipelined step's durations on the session clock, taken when the step completes."""
        record = done.outcome.record
        record.train_time_s = done.train_end - done.train_start
        record.weight_sync_time_s = done.sync_end - done.sync_start
        end = done.sync_end - self._origin
        record.step_time_s = end - (record.t_start if self._last_end is None else self._last_end)
        self._last_end = done.session_end = end

    def _complete_pipelined(self, done: StepDone, accuracy: float | None, bars: _Bars) -> None:
        """The rows of one step of a pipelined arm: each phase at the time it ran (they overlap)."""
        step, record = done.step, done.outcome.record
        record.train_metrics = dict(getattr(done.train_result, "metrics", {}) or {})
        record.warmup = step < self.config.warmup_steps
        record.accuracy = accuracy
        for kind, at in (
            ("rollout_start", done.rollout_start),
            ("rollout_stop", done.rollout_end - record.drain_time_s),
            ("rollout_end", done.rollout_end),
            ("train_start", done.train_start),
            ("train_end", done.train_end),
            ("weight_sync_start", done.sync_start),
            ("weight_sync_end", done.sync_end),
        ):
            self._event(step, kind, at)
        self._engine_metrics(step, "step_end", done.session_end or 0.0)
        self.recorder.sample_fates(
            self.arm.label,
            done.outcome.batch,
            step=step,
            fate=Fate.TRAINED,
            reason="accepted",
            train_version=done.train_version,
            repeat=self.repeat,
        )
        self.recorder.add(record)
        self._done = step + 1
        if self.after_step is not None:
            self.after_step()
        self._checkpoint()
        bars.advance(self)

    def _eval_due(self, done: int) -> bool:
        config = self.config
        due = done in (0, config.steps) or (config.eval_every is not None and done % config.eval_every == 0)
        return self.components.evaluator is not None and due

    async def _evaluate(self, done: int) -> float | None:
        evaluator = self.components.evaluator
        if evaluator is None or not self._eval_due(done):
            return None
        assert self._engine is not None
        loop = asyncio.get_running_loop()
        start = loop.time()
        self._event(done, "eval_start", start)
        result = await evaluator.evaluate(self._engine)
        elapsed = loop.time() - start
        self._event(done, "eval_end", start + elapsed)
        self.recorder.add(
            EvalRecord(
                arm=self.arm.label,
                step=done,
                policy_version=done,
                train_time_s=start - self._origin,
                accuracy=result.accuracy,
                accuracy_stderr=result.stderr,
                n=result.n,
                mean_response_len=result.mean_response_len,
                eval_time_s=elapsed,
                by_dataset={name: dict(d) for name, d in result.by_dataset.items()},
                repeat=self.repeat,
            )
        )
        self._shift(elapsed)
        return result.accuracy

    # ------------------------------------------------------------------ clock
    def _set_origin(self, origin: float) -> None:
        assert self._rollout is not None
        self._rollout.shift_clock(origin - self._origin)
        self._origin = origin

    def _shift(self, seconds: float) -> None:
        """Cut ``seconds`` out of the session clock (an evaluation, another session's block)."""
        self._set_origin(self._origin + seconds)

    def _pause(self) -> None:
        self._paused_at = asyncio.get_running_loop().time()

    def _unpause(self) -> None:
        if self._paused_at is not None:
            self._shift(asyncio.get_running_loop().time() - self._paused_at)
            self._paused_at = None

    # ------------------------------------------------------------------ rows
    def _event(self, step: int, kind: str, at: float | None = None) -> None:
        t = asyncio.get_running_loop().time() if at is None else at
        self.recorder.add(
            EventRecord(
                arm=self.arm.label, step=step, kind=kind, t=t - self._origin_of_run, repeat=self.repeat
            )
        )

    def _engine_metrics(self, step: int, phase: str, t: float) -> None:
        if isinstance(self._engine, EngineMetrics):
            self.recorder.add(
                EngineMetricRecord(
                    arm=self.arm.label,
                    step=step,
                    phase=phase,
                    t=t,
                    metrics=self._engine.metrics(),
                    repeat=self.repeat,
                )
            )

    @property
    def _origin_of_run(self) -> float:
        assert self.run_origin is not None, "the run's clock is set when the session opens"
        return self.run_origin

    def saved_run_elapsed(self) -> float:
        """Seconds of run clock this session's checkpoint reached (0 when starting fresh)."""
        saved = self._load_checkpoint()
        return 0.0 if saved is None else float(saved["run_elapsed"])

    def _flush(self) -> None:
        flush = getattr(self.recorder.sink, "flush", None)
        if flush is not None:
            flush()

    # ------------------------------------------------------------------ checkpoints
    def _checkpoint(self) -> None:
        """After a completed step: rows to disk, then the session's state, then the status."""
        if self.status is None:
            return
        assert self._rollout is not None and self._engine is not None
        self._flush()
        if self._pipeline is not None and self._done < self.config.steps:
            return  # requests in flight and batches rolled out ahead: not a state a checkpoint holds
        loop = asyncio.get_running_loop()
        path = state_path(self.status.path.parent, self.arm.label, self.repeat, self._done)
        path.parent.mkdir(parents=True, exist_ok=True)
        trainer_file = None
        if isinstance(self._trainer, TrainerState):
            trainer_file = str(path.with_suffix(".trainer.pt"))
            self._trainer.save_state(trainer_file)
        write_json_atomic(
            path,
            {
                "completed_steps": self._done,
                "clock_now": loop.time(),
                "session_elapsed": loop.time() - self._origin,
                "run_elapsed": loop.time() - self._origin_of_run,
                "rollout": self._rollout.state(),
                "strategy": self._rollout.strategy.state()
                if hasattr(self._rollout.strategy, "state")
                else {},
                "engine": self._engine.export_state() if isinstance(self._engine, EngineState) else None,
                "trainer_file": trainer_file,
            },
        )
        self.status.step_done(self.arm.label, self.repeat, self._done)
        # the status now names this checkpoint; the previous one can go
        previous = state_path(self.status.path.parent, self.arm.label, self.repeat, self._done - 1)
        previous.unlink(missing_ok=True)
        previous.with_suffix(".trainer.pt").unlink(missing_ok=True)

    def _load_checkpoint(self) -> dict[str, Any] | None:
        if self.status is None:
            return None
        completed = self.status.completed.get(f"{self.arm.label}#{self.repeat}", 0)
        if not completed:
            return None
        path = state_path(self.status.path.parent, self.arm.label, self.repeat, completed)
        try:
            saved: dict[str, Any] = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise RuntimeError(f"{path}: the checkpoint of {self.name} cannot be read ({exc})") from None
        return saved

    async def _restore(self, saved: dict[str, Any]) -> None:
        assert self._rollout is not None and self._engine is not None and self._trainer is not None
        assert self._sync is not None
        loop = asyncio.get_running_loop()
        self._done = saved["completed_steps"]
        if saved["trainer_file"] and isinstance(self._trainer, TrainerState):
            self._trainer.load_state(saved["trainer_file"])
            await self._sync.push(self._trainer, self._engine, self._done)  # before the clock restarts
        if saved["engine"] is not None and isinstance(self._engine, EngineState):
            self._engine.restore_state(saved["engine"])
        self._rollout.restore(saved["rollout"])
        restore = getattr(self._rollout.strategy, "restore", None)
        if restore is not None:
            restore(saved["strategy"])
        self._set_origin(loop.time() - saved["session_elapsed"])
