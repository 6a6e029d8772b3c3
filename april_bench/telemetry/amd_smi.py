"""AMD GPUs through AMD SMI (the ``amdsmi`` Python wrapper of ``libamd_smi.so``).

Units, as ``amdsmi`` 7.x returns them: activity in % (``"N/A"`` when the driver
reports 0xFFFF), clocks in MHz, VRAM in MiB (the library divides bytes by
1024 * 1024), socket power in W, and the energy counter as an accumulator of
ticks times ``counter_resolution`` microjoules (as the ``amd-smi`` CLI computes
it).  MI300 fills ``current_socket_power``; older parts ``average_socket_power``.

Devices are indexed in the order of ``amdsmi_get_processor_handles()``.
``ROCR_VISIBLE_DEVICES`` selects among them, then ``HIP_VISIBLE_DEVICES`` (or
``CUDA_VISIBLE_DEVICES``, which HIP honours) selects among those, as the ROCm
runtime does; only integer ordinals are understood here (pass ``devices`` for
UUID-based setups).
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

__all__ = ["INSTALL_HINT", "AmdSmiReader", "energy_counter_j", "load_amdsmi"]

INSTALL_HINT = "pip install 'april-bench[amd]' (or, to match your ROCm, pip install /opt/rocm/share/amd_smi)"
_MIB = 1024 * 1024


def load_amdsmi(loader: ModuleLoader | None = None) -> tuple[ModuleType, list[Any]]:
    """Import ``amdsmi``, initialise it for GPUs, and return the module and its processor handles."""
    smi = import_vendor("amdsmi", loader, INSTALL_HINT)
    try:
        smi.amdsmi_init(smi.AmdSmiInitFlags.INIT_AMD_GPUS)
    except Exception as exc:  # AmdSmiLibraryException: driver not loaded, no GPU
        raise TelemetryUnavailable(f"AMD SMI could not start ({exc}); check that amd-smi works") from None
    try:
        handles = list(smi.amdsmi_get_processor_handles())
    except Exception as exc:
        _shutdown(smi)
        raise TelemetryUnavailable(f"AMD SMI lists no GPU ({exc})") from None
    if not handles:
        _shutdown(smi)
        raise TelemetryUnavailable("AMD SMI sees no GPU")
    return smi, handles


def energy_counter_j(counter: Mapping[str, Any]) -> float | None:
    """``amdsmi_get_energy_count``'s dict in J: accumulator ticks x resolution (uJ per tick) / 1e6.

    amdsmi 6.x named the accumulator ``power``; 7.x names it ``energy_accumulator``."""
    ticks = counter.get("energy_accumulator", counter.get("power"))
    resolution = as_number(counter.get("counter_resolution"))
    if as_number(ticks) is None or resolution is None:
        return None
    return float(ticks) * resolution / 1e6


class AmdSmiReader(VendorReader):
    """Reads GFX activity, UMC activity, GFX clock, VRAM, socket power and the energy counter."""

    backend = "amdsmi"

    @classmethod
    def _start(cls, loader: ModuleLoader | None) -> tuple[ModuleType, list[Any]]:
        return load_amdsmi(loader)

    @classmethod
    def _select(
        cls, lib: ModuleType, found: list[Any], devices: Sequence[int] | None, env: Mapping[str, str]
    ) -> dict[int, Any]:
        """``ROCR_VISIBLE_DEVICES``, then ``HIP_VISIBLE_DEVICES``, pick among the processor handles."""
        return {i: found[i] for i in _pick_devices(len(found), devices, env)}

    @staticmethod
    def _name(lib: ModuleType, handle: Any, index: int) -> str:
        with contextlib.suppress(Exception):
            name = lib.amdsmi_get_gpu_asic_info(handle).get("market_name")
            if name and name != "N/A":
                return str(name)
        return f"AMD GPU {index}"

    def read(self, device: int) -> DeviceReading:
        smi, h, call = self._lib, self._handles[device], self.errors.call
        activity = call(device, "activity", lambda: smi.amdsmi_get_gpu_activity(h)) or {}
        clock = call(device, "gfx_clock", lambda: smi.amdsmi_get_clock_info(h, smi.AmdSmiClkType.GFX)) or {}
        vram = call(device, "vram", lambda: smi.amdsmi_get_gpu_vram_usage(h)) or {}
        power = call(device, "power", lambda: smi.amdsmi_get_power_info(h)) or {}
        energy = call(device, "energy", lambda: smi.amdsmi_get_energy_count(h))
        used, total = as_number(vram.get("vram_used")), as_number(vram.get("vram_total"))
        socket_w = as_number(power.get("current_socket_power"))
        if socket_w is None:
            socket_w = as_number(power.get("average_socket_power"))
        return DeviceReading(
            util_gpu=as_number(activity.get("gfx_activity")),
            util_mem=as_number(activity.get("umc_activity")),
            sm_clock_mhz=as_number(clock.get("clk")),
            mem_used_bytes=int(used) * _MIB if used is not None else None,
            mem_total_bytes=int(total) * _MIB if total is not None else None,
            power_w=socket_w,
            energy_counter_j=energy_counter_j(energy) if energy is not None else None,
        )

    @staticmethod
    def shutdown(lib: ModuleType) -> None:
        _shutdown(lib)


def _pick_devices(count: int, devices: Sequence[int] | None, env: Mapping[str, str]) -> list[int]:
    if devices is not None:
        return check_requested(devices, count)
    rocr = parse_visible(env, ("ROCR_VISIBLE_DEVICES",))
    physical = _ordinals(rocr.entries, list(range(count)))
    hip = parse_visible(env, ("HIP_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES"))
    picked = _ordinals(hip.entries, physical)
    if not picked:
        raise TelemetryUnavailable(f"no visible GPU ({rocr.source}, {hip.source})")
    return picked


def _ordinals(entries: tuple[int | str, ...] | None, pool: list[int]) -> list[int]:
    """The members of ``pool`` that ``entries`` select by position, up to the first unusable entry."""
    if entries is None:
        return pool
    picked: list[int] = []
    for entry in entries:
        if not isinstance(entry, int) or entry >= len(pool):
            break
        if pool[entry] not in picked:
            picked.append(pool[entry])
    return picked


def _shutdown(smi: ModuleType) -> None:
    with contextlib.suppress(Exception):
        smi.amdsmi_shut_down()
