"""A fake ``pynvml`` (nvidia-ml-py): the functions april-bench calls, with NVML's units.

Units as in the real module: utilisation % (``.gpu``, ``.memory``), clocks MHz, memory bytes
(``.total``, ``.free``, ``.used``), power and power limits mW, energy mJ, CUDA driver version as
``1000 * major + 10 * minor``.  A missing value raises ``NVMLError_NotSupported`` (code 3), as a
device without the feature does.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import ModuleType, SimpleNamespace
from typing import Any

from fakes import Script

NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_NOT_FOUND = 6


class NVMLError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.value = value

    def __str__(self) -> str:
        return {
            NVML_ERROR_NOT_SUPPORTED: "Not Supported",
            NVML_ERROR_DRIVER_NOT_LOADED: "Driver Not Loaded",
            NVML_ERROR_LIBRARY_NOT_FOUND: "NVML Shared Library Not Found",
            NVML_ERROR_NOT_FOUND: "Not Found",
        }.get(self.value, f"NVML error {self.value}")


class NVMLError_NotSupported(NVMLError):  # pynvml's own class name
    def __init__(self) -> None:
        super().__init__(NVML_ERROR_NOT_SUPPORTED)


#: Use as a value to make a query fail as unsupported.
NOT_SUPPORTED = NVMLError_NotSupported()


@dataclass
class FakeNvidiaGpu:
    name: str = "NVIDIA H100 80GB HBM3"
    uuid: str = "GPU-00000000-0000-0000-0000-000000000000"
    #: Each a Script of per-call values (the last repeats) or a constant.
    util: Any = (0, 0)  # (gpu %, memory %)
    sm_clock_mhz: Any = 1980
    mem_used: Any = 0
    mem_total: int = 85_520_809_984
    power_mw: Any = 70_000
    energy_mj: Any = 1_000_000
    max_sm_clock_mhz: Any = 1980
    power_limit_mw: Any = 700_000
    persistence: Any = 1
    compute_mode: Any = 0
    mig_children: dict[str, Any] = field(default_factory=dict)
    #: GPM (Hopper and newer): None for a GPU without it, else a Script or constant of
    #: (sm_util %, sm_occupancy %, dram_bw %) that each metrics call returns for its interval.
    gpm: Any = None


def _value(v: Any) -> Any:
    return v.next() if isinstance(v, Script) else _check(v)


def _check(v: Any) -> Any:
    if isinstance(v, BaseException):
        raise v
    return v


def make(
    gpus: list[FakeNvidiaGpu],
    *,
    init_error: int | None = None,
    driver: str = "550.54.15",
    cuda: int = 12040,
) -> ModuleType:
    """A module object with pynvml's names, over ``gpus`` (index = list position)."""
    m = ModuleType("pynvml")
    state = SimpleNamespace(initialised=0, shutdowns=0)
    m.state = state  # type: ignore[attr-defined]
    m.NVMLError = NVMLError  # type: ignore[attr-defined]
    m.NVMLError_NotSupported = NVMLError_NotSupported  # type: ignore[attr-defined]
    m.NVML_CLOCK_GRAPHICS, m.NVML_CLOCK_SM, m.NVML_CLOCK_MEM = 0, 1, 2  # type: ignore[attr-defined]
    m.NVML_COMPUTEMODE_DEFAULT = 0  # type: ignore[attr-defined]
    m.NVML_COMPUTEMODE_EXCLUSIVE_THREAD = 1  # type: ignore[attr-defined]
    m.NVML_COMPUTEMODE_PROHIBITED = 2  # type: ignore[attr-defined]
    m.NVML_COMPUTEMODE_EXCLUSIVE_PROCESS = 3  # type: ignore[attr-defined]

    def require_init() -> None:
        if not state.initialised:
            raise NVMLError(1)  # NVML_ERROR_UNINITIALIZED

    def gpu(handle: Any) -> FakeNvidiaGpu:
        require_init()
        return gpus[handle.index]

    def nvmlInit() -> None:
        if init_error is not None:
            raise NVMLError(init_error)
        state.initialised += 1

    def nvmlShutdown() -> None:
        require_init()
        state.initialised -= 1
        state.shutdowns += 1

    def nvmlDeviceGetCount() -> int:
        require_init()
        return len(gpus)

    def nvmlDeviceGetHandleByIndex(index: int) -> Any:
        require_init()
        if not 0 <= index < len(gpus):
            raise NVMLError(2)  # INVALID_ARGUMENT
        return SimpleNamespace(index=index, mig=None)

    def nvmlDeviceGetHandleByUUID(uuid: str) -> Any:
        require_init()
        for i, g in enumerate(gpus):
            if g.uuid == uuid:
                return SimpleNamespace(index=i, mig=None)
            if uuid in g.mig_children:
                return SimpleNamespace(index=i, mig=uuid)
        raise NVMLError(NVML_ERROR_NOT_FOUND)

    def nvmlDeviceGetDeviceHandleFromMigDeviceHandle(handle: Any) -> Any:
        return SimpleNamespace(index=handle.index, mig=None)

    def nvmlDeviceGetIndex(handle: Any) -> int:
        if handle.mig is not None:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return int(handle.index)

    def nvmlDeviceGetUtilizationRates(handle: Any) -> Any:
        gpu_pct, mem_pct = _value(gpu(handle).util)
        return SimpleNamespace(gpu=gpu_pct, memory=mem_pct)

    def nvmlDeviceGetMemoryInfo(handle: Any) -> Any:
        g = gpu(handle)
        used = _value(g.mem_used)
        return SimpleNamespace(total=g.mem_total, free=g.mem_total - used, used=used)

    def nvmlDeviceGetClockInfo(handle: Any, clock_type: int) -> int:
        if clock_type != m.NVML_CLOCK_SM:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return _value(gpu(handle).sm_clock_mhz)

    def nvmlDeviceGetMaxClockInfo(handle: Any, clock_type: int) -> int:
        if clock_type != m.NVML_CLOCK_SM:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return _value(gpu(handle).max_sm_clock_mhz)

    _gpm(m, gpu, state)
    m.nvmlInit = nvmlInit  # type: ignore[attr-defined]
    m.nvmlShutdown = nvmlShutdown  # type: ignore[attr-defined]
    m.nvmlDeviceGetCount = nvmlDeviceGetCount  # type: ignore[attr-defined]
    m.nvmlDeviceGetHandleByIndex = nvmlDeviceGetHandleByIndex  # type: ignore[attr-defined]
    m.nvmlDeviceGetHandleByUUID = nvmlDeviceGetHandleByUUID  # type: ignore[attr-defined]
    m.nvmlDeviceGetDeviceHandleFromMigDeviceHandle = nvmlDeviceGetDeviceHandleFromMigDeviceHandle  # type: ignore[attr-defined]
    m.nvmlDeviceGetIndex = nvmlDeviceGetIndex  # type: ignore[attr-defined]
    m.nvmlDeviceGetName = lambda h: gpu(h).name  # type: ignore[attr-defined]
    m.nvmlDeviceGetUUID = lambda h: gpu(h).uuid  # type: ignore[attr-defined]
    m.nvmlDeviceGetUtilizationRates = nvmlDeviceGetUtilizationRates  # type: ignore[attr-defined]
    m.nvmlDeviceGetMemoryInfo = nvmlDeviceGetMemoryInfo  # type: ignore[attr-defined]
    m.nvmlDeviceGetClockInfo = nvmlDeviceGetClockInfo  # type: ignore[attr-defined]
    m.nvmlDeviceGetMaxClockInfo = nvmlDeviceGetMaxClockInfo  # type: ignore[attr-defined]
    m.nvmlDeviceGetPowerUsage = lambda h: _value(gpu(h).power_mw)  # type: ignore[attr-defined]
    m.nvmlDeviceGetTotalEnergyConsumption = lambda h: _value(gpu(h).energy_mj)  # type: ignore[attr-defined]
    m.nvmlDeviceGetEnforcedPowerLimit = lambda h: _value(gpu(h).power_limit_mw)  # type: ignore[attr-defined]
    m.nvmlDeviceGetPersistenceMode = lambda h: _value(gpu(h).persistence)  # type: ignore[attr-defined]
    m.nvmlDeviceGetComputeMode = lambda h: _value(gpu(h).compute_mode)  # type: ignore[attr-defined]
    m.nvmlSystemGetDriverVersion = lambda: (require_init(), driver)[1]  # type: ignore[attr-defined]
    m.nvmlSystemGetCudaDriverVersion = lambda: (require_init(), cuda)[1]  # type: ignore[attr-defined]
    return m


def _gpm(m: ModuleType, gpu: Any, state: SimpleNamespace) -> None:
    """GPM as pynvml exposes it: opaque sample buffers, a ctypes request struct filled by the caller,
    per-metric return codes.  ``state.gpm_samples`` counts live buffers (a leak shows as > 0)."""
    m.NVML_GPM_METRIC_SM_UTIL, m.NVML_GPM_METRIC_SM_OCCUPANCY = 2, 3  # type: ignore[attr-defined]
    m.NVML_GPM_METRIC_DRAM_BW_UTIL = 10  # type: ignore[attr-defined]
    m.NVML_GPM_METRICS_GET_VERSION = 1  # type: ignore[attr-defined]
    state.gpm_samples = 0
    order = {2: 0, 3: 1, 10: 2}

    class Metric:
        def __init__(self) -> None:
            self.metricId, self.nvmlReturn, self.value = 0, 0, 0.0

    class MetricsGet:  # c_nvmlGpmMetricsGet_t
        def __init__(self) -> None:
            self.version = self.numMetrics = 0
            self.sample1: Any = None
            self.sample2: Any = None
            self.metrics = [Metric() for _ in range(98)]

    def query_support(handle: Any) -> Any:
        return SimpleNamespace(version=1, isSupportedDevice=int(gpu(handle).gpm is not None))

    def alloc() -> Any:
        state.gpm_samples += 1
        return SimpleNamespace(device=None, taken=0)

    def free(sample: Any) -> None:
        state.gpm_samples -= 1

    def sample_get(handle: Any, sample: Any) -> Any:
        if gpu(handle).gpm is None:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        sample.device, sample.taken = handle.index, sample.taken + 1
        return sample

    def metrics_get(request: Any) -> Any:
        if request.version != 1 or request.sample1.device != request.sample2.device:
            raise NVMLError(2)  # INVALID_ARGUMENT
        values = _value(gpus_of(request.sample2.device).gpm)
        for metric in request.metrics[: request.numMetrics]:
            metric.value, metric.nvmlReturn = float(values[order[metric.metricId]]), 0
        return request

    gpus_of = lambda index: gpu(SimpleNamespace(index=index))  # noqa: E731
    m.c_nvmlGpmMetricsGet_t = MetricsGet  # type: ignore[attr-defined]
    m.nvmlGpmQueryDeviceSupport = query_support  # type: ignore[attr-defined]
    m.nvmlGpmSampleAlloc = alloc  # type: ignore[attr-defined]
    m.nvmlGpmSampleFree = free  # type: ignore[attr-defined]
    m.nvmlGpmSampleGet = sample_get  # type: ignore[attr-defined]
    m.nvmlGpmMetricsGet = metrics_get  # type: ignore[attr-defined]


#: Every pynvml name the fake defines that april-bench may call (checked against the real module).
API = (
    "NVMLError",
    "NVMLError_NotSupported",
    "NVML_CLOCK_SM",
    "NVML_COMPUTEMODE_DEFAULT",
    "NVML_COMPUTEMODE_EXCLUSIVE_THREAD",
    "NVML_COMPUTEMODE_PROHIBITED",
    "NVML_COMPUTEMODE_EXCLUSIVE_PROCESS",
    "nvmlInit",
    "nvmlShutdown",
    "nvmlDeviceGetCount",
    "nvmlDeviceGetHandleByIndex",
    "nvmlDeviceGetHandleByUUID",
    "nvmlDeviceGetDeviceHandleFromMigDeviceHandle",
    "nvmlDeviceGetIndex",
    "nvmlDeviceGetName",
    "nvmlDeviceGetUUID",
    "nvmlDeviceGetUtilizationRates",
    "nvmlDeviceGetMemoryInfo",
    "nvmlDeviceGetClockInfo",
    "nvmlDeviceGetMaxClockInfo",
    "nvmlDeviceGetPowerUsage",
    "nvmlDeviceGetTotalEnergyConsumption",
    "nvmlDeviceGetEnforcedPowerLimit",
    "nvmlDeviceGetPersistenceMode",
    "nvmlDeviceGetComputeMode",
    "nvmlSystemGetDriverVersion",
    "nvmlSystemGetCudaDriverVersion",
    "NVML_GPM_METRIC_SM_UTIL",
    "NVML_GPM_METRIC_SM_OCCUPANCY",
    "NVML_GPM_METRIC_DRAM_BW_UTIL",
    "NVML_GPM_METRICS_GET_VERSION",
    "c_nvmlGpmMetricsGet_t",
    "nvmlGpmQueryDeviceSupport",
    "nvmlGpmSampleAlloc",
    "nvmlGpmSampleFree",
    "nvmlGpmSampleGet",
    "nvmlGpmMetricsGet",
)
