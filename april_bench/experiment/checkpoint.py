"""A session's checkpoint after each completed step, and the resume from it.

The checkpoint is a JSON file per session (``state/<arm>#<repeat>/<steps>.json``, see
:func:`april_bench.results.resume.state_path`) with the rollout loop's, the strategy's and the engine's
state, the clocks, and the trainer's state beside it (``.trainer.pt``).  It is written after the step's
rows are on disk and before ``status.json`` names it, so a run stopped anywhere resumes from a step
whose rows and state agree.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from april_bench.backends.weights import WeightSync
from april_bench.engines.protocol import STATE, Engine
from april_bench.results.resume import RunStatus, state_path
from april_bench.results.store import write_json_atomic
from april_bench.results.validate_files import load_trainer_state, read_checkpoint, save_trainer_state
from april_bench.results.validate_files import trainer_file as stored_trainer_file
from april_bench.rollout.loop import RolloutLoop
from april_bench.trainers.protocol import Trainer, TrainerState

__all__ = ["load", "restore", "save"]


def save(
    status: RunStatus,
    arm: str,
    repeat: int,
    done: int,
    *,
    rollout: RolloutLoop,
    engine: Engine,
    trainer: Trainer | None,
    clocks: dict[str, float],
) -> None:
    """Write the session's state after ``done`` completed steps, then tell ``status``; the previous
    checkpoint goes once the status names this one.  ``clocks``: ``clock_now``, ``session_elapsed``,
    ``run_elapsed``."""
    path = state_path(status.path.parent, arm, repeat, done)
    path.parent.mkdir(parents=True, exist_ok=True)
    trainer_file = None
    if isinstance(trainer, TrainerState):
        trainer_file = f"state/{path.with_suffix('.trainer.pt').name}"  # relative: a run dir moves
        save_trainer_state(trainer, path.with_suffix(".trainer.pt"))
    write_json_atomic(
        path,
        {
            "completed_steps": done,
            **clocks,
            "rollout": rollout.state(),
            "strategy": rollout.strategy.state(),
            "engine": stateful.export_state() if (stateful := STATE.of(engine)) else None,
            "trainer_file": trainer_file,
        },
    )
    status.step_done(arm, repeat, done)
    previous = state_path(status.path.parent, arm, repeat, done - 1)
    previous.unlink(missing_ok=True)
    previous.with_suffix(".trainer.pt").unlink(missing_ok=True)


def load(status: RunStatus | None, arm: str, repeat: int, name: str) -> dict[str, Any] | None:
    """The session's last checkpoint (``None``: no status, or no step completed yet)."""
    if status is None:
        return None
    completed = status.completed.get(f"{arm}#{repeat}", 0)
    if not completed:
        return None
    path = state_path(status.path.parent, arm, repeat, completed)
    return read_checkpoint(path, name, completed)


async def restore(
    saved: dict[str, Any],
    *,
    rollout: RolloutLoop,
    engine: Engine,
    trainer: Trainer,
    sync: WeightSync,
    run_dir: Path,
) -> int:
    """Put trainer, engine, rollout loop and strategy back to ``saved``; the completed steps.  The
    trainer's state file is the one inside ``run_dir`` (a moved or copied run resumes from its own)."""
    done = int(saved["completed_steps"])
    if saved["trainer_file"] and isinstance(trainer, TrainerState):
        load_trainer_state(stored_trainer_file(run_dir, saved["trainer_file"]), trainer.load_state)
        await sync.push(trainer, engine, done)  # before the clock restarts
    if saved["engine"] is not None and (stateful := STATE.of(engine)):
        stateful.restore_state(saved["engine"])
    rollout.restore(saved["rollout"])
    rollout.strategy.restore(saved["strategy"])
    return done
