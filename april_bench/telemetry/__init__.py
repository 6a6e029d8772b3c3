"""GPU telemetry: a sampler thread over NVML or AMD SMI, per-arm metrics of where GPU time and
energy go (joined to the driver's event rows by time), and GPU facts for provenance.

Light on import (no ``pynvml``, ``amdsmi`` or ``torch``): vendor modules load when a sampler
starts.  One sampler per measured run, on the run's event clock::

    buffer = ListSink()
    sampler = config.telemetry.build(sink=buffer, clock=lambda: loop.time() - run_origin)
    with sampler:  # start(): first sample now; stop(): join, last sample, release the library
        ...        # at each step boundary, on the loop's thread: recorder.extend(buffer.drain())

and afterwards ``gpu_summary(telemetry, events, steps, requests, samples)``.
"""

from __future__ import annotations

from april_bench.telemetry.metrics import gpu_metrics, gpu_summary, tail_windows, window_metrics
from april_bench.telemetry.records import ListSink, TelemetryRecord, TelemetrySink
from april_bench.telemetry.sampler import BACKENDS, TelemetryConfig, TelemetrySampler, check_backend

__all__ = [
    "BACKENDS",
    "ListSink",
    "TelemetryConfig",
    "TelemetryRecord",
    "TelemetrySampler",
    "TelemetrySink",
    "check_backend",
    "gpu_metrics",
    "gpu_summary",
    "tail_windows",
    "window_metrics",
]
