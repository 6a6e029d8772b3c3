"""The starting policy is evaluated once per run and repeat: an arm whose engine is built the same way
reuses another arm's step-0 row (``reused_from``) instead of generating the same numbers again."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from april_bench.experiment.session import ArmSession
from april_bench.results.recorder import RunRecorder
from april_bench.results.records import EvalRecord, as_row
from april_bench.strategies import ArmSpec

ARMS = [
    ArmSpec.parse("sync"),
    ArmSpec.parse("april"),
    ArmSpec.parse("april[driver=stale]"),
]


def _row(arm: str, step: int = 0, repeat: int = 0, reused_from: str | None = None) -> EvalRecord:
    return EvalRecord(
        arm, step, step, 1.5, 0.25, 0.01, 40, 12.0, 3.0, {"x": {"accuracy": 0.25}}, repeat, reused_from
    )


def _session(label: str, rows: list[Any], repeat: int = 0) -> Any:
    recorder = RunRecorder()
    for row in rows:
        if isinstance(row, dict):
            recorder.preload({"evals": [row]})  # a resumed run's rows come back as dicts
        else:
            recorder.add(row)
    arm = next(a for a in ARMS if a.label == label)
    events: list[str] = []
    return SimpleNamespace(
        arm=arm,
        config=SimpleNamespace(arms=ARMS),
        recorder=recorder,
        repeat=repeat,
        _origin=0.0,
        _event=lambda step, kind, t: events.append(kind),
    )


def test_an_arm_reuses_the_step_0_row_of_an_arm_with_the_same_engine_and_repeat() -> None:
    shared = ArmSession._shared_start_eval
    assert shared(_session("april", [_row("sync")])) is not None
    assert shared(_session("april", [as_row(_row("sync"))])) is not None  # resumed: a dict row
    assert shared(_session("april", [_row("sync", step=2)])) is None  # not the starting policy
    assert shared(_session("april", [_row("sync", repeat=1)])) is None  # another repeat
    assert shared(_session("april", [_row("april")])) is None  # its own row: never twice
    assert shared(_session("april", [_row("sync", reused_from="x")])) is None  # only evaluated rows
    stale = ARMS[2].label
    assert shared(_session(stale, [_row("sync")])) is None  # an asynchronous arm's engine differs
    assert shared(_session("april", [_row(stale)])) is None


def test_the_reused_row_has_the_numbers_this_arms_clock_and_says_where_they_come_from() -> None:
    session = _session("april", [_row("sync")])

    async def reuse() -> float:
        return ArmSession._reuse_start_eval(session, as_row(_row("sync")))

    assert asyncio.run(reuse()) == 0.25
    first, second = (as_row(r) for r in session.recorder["evals"])
    assert second["arm"] == "april" and second["reused_from"] == "sync" and second["eval_time_s"] == 0.0
    same = ("step", "policy_version", "accuracy", "accuracy_stderr", "n", "mean_response_len", "by_dataset")
    assert [second[k] for k in same] == [first[k] for k in same]
