"""Telemetry in a measured run: one sampler for the run, rows on the event clock, GPU metrics per arm.

The engine is the sglang adapter over the fake SGLang server (real time, on this CPU); NVML is the
hand-written fake module, so the rows and the busy share are exact.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from fakes import fake_pynvml
from helpers import flags, table_rows, tiny_sim_flags

from april_bench.cli import main

RUN = [
    "run",
    *flags(
        engine="sglang-fake",
        hw="cpu",
        dataset="deepscaler",
        model="qwen3-4b",
        steps=2,
        rollout_batch_size=2,
        n_samples_per_prompt=2,
        over_sampling_batch_size=4,
        max_response_len=64,
        no_progress=True,
    ),
]


def test_a_measured_run_records_telemetry_and_reports_gpu_time_per_arm(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # Hopper's GPM: 30% of SMs active and 45% of DRAM bandwidth, while utilisation reads 75%
    gpu = fake_pynvml.FakeNvidiaGpu(util=(75, 20), power_mw=300_000, gpm=(30.0, 12.0, 45.0))
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml.make([gpu]))
    out = tmp_path / "run"
    assert main([*RUN, "--telemetry", "nvml", "--telemetry-rate", "50", "--out", str(out)]) == 0
    rows = table_rows(out, "telemetry")
    assert len(rows) >= 2 and {r["device"] for r in rows} == {0}
    assert {r["util_gpu"] for r in rows} == {75} and {r["power_w"] for r in rows} == {300.0}
    events = table_rows(out, "events")
    t_events = [e["t"] for e in events]
    assert min(r["t"] for r in rows) <= min(t_events) and max(r["t"] for r in rows) >= max(t_events)
    arms = json.loads((out / "summary.json").read_text())["arms"]
    for arm in ("sync", "april"):
        gpu = arms[arm]["gpu"]
        assert gpu["gpus"] == 1 and gpu["rollout_coverage"] == 1.0
        assert gpu["rollout_busy_share"] == pytest.approx(0.75)  # a constant 75% utilisation
        assert gpu["rollout_energy_j"] == 0.0  # the fake's energy counter never moves
        assert (gpu["rollout_sm_active"], gpu["rollout_dram_bw"]) == pytest.approx((0.30, 0.45))
    # the GPU table of table.md (and of the printed report: the same text), one row per arm and phase
    table = (out / "table.md").read_text()
    assert "### GPU: busy share, idle GPU-seconds and energy per arm and phase (simulated" in table
    gpu_rows = [line for line in table.splitlines() if line.startswith(("| sync ", "| april "))]
    rollout = [r.split("|")[3].strip() for r in gpu_rows if r.split("|")[2].strip() == "rollout"]
    assert rollout == ["75%", "75%"]  # the fake GPU's constant utilisation, for both arms
    gpm = [(r.split("|")[8].strip(), r.split("|")[9].strip()) for r in gpu_rows if "rollout" in r]
    assert gpm == [("30%", "45%"), ("30%", "45%")]  # SM active and DRAM BW beside the busy share
    steps = [r for r in gpu_rows if r.split("|")[2].strip() == "step"]
    assert len(steps) == 2 and all(r.split("|")[6].strip() == "0.0000" for r in steps)  # no energy moved
    assert "### GPU" in capsys.readouterr().out
    provenance = json.loads((out / "provenance.json").read_text())
    facts = provenance["machine"]["gpus"]  # read through the same (fake) NVML
    assert len(facts) == 1 and "H100" in str(facts[0].get("model", facts[0]))


def test_telemetry_off_records_nothing_and_a_simulated_run_never_samples(tmp_path: Path) -> None:
    assert main([*RUN, "--telemetry", "off", "--out", str(tmp_path / "off")]) == 0
    assert (tmp_path / "off" / "telemetry.jsonl").read_text() == ""
    assert main(["run", *tiny_sim_flags(), "--out", str(tmp_path / "sim")]) == 0
    assert (tmp_path / "sim" / "telemetry.jsonl").read_text() == ""
