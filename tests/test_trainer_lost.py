"""A failure the run cannot survive (its trainer died) ends it as interrupted with the resume line, exit
75 and ``status.json`` saying why, never a traceback; ``run --resume`` then finishes it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from helpers import embedded_flags, sim_flags, table_rows

from april_bench.cli import main
from april_bench.trainers.protocol import TrainerLost

SIM = sim_flags(strategies="sync,april")


def _check_interrupted(out: Path, err: str) -> None:
    assert "Traceback" not in err, err
    assert "trainer actor died" in err and f"run --resume {out}" in err
    status = json.loads((out / "status.json").read_text())
    assert status["state"] == "interrupted" and "trainer_lost" in status["message"], status


def _steps(out: Path) -> list[tuple[str, int]]:
    rows = table_rows(out, "steps")
    return sorted((r["arm"], r["step"]) for r in rows)


def test_a_dead_trainer_interrupts_the_run_and_resume_finishes_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from april_bench.trainers.sim import SimTrainer

    original = SimTrainer.train

    async def dies(self: Any, batch: Any, *, step: int, policy_version: int) -> Any:
        if step == 1:
            raise TrainerLost("the Ray trainer actor died (train: ActorDiedError: killed by the test)")
        return await original(self, batch, step=step, policy_version=policy_version)

    out = tmp_path / "run"
    monkeypatch.setattr(SimTrainer, "train", dies)
    assert main(["run", *SIM, "--out", str(out)]) == 75
    _check_interrupted(out, capsys.readouterr().err)
    assert _steps(out) == [("sync", 0)]  # the first arm's step 0 is saved; its step 1 died in training
    monkeypatch.setattr(SimTrainer, "train", original)
    assert main(["run", "--resume", str(out), "--no-progress"]) == 0
    assert _steps(out) == [(arm, s) for arm in ("april", "sync") for s in range(3)]
    assert json.loads((out / "status.json").read_text())["state"] == "complete"


# ---------------------------------------------------------------- a real Ray trainer actor killed


@pytest.mark.slow
@pytest.mark.ray
def test_a_killed_ray_trainer_actor_interrupts_the_run(
    ray_cluster: list[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    import ray

    from april_bench.trainers.ray_actor import RayTrainer

    original = RayTrainer.train

    async def killed_at_step_1(self: Any, batch: Any, *, step: int, policy_version: int) -> Any:
        if step == 1:
            ray.kill(self._actor)  # the actor process dies: its pending and later calls fail
        return await original(self, batch, step=step, policy_version=policy_version)

    out = tmp_path / "run"
    argv = embedded_flags(
        trainer="ray",
        trainer_arg="num_cpus=0.25",
        strategies="sync",
        rollout_batch_size=2,
        n_samples_per_prompt=2,
        over_sampling_batch_size=None,
        eval_every=100,
        max_response_len=16,
        warmstart_arg="steps=5",
        task_arg="max_n=30",
    )
    monkeypatch.setattr(RayTrainer, "train", killed_at_step_1)
    assert main(["run", *argv, "--out", str(out)]) == 75
    _check_interrupted(out, capsys.readouterr().err)
    assert _steps(out) == [("sync", 0)]
    monkeypatch.setattr(RayTrainer, "train", original)
    assert main(["run", "--resume", str(out), "--no-progress"]) == 0  # a new trainer actor
    assert _steps(out) == [("sync", s) for s in range(3)]
