"""The measured CI gate (tox.ini): a short embedded run against results/gates/ci-embedded-gate, on the
gains per engine iteration.  Unchanged code passes it; an injected scheduling regression fails it."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from april_bench.cli import main
from april_bench.strategies import build_strategy

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = ROOT / "results" / "gates" / "ci-embedded-gate"


def _gate_args() -> list[str]:
    """The measured gate's ``run`` arguments, read from tox.ini (one source of truth)."""
    for line in (ROOT / "tox.ini").read_text().splitlines():
        if "gate-measured" in line and " run " in line:
            args = shlex.split(line.split(" run ", 1)[1])
            return args[: args.index("--out")]
    raise AssertionError("tox.ini has no measured gate run")


@pytest.mark.slow
def test_the_measured_gate_passes_unchanged_code_and_fails_april_resuming_its_partials_last(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("APRIL_BENCH_CACHE", str(tmp_path / "cache"))
    same = tmp_path / "same"
    assert main(["run", *_gate_args(), "--out", str(same), "--no-progress"]) == 0
    assert main(["compare", str(REFERENCE), str(same), "--fail", "iterations:0"]) == 0

    april = type(build_strategy("april"))

    def resume_partials_last(self, candidates, count, view):  # type: ignore[no-untyped-def]
        return sorted(candidates, key=lambda c: not c.fresh)[:count]

    monkeypatch.setattr(april, "select", resume_partials_last)
    regressed = tmp_path / "regressed"
    assert main(["run", *_gate_args(), "--out", str(regressed), "--no-progress"]) == 0
    capsys.readouterr()
    assert main(["compare", str(REFERENCE), str(regressed), "--fail", "iterations:0"]) == 1
    assert "REGRESSED" in capsys.readouterr().out
