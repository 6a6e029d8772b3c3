"""The fakes against the real vendor packages, and the sampler on a real GPU (``gpu`` marker)."""

from __future__ import annotations

import ast
import importlib.util
import time
from pathlib import Path

import pytest
from fakes import fake_amdsmi, fake_pynvml

from april_bench.telemetry import ListSink, TelemetryConfig, TelemetryRecord
from april_bench.telemetry.gpu_facts import gpu_info


def test_every_pynvml_name_the_fake_defines_exists_in_the_real_module() -> None:
    pynvml = pytest.importorskip("pynvml", reason="nvidia-ml-py not installed")
    assert [name for name in fake_pynvml.API if not hasattr(pynvml, name)] == []
    assert (pynvml.NVML_CLOCK_SM, pynvml.NVML_ERROR_NOT_SUPPORTED) == (
        1,
        fake_pynvml.NVML_ERROR_NOT_SUPPORTED,
    )


def test_every_amdsmi_name_the_fake_defines_is_exported_by_the_real_package() -> None:
    # ``import amdsmi`` fails without libamd_smi.so, so read the package's exports from its source
    spec = importlib.util.find_spec("amdsmi")
    if spec is None or spec.origin is None:
        pytest.skip("amdsmi not installed")
    tree = ast.parse(Path(spec.origin).read_text())
    exported = {
        alias.asname or alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
    }
    assert [name for name in fake_amdsmi.API if name not in exported] == []


@pytest.mark.gpu
def test_the_sampler_reads_this_gpu() -> None:
    sink: ListSink[TelemetryRecord] = ListSink()
    with TelemetryConfig(rate_hz=20.0).build(sink=sink) as sampler:
        assert sampler.available, sampler.reason
        time.sleep(1.0)
    rows = sink.snapshot()
    for device, _ in sampler.devices:
        mine = [r for r in rows if r.device == device]
        assert len(mine) >= 5
        assert all(r.mem_total_bytes and r.mem_total_bytes > 0 for r in mine)
        assert all(r.util_gpu is None or 0 <= r.util_gpu <= 100 for r in mine)
        energy = [r.energy_j for r in mine if r.energy_j is not None]
        assert energy == sorted(energy)


@pytest.mark.gpu
def test_gpu_info_names_every_gpu_here() -> None:
    facts = gpu_info()
    assert facts and all(
        f["name"] and f["source"] in ("nvml", "amdsmi", "torch", "nvidia-smi") for f in facts
    )
