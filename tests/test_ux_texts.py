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
