"""The asynchronous drivers through the CLI on the simulator: every arm conserves prompts and tokens,
keeps its staleness bound, and an interrupted run resumes with the rows of an uninterrupted one (an
asynchronous arm, whose in-flight state no checkpoint holds, by running again from step 0)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from helpers import comparable_rows, sim_flags

from april_bench.cli import main
from april_bench.results.store import check_run, load_run

SIM = sim_flags(steps=4)
ONE_STEP_OFF = "sync[driver=one-step-off]"
STALE_SYNC = "sync[driver=stale,max_staleness=2]"
STALE_APRIL = "april[driver=stale,max_staleness=1]"
STALE_APRIL2 = "april[driver=stale,max_staleness=2]"
ARMS = f"sync,{ONE_STEP_OFF},april[driver=one-step-off],{STALE_SYNC},{STALE_APRIL},{STALE_APRIL2}"


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("async") / "run"
    assert main(["run", *SIM, "--strategies", ARMS, "--out", str(out)]) == 0
    return out


def test_every_async_arm_conserves_prompts_and_tokens_and_keeps_its_bound(uninterrupted: Path) -> None:
    run = load_run(uninterrupted)
    assert check_run(run) == []  # the token balance of every arm adds up
    summary = run.summary()
    for arm, m in summary.items():
        p = m["prompts"]
        assert p["inconsistent"] == 0 and p["launched"] == p["trained"] + p["dropped"] + p["buffered"], arm
    assert summary[ONE_STEP_OFF]["max_staleness"] == 1 and summary[ONE_STEP_OFF]["max_version_span"] == 0
    assert summary[STALE_SYNC]["max_version_span"] == 0  # drain: a request never mixes versions
    assert summary[STALE_APRIL]["max_staleness"] <= 1 and summary[STALE_APRIL2]["max_staleness"] <= 2
    assert summary[STALE_APRIL2]["max_version_span"] >= 1  # updates landed on requests in flight


def test_async_step_times_add_up_to_the_session_and_phases_overlap(uninterrupted: Path) -> None:
    run = load_run(uninterrupted)
    for arm in (ONE_STEP_OFF, STALE_APRIL2):
        steps = sorted((s for s in run.rows("steps") if s["arm"] == arm), key=lambda s: s["step"])
        events = [e for e in run.rows("events") if e["arm"] == arm]
        end = max(e["t"] for e in events if e["kind"] == "weight_sync_end")
        assert sum(s["step_time_s"] for s in steps) == pytest.approx(end - steps[0]["t_start"])
        starts = {e["step"]: e["t"] for e in events if e["kind"] == "rollout_start"}
        trains = {e["step"]: e["t"] for e in events if e["kind"] == "train_end"}
        assert any(starts[k + 1] < trains[k] for k in range(3)), arm  # rollout k+1 overlaps train k


def test_async_arms_on_the_simulator_split_the_node(uninterrupted: Path) -> None:
    steps = load_run(uninterrupted).rows("steps")
    sync_train = [s["train_time_s"] for s in steps if s["arm"] == "sync"]
    async_train = [s["train_time_s"] for s in steps if s["arm"] == ONE_STEP_OFF]
    # a quarter of the node trains: 4x the colocated time for a batch of the same size
    ratio = sum(async_train) / sum(sync_train)
    assert 3.0 < ratio < 5.5


def test_an_interrupted_async_arm_restarts_and_the_run_matches_an_uninterrupted_one(
    uninterrupted: Path, tmp_path: Path, monkeypatch, capsys
) -> None:
    from april_bench import experiment

    original = experiment.ArmSession._complete_pipelined

    def interrupted(self: Any, done: Any, accuracy: Any, bars: Any) -> None:
        if self.arm.label == STALE_APRIL2 and done.step == 2:
            raise KeyboardInterrupt
        original(self, done, accuracy, bars)

    out = tmp_path / "run"
    monkeypatch.setattr(experiment.ArmSession, "_complete_pipelined", interrupted)
    assert main(["run", *SIM, "--strategies", ARMS, "--out", str(out)]) == 130
    capsys.readouterr()
    monkeypatch.setattr(experiment.ArmSession, "_complete_pipelined", original)
    assert main(["run", "--resume", str(out), "--no-progress"]) == 0
    err = capsys.readouterr().err
    assert f"arm {STALE_APRIL2}: driver=stale" in err and "restart from step 0" in err
    for table in ("requests", "samples", "steps", "events"):
        assert comparable_rows(out, table) == comparable_rows(uninterrupted, table), table
    assert check_run(load_run(out)) == []


def test_a_bad_driver_option_is_one_line(capsys) -> None:
    assert main(["run", *SIM, "--strategies", "sync,april[driver=stale,max_staleness=-1]"]) == 2
    err = capsys.readouterr().err
    assert "max_staleness must be >= 0" in err and "Traceback" not in err
    assert main(["run", *SIM, "--strategies", "sync,april[driver=stale,train_gpus=8]"]) == 2
    err = capsys.readouterr().err
    assert "train_gpus" in err and "Traceback" not in err


def test_an_evaluation_drains_the_pipeline_and_is_cut_from_the_clock() -> None:
    import asyncio
    import dataclasses

    from april_bench.backends import build_components
    from april_bench.evaluation import EvalResult
    from april_bench.experiment import run
    from april_bench.experiment_config import ExperimentConfig

    class SlowEvaluator:
        """100 s of the loop's clock per evaluation; it sees the engine idle."""

        def __init__(self) -> None:
            self.idle: list[bool] = []

        async def evaluate(self, engine: Any) -> EvalResult:
            self.idle.append((await engine.load()).idle)
            await asyncio.sleep(100.0)
            return EvalResult(accuracy=0.5, stderr=0.0, n=1, mean_response_len=1.0)

        def longest_prompt(self) -> int:
            return 8

    arm = "april[driver=stale,max_staleness=1]"
    config = ExperimentConfig(engine="fake", strategies=("sync", arm), steps=4, eval_every=2, seed=0).replace(
        rollout=ExperimentConfig().rollout.replace(
            rollout_batch_size=4, n_samples_per_prompt=2, over_sampling_batch_size=8, max_response_len=64
        )
    )
    evaluator = SlowEvaluator()
    components = dataclasses.replace(build_components(config), evaluator=evaluator)
    result = run(config, progress=False, components=components)
    steps = [s for s in result.recorder["steps"] if s.arm == arm]
    assert all(s.step_time_s > 0 for s in steps)
    assert [s.accuracy is not None for s in steps] == [False, True, False, True]
    ends = [e.t for e in result.recorder["events"] if e.arm == arm and e.kind == "weight_sync_end"]
    evals = [e.t for e in result.recorder["events"] if e.arm == arm and e.kind == "eval_end"]
    # from the end of the first evaluation to the last push, the session clock leaves out the one
    # after step 2 (100 s); the one after step 4 comes after the last push
    assert sum(s.step_time_s for s in steps) == pytest.approx(max(ends) - 100.0 - min(evals))
    assert all(evaluator.idle)


def test_an_in_flight_update_on_an_engine_that_cannot_is_refused_before_it_starts(capsys) -> None:
    argv = ["validate", "--engine", "sglang-fake", "--strategies", "sync,april[driver=stale]"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "cannot update weights with requests in flight" in err and "weight_update=drain" in err
    assert "Traceback" not in err
    argv[-1] = "sync,april[driver=stale,weight_update=drain],sync[driver=one-step-off]"
    assert main(argv) == 0


@pytest.mark.parametrize("arm", ["april[driver=stale,max_staleness=2]", "sync[driver=one-step-off]"])
def test_a_rollout_that_stalls_in_an_async_arm_is_one_line_not_a_hang(arm: str, tmp_path: Path) -> None:
    import subprocess
    import sys

    trace = tmp_path / "lengths.jsonl"  # every reward equal: no group passes DAPO's filter
    trace.write_text(
        "".join(json.dumps({"uid": u, "length": 100 + u % 7, "reward": 0}) + "\n" for u in range(64))
    )
    argv = ["run", *SIM, "--algo", "dapo", "--strategies", arm, "--workload-arg", f"length_trace={trace}"]
    proc = subprocess.run(
        [sys.executable, "-m", "april_bench", *argv, "--out", str(tmp_path / "r")],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr and "never retrieved" not in proc.stderr, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "rejected by dynamic sampling" in errors[0]


def test_vllm_updates_in_flight_in_process_and_its_server_variant_does_not() -> None:
    from april_bench.engines import ENGINES

    spec = ENGINES.get("vllm")
    assert spec.updates_in_flight({}) and spec.updates_in_flight({"server": False})
    assert not spec.updates_in_flight({"server": True})
    assert not spec.updates_in_flight({"url": "http://127.0.0.1:8000"})
