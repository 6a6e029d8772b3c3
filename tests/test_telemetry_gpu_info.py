"""GPU facts for provenance, from fake NVML, AMD SMI, torch and nvidia-smi: exact dicts."""

from __future__ import annotations

import subprocess
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest
from fakes import fake_amdsmi, fake_pynvml, loader_for
from fakes.fake_amdsmi import FakeAmdGpu
from fakes.fake_pynvml import NOT_SUPPORTED, FakeNvidiaGpu

from april_bench.telemetry.gpu_facts import FACT_KEYS, collect_gpu_info, gpu_info

NO_SMI = {"which": lambda _name: None}


def test_nvml_facts_are_converted_to_bytes_watts_and_named_modes() -> None:
    gpus = [
        FakeNvidiaGpu(
            uuid="GPU-aa", sm_clock_mhz=1755, power_limit_mw=700_000, persistence=1, compute_mode=0
        ),
        FakeNvidiaGpu(uuid="GPU-bb", persistence=NOT_SUPPORTED, compute_mode=3, power_limit_mw=NOT_SUPPORTED),
    ]
    nvml = fake_pynvml.make(gpus, driver="550.54.15", cuda=12040)
    facts = collect_gpu_info(loader=loader_for({"pynvml": nvml}), **NO_SMI)
    assert facts == [
        {
            "index": 0,
            "vendor": "nvidia",
            "name": "NVIDIA H100 80GB HBM3",
            "uuid": "GPU-aa",
            "driver_version": "550.54.15",
            "cuda_version": "12.4",
            "rocm_version": None,
            "memory_total_bytes": 85_520_809_984,
            "sm_clock_max_mhz": 1980,
            "sm_clock_mhz": 1755,
            "power_limit_w": 700.0,
            "persistence_mode": True,
            "compute_mode": "default",
            "source": "nvml",
        },
        {
            "index": 1,
            "vendor": "nvidia",
            "name": "NVIDIA H100 80GB HBM3",
            "uuid": "GPU-bb",
            "driver_version": "550.54.15",
            "cuda_version": "12.4",
            "rocm_version": None,
            "memory_total_bytes": 85_520_809_984,
            "sm_clock_max_mhz": 1980,
            "sm_clock_mhz": 1980,
            "power_limit_w": None,
            "persistence_mode": None,
            "compute_mode": "exclusive_process",
            "source": "nvml",
        },
    ]
    assert nvml.state.initialised == 0  # type: ignore[attr-defined]


def test_amdsmi_facts_when_nvml_has_no_driver() -> None:
    nvml = fake_pynvml.make([], init_error=fake_pynvml.NVML_ERROR_DRIVER_NOT_LOADED)
    smi = fake_amdsmi.make([FakeAmdGpu(gfx_clock_mhz=1300)], driver="6.8.5", rocm="6.4.1")
    facts = collect_gpu_info(loader=loader_for({"pynvml": nvml, "amdsmi": smi}), **NO_SMI)
    assert facts == [
        {
            "index": 0,
            "vendor": "amd",
            "name": "AMD Instinct MI300X",
            "uuid": "a1ff74a1-0000-1000-80d9-9bf1e3a2d6e7",
            "driver_version": "6.8.5",
            "cuda_version": None,
            "rocm_version": "6.4.1",
            "memory_total_bytes": 196_592 * 1024 * 1024,
            "sm_clock_max_mhz": 2100.0,
            "sm_clock_mhz": 1300.0,
            "power_limit_w": 750.0,
            "persistence_mode": None,
            "compute_mode": None,
            "source": "amdsmi",
        }
    ]
    assert smi.state.shutdowns == 1  # type: ignore[attr-defined]


def fake_torch(*, hip: str | None = None) -> ModuleType:
    torch = ModuleType("torch")
    props = SimpleNamespace(
        name="NVIDIA H200", total_memory=150_754_820_096, clock_rate=1_980_000, uuid="5e2d-11"
    )
    torch.cuda = SimpleNamespace(  # type: ignore[attr-defined]
        is_available=lambda: True, device_count=lambda: 1, get_device_properties=lambda i: props
    )
    torch.version = SimpleNamespace(cuda="12.8", hip=hip)  # type: ignore[attr-defined]
    return torch


def test_torch_facts_only_when_a_gpu_device_node_exists() -> None:
    loader = loader_for({"torch": fake_torch()})
    assert collect_gpu_info(loader=loader, has_gpu_nodes=False, **NO_SMI) == []
    (facts,) = collect_gpu_info(loader=loader, has_gpu_nodes=True, **NO_SMI)
    assert facts == dict.fromkeys(FACT_KEYS) | {
        "index": 0,
        "vendor": "nvidia",
        "name": "NVIDIA H200",
        "uuid": "5e2d-11",
        "cuda_version": "12.8",
        "memory_total_bytes": 150_754_820_096,
        "sm_clock_max_mhz": 1980.0,
        "source": "torch",
    }


SMI_CSV = (
    "0, NVIDIA H100 80GB HBM3, GPU-aa, 550.54.15, 81559, 1980, 1755, 700.00, Enabled, Default\n"
    "1, NVIDIA H100 80GB HBM3, GPU-bb, 550.54.15, 81559, 1980, [N/A], [N/A], Disabled, Exclusive_Process\n"
)


def test_nvidia_smi_csv_is_the_last_resort_and_unknown_fields_are_none() -> None:
    calls: list[list[str]] = []

    def run(cmd: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
        calls.append(cmd)
        return subprocess.CompletedProcess(cmd, 0, stdout=SMI_CSV, stderr="")

    facts = collect_gpu_info(loader=loader_for({}), run=run, which=lambda name: f"/usr/bin/{name}")
    assert calls == [
        [
            "/usr/bin/nvidia-smi",
            "--query-gpu=index,name,uuid,driver_version,memory.total,clocks.max.sm,clocks.sm,power.limit,"
            "persistence_mode,compute_mode",
            "--format=csv,noheader,nounits",
        ]
    ]
    assert [f["source"] for f in facts] == ["nvidia-smi", "nvidia-smi"]
    assert facts[0] | {"source": None} == dict.fromkeys(FACT_KEYS) | {
        "index": 0,
        "vendor": "nvidia",
        "name": "NVIDIA H100 80GB HBM3",
        "uuid": "GPU-aa",
        "driver_version": "550.54.15",
        "memory_total_bytes": 81559 * 1024 * 1024,
        "sm_clock_max_mhz": 1980.0,
        "sm_clock_mhz": 1755.0,
        "power_limit_w": 700.0,
        "persistence_mode": True,
        "compute_mode": "default",
    }
    assert (facts[1]["sm_clock_mhz"], facts[1]["power_limit_w"], facts[1]["persistence_mode"]) == (
        None,
        None,
        False,
    )
    assert facts[1]["compute_mode"] == "exclusive_process"


def test_no_source_answers_gives_an_empty_list_and_a_failing_source_never_raises() -> None:
    def run(cmd: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
        raise subprocess.TimeoutExpired(cmd, 20)

    assert collect_gpu_info(loader=loader_for({}), run=run, which=lambda name: "/bin/" + name) == []

    def explode(name: str) -> ModuleType:
        raise RuntimeError("ctypes blew up")

    assert collect_gpu_info(loader=explode, has_gpu_nodes=True, **NO_SMI) == []


def test_machine_gpu_info_swallows_any_failure(monkeypatch: pytest.MonkeyPatch) -> None:
    from april_bench.telemetry import gpu_facts

    def broken(**kwargs: Any) -> list[dict[str, Any]]:
        raise MemoryError("out of memory while probing")

    monkeypatch.setattr(gpu_facts, "collect_gpu_info", broken)
    assert gpu_info() == []
