"""NVML's GPU Performance Metrics (GPM, Hopper and newer): SM activity, SM occupancy and DRAM bandwidth.

NVML's ``utilization.gpu`` is the share of time *a* kernel ran, so one sequence decoding at batch 1
reads ~100% busy.  GPM counts what the SMs and memory did between two samples: ``SM_UTIL`` (share of
SMs busy), ``SM_OCCUPANCY`` (active warps over the maximum) and ``DRAM_BW_UTIL`` (DRAM bandwidth used
over the peak), each 0-100 over the interval.  That is the reading that tells a batch-1 tail from a
full batch.

Each device keeps two sample buffers: every read fills one and computes the metrics against the
other, so a value describes the interval since the previous read - the same held-backwards rule the
utilisation samples follow (:mod:`april_bench.telemetry.metrics`).  The first read of a device has no
interval and gives ``None``.  A device, driver or ``pynvml`` without GPM gives ``None`` always; so do
AMD GPUs, whose activity counters are already ``util_gpu`` (GFX) and ``util_mem`` (UMC).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from types import ModuleType
from typing import Any

__all__ = ["GPM_METRICS", "GpmCounters", "GpmReading"]

#: (``pynvml`` constant, :class:`GpmReading` field) of the metrics read, in request order.
GPM_METRICS = (
    ("NVML_GPM_METRIC_SM_UTIL", "sm_active_pct"),
    ("NVML_GPM_METRIC_SM_OCCUPANCY", "sm_occupancy_pct"),
    ("NVML_GPM_METRIC_DRAM_BW_UTIL", "dram_bw_pct"),
)
_NVML_SUCCESS = 0
_REQUIRED = (
    "nvmlGpmQueryDeviceSupport",
    "nvmlGpmSampleAlloc",
    "nvmlGpmSampleGet",
    "nvmlGpmSampleFree",
    "nvmlGpmMetricsGet",
    "c_nvmlGpmMetricsGet_t",
    "NVML_GPM_METRICS_GET_VERSION",
    *(constant for constant, _ in GPM_METRICS),
)


@dataclass(frozen=True, slots=True)
class GpmReading:
    """One device's GPM metrics over the interval since its previous read (%, 0-100)."""

    sm_active_pct: float | None = None
    sm_occupancy_pct: float | None = None
    dram_bw_pct: float | None = None


class GpmCounters:
    """GPM sampling for the devices of one NVML session; :meth:`read` never raises."""

    def __init__(self, nvml: ModuleType) -> None:
        self._nvml = nvml
        self._available = all(hasattr(nvml, name) for name in _REQUIRED)
        #: handle key -> [previous sample or None, spare sample]; None: the device has no GPM.
        self._buffers: dict[int, list[Any] | None] = {}

    def read(self, key: int, handle: Any) -> GpmReading:
        """Metrics of device ``key`` (its NVML ``handle``) since the previous call for it."""
        buffers = self._open(key, handle)
        if buffers is None:
            return GpmReading()
        previous, spare = buffers
        try:
            self._nvml.nvmlGpmSampleGet(handle, spare)
        except Exception:  # this interval is lost; the next read starts a new one
            if previous is not None:
                with contextlib.suppress(Exception):
                    self._nvml.nvmlGpmSampleFree(previous)
            buffers[0] = None
            return GpmReading()
        buffers[0], buffers[1] = spare, previous if previous is not None else self._alloc()
        if previous is None:
            return GpmReading()
        return self._metrics(previous, spare)

    def close(self) -> None:
        """Free every sample buffer (before ``nvmlShutdown``)."""
        for buffers in self._buffers.values():
            for sample in buffers or ():
                if sample is not None:
                    with contextlib.suppress(Exception):
                        self._nvml.nvmlGpmSampleFree(sample)
        self._buffers.clear()

    def _open(self, key: int, handle: Any) -> list[Any] | None:
        if key not in self._buffers:
            self._buffers[key] = self._support(handle)
        return self._buffers[key]

    def _support(self, handle: Any) -> list[Any] | None:
        if not self._available:
            return None
        try:
            if not self._nvml.nvmlGpmQueryDeviceSupport(handle).isSupportedDevice:
                return None
            return [None, self._alloc()]
        except Exception:  # NotSupported on pre-Hopper GPUs, old drivers, MIG without a GPU instance
            return None

    def _alloc(self) -> Any:
        return self._nvml.nvmlGpmSampleAlloc()

    def _metrics(self, first: Any, second: Any) -> GpmReading:
        nvml = self._nvml
        request = nvml.c_nvmlGpmMetricsGet_t()
        request.version = nvml.NVML_GPM_METRICS_GET_VERSION
        request.numMetrics = len(GPM_METRICS)
        request.sample1, request.sample2 = first, second
        for i, (constant, _) in enumerate(GPM_METRICS):
            request.metrics[i].metricId = getattr(nvml, constant)
        try:
            nvml.nvmlGpmMetricsGet(request)
        except Exception:
            return GpmReading()
        values: dict[str, float | None] = {}
        for i, (_, field) in enumerate(GPM_METRICS):
            metric = request.metrics[i]
            ok = metric.nvmlReturn == _NVML_SUCCESS and 0.0 <= float(metric.value) <= 100.0 + 1e-6
            values[field] = float(metric.value) if ok else None
        return GpmReading(**values)
