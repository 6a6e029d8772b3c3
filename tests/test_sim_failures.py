"""The simulator's replica failures (april_bench/engines/sim/failures.py): the exact schedule of a
failure, its re-queue and restart, what it costs each strategy, and a resumed run meeting the same
failures."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from helpers import interrupt_at, sim_flags, table_rows

from april_bench.cli import main
from april_bench.config import ConfigError
from april_bench.engines.protocol import FaultEvent, GenerateRequest, SamplingParams
from april_bench.engines.sim.engine import SimEngine
from april_bench.engines.sim.failures import FailurePlan
from april_bench.types import FinishReason
from april_bench.vtime import run_virtual

SP = SamplingParams()
RESTART = 30.0


def _engine(gpus: int = 2, **kw: Any) -> SimEngine:
    settings = {"hardware": "h100", "model": "qwen3-4b", "num_gpus": gpus, "tp_size": 1}
    settings.update({"router_policy": "round_robin", "restart_s": RESTART, **kw})
    return SimEngine.Config(**settings).build()


def _requests(n: int, replay: int = 1000) -> list[GenerateRequest]:
    return [
        GenerateRequest(f"r{i}", input_len=100, max_new_tokens=2000, sampling=SP, replay_len=replay)
        for i in range(n)
    ]


def _run(
    engine: SimEngine, requests: list[GenerateRequest], during: Any = None, linger: float = 0.0
) -> tuple[list, list]:
    events: list[FaultEvent] = []
    engine.watch_faults(events.append)

    async def main() -> list:
        await engine.start()
        stream = engine.generate(requests)
        if during is not None:
            await during(engine)
        out = [c async for c in stream]
        await asyncio.sleep(linger)  # the engine idles on: a restart lands
        await engine.close()
        return out

    return run_virtual(main()), events


def test_plan_times_are_the_trace_and_a_seeded_poisson_process_merged() -> None:
    plan = FailurePlan(4, at_s=(50.0, 10.0), rate_per_hour=36.0, seed=1)
    first = [t for t, _ in zip(plan.times(), range(12), strict=False)]
    assert first == sorted(first) and 10.0 in first and 50.0 in first
    assert first == [t for t, _ in zip(plan.times(), range(12), strict=False)]  # a pure function
    other = FailurePlan(4, at_s=(50.0, 10.0), rate_per_hour=36.0, seed=2)
    assert first != [t for t, _ in zip(other.times(), range(12), strict=False)]
    # 360 per replica-hour on 4 replicas: one failure every 2.5 s on average
    many = [t for t, _ in zip(FailurePlan(4, rate_per_hour=360.0).times(), range(4000), strict=False)]
    assert many[-1] / len(many) == pytest.approx(2.5, rel=0.05)
    assert list(FailurePlan(2, at_s=(3.0,)).times()) == [3.0]
    assert not FailurePlan(2).active
    # failure k's victim: a function of (seed, k) and the replicas up, nothing else
    assert plan.victim(5, [0, 2, 3]) == plan.victim(5, [0, 2, 3]) in (0, 2, 3)


def test_a_failure_loses_the_decode_requeues_the_inputs_in_front_and_restarts_the_replica() -> None:
    at = 2.0
    undisturbed, _ = _run(_engine(), _requests(4))
    engine = _engine(failure_at_s=(at,), failure_seed=7)
    out, events = _run(engine, _requests(4), linger=60.0)
    victim = FailurePlan(2, seed=7).victim(0, [0, 1])
    survivor = 1 - victim
    cost = engine.cost
    # round robin: replica 1 got r0 and r2, replica 0 r1 and r3; each prefilled both, then decoded
    prefill = cost.prefill_time([(0, 100), (0, 100)])
    done = cost.iterations_within(2, 202, 999, at - prefill)
    lost_ids = {f"r{i}" for i in range(4) if (i + 1) % 2 == victim}
    assert [(e.kind, e.t, e.replica, e.requests, e.tokens) for e in events] == [
        ("replica_failed", at, victim, 2, 2 * (1 + done)),  # the prefill's token + the decode steps
        ("requests_requeued", at, victim, 2, 200),  # their inputs, prefilled again
        ("replica_restarted", pytest.approx(at + RESTART + engine.weight_sync_time()), victim, None, None),
    ]
    # every request answered once, in full; the victim's on the survivor, and later than undisturbed
    assert sorted(c.request_id for c in out) == [f"r{i}" for i in range(4)]
    assert all((c.num_tokens, c.finish_reason) == (1000, FinishReason.STOP) for c in out)
    before = {c.request_id: c.t_done for c in undisturbed}
    for c in out:
        if c.request_id in lost_ids:
            assert c.replica == survivor and c.t_done > before[c.request_id] + at
    # the survivor's own requests waited for the re-queued ones' prefill (they went in front)
    assert all(c.t_done > before[c.request_id] for c in out if c.request_id not in lost_ids)
    # work of the dead replica stays counted
    assert engine.forward_passes() > 0


def test_an_aborted_request_of_a_dead_replica_comes_back_empty() -> None:
    engine = _engine(gpus=2, failure_at_s=(1e9,))  # the model is on; the failure is triggered by hand

    async def abort_then_fail(e: SimEngine) -> None:
        await asyncio.sleep(2.0)
        await e.abort(["r0"])
        assert e.failures is not None
        e.failures.fail(1, asyncio.get_running_loop().time())  # r0's replica (round robin: 1 first)

    out, events = _run(engine, _requests(2), abort_then_fail)
    by_id = {c.request_id: c for c in out}
    assert (by_id["r0"].num_tokens, by_id["r0"].finish_reason, by_id["r0"].replica) == (
        0,
        FinishReason.ABORT,
        0,
    )
    assert (by_id["r1"].num_tokens, by_id["r1"].finish_reason) == (1000, FinishReason.STOP)
    assert [e.kind for e in events] == ["replica_failed", "requests_requeued"]


def test_with_every_replica_down_the_requests_wait_for_the_restart() -> None:
    at = 1.0
    engine = _engine(gpus=1, failure_at_s=(at,))
    out, events = _run(engine, _requests(2))
    back = at + RESTART + engine.weight_sync_time()
    assert [e.kind for e in events] == ["replica_failed", "requests_requeued", "replica_restarted"]
    assert "none was up" in (events[1].detail or "")
    assert all(c.num_tokens == 1000 and c.t_done > back for c in out)


def test_bad_failure_options_are_one_line_errors() -> None:
    with pytest.raises(ConfigError, match="failure_rate_per_hour must be >= 0"):
        _engine(failure_rate_per_hour=-1.0)
    with pytest.raises(ConfigError, match="failure_at_s must be virtual seconds"):
        _engine(failure_at_s=(-3.0,))
    with pytest.raises(ConfigError, match="restart_s must be >= 0"):
        _engine(restart_s=-1.0)


# ---------------------------------------------------------------- runs: what a failure costs each strategy

SIM = sim_flags(steps=4, strategies="sync,april")
FAILURES = ["--engine-arg", "failure_at_s=[3,25]", "--engine-arg", "restart_s=20"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("failures")
    out = {"undisturbed": root / "undisturbed", "failed": root / "failed", "again": root / "again"}
    assert main(["run", *SIM, "--out", str(out["undisturbed"])]) == 0
    assert main(["run", *SIM, *FAILURES, "--out", str(out["failed"])]) == 0
    assert main(["run", *SIM, *FAILURES, "--out", str(out["again"])]) == 0
    return out


def _summary(run: Path) -> dict[str, Any]:
    return json.loads((run / "summary.json").read_text())["arms"]


def test_a_failed_run_accounts_for_every_prompt_and_prices_the_failure(runs: dict[str, Path]) -> None:
    failed, undisturbed = _summary(runs["failed"]), _summary(runs["undisturbed"])
    events = table_rows(runs["failed"], "events")
    for arm in ("sync", "april"):
        m = failed[arm]
        assert m["prompts"]["inconsistent"] == 0, arm
        assert (
            m["prompts"]["launched"]
            == m["prompts"]["trained"] + m["prompts"]["dropped"] + m["prompts"]["buffered"]
        )
        assert m["generated_tokens"] == m["trained_tokens"] + m["wasted_tokens"] + m["buffered_tokens_at_end"]
        # the summary's failure counts are the events' sums
        rows = [e for e in events if e["arm"] == arm]
        f = m["failures"]
        assert f["replica_failures"] == 2 == sum(e["kind"] == "replica_failed" for e in rows)
        requeued = [e for e in rows if e["kind"] == "requests_requeued"]
        assert f["requeued_requests"] == sum(e["requests"] for e in requeued) > 0
        assert f["requeued_tokens"] == sum(e["tokens"] for e in requeued) > 0
        assert f["lost_decode_tokens"] > 0
        assert undisturbed[arm]["failures"] is None
        # the first failure lands mid-rollout of step 0: that step is slower than undisturbed
        steps = {r["step"]: r for r in table_rows(runs["failed"], "steps") if r["arm"] == arm}
        calm = {r["step"]: r for r in table_rows(runs["undisturbed"], "steps") if r["arm"] == arm}
        assert steps[0]["rollout_time_s"] > calm[0]["rollout_time_s"]
    # trained samples are the same count: a failure changes no prompt's fate in sync
    assert failed["sync"]["trained_tokens"] == undisturbed["sync"]["trained_tokens"]


def test_the_same_failure_plan_gives_the_same_run(runs: dict[str, Path]) -> None:
    for table in ("events", "requests", "steps"):
        a = [{k: v for k, v in r.items() if k != "bookkeeping_s"} for r in table_rows(runs["failed"], table)]
        b = [{k: v for k, v in r.items() if k != "bookkeeping_s"} for r in table_rows(runs["again"], table)]
        assert a == b, table


def test_a_resumed_run_meets_the_same_failures(runs: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "run"
    with interrupt_at(2, "april"):
        assert main(["run", *SIM, *FAILURES, "--out", str(out)]) == 130
    assert main(["run", "--resume", str(out), "--no-progress"]) == 0

    def faults(run: Path) -> list[dict]:
        return [e for e in table_rows(run, "events") if e["kind"].startswith(("replica_", "requests_"))]

    assert sorted(map(json.dumps, faults(out))) == sorted(map(json.dumps, faults(runs["failed"])))


def test_whatif_and_ablate_show_the_failure_cost(tmp_path: Path, capsys) -> None:
    argv = ["whatif", "example", "--strategies", "sync,april", "--drivers", "none", "--steps", "2"]
    assert main([*argv, "--failure-at", "0.05", "--no-progress", "--out", str(tmp_path / "w")]) == 0
    text = capsys.readouterr().out
    assert "Replica failures and their cost (simulated)" in text
    rows = json.loads((tmp_path / "w" / "whatif.json").read_text())["rows"]
    assert all(r["failures"]["replica_failures"] == 1 for r in rows)
    ablate = [
        "ablate",
        *sim_flags(steps=4, no_progress=None),
        "--strategies",
        "sync,april",
        "--ratios",
        "2",
        "--spans",
        "none",
    ]
    ablate += ["--drivers", "none", "--no-progress", *FAILURES, "--out", str(tmp_path / "a")]
    assert main(ablate) == 0
    assert "Replica failures and their cost (simulated)" in capsys.readouterr().out
