"""One arm's session: engine, trainer, rollout loop and clock, run step by step (:class:`ArmSession`)."""

from __future__ import annotations

import asyncio
import logging
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tqdm import tqdm

import april_bench.experiment.checkpoint as checkpoint
from april_bench.backends import Components
from april_bench.backends.weights import WeightSync, choose_weight_sync
from april_bench.engines.protocol import (
    FAULTS,
    ITERATIONS,
    METRICS,
    PLACEMENT,
    SLEEP,
    Engine,
    EngineError,
    FaultEvent,
)
from april_bench.experiment.steps import record_step
from april_bench.experiment_config import ExperimentConfig
from april_bench.results.recorder import RunRecorder
from april_bench.results.records import (
    EngineMetricRecord,
    EvalRecord,
    EventRecord,
    Fate,
    IterationRecord,
    as_row,
)
from april_bench.results.resume import RunStatus
from april_bench.results.rundir import SCRATCH_PREFIX, scratch_root
from april_bench.rollout.driver import Pipeline, StepDone
from april_bench.rollout.loop import RolloutConfig, RolloutLoop, RolloutStalled
from april_bench.strategies import ArmSpec, build_strategy
from april_bench.trainers.protocol import ClosableTrainer, Trainer, has_state
from april_bench.vtime import VirtualTimeLoop

__all__ = ["ArmSession", "Bars", "open_session", "run_alone"]

log = logging.getLogger(__name__)

#: Rows of the ``iterations`` table per step and arm at most: a step with more engine rounds keeps
#: every k-th (``sampled_every``), so a long GPU run's table stays small.
ITERATION_ROWS_PER_STEP = 256


class Bars:
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
        #: Where the engine's replicas run (a Ray pool's placement; empty for other engines).
        self.placement: list[dict[str, Any]] = []
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
        #: The latest checkpoint written (``None``: none yet), and whether the trainer is still at its
        #: step (not part-way into the next): then an interruption can add the trainer's state to it.
        self._saved: dict[str, Any] | None = None
        self._trainer_at_saved = False
        #: The checkpoint the session continues from (``None``: a fresh start), read when it opens.
        self._resume_from: dict[str, Any] | None = None
        self._alone = False  # on its own (virtual) clock, not the interleaved run's

    # ------------------------------------------------------------------ lifecycle
    async def _start_engine(self) -> Engine:
        """Start the arm's engine and trainer and choose the weight sync; the run's clock is set (a
        resumed simulated run continues on the same virtual clock)."""
        loop = asyncio.get_running_loop()
        saved = self._resume_from = self._load_checkpoint()
        if saved is not None and isinstance(loop, VirtualTimeLoop):
            loop.set_time(saved["clock_now"])  # a simulated run continues on the same virtual clock
        self._alone = self.run_origin is None  # alone on its own (virtual) clock
        if self._alone:
            self.run_origin = loop.time() if saved is None else loop.time() - saved["run_elapsed"]
        driver = self.arm.driver
        make_engine, make_trainer = self.components.engine, self.components.trainer
        if driver.asynchronous:
            make_engine, make_trainer, _ = self.components.split(driver.train_gpus)
        engine = self._engine = make_engine()
        if reporter := FAULTS.of(engine):  # a replica pool: its failures go to the events table
            reporter.watch_faults(self._fault_event)
        await engine.start()
        info = engine.info  # known once started
        self.simulated, self.engine_version, self.engine_dtype = info.simulated, info.version, info.dtype
        if placed := PLACEMENT.of(engine):
            self.placement = placed.placement  # the pool's own list: restarts update it
        self._trainer = make_trainer()
        self._scratch = tempfile.TemporaryDirectory(prefix=SCRATCH_PREFIX, dir=scratch_root(self.status))
        self._sync = choose_weight_sync(engine, self._trainer, Path(self._scratch.name))
        return engine

    async def _begin(self) -> None:
        """With the rollout loop built: the first evaluation, or the checkpoint restored; the pipeline."""
        loop = asyncio.get_running_loop()
        saved = self._resume_from
        if saved is None:
            self._set_origin(loop.time())
            self._event(0, "arm_start")
            await self._evaluate(0)
        else:
            await self._restore(saved)
            if self._alone:  # the restore's weight push is cut out of the run's clock as out of the session's
                self.run_origin = loop.time() - saved["run_elapsed"]
        if self.arm.driver.asynchronous:
            self._pipeline = self._build_pipeline()
        self._pause()  # other sessions may open or run before this one's first block

    def _build_pipeline(self) -> Pipeline:
        assert self._engine is not None and self._trainer is not None and self._sync is not None
        assert self._rollout is not None
        engine, trainer, sync = self._engine, self._trainer, self._sync
        partial = self._rollout.strategy.partial_rollout
        driver = self.arm.driver  # validated before any engine started (check_drivers)

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

    async def run_steps(self, steps: range, bars: Bars) -> None:
        try:
            await self._run_steps(steps, bars)
        except RolloutStalled as exc:  # say which arm, so a grid (ablate, whatif) can leave it out
            exc.arm = self.arm.label
            raise

    async def _run_steps(self, steps: range, bars: Bars) -> None:
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
            self._trainer_at_saved = True
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
        t_rollout = loop.time()
        first_round = rounds.iteration_count() if (rounds := ITERATIONS.of(self._engine)) else 0
        outcome = await self._rollout.run_step(step, version)
        t_rollout_end = loop.time()
        self._engine_metrics(step, "rollout_end", t_rollout_end - self._origin)
        self._iterations(step, first_round)
        self._trainer_at_saved = False  # from here until the step's checkpoint the trainer is ahead of it
        switch = await self._switch(step, "sleep") if self.config.colocate else 0.0
        t_train = loop.time()
        result = await self._trainer.train(outcome.batch, step=step, policy_version=version)
        t_trained = loop.time()
        switch += await self._switch(step, "wake") if self.config.colocate else 0.0
        t_sync = loop.time()
        await self._sync.push(self._trainer, self._engine, version + 1)
        t_end = loop.time()
        record = outcome.record
        record.switch_time_s = switch
        record.train_time_s = t_trained - t_train
        record.weight_sync_time_s = t_end - t_sync
        record.step_time_s = t_end - (self._origin + record.t_start)
        done = StepDone(
            step, outcome, result, version, t_rollout, t_rollout_end, t_train, t_trained, t_sync, t_end
        )
        self._record(done)
        record.accuracy = await self._evaluate(step + 1)
        self.recorder.add(record)

    async def _switch(self, step: int, to: str) -> float:
        """``--colocate``: the engine gives its memory to the trainer (``sleep``, level 2: the weights
        come back with the push after the wake) or takes it back (``wake``); its seconds, with an event
        at each end."""
        assert self._engine is not None
        engine = SLEEP.of(self._engine)
        if engine is None:  # validate refused this engine already; a pool's replica may still lack it
            raise EngineError(f"--colocate: engine {self._engine.info.name!r} cannot release its memory")
        loop = asyncio.get_running_loop()
        start = loop.time()
        self._event(step, f"engine_{to}_start", start)
        await (engine.sleep(2) if to == "sleep" else engine.wake_up())
        end = loop.time()
        self._event(step, f"engine_{to}_end", end)
        return end - start

    async def _run_pipelined(self, steps: range, bars: Bars) -> None:
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

    def _complete_pipelined(self, done: StepDone, accuracy: float | None, bars: Bars) -> None:
        """The rows of one step of a pipelined arm: each phase at the time it ran (they overlap)."""
        self._record(done)
        self._engine_metrics(done.step, "step_end", done.session_end or 0.0)
        done.outcome.record.accuracy = accuracy
        self.recorder.add(done.outcome.record)
        self._done = done.step + 1
        if self.after_step is not None:
            self.after_step()
        self._checkpoint()
        bars.advance(self)

    def _record(self, done: StepDone) -> None:
        record_step(
            self.recorder,
            self.arm.label,
            self.repeat,
            done,
            run_origin=self._origin_of_run,
            warmup=done.step < self.config.warmup_steps,
        )

    def _eval_due(self, done: int) -> bool:
        config = self.config
        due = done in (0, config.steps) or (config.eval_every is not None and done % config.eval_every == 0)
        return self.components.evaluator is not None and due

    def _shared_start_eval(self) -> EvalRecord | dict[str, Any] | None:
        """An evaluation of the starting policy already made in this run by another arm whose engine
        is built the same way (the same factory: both synchronous, or both asynchronous with the
        same training GPUs), for the same repeat.  Every arm starts from the same weights and the
        evaluator draws the same seeds each time, on a fresh, idle engine, so this arm's step-0
        evaluation would be the same numbers (the embedded default's two arms measured 16.56% both).
        """
        driver = self.arm.driver
        specs = {a.label: a.driver for a in self.config.arms}
        for row in self.recorder["evals"]:
            fields = row if isinstance(row, dict) else as_row(row)  # a resumed run's rows are dicts
            other = specs.get(str(fields["arm"]))
            if (
                fields["step"] == 0
                and fields["repeat"] == self.repeat
                and fields["arm"] != self.arm.label
                and not fields.get("reused_from")
                and other is not None
                and (other.asynchronous, other.train_gpus) == (driver.asynchronous, driver.train_gpus)
            ):
                return row
        return None

    async def _evaluate(self, done: int) -> float | None:
        evaluator = self.components.evaluator
        if evaluator is None or not self._eval_due(done):
            return None
        assert self._engine is not None
        if done == 0 and (shared := self._shared_start_eval()) is not None:
            return self._reuse_start_eval(shared)
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

    def _reuse_start_eval(self, shared: EvalRecord | dict[str, Any]) -> float:
        """This arm's step-0 row from ``shared`` (:meth:`_shared_start_eval`): its numbers, this
        arm's clock, ``eval_time_s`` 0 (nothing ran) and ``reused_from`` naming the arm evaluated."""
        row = shared if isinstance(shared, dict) else as_row(shared)
        t = asyncio.get_running_loop().time()
        self._event(0, "eval_start", t)
        self._event(0, "eval_end", t)
        self.recorder.add(
            EvalRecord(
                arm=self.arm.label,
                step=0,
                policy_version=0,
                train_time_s=t - self._origin,
                accuracy=row["accuracy"],
                accuracy_stderr=row["accuracy_stderr"],
                n=row["n"],
                mean_response_len=row["mean_response_len"],
                eval_time_s=0.0,
                by_dataset={name: dict(d) for name, d in row["by_dataset"].items()},
                repeat=self.repeat,
                reused_from=row["arm"],
            )
        )
        return float(row["accuracy"])

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

    def _fault_event(self, fault: FaultEvent) -> None:
        """A replica pool's failure handling, as it happens, in the step being rolled out."""
        self.recorder.add(
            EventRecord(
                arm=self.arm.label,
                step=self._done,
                kind=fault.kind,
                t=fault.t - (self.run_origin or 0.0),
                repeat=self.repeat,
                replica=fault.replica,
                requests=fault.requests,
                tokens=fault.tokens,
                detail=fault.detail,
            )
        )

    def _engine_metrics(self, step: int, phase: str, t: float) -> None:
        if self._engine is not None and (engine := METRICS.of(self._engine)):
            self.recorder.add(
                EngineMetricRecord(
                    arm=self.arm.label,
                    step=step,
                    phase=phase,
                    t=t,
                    metrics=engine.metrics(),
                    repeat=self.repeat,
                )
            )

    def _iterations(self, step: int, first: int) -> None:
        """The engine's scheduler rounds of this step's rollout (from round ``first``), at most
        :data:`ITERATION_ROWS_PER_STEP` rows: every k-th round of a longer rollout."""
        if self._engine is None or (engine := ITERATIONS.of(self._engine)) is None:
            return
        rounds = engine.iteration_log(first)
        every = max(1, -(-len(rounds) // ITERATION_ROWS_PER_STEP))
        for kind, batch, tokens, context, cpu_s, t, wall_s, steps in rounds[::every]:
            self.recorder.add(
                IterationRecord(
                    arm=self.arm.label,
                    step=step,
                    t=t - self._origin,
                    kind=kind,
                    batch=batch,
                    tokens=tokens,
                    context=context,
                    steps=steps,
                    step_ms=1000.0 * wall_s / max(steps, 1),
                    cpu_s=cpu_s,
                    sampled_every=every,
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
        """After a completed step: rows to disk, then the session's state, then the status.  The
        trainer's state goes with it every ``checkpoint_every`` steps (and at an interruption:
        :meth:`save_trainer_state`); after the last step nothing trains, so it needs none."""
        if self.status is None:
            return
        assert self._rollout is not None and self._engine is not None
        self._flush()
        if self._pipeline is not None and self._done < self.config.steps:
            return  # requests in flight and batches rolled out ahead: not a state a checkpoint holds
        now = asyncio.get_running_loop().time()
        every = self.config.checkpoint_every
        last = self._done == self.config.steps
        self._saved = checkpoint.save(
            self.status,
            self.arm.label,
            self.repeat,
            self._done,
            rollout=self._rollout,
            engine=self._engine,
            trainer=self._trainer,
            clocks={
                "clock_now": now,
                "session_elapsed": now - self._origin,
                "run_elapsed": now - self._origin_of_run,
            },
            full=not last and every > 0 and self._done % every == 0,
            last=last,
        )

    def save_trainer_state(self) -> None:
        """When the run is interrupted: add the trainer's state to the latest checkpoint, unless it has
        it already or the trainer has moved past it (interrupted while training or pushing weights),
        so the resume continues from there instead of running steps again.  A failure here (a full
        disk, a trainer process gone) is logged: the resume then runs from the last full checkpoint."""
        saved, status, trainer = self._saved, self.status, self._trainer
        if status is None or saved is None or not self._trainer_at_saved:
            return
        if not has_state(trainer):
            return
        key = f"{self.arm.label}#{self.repeat}"
        if saved["completed_steps"] != status.completed.get(key) or status.full_steps(key) >= self._done:
            return
        try:
            checkpoint.add_trainer_state(status, self.arm.label, self.repeat, saved, trainer)
        except Exception as exc:  # the interruption goes on; the resume replays from the last full one
            log.warning(
                "%s: the trainer state could not be saved at the interruption (%s: %s); the resume runs "
                "again from step %d",
                self.name,
                type(exc).__name__,
                exc,
                status.full_steps(key),
            )

    def _load_checkpoint(self) -> dict[str, Any] | None:
        return checkpoint.load(self.status, self.arm.label, self.repeat, self.name)

    async def _restore(self, saved: dict[str, Any]) -> None:
        assert self._rollout is not None and self._engine is not None and self._trainer is not None
        assert self._sync is not None
        assert self.status is not None  # a checkpoint exists only in a run directory
        self._done = await checkpoint.restore(
            saved,
            rollout=self._rollout,
            engine=self._engine,
            trainer=self._trainer,
            sync=self._sync,
            run_dir=self.status.path.parent,
        )
        self._saved, self._trainer_at_saved = saved, True
        self._set_origin(asyncio.get_running_loop().time() - saved["session_elapsed"])


async def open_session(session: ArmSession, rollout: RolloutConfig) -> None:
    """Start ``session``'s engine and trainer, build its rollout loop from ``rollout`` and the arm's
    strategy, then evaluate at step 0 (or restore its checkpoint)."""
    engine = await session._start_engine()
    session._rollout = RolloutLoop(
        rollout,
        arm=session.arm.label,
        engine=engine,
        strategy=build_strategy(session.arm, session.config.strategy_args),
        workload=session.components.workload,
        prompts=session.components.workload.prompt_stream(),
        recorder=session.recorder,
        repeat=session.repeat,
    )
    await session._begin()


async def run_alone(session: ArmSession, rollout: RolloutConfig, bars: Bars) -> None:
    """One session from open to close on its own (virtual) clock; an interruption saves the trainer's
    state where it is whole."""
    await open_session(session, rollout)
    try:
        await session.run_steps(range(session.config.steps), bars)
        await session.finish()
    except BaseException:
        session.save_trainer_state()
        raise
    finally:
        await session.close()
