"""Rows of the run's ``telemetry`` and ``events`` tables, and the sink they are written into.

Both row kinds are plain slotted dataclasses (``dataclasses.asdict`` gives their
JSON form) whose ``t`` is a time on ONE clock: the clock the sampler was given
and the clock the harness stamps events with (``time.monotonic``, which is also
what ``loop.time()`` returns on a real asyncio loop).  That shared clock is what
lets metrics join GPU samples to rollout phases by time.
"""

from __future__ import annotations

import enum
import threading
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar, runtime_checkable

__all__ = ["EventKind", "EventRecord", "ListSink", "TelemetryRecord", "TelemetrySink"]

Row = TypeVar("Row", contravariant=True)
T = TypeVar("T")


@dataclass(slots=True)
class TelemetryRecord:
    """One GPU at one sampling instant.  ``None`` marks a query the device or driver could not answer."""

    #: Sample time on the shared clock (seconds).
    t: float
    #: The arm this sampler ran for ("" for a stand-alone probe).
    arm: str
    #: Physical device index as the driver enumerates it (what ``nvidia-smi`` / ``amd-smi`` show).
    device: int
    name: str
    #: Share of the driver's last sample period in which a kernel ran (%).  Not SM occupancy.
    util_gpu: float | None
    #: Memory-controller (NVML) or UMC (AMD) activity (%).
    util_mem: float | None
    #: SM clock (NVML) or GFX clock (AMD), MHz.
    sm_clock_mhz: float | None
    mem_used_bytes: int | None
    mem_total_bytes: int | None
    power_w: float | None
    #: Energy since the sampler's first reading of this device, from the driver's energy counter (J).
    energy_j: float | None


class EventKind(enum.StrEnum):
    """The phase boundaries the driver emits, so GPU samples can be attributed to phases."""

    ROLLOUT_START = "rollout_start"
    #: The first abort of a step (APRIL / over-sampling: the N-th group just finished).
    FIRST_ABORT = "first_abort"
    #: Any later abort round of the same step.
    ABORT = "abort"
    ROLLOUT_END = "rollout_end"
    TRAIN_START = "train_start"
    TRAIN_END = "train_end"
    WEIGHT_SYNC_START = "weight_sync_start"
    WEIGHT_SYNC_END = "weight_sync_end"
    EVAL_START = "eval_start"
    EVAL_END = "eval_end"


@dataclass(slots=True)
class EventRecord:
    """A phase boundary of one arm, stamped on the same clock as the telemetry rows."""

    t: float
    arm: str
    #: Training step (for evaluations: steps completed before it).
    step: int
    kind: str
    detail: str = ""

    def __post_init__(self) -> None:
        self.kind = EventKind(self.kind).value  # rejects unknown kinds; stores the plain string


@runtime_checkable
class TelemetrySink(Protocol[Row]):
    """Where rows go: anything with ``append`` (a list, a recorder table).

    The sampler appends from its own thread: a sink must accept appends from a
    thread other than the one reading it (a ``list`` does; ``ListSink`` adds a lock
    for readers that iterate while sampling runs).
    """

    def append(self, row: Row, /) -> None: ...


class ListSink(list[T], Generic[T]):
    """A list whose ``append`` and ``snapshot`` are safe to call from different threads."""

    def __init__(self) -> None:
        super().__init__()
        self._lock = threading.Lock()

    def append(self, row: T, /) -> None:
        with self._lock:
            super().append(row)

    def snapshot(self) -> list[T]:
        """A copy taken under the lock (read while the sampler is still writing)."""
        with self._lock:
            return list(self)
