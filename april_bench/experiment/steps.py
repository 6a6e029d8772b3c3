"""The rows of one trained step, the same for the synchronous and the pipelined drivers."""

from __future__ import annotations

from april_bench.results.recorder import RunRecorder
from april_bench.results.records import EventRecord, Fate
from april_bench.rollout.driver import StepDone

__all__ = ["PHASES", "record_step"]

#: The events of a step, in the order they are written.
PHASES = (
    "rollout_start",
    "rollout_stop",
    "rollout_end",
    "train_start",
    "train_end",
    "weight_sync_start",
    "weight_sync_end",
)


def record_step(
    recorder: RunRecorder, arm: str, repeat: int, done: StepDone, *, run_origin: float, warmup: bool
) -> None:
    """One step's phase events (each at the loop time it ran; a pipelined arm's overlap), the trained
    samples' fates, and the step row's train metrics and warm-up flag.  The step row itself is added
    by the caller, once the evaluation due after the step has given its accuracy."""
    record = done.outcome.record
    record.train_metrics = dict(getattr(done.train_result, "metrics", {}) or {})
    record.warmup = warmup
    times = (
        done.rollout_start,
        done.rollout_end - record.drain_time_s,
        done.rollout_end,
        done.train_start,
        done.train_end,
        done.sync_start,
        done.sync_end,
    )
    for kind, at in zip(PHASES, times, strict=True):
        recorder.add(EventRecord(arm=arm, step=done.step, kind=kind, t=at - run_origin, repeat=repeat))
    recorder.sample_fates(
        arm,
        done.outcome.batch,
        step=done.step,
        fate=Fate.TRAINED,
        reason="accepted",
        train_version=done.train_version,
        repeat=repeat,
    )
