"""What a user sees on ``--resume``: bars from the saved step, a resume line per arm, a status that
says running (not the old interrupt) while the run goes on."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
from helpers import interrupt_at, sim_flags

from april_bench.cli import main

SIM = sim_flags(over_sampling_batch_size=None, max_response_len=None, no_progress=None)
SIM += ["--over-sampling-batch-size", "8", "--max-response-len", "2048", "--strategies", "sync,april"]


def test_resume_shows_saved_steps_and_a_running_status(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from april_bench import experiment

    out = tmp_path / "run"
    with interrupt_at(1, "april"):
        assert main(["run", *SIM, "--no-progress", "--out", str(out)]) == 130
    original = experiment.ArmSession._step
    assert json.loads((out / "status.json").read_text())["message"] == "stopped by SIGINT"
    seen: list[dict[str, Any]] = []

    async def watched(self: Any, s: int) -> None:
        seen.append(json.loads((out / "status.json").read_text()))
        await original(self, s)

    monkeypatch.setattr(experiment.ArmSession, "_step", watched)
    capsys.readouterr()
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)  # bars are drawn on a terminal only
    assert main(["run", "--resume", str(out)]) == 0  # progress bars on
    err = capsys.readouterr().err
    assert "resuming" in err and "4 of 6 steps saved: sync 3/3, april 1/3" in err
    lines = err.replace("\r", "\n").splitlines()
    april_bar = [line for line in lines if "april |" in line or "april:" in line]
    assert april_bar and "1/3" in april_bar[0], april_bar  # the bar starts at the saved step, not 0
    assert not any(" 0/3" in line for line in april_bar)
    assert seen and all(s["state"] == "running" and s["message"] == "" for s in seen)
