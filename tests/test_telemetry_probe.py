"""benchmarks/telemetry_probe.py runs end to end against a fake NVML (installed as ``pynvml``)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest
from fakes import fake_pynvml
from fakes.fake_pynvml import FakeNvidiaGpu

PROBE = Path(__file__).resolve().parents[1] / "benchmarks" / "telemetry_probe.py"


def load_probe() -> ModuleType:
    spec = importlib.util.spec_from_file_location("telemetry_probe", PROBE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_probe_reports_constant_fake_readings_exactly(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    gpu = FakeNvidiaGpu(
        util=(50, 10), sm_clock_mhz=1500, power_mw=300_000, energy_mj=7_000_000, mem_used=2**30
    )
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml.make([gpu]))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert load_probe().main(["--seconds", "0.3", "--rate", "50"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "GPUs (1):"
    assert out[2] == "GPU telemetry via nvml on 0:NVIDIA H100 80GB HBM3"
    report = json.loads(out[-1])
    assert (report["kind"], report["backend"], report["field_errors"]) == ("measured", "nvml", [])
    assert report["gpus"][0]["name"] == "NVIDIA H100 80GB HBM3"
    device = report["devices"]["0"]
    assert device["rows"] >= 2
    assert (device["util_mean"], device["power_mean_w"]) == (50.0, 300.0)
    assert device["sm_clock_mean_mhz"] == pytest.approx(1500.0)
    assert (device["mem_peak_bytes"], device["energy_counter_j"]) == (2**30, 0.0)


def test_probe_rejects_a_bad_rate_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert load_probe().main(["--rate", "0"]) == 2
    assert capsys.readouterr().err == "error: --telemetry-rate must be in (0, 100] Hz, got 0\n"
