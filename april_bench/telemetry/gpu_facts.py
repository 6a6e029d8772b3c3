"""GPU facts for a run's provenance: model, driver, CUDA/ROCm, memory, clocks, power limit, modes.

Sources, first that answers: NVML, AMD SMI, ``torch.cuda`` (only when a GPU device
node exists, so a CPU machine never pays for importing torch), ``nvidia-smi
--query-gpu``.  Every dict has the same keys (:data:`FACT_KEYS`), ``None`` where the
source does not know; ``source`` says which answered.  Nothing here raises.
"""

from __future__ import annotations

import contextlib
import csv
import io
import shutil
import subprocess
from collections.abc import Callable
from typing import Any

from april_bench.machine import detect_accelerators
from april_bench.telemetry.devices import ModuleLoader, TelemetryUnavailable, as_number, import_quietly

__all__ = [
    "FACT_KEYS",
    "amdsmi_facts",
    "collect_gpu_info",
    "gpu_info",
    "nvidia_smi_facts",
    "nvml_facts",
    "torch_facts",
]

FACT_KEYS = (
    "index",
    "vendor",
    "name",
    "uuid",
    "driver_version",
    "cuda_version",
    "rocm_version",
    "memory_total_bytes",
    "sm_clock_max_mhz",
    "sm_clock_mhz",
    "power_limit_w",
    "persistence_mode",
    "compute_mode",
    "source",
)
_COMPUTE_MODES = {0: "default", 1: "exclusive_thread", 2: "prohibited", 3: "exclusive_process"}
Runner = Callable[..., subprocess.CompletedProcess[str]]


def collect_gpu_info(
    *,
    loader: ModuleLoader | None = None,
    has_gpu_nodes: bool = False,
    run: Runner = subprocess.run,
    which: Callable[[str], str | None] = shutil.which,
) -> list[dict[str, Any]]:
    """Facts of every GPU from the first source that answers; ``[]`` when none does."""
    sources: list[Callable[[], list[dict[str, Any]]]] = [
        lambda: nvml_facts(loader),
        lambda: amdsmi_facts(loader),
    ]
    if has_gpu_nodes:
        sources.append(lambda: torch_facts(loader))
    sources.append(lambda: nvidia_smi_facts(run, which))
    for source in sources:
        try:
            facts = source()
        except Exception:  # an unavailable or misbehaving source: try the next
            continue
        if facts:
            return facts
    return []


def nvml_facts(loader: ModuleLoader | None = None) -> list[dict[str, Any]]:
    from april_bench.telemetry.nvml import load_nvml

    nvml = load_nvml(loader)
    try:
        driver = _text(_try(nvml.nvmlSystemGetDriverVersion))
        cuda = _try(nvml.nvmlSystemGetCudaDriverVersion)
        facts = []
        for index in range(int(nvml.nvmlDeviceGetCount())):
            h = nvml.nvmlDeviceGetHandleByIndex(index)
            memory = _try(nvml.nvmlDeviceGetMemoryInfo, h)
            limit_mw = _try(nvml.nvmlDeviceGetEnforcedPowerLimit, h)
            persistence = _try(nvml.nvmlDeviceGetPersistenceMode, h)
            mode = _try(nvml.nvmlDeviceGetComputeMode, h)
            facts.append(
                _facts(
                    index=index,
                    vendor="nvidia",
                    name=_text(_try(nvml.nvmlDeviceGetName, h)),
                    uuid=_text(_try(nvml.nvmlDeviceGetUUID, h)),
                    driver_version=driver,
                    cuda_version=f"{cuda // 1000}.{cuda % 1000 // 10}" if isinstance(cuda, int) else None,
                    memory_total_bytes=int(memory.total) if memory is not None else None,
                    sm_clock_max_mhz=_try(nvml.nvmlDeviceGetMaxClockInfo, h, nvml.NVML_CLOCK_SM),
                    sm_clock_mhz=_try(nvml.nvmlDeviceGetClockInfo, h, nvml.NVML_CLOCK_SM),
                    power_limit_w=limit_mw / 1e3 if limit_mw is not None else None,
                    persistence_mode=bool(persistence) if persistence is not None else None,
                    compute_mode=_COMPUTE_MODES.get(mode) if mode is not None else None,
                    source="nvml",
                )
            )
        return facts
    finally:
        with contextlib.suppress(Exception):
            nvml.nvmlShutdown()


def amdsmi_facts(loader: ModuleLoader | None = None) -> list[dict[str, Any]]:
    from april_bench.telemetry.amd_smi import load_amdsmi

    smi, handles = load_amdsmi(loader)
    try:
        ok, rocm = _try(smi.amdsmi_get_rocm_version) or (False, None)
        facts = []
        for index, h in enumerate(handles):
            vram = _try(smi.amdsmi_get_gpu_vram_usage, h) or {}
            clock = _try(smi.amdsmi_get_clock_info, h, smi.AmdSmiClkType.GFX) or {}
            cap = _try(smi.amdsmi_get_power_cap_info, h) or {}
            driver = _try(smi.amdsmi_get_gpu_driver_info, h) or {}
            total_mib, cap_uw = as_number(vram.get("vram_total")), as_number(cap.get("power_cap"))
            asic = _try(smi.amdsmi_get_gpu_asic_info, h) or {}
            facts.append(
                _facts(
                    index=index,
                    vendor="amd",
                    name=_known(asic.get("market_name")),
                    uuid=_known(_try(smi.amdsmi_get_gpu_device_uuid, h)),
                    driver_version=_known(driver.get("driver_version")),
                    rocm_version=rocm if ok else None,
                    memory_total_bytes=int(total_mib) * 1024 * 1024 if total_mib is not None else None,
                    sm_clock_max_mhz=as_number(clock.get("max_clk")),
                    sm_clock_mhz=as_number(clock.get("clk")),
                    power_limit_w=cap_uw / 1e6 if cap_uw is not None else None,  # uW on bare-metal Linux
                    source="amdsmi",
                )
            )
        return facts
    finally:
        with contextlib.suppress(Exception):
            smi.amdsmi_shut_down()


def torch_facts(loader: ModuleLoader | None = None) -> list[dict[str, Any]]:
    """What ``torch.cuda`` knows (no driver version, clocks or modes); indices are the visible ones."""
    torch = import_quietly("torch", loader)
    if not torch.cuda.is_available():
        raise TelemetryUnavailable("torch sees no GPU")
    hip = getattr(torch.version, "hip", None)
    facts = []
    for index in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(index)
        clock_khz = getattr(props, "clock_rate", None)
        uuid = getattr(props, "uuid", None)
        facts.append(
            _facts(
                index=index,
                vendor="amd" if hip else "nvidia",
                name=props.name,
                uuid=str(uuid) if uuid is not None else None,
                cuda_version=None if hip else torch.version.cuda,
                rocm_version=hip,
                memory_total_bytes=int(props.total_memory),
                sm_clock_max_mhz=clock_khz / 1e3 if clock_khz else None,
                source="torch",
            )
        )
    return facts


_SMI_FIELDS = (
    "index,name,uuid,driver_version,memory.total,clocks.max.sm,clocks.sm,power.limit,"
    "persistence_mode,compute_mode"
)


def nvidia_smi_facts(
    run: Runner = subprocess.run, which: Callable[[str], str | None] = shutil.which
) -> list[dict[str, Any]]:
    """``nvidia-smi --query-gpu=... --format=csv,noheader,nounits`` (memory MiB, clocks MHz, power W)."""
    exe = which("nvidia-smi")
    if exe is None:
        return []
    out = run(
        [exe, f"--query-gpu={_SMI_FIELDS}", "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
        timeout=20,
        check=True,
    ).stdout
    facts = []
    for row in csv.reader(io.StringIO(out), skipinitialspace=True):
        if len(row) != len(_SMI_FIELDS.split(",")):
            continue
        index, name, uuid, driver, mem, max_sm, sm, limit, persistence, mode = (
            _known(v.strip()) for v in row
        )
        mem_mib = _float(mem)
        facts.append(
            _facts(
                index=int(index) if index is not None else None,
                vendor="nvidia",
                name=name,
                uuid=uuid,
                driver_version=driver,
                memory_total_bytes=int(mem_mib) * 1024 * 1024 if mem_mib is not None else None,
                sm_clock_max_mhz=_float(max_sm),
                sm_clock_mhz=_float(sm),
                power_limit_w=_float(limit),
                persistence_mode={"Enabled": True, "Disabled": False}.get(persistence or ""),
                compute_mode=mode.lower() if mode is not None else None,
                source="nvidia-smi",
            )
        )
    return facts


def _facts(**values: Any) -> dict[str, Any]:
    unknown = set(values) - set(FACT_KEYS)
    if unknown:
        raise KeyError(f"not a GPU fact: {sorted(unknown)}")
    return {key: values.get(key) for key in FACT_KEYS}


def _try(query: Callable[..., Any], *args: Any) -> Any:
    """``query(*args)``, or ``None`` when it fails: an unsupported query leaves that fact unknown."""
    try:
        return query(*args)
    except Exception:
        return None


def _text(value: Any) -> str | None:
    if value is None:
        return None
    return value.decode() if isinstance(value, bytes) else str(value)


def _known(value: Any) -> Any:
    """``None`` for the placeholders vendors print for unknown values."""
    if value is None or (isinstance(value, str) and value.strip("[] ") in ("", "N/A", "Not Supported")):
        return None
    return value


def _float(value: str | None) -> float | None:
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None


def gpu_info() -> list[dict[str, Any]]:
    """One dict per GPU for provenance: model, driver, CUDA/ROCm version, memory, max and current SM
    clocks, power limit, persistence and compute mode (keys: :data:`FACT_KEYS`).

    Asks NVML, then AMD SMI, then ``torch.cuda`` (only if a GPU device node exists), then
    ``nvidia-smi``; ``[]`` on a machine without GPUs.  Never raises.
    """
    try:
        return collect_gpu_info(has_gpu_nodes=detect_accelerators().any)
    except Exception:  # provenance must never fail a run
        return []
