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

With a run directory's ``status``, every session writes a checkpoint after each
completed step (the trainer's state every ``checkpoint_every`` steps and when the
run is interrupted) and a resume continues from them
(:mod:`april_bench.results.resume`).
An asynchronous arm has requests in flight and batches rolled out ahead at
every step boundary but the last, which a checkpoint does not hold: it writes
its checkpoint when it completes, and an interrupted one restarts from step 0.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from april_bench.backends import Components, build_components
from april_bench.experiment.session import ArmSession, Bars, open_session, run_alone
from april_bench.experiment_config import ExperimentConfig, load_config
from april_bench.results.recorder import RunRecorder
from april_bench.results.resume import RunStatus
from april_bench.rollout.loop import RolloutConfig
from april_bench.telemetry.records import ListSink, TelemetryRecord
from april_bench.vtime import run_real, run_virtual

__all__ = ["ArmSession", "ExperimentConfig", "RunResult", "load_config", "run", "run_prepared", "schedule"]


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
    #: Where each session's engine replicas ran, ``{"arm#repeat": [{"replica", "node_id", ...}]}``
    #: (Ray pools; empty otherwise).
    placement: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    #: The run directory, when the run was written into one (``april_bench.run(config, out=...)``).
    out: Path | None = None

    def summary(self) -> dict[str, dict[str, Any]]:
        """Per-arm metrics against the config's baseline: the run directory's ``summary.json`` (``arms``)
        when there is one (a resumed run's covers every step), else the recorded rows'."""
        if self.out is not None and (self.out / "summary.json").is_file():
            import json

            arms: dict[str, dict[str, Any]] = json.loads((self.out / "summary.json").read_text())["arms"]
            return arms
        return self.recorder.summary(baseline=self.config.baseline, block_steps=self.config.block_steps)

    def gains(self) -> dict[str, float | None]:
        """Each arm's throughput gain against the baseline (the paper's metric; 0 for the baseline)."""
        return {arm: m.get("throughput_gain") for arm, m in self.summary().items()}


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
    sink): :func:`run_prepared` on ``components``, built and validated here when not given
    (:func:`april_bench.backends.build_components`)."""
    if components is None:
        components = build_components(config, progress=progress)
    return run_prepared(config, components, progress=progress, echo=echo, recorder=recorder, status=status)


def run_prepared(
    config: ExperimentConfig,
    components: Components,
    *,
    progress: bool = True,
    echo: Callable[[str], None] | None = None,
    recorder: RunRecorder | None = None,
    status: RunStatus | None = None,
) -> RunResult:
    """Run every session of ``config`` on its validated ``components`` (the runner's: it built them
    before claiming the run directory) and return the tidy records (also streamed to ``recorder``'s
    sink).  With ``status`` (a run directory's), sessions checkpoint after every step (the trainer's
    state every ``checkpoint_every`` steps and at an interruption) and continue from the steps
    ``status`` says they completed."""
    for note in components.notes:
        if echo:
            echo(note)
    recorder = recorder if recorder is not None else RunRecorder()
    rollout = components.rollout  # every session's rollout loop settings, resolved with the components
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
    bars = Bars(sessions, config.steps, progress, status)
    try:
        if components.virtual_time:
            for session in sessions:  # virtual time: each session alone, on its own clock
                alone = run_alone(session, rollout, bars)
                run_virtual(alone)
        else:
            run_real(_interleaved(sessions, config, rollout, bars))
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
        placement={f"{s.arm.label}#{s.repeat}": s.placement for s in sessions if s.placement},
    )


def schedule(sessions: int, steps: int, block: int) -> Iterator[tuple[int, range]]:
    """``(session, steps)`` blocks in ABBA order: block 0 runs sessions 0..S-1, block 1 runs them
    backwards, and so on, so sessions alternate who goes first."""
    for b, start in enumerate(range(0, steps, block)):
        order = range(sessions) if b % 2 == 0 else range(sessions - 1, -1, -1)
        for s in order:
            yield s, range(start, min(start + block, steps))


async def _interleaved(
    sessions: list[ArmSession], config: ExperimentConfig, rollout: RolloutConfig, bars: Bars
) -> None:
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
            await open_session(session, rollout)
            opened.append(session)
        block = config.block_steps or config.steps
        for index, steps in schedule(len(sessions), config.steps, block):
            await sessions[index].run_steps(steps, bars)
        for session in sessions:
            await session.finish()
    except BaseException:
        for session in opened:  # interrupted (or failed): each trainer's state, where it is whole
            session.save_trainer_state()
        raise
    finally:
        sampler.stop()
        drain()
        for session in opened:
            await session.close()
