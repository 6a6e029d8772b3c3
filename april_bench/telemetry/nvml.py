"""NVIDIA GPUs through NVML (``nvidia-ml-py``, import name ``pynvml``).

Units, as ``pynvml`` returns them: utilisation in % of the driver's last sample
period (1/6 s to 1 s, by product), clocks in MHz, memory in bytes, power in
mW, and the energy counter in mJ since the driver was loaded (Volta and newer).

Device indices are NVML's, which follow PCI bus order.  ``CUDA_VISIBLE_DEVICES``
ordinals are mapped onto them as-is: that is exact under
``CUDA_DEVICE_ORDER=PCI_BUS_ID`` and on nodes of identical GPUs (the CUDA
default, fastest first, breaks ties by bus id); UUIDs are exact always.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from types import ModuleType
from typing import Any

from april_bench.telemetry.devices import (
    DeviceReading,
    ModuleLoader,
    TelemetryUnavailable,
    VendorReader,
    as_number,
    check_requested,
    import_vendor,
    parse_visible,
)
from april_bench.telemetry.gpm import GpmCounters

__all__ = ["INSTALL_HINT", "NvmlReader", "load_nvml"]

INSTALL_HINT = "pip install 'april-bench[nvidia]'"


def load_nvml(loader: ModuleLoader | None = None) -> ModuleType:
    """Import ``pynvml`` and call ``nvmlInit``; :class:`TelemetryUnavailable` says why not."""
    nvml = import_vendor("pynvml", loader, INSTALL_HINT)
    try:
        nvml.nvmlInit()
    except Exception as exc:  # NVMLError_LibraryNotFound / DriverNotLoaded / ...
        raise TelemetryUnavailable(f"NVML could not start ({exc}); check that nvidia-smi works") from None
    return nvml


class NvmlReader(VendorReader):
    """Reads utilisation, SM clock, memory, power, the energy counter and, where the GPU has them (Hopper
    and newer), GPM's SM activity, SM occupancy and DRAM bandwidth of a fixed set of GPUs."""

    backend = "nvml"

    def __init__(self, nvml: ModuleType, handles: Mapping[int, Any], names: Mapping[int, str]) -> None:
        super().__init__(nvml, handles, names)
        self._gpm = GpmCounters(nvml)

    @classmethod
    def _start(cls, loader: ModuleLoader | None) -> tuple[ModuleType, None]:
        return load_nvml(loader), None

    @classmethod
    def _select(
        cls, lib: ModuleType, found: None, devices: Sequence[int] | None, env: Mapping[str, str]
    ) -> dict[int, Any]:
        """``CUDA_VISIBLE_DEVICES`` (ordinals or UUIDs) picks among NVML's devices."""
        return {i: lib.nvmlDeviceGetHandleByIndex(i) for i in _pick_devices(lib, devices, env)}

    @staticmethod
    def _name(lib: ModuleType, handle: Any, index: int) -> str:
        return _text(lib.nvmlDeviceGetName(handle))

    def read(self, device: int) -> DeviceReading:
        nvml, h, call = self._lib, self._handles[device], self.errors.call
        util = call(device, "utilization", lambda: nvml.nvmlDeviceGetUtilizationRates(h))
        memory = call(device, "memory", lambda: nvml.nvmlDeviceGetMemoryInfo(h))
        clock = call(device, "sm_clock", lambda: nvml.nvmlDeviceGetClockInfo(h, nvml.NVML_CLOCK_SM))
        power_mw = call(device, "power", lambda: nvml.nvmlDeviceGetPowerUsage(h))
        energy_mj = call(device, "energy", lambda: nvml.nvmlDeviceGetTotalEnergyConsumption(h))
        gpm = self._gpm.read(device, h)
        return DeviceReading(
            util_gpu=as_number(util.gpu) if util is not None else None,
            util_mem=as_number(util.memory) if util is not None else None,
            sm_clock_mhz=as_number(clock),
            mem_used_bytes=int(memory.used) if memory is not None else None,
            mem_total_bytes=int(memory.total) if memory is not None else None,
            power_w=power_mw / 1e3 if power_mw is not None else None,
            energy_counter_j=energy_mj / 1e3 if energy_mj is not None else None,
            sm_active_pct=gpm.sm_active_pct,
            sm_occupancy_pct=gpm.sm_occupancy_pct,
            dram_bw_pct=gpm.dram_bw_pct,
        )

    def close(self) -> None:
        self._gpm.close()  # the GPM sample buffers before nvmlShutdown
        super().close()

    @staticmethod
    def shutdown(lib: ModuleType) -> None:
        _shutdown(lib)


def _pick_devices(nvml: ModuleType, devices: Sequence[int] | None, env: Mapping[str, str]) -> list[int]:
    count = int(nvml.nvmlDeviceGetCount())
    if count == 0:
        raise TelemetryUnavailable("NVML sees no GPU")
    if devices is not None:
        return check_requested(devices, count)
    visible = parse_visible(env, ("CUDA_VISIBLE_DEVICES",))
    if visible.entries is None:
        return list(range(count))
    picked: list[int] = []
    for entry in visible.entries:
        index = _resolve(nvml, entry, count)
        if index is None:  # the CUDA runtime stops at the first entry it cannot use, too
            break
        if index not in picked:
            picked.append(index)
    if not picked:
        raise TelemetryUnavailable(f"no visible GPU ({visible.source})")
    return picked


def _resolve(nvml: ModuleType, entry: int | str, count: int) -> int | None:
    if isinstance(entry, int):
        return entry if entry < count else None
    try:
        handle = nvml.nvmlDeviceGetHandleByUUID(entry)
        if entry.startswith("MIG-"):  # utilisation is a whole-GPU quantity: sample the parent
            handle = nvml.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(handle)
        return int(nvml.nvmlDeviceGetIndex(handle))
    except Exception:
        return None


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _shutdown(nvml: ModuleType) -> None:
    with contextlib.suppress(Exception):  # shutting down twice, or a lost driver: nothing left to release
        nvml.nvmlShutdown()
