"""``benchmarks/speed_gate.py``: the simulator's requests per CPU second and the paper table's simulated
steps per CPU second, each over a reference loop's operations per CPU second, against committed ratios.
A slowdown injected into the simulator's per-request path fails the gate; one injected into an agent
turn fails the paper table's ratio alone; the same code without either passes."""

from __future__ import annotations

import importlib.util
import json
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _gate() -> ModuleType:
    spec = importlib.util.spec_from_file_location("speed_gate", ROOT / "benchmarks" / "speed_gate.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow  # four gate runs, two of them slowed down: about 40 s on 2 loaded cores
def test_an_injected_slowdown_fails_the_gate_and_the_same_code_without_it_passes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from april_bench.engines.sim.replica import SimReplica

    gate = _gate()
    reference = tmp_path / "speed_gate.json"
    # the reference measured here, in this process, so the test holds on any machine
    assert gate.main(["--update", "--reference", str(reference), "--repeats", "2"]) == 0
    # Two repeats on a loaded machine can differ by half: the test's reference is two thirds of what was
    # measured, so the same code fails only below a third of it, and each injected slowdown (5x or more)
    # still does.
    measured = json.loads(reference.read_text(encoding="utf-8"))
    for key, _ in gate.GATED:
        measured[key] *= 2 / 3
    reference.write_text(json.dumps(measured), encoding="utf-8")
    assert gate.main(["--reference", str(reference), "--repeats", "2"]) == 0
    verdicts = capsys.readouterr().out.splitlines()[-2:]
    assert [line.split(":")[0] for line in verdicts] == ["the simulator", "the paper table's agent cell"]
    assert all(line.endswith(": pass") for line in verdicts)

    from april_bench.rollout import episodes

    turn_action = episodes.turn_action

    def slow_turn(*args: Any, **kwargs: Any) -> Any:  # 0.6 ms of CPU per tool call (about 5x a turn)
        until = time.process_time() + 6e-4
        while time.process_time() < until:
            pass
        return turn_action(*args, **kwargs)

    with monkeypatch.context() as patch:
        patch.setattr(episodes, "turn_action", slow_turn)
        assert gate.main(["--reference", str(reference), "--repeats", "2"]) == 1
    simulator, table = capsys.readouterr().out.splitlines()[-2:]
    assert simulator.endswith(": pass")  # the plain simulated run has no tool turns
    assert table.startswith("the paper table's agent cell") and "FAIL: below 50% of the reference" in table

    deliver = SimReplica._deliver

    def slow_deliver(self: Any, *args: Any, **kwargs: Any) -> None:  # 0.3 ms of CPU per request
        until = time.process_time() + 3e-4
        while time.process_time() < until:
            pass
        deliver(self, *args, **kwargs)

    monkeypatch.setattr(SimReplica, "_deliver", slow_deliver)
    assert gate.main(["--reference", str(reference), "--repeats", "2"]) == 1
    simulator = capsys.readouterr().out.splitlines()[-2]
    assert simulator.startswith("the simulator") and "FAIL: below 50% of the reference" in simulator


def test_the_committed_reference_is_a_ratio_and_a_missing_one_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    gate = _gate()
    committed = json.loads(gate.REFERENCE.read_text(encoding="utf-8"))
    assert committed["ratio"] > 0 and committed["paper_table_ratio"] > 0
    assert committed["floor"] == gate.FLOOR == 0.5
    assert committed["measured"]["simulated_requests"] > 0  # what the ratios were measured on
    assert committed["measured"]["paper_table_steps"] == gate.AGENT_CELL[3] * 2
    assert gate.main(["--reference", str(tmp_path / "none.json"), "--repeats", "1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "--update" in err and "Traceback" not in err


def test_a_reference_without_the_paper_tables_ratio_is_one_line_naming_update(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    gate = _gate()
    old = tmp_path / "old.json"  # a reference written before the paper table's ratio was gated
    old.write_text(json.dumps({"ratio": 0.0155, "floor": 0.5}), encoding="utf-8")
    assert gate.main(["--reference", str(old), "--repeats", "1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "paper_table_ratio" in err and "--update" in err
