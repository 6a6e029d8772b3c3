"""A fake ``amdsmi`` (7.0.2 Python wrapper): the functions april-bench calls, with AMD SMI's units.

As in the real wrapper: activity in % with ``"N/A"`` for unsupported engines, clocks MHz, VRAM in
MiB, socket power in W (``"N/A"`` when unsupported), power cap in uW, and the energy counter as
``{"energy_accumulator": ticks, "counter_resolution": uJ per tick, "timestamp": ns}``.  A
``LIBRARY_MISSING`` error stands for the real import failure (``KeyError('libamd_smi.so')``).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from types import ModuleType, SimpleNamespace
from typing import Any

from fakes import Script

AMDSMI_STATUS_NOT_SUPPORTED = 2
AMDSMI_STATUS_DRIVER_NOT_LOADED = 34


class AmdSmiException(Exception):
    pass


class AmdSmiLibraryException(AmdSmiException):
    def __init__(self, err_code: int) -> None:
        super().__init__(err_code)
        self.err_code = err_code


#: What ``import amdsmi`` raises when libamd_smi.so cannot be found (after printing to stdout).
LIBRARY_MISSING = KeyError("libamd_smi.so")
#: Use as a value to make a query fail as unsupported.
NOT_SUPPORTED = AmdSmiLibraryException(AMDSMI_STATUS_NOT_SUPPORTED)


class AmdSmiInitFlags(enum.IntFlag):
    INIT_ALL_PROCESSORS = 0xFFFFFFFF
    INIT_AMD_CPUS = 1
    INIT_AMD_GPUS = 2


class AmdSmiClkType(enum.IntEnum):
    SYS = 0
    GFX = 0  # the real enum aliases GFX to SYS (AMDSMI_CLK_TYPE_GFX == AMDSMI_CLK_TYPE_SYS)
    DF = 1
    DCEF = 2
    SOC = 3
    MEM = 4


@dataclass
class FakeAmdGpu:
    market_name: str = "AMD Instinct MI300X"
    uuid: str = "a1ff74a1-0000-1000-80d9-9bf1e3a2d6e7"
    #: Each a Script of per-call values (the last repeats) or a constant.
    activity: Any = (0, 0)  # (gfx %, umc %); "N/A" allowed
    gfx_clock_mhz: Any = 2100
    max_gfx_clock_mhz: Any = 2100
    vram_used_mib: Any = 0
    vram_total_mib: int = 196_592
    current_socket_power: Any = 150
    average_socket_power: Any = "N/A"
    energy_ticks: Any = 0
    counter_resolution: float = 15.259
    power_cap_uw: Any = 750_000_000


def _value(v: Any) -> Any:
    v = v.next() if isinstance(v, Script) else v
    if isinstance(v, BaseException):
        raise v
    return v


def make(
    gpus: list[FakeAmdGpu],
    *,
    init_error: int | None = None,
    driver: str = "6.8.5",
    rocm: str = "6.4.1",
) -> ModuleType:
    m = ModuleType("amdsmi")
    state = SimpleNamespace(initialised=0, shutdowns=0)
    m.state = state  # type: ignore[attr-defined]
    m.AmdSmiException = AmdSmiException  # type: ignore[attr-defined]
    m.AmdSmiLibraryException = AmdSmiLibraryException  # type: ignore[attr-defined]
    m.AmdSmiInitFlags = AmdSmiInitFlags  # type: ignore[attr-defined]
    m.AmdSmiClkType = AmdSmiClkType  # type: ignore[attr-defined]

    def gpu(handle: Any) -> FakeAmdGpu:
        if not state.initialised:
            raise AmdSmiLibraryException(32)  # NOT_INIT
        return gpus[handle.index]

    def amdsmi_init(flag: AmdSmiInitFlags = AmdSmiInitFlags.INIT_AMD_GPUS) -> None:
        if not isinstance(flag, AmdSmiInitFlags):
            raise TypeError("flag must be an AmdSmiInitFlags")
        if init_error is not None:
            raise AmdSmiLibraryException(init_error)
        state.initialised += 1

    def amdsmi_shut_down() -> None:
        state.initialised -= 1
        state.shutdowns += 1

    def amdsmi_get_gpu_activity(h: Any) -> dict[str, Any]:
        gfx, umc = _value(gpu(h).activity)
        return {"gfx_activity": gfx, "umc_activity": umc, "mm_activity": "N/A"}

    def amdsmi_get_clock_info(h: Any, clock_type: AmdSmiClkType) -> dict[str, Any]:
        if clock_type != AmdSmiClkType.GFX:
            raise AmdSmiLibraryException(AMDSMI_STATUS_NOT_SUPPORTED)
        g = gpu(h)
        return {
            "clk": _value(g.gfx_clock_mhz),
            "min_clk": 500,
            "max_clk": _value(g.max_gfx_clock_mhz),
            "clk_locked": False,
            "clk_deep_sleep": "N/A",
        }

    def amdsmi_get_gpu_vram_usage(h: Any) -> dict[str, Any]:
        g = gpu(h)
        return {"vram_total": g.vram_total_mib, "vram_used": _value(g.vram_used_mib)}

    def amdsmi_get_power_info(h: Any) -> dict[str, Any]:
        g = gpu(h)
        return {
            "socket_power": "N/A",
            "current_socket_power": _value(g.current_socket_power),
            "average_socket_power": _value(g.average_socket_power),
            "gfx_voltage": "N/A",
            "soc_voltage": "N/A",
            "mem_voltage": "N/A",
            "power_limit": 750,
        }

    def amdsmi_get_energy_count(h: Any) -> dict[str, Any]:
        g = gpu(h)
        return {
            "energy_accumulator": _value(g.energy_ticks),
            "counter_resolution": g.counter_resolution,
            "timestamp": 0,
        }

    def amdsmi_get_gpu_asic_info(h: Any) -> dict[str, Any]:
        return {"market_name": gpu(h).market_name, "vendor_id": "0x1002", "device_id": "0x74a1"}

    def amdsmi_get_power_cap_info(h: Any) -> dict[str, Any]:
        cap = _value(gpu(h).power_cap_uw)
        return {
            "power_cap": cap,
            "default_power_cap": cap,
            "dpm_cap": 0,
            "min_power_cap": 0,
            "max_power_cap": cap,
        }

    m.amdsmi_init = amdsmi_init  # type: ignore[attr-defined]
    m.amdsmi_shut_down = amdsmi_shut_down  # type: ignore[attr-defined]
    m.amdsmi_get_processor_handles = lambda: [SimpleNamespace(index=i) for i in range(len(gpus))]  # type: ignore[attr-defined]
    m.amdsmi_get_gpu_activity = amdsmi_get_gpu_activity  # type: ignore[attr-defined]
    m.amdsmi_get_clock_info = amdsmi_get_clock_info  # type: ignore[attr-defined]
    m.amdsmi_get_gpu_vram_usage = amdsmi_get_gpu_vram_usage  # type: ignore[attr-defined]
    m.amdsmi_get_power_info = amdsmi_get_power_info  # type: ignore[attr-defined]
    m.amdsmi_get_energy_count = amdsmi_get_energy_count  # type: ignore[attr-defined]
    m.amdsmi_get_gpu_asic_info = amdsmi_get_gpu_asic_info  # type: ignore[attr-defined]
    m.amdsmi_get_power_cap_info = amdsmi_get_power_cap_info  # type: ignore[attr-defined]
    m.amdsmi_get_gpu_device_uuid = lambda h: gpu(h).uuid  # type: ignore[attr-defined]
    m.amdsmi_get_gpu_driver_info = lambda h: (  # type: ignore[attr-defined]
        gpu(h),
        {"driver_name": "amdgpu", "driver_version": driver, "driver_date": "N/A"},
    )[1]
    m.amdsmi_get_rocm_version = lambda: (True, rocm)  # type: ignore[attr-defined]
    return m


#: Every amdsmi name the fake defines that april-bench may call (checked against the real wrapper).
API = (
    "AmdSmiException",
    "AmdSmiLibraryException",
    "AmdSmiInitFlags",
    "AmdSmiClkType",
    "amdsmi_init",
    "amdsmi_shut_down",
    "amdsmi_get_processor_handles",
    "amdsmi_get_gpu_activity",
    "amdsmi_get_clock_info",
    "amdsmi_get_gpu_vram_usage",
    "amdsmi_get_power_info",
    "amdsmi_get_energy_count",
    "amdsmi_get_gpu_asic_info",
    "amdsmi_get_power_cap_info",
    "amdsmi_get_gpu_device_uuid",
    "amdsmi_get_gpu_driver_info",
    "amdsmi_get_rocm_version",
)
