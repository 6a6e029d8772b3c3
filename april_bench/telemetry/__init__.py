"""GPU telemetry: a sampler thread over NVML or AMD SMI, event rows for phase boundaries, per-arm
metrics of where GPU time and energy go, and GPU facts for provenance.

Light on import (no ``pynvml``, ``amdsmi`` or ``torch``): vendor modules load when a
sampler starts.  Typical use by the driver, per arm::

    sampler = TelemetryConfig(backend="auto", rate_hz=10).build(
        sink=recorder.telemetry, clock=time.monotonic, arm=name
    )
    with sampler:  # start(): first sample now; stop(): last sample, join, release
        recorder.events.append(EventRecord(t=time.monotonic(), arm=name, step=0, kind="rollout_start"))
        ...

and afterwards ``gpu_summary(telemetry, events, steps, requests, samples)``.
"""

from __future__ import annotations

from april_bench.telemetry.metrics import gpu_metrics, gpu_summary, tail_windows
from april_bench.telemetry.records import EventKind, EventRecord, ListSink, TelemetryRecord, TelemetrySink
from april_bench.telemetry.sampler import BACKENDS, TelemetryConfig, TelemetrySampler, check_backend

__all__ = [
    "BACKENDS",
    "EventKind",
    "EventRecord",
    "ListSink",
    "TelemetryConfig",
    "TelemetryRecord",
    "TelemetrySampler",
    "TelemetrySink",
    "check_backend",
    "gpu_metrics",
    "gpu_summary",
    "tail_windows",
]
