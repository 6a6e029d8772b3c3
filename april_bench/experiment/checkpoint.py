"""A session's checkpoint after each completed step, and the resume from it.

The checkpoint is a JSON file per session and step count (``state/<arm>-r<repeat>-s<steps>.json``, see
:func:`april_bench.results.resume.state_path`) with the rollout loop's, the strategy's and the engine's
state and the clocks.  It is written after the step's rows are on disk and before ``status.json`` names
it, so a run stopped anywhere resumes from a step whose rows and state agree.

The trainer's state (``.trainer.pt`` beside it: float32 weights and AdamW moments, ~16 bytes a
parameter) goes with it only in a *full* checkpoint: every ``--checkpoint-every`` steps
(:func:`save` with ``full=True``) and when the run is interrupted (:func:`add_trainer_state`).  A
session keeps two checkpoints on disk: its latest, and its last full one, which ``--resume`` continues
from (:meth:`april_bench.results.resume.RunStatus.rewind`).  A trainer without state (the simulated
one) makes every checkpoint full.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from april_bench.backends.weights import WeightSync
from april_bench.engines.protocol import STATE, Engine
from april_bench.results.resume import RunStatus, session_key, state_path
from april_bench.results.store import write_json_atomic
from april_bench.results.validate_files import load_trainer_state, read_checkpoint, save_trainer_state
from april_bench.results.validate_files import trainer_file as stored_trainer_file
from april_bench.rollout.loop import RolloutLoop
from april_bench.trainers.protocol import Trainer, TrainerState, has_state

__all__ = ["add_trainer_state", "load", "restore", "save"]


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
    full: bool = True,
    last: bool = False,
) -> dict[str, Any]:
    """Write the session's state after ``done`` completed steps (with the trainer's when ``full``), then
    tell ``status``; checkpoints no longer needed go once the status names this one.  ``clocks``:
    ``clock_now``, ``session_elapsed``, ``run_elapsed``.  ``last``: the session's last step, after
    which nothing trains, so the checkpoint is a full one without the trainer's state.  Returns what
    was written (the checkpoint :func:`add_trainer_state` completes at an interruption)."""
    path = state_path(status.path.parent, arm, repeat, done)
    path.parent.mkdir(parents=True, exist_ok=True)
    stateful_trainer = has_state(trainer)
    trainer_file = None
    if full and has_state(trainer):
        trainer_file = _save_trainer(trainer, path)
    saved = {
        "completed_steps": done,
        **clocks,
        "rollout": rollout.state(),
        "strategy": rollout.strategy.state(),
        "engine": stateful.export_state() if (stateful := STATE.of(engine)) else None,
        "trainer_file": trainer_file,
    }
    write_json_atomic(path, saved, indent=None)  # written every step, read by the code alone: compact
    status.step_done(arm, repeat, done, full=full or last or not stateful_trainer)
    _remove_unneeded(status, arm, repeat)
    return saved


def add_trainer_state(
    status: RunStatus, arm: str, repeat: int, saved: dict[str, Any], trainer: TrainerState
) -> None:
    """Make the session's latest checkpoint ``saved`` (what :func:`save` returned) a full one: the
    trainer's state beside it, the checkpoint naming it, the status saying so.  Called when the run
    is interrupted, with the trainer still at the checkpoint's step (not part-way into the next)."""
    done = int(saved["completed_steps"])
    path = state_path(status.path.parent, arm, repeat, done)
    saved = {**saved, "trainer_file": _save_trainer(trainer, path)}
    write_json_atomic(path, saved, indent=None)
    status.step_done(arm, repeat, done, full=True)
    _remove_unneeded(status, arm, repeat)


def _save_trainer(trainer: TrainerState, checkpoint: Path) -> str:
    """Write the trainer's state beside ``checkpoint``; the name a checkpoint stores (relative: a run
    directory moves)."""
    target = checkpoint.with_suffix(".trainer.pt")
    save_trainer_state(trainer, target)
    return f"state/{target.name}"


def _remove_unneeded(status: RunStatus, arm: str, repeat: int) -> None:
    """Delete the session's checkpoint files other than the two the status names: its latest and its
    last full one (left over from earlier steps, or from a write the status never named)."""
    key = session_key(arm, repeat)
    first = state_path(status.path.parent, arm, repeat, 0)
    prefix = first.name.removesuffix("0.json")
    pattern = re.compile(re.escape(prefix) + r"(\d+)\.(?:json|trainer\.pt)$")
    keep = {status.completed.get(key, 0), status.full_steps(key)}
    for child in first.parent.iterdir():
        match = pattern.match(child.name)
        if match and int(match.group(1)) not in keep:
            child.unlink(missing_ok=True)


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
    if saved["trainer_file"] and has_state(state := trainer):
        load_trainer_state(stored_trainer_file(run_dir, saved["trainer_file"]), state.load_state)
        await sync.push(trainer, engine, done)  # before the clock restarts
    if saved["engine"] is not None and (stateful := STATE.of(engine)):
        stateful.restore_state(saved["engine"])
    rollout.restore(saved["rollout"])
    rollout.strategy.restore(saved["strategy"])
    return done
