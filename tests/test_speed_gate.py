"""``benchmarks/speed_gate.py``: the simulator's requests per CPU second over a reference loop's operations
per CPU second, against a committed ratio.  A slowdown injected into the simulator's per-request path
fails the gate; the same code without it passes."""

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


@pytest.mark.slow  # three gate runs, one of them slowed down: about 6 CPU seconds
def test_an_injected_slowdown_fails_the_gate_and_the_same_code_without_it_passes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from april_bench.engines.sim.replica import SimReplica

    gate = _gate()
    reference = tmp_path / "speed_gate.json"
    # the reference measured here, in this process, so the test holds on any machine
    assert gate.main(["--update", "--reference", str(reference), "--repeats", "2"]) == 0
    assert gate.main(["--reference", str(reference), "--repeats", "2"]) == 0
    assert capsys.readouterr().out.rstrip().endswith(": pass")

    deliver = SimReplica._deliver

    def slow_deliver(self: Any, *args: Any, **kwargs: Any) -> None:  # 0.3 ms of CPU per request
        until = time.process_time() + 3e-4
        while time.process_time() < until:
            pass
        deliver(self, *args, **kwargs)

    monkeypatch.setattr(SimReplica, "_deliver", slow_deliver)
    assert gate.main(["--reference", str(reference), "--repeats", "2"]) == 1
    assert "FAIL: below 50% of the reference" in capsys.readouterr().out


def test_the_committed_reference_is_a_ratio_and_a_missing_one_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    gate = _gate()
    committed = json.loads(gate.REFERENCE.read_text(encoding="utf-8"))
    assert committed["ratio"] > 0 and committed["floor"] == gate.FLOOR == 0.5
    assert committed["measured"]["simulated_requests"] > 0  # what the ratio was measured on
    assert gate.main(["--reference", str(tmp_path / "none.json"), "--repeats", "1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "--update" in err and "Traceback" not in err
