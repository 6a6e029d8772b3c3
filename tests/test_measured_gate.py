"""The measured CI gate (tox.ini): a short forced-length embedded run against
results/gates/ci-embedded-gate, on its engine work and gains per engine iteration, exactly.  Unchanged
code passes it; an injected scheduling regression fails it; the reference is a forced-length run."""

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


def _gate_rule() -> list[str]:
    """The measured gate's ``compare`` rule, read from tox.ini."""
    for line in (ROOT / "tox.ini").read_text().splitlines():
        if "gate-measured" in line and " compare " in line:
            args = shlex.split(line)
            return args[args.index("--fail") : args.index("--fail") + 2]
    raise AssertionError("tox.ini has no measured gate compare")


def test_the_gate_is_a_forced_length_run_compared_exactly() -> None:
    """Its schedule must not depend on the machine: forced lengths, an exact two-sided rule, and a
    reference written with the same arguments that records the CPU it ran on."""
    import json

    args = _gate_args()
    assert "--length-oracle" in args and _gate_rule() == ["--fail", "iterations:exact"]
    config = json.loads((REFERENCE / "config.json").read_text())
    assert config["length_oracle"] == args[args.index("--length-oracle") + 1]
    provenance = json.loads((REFERENCE / "provenance.json").read_text())
    assert provenance["git"]["dirty"] is False
    assert provenance["command"][2 : provenance["command"].index("--out")] == args
    assert provenance["machine"]["cpu_facts"]["vector_flags"]


@pytest.mark.slow
def test_the_measured_gate_passes_unchanged_code_and_fails_april_resuming_its_partials_last(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("APRIL_BENCH_CACHE", str(tmp_path / "cache"))
    same = tmp_path / "same"
    assert main(["run", *_gate_args(), "--out", str(same), "--no-progress"]) == 0
    assert main(["compare", str(REFERENCE), str(same), *_gate_rule()]) == 0

    april = type(build_strategy("april"))

    def resume_partials_last(self, candidates, count, view):  # type: ignore[no-untyped-def]
        return sorted(candidates, key=lambda c: not c.fresh)[:count]

    monkeypatch.setattr(april, "select", resume_partials_last)
    regressed = tmp_path / "regressed"
    assert main(["run", *_gate_args(), "--out", str(regressed), "--no-progress"]) == 0
    capsys.readouterr()
    assert main(["compare", str(REFERENCE), str(regressed), *_gate_rule()]) == 1
    assert "CHANGED" in capsys.readouterr().out
