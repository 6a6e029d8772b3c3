"""Rows of the run's ``telemetry`` table, and the sink the sampler writes them into.

A :class:`TelemetryRecord` is a plain slotted dataclass (``dataclasses.asdict``
gives its JSON form).  Its ``t`` is on the run's event clock: the sampler is given
the same ``clock`` the driver stamps :class:`~april_bench.results.records.EventRecord`
rows with (seconds since the run started, ``time.monotonic`` based).  Rows carry no
arm: interleaved sessions share the GPUs, so a sample belongs to whichever arm's
event windows contain it (:mod:`april_bench.telemetry.metrics`).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar, runtime_checkable

__all__ = ["ListSink", "TelemetryRecord", "TelemetrySink"]

Row = TypeVar("Row", contravariant=True)
T = TypeVar("T")


@dataclass(slots=True)
class TelemetryRecord:
    """One GPU at one sampling instant.  ``None`` marks a query the device or driver could not answer."""

    #: Sample time on the run's event clock (seconds).
    t: float
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
    #: Energy since this sampler's first reading of the device, from the driver's energy counter (J).
    energy_j: float | None
    #: GPM (NVIDIA Hopper and newer) over the interval since the previous sample (%): the share of SMs
    #: busy, active warps over the maximum, and DRAM bandwidth over the peak.  Unlike ``util_gpu`` these
    #: fall when one sequence decodes alone.  ``None`` where the GPU or driver has no GPM (and on AMD).
    sm_active_pct: float | None = None
    sm_occupancy_pct: float | None = None
    dram_bw_pct: float | None = None


@runtime_checkable
class TelemetrySink(Protocol[Row]):
    """Where rows go: anything with ``append``.

    The sampler appends from its own thread.  A sink that is read or written elsewhere at the same
    time (a recorder streaming rows to disk) must not be handed to the sampler directly: give it a
    :class:`ListSink` and move rows over on the driver's thread with :meth:`ListSink.drain`.
    """

    def append(self, row: Row, /) -> None: ...


class ListSink(list[T], Generic[T]):
    """A list whose ``append``, ``snapshot`` and ``drain`` are safe to call from different threads."""

    def __init__(self) -> None:
        super().__init__()
        self._lock = threading.Lock()

    def append(self, row: T, /) -> None:
        with self._lock:
            super().append(row)

    def snapshot(self) -> list[T]:
        """A copy, taken under the lock."""
        with self._lock:
            return list(self)

    def drain(self) -> list[T]:
        """Remove and return every row so far, under the lock (the driver hands them to its recorder)."""
        with self._lock:
            rows = list(self)
            self.clear()
            return rows
