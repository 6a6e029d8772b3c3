"""Texts a user reads (issue 35): each was wrong once."""

from __future__ import annotations

import importlib.util

import pytest

from april_bench.cli import main
from april_bench.results.compare import points


@pytest.mark.parametrize(
    ("change", "sign", "text"),
    [(0.0, True, "+0.00"), (0.1234, True, "+12.34"), (-3e-5, True, "-3.0e-03"), (3e-5, False, "3.0e-03")],
)
def test_a_change_that_two_decimals_round_to_zero_still_shows(change: float, sign: bool, text: str) -> None:
    assert points(change, sign=sign) == text


def test_compare_help_prints_a_plain_percent_sign(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["compare", "--help"]) == 0
    out = capsys.readouterr().out
    assert "95%" in out and "%%" not in out


def test_ls_engines_says_whether_sglang_can_launch_here(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["ls", "engines"]) == 0
    lines = capsys.readouterr().out.splitlines()
    status = lines[[line.split()[0] if line.strip() else "" for line in lines].index("sglang") + 1]
    if importlib.util.find_spec("sglang") is None:
        assert "cannot launch a server" in status and "--engine-url" in status
    else:
        assert status.strip() == "installed here"


def test_run_help_names_the_april_caps_default(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "--help"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "ls strategies`)" not in out
    assert "unlimited" in out


def test_the_gpu_library_hint_only_where_a_gpu_lacks_its_library(monkeypatch: pytest.MonkeyPatch) -> None:
    from april_bench import machine
    from april_bench.telemetry.sampler import TelemetryConfig, check_backend

    monkeypatch.setattr(machine, "detect_accelerators", lambda: machine.Accelerators(nvidia=0, amd=0))
    assert check_backend(TelemetryConfig()) == ""  # a CPU machine: nothing to say
    monkeypatch.setattr(machine, "detect_accelerators", lambda: machine.Accelerators(nvidia=1, amd=0))
    note = check_backend(TelemetryConfig())
    if importlib.util.find_spec("pynvml") is None:
        assert "pip install 'april-bench[nvidia]'" in note  # a GPU without NVML: the hint


def _sim_run(tmp_path, *extra: str) -> list[str]:
    from helpers import sim_flags

    return ["run", *sim_flags(), "--strategies", "sync,april", "--out", str(tmp_path / "run"), *extra]


def test_no_progress_bars_or_control_characters_off_a_terminal(tmp_path, capsys) -> None:
    assert main(_sim_run(tmp_path)) == 0
    captured = capsys.readouterr()
    assert "\r" not in captured.err and "\x1b" not in captured.err
    assert "step/s" not in captured.err


def test_log_level_quiets_what_is_said_along_the_way(tmp_path, capsys, monkeypatch) -> None:
    assert main(_sim_run(tmp_path, "--log-level", "warning")) == 0
    captured = capsys.readouterr()
    assert captured.err == ""
    assert "## Results: SIMULATED" in captured.out  # the product still goes to stdout
    monkeypatch.setenv("APRIL_BENCH_LOG_LEVEL", "error")
    assert main(_sim_run(tmp_path / "b")) == 0
    assert capsys.readouterr().err == ""
    monkeypatch.setenv("APRIL_BENCH_LOG_LEVEL", "loud")
    assert main(["ls", "engines"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: APRIL_BENCH_LOG_LEVEL='loud'") and "Traceback" not in err
