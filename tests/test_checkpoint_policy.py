"""The checkpoint policy: rows, the partial buffer and the status after every step, the trainer's state
every ``--checkpoint-every`` steps and at an interruption, and ``--resume`` continuing from the last
checkpoint that holds it, with exactly the rows of an uninterrupted run.

The simulated trainer has no state, so these tests give it one (a log of what it trained on, written
by ``save_state``): a resume that loaded the wrong state, or skipped or doubled a step, shows in the log.
Every column compares exactly except the virtual clock's readings, which compare to a nanosecond: a
resumed session's clock origin is recomputed after the restore's weight push, which moves the last bit
of a subtraction.  The embedded run (hf engine, torch trainer) checks the same with real weights (slow).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers import embedded_flags, interrupt_at, sim_flags, table_rows

from april_bench.cli import main
from april_bench.results.resume import RunStatus
from april_bench.trainers.sim import SimTrainer

SIM = sim_flags(steps=5, strategies="sync,april")
TABLES = ("requests", "samples", "steps", "evals", "events")


class StatefulSimTrainer:
    """Gives the simulated trainer a state: the ``(step, tokens)`` of every batch it trained on, in
    order.  ``made`` lists the trainers built, in the order the sessions open them (sync, then april)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.made: list[SimTrainer] = []
        self.saves: list[str] = []
        #: ``(trainer index, step)`` at which training raises ``KeyboardInterrupt`` after updating.
        self.interrupt_after_training: tuple[int, int] | None = None
        original = SimTrainer.train
        harness = self

        async def train(trainer: SimTrainer, batch: Any, *, step: int, policy_version: int) -> Any:
            if not any(t is trainer for t in harness.made):
                harness.made.append(trainer)
            result = await original(trainer, batch, step=step, policy_version=policy_version)
            history = trainer.__dict__.setdefault("history", [])
            history.append([step, int(result.metrics["train_tokens"])])
            if harness.interrupt_after_training == (harness.index(trainer), step):
                raise KeyboardInterrupt  # the trainer has moved past the last checkpoint
            return result

        def save_state(trainer: SimTrainer, path: str) -> None:
            harness.saves.append(Path(path).name)
            Path(path).write_text(json.dumps(trainer.__dict__.get("history", [])))

        def load_state(trainer: SimTrainer, path: str) -> None:
            harness.made.append(trainer)
            trainer.__dict__["history"] = json.loads(Path(path).read_text())

        monkeypatch.setattr(SimTrainer, "train", train)
        monkeypatch.setattr(SimTrainer, "save_state", save_state, raising=False)
        monkeypatch.setattr(SimTrainer, "load_state", load_state, raising=False)

    def index(self, trainer: SimTrainer) -> int:
        return next(i for i, t in enumerate(self.made) if t is trainer)

    def history(self, index: int) -> list[list[int]]:
        return list(self.made[index].__dict__.get("history", []))


@pytest.fixture
def stateful(monkeypatch: pytest.MonkeyPatch) -> Iterator[StatefulSimTrainer]:
    yield StatefulSimTrainer(monkeypatch)


def comparable_rows(run: Path, table: str) -> list[str]:
    """A table's rows, order-free, as sorted JSON: times to the nanosecond (the module's docstring), the
    harness's own CPU seconds left out (measured, not simulated)."""

    def exact(value: Any) -> Any:
        return round(value, 9) if isinstance(value, float) else value

    rows = ({k: exact(v) for k, v in row.items() if k != "bookkeeping_s"} for row in table_rows(run, table))
    return sorted(json.dumps(row, sort_keys=True) for row in rows)


def _state_files(run: Path) -> list[str]:
    return sorted(p.name for p in (run / "state").iterdir() if not p.name.startswith("april-bench-"))


def _status(run: Path) -> dict[str, Any]:
    return json.loads((run / "status.json").read_text())


@pytest.fixture(scope="module")
def uninterrupted_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[list[list[int]]]]:
    """The reference: 5 steps of sync and APRIL, trainer state every 2 steps; each trainer's log."""
    with pytest.MonkeyPatch.context() as mp:
        trainer = StatefulSimTrainer(mp)
        out = tmp_path_factory.mktemp("full") / "run"
        assert main(["run", *SIM, "--checkpoint-every", "2", "--out", str(out)]) == 0
        # every 2 steps; none after the last step (nothing trains after it)
        assert trainer.saves == [f"{arm}-r0-s{n}.trainer.pt" for arm in ("sync", "april") for n in (2, 4)]
        return out, [trainer.history(0), trainer.history(1)]


def test_a_complete_run_keeps_the_last_checkpoints_and_no_trainer_state(
    uninterrupted_run: tuple[Path, Any],
) -> None:
    run, histories = uninterrupted_run
    assert [len(h) for h in histories] == [5, 5]
    assert _state_files(run) == ["april-r0-s5.json", "sync-r0-s5.json"]
    status = _status(run)
    assert status["completed"] == {"sync#0": 5, "april#0": 5}
    assert {k: v["steps"] for k, v in status["full"].items()} == {"sync#0": 5, "april#0": 5}


def test_interrupted_mid_training_resumes_from_the_last_trainer_state_and_runs_the_steps_after_it_again(
    uninterrupted_run: tuple[Path, list[list[list[int]]]],
    stateful: StatefulSimTrainer,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    reference, histories = uninterrupted_run
    run = tmp_path / "run"
    stateful.interrupt_after_training = (1, 3)  # april, in step 3: its trainer is past step 3's start
    assert main(["run", *SIM, "--checkpoint-every", "2", "--out", str(run)]) == 130
    status = _status(run)
    assert status["completed"] == {"sync#0": 5, "april#0": 3}
    assert status["full"]["april#0"]["steps"] == 2  # the trainer could not be saved at step 3
    assert status["full"]["april#0"]["rows"] != status["rows"]["april#0"]
    # the latest checkpoint (3: rows, buffer, status) and the last full one (2, with the trainer's state)
    files = ["april-r0-s2.json", "april-r0-s2.trainer.pt", "april-r0-s3.json", "sync-r0-s5.json"]
    assert _state_files(run) == files
    assert {r["step"] for r in table_rows(run, "steps") if r["arm"] == "april"} == {0, 1, 2}
    capsys.readouterr()

    stateful.made.clear()
    stateful.interrupt_after_training = None
    assert main(["run", "--resume", str(run), "--no-progress"]) == 0
    err = capsys.readouterr().err
    assert "session april#0 completed 3 step(s) but its trainer state was saved after 2" in err
    assert "its last 1 step(s) run again" in err
    for table in TABLES:
        assert comparable_rows(run, table) == comparable_rows(reference, table), table
    # the finished sync session neither loads nor trains: april's trainer is the one made
    assert len(stateful.made) == 1
    assert stateful.history(0) == histories[1]  # loaded after 2 steps, then steps 2, 3, 4 trained once
    assert _state_files(run) == ["april-r0-s5.json", "sync-r0-s5.json"]


def test_an_interruption_between_steps_saves_the_trainer_state_so_nothing_runs_again(
    uninterrupted_run: tuple[Path, list[list[list[int]]]],
    stateful: StatefulSimTrainer,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    reference, histories = uninterrupted_run
    run = tmp_path / "run"
    with interrupt_at(3, "april"):  # before step 3 trains: the trainer is at checkpoint 3
        assert main(["run", *SIM, "--checkpoint-every", "2", "--out", str(run)]) == 130
    status = _status(run)
    assert status["completed"]["april#0"] == 3 and status["full"]["april#0"]["steps"] == 3
    assert status["full"]["april#0"]["rows"] == status["rows"]["april#0"]
    assert _state_files(run) == ["april-r0-s3.json", "april-r0-s3.trainer.pt", "sync-r0-s5.json"]
    saved = json.loads((run / "state" / "april-r0-s3.json").read_text())
    assert saved["trainer_file"] == "state/april-r0-s3.trainer.pt"
    assert json.loads((run / "state" / "april-r0-s3.trainer.pt").read_text()) == histories[1][:3]
    capsys.readouterr()

    stateful.made.clear()
    assert main(["run", "--resume", str(run), "--no-progress"]) == 0
    assert "run again" not in capsys.readouterr().err
    for table in TABLES:
        assert comparable_rows(run, table) == comparable_rows(reference, table), table
    assert len(stateful.made) == 1 and stateful.history(0) == histories[1]


def test_a_trainer_state_that_cannot_be_saved_at_the_interruption_is_logged_and_the_resume_replays(
    uninterrupted_run: tuple[Path, Any],
    stateful: StatefulSimTrainer,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    from april_bench import experiment

    reference, _ = uninterrupted_run
    original = experiment.ArmSession._step
    save_state = SimTrainer.save_state  # type: ignore[attr-defined]

    async def stop_at_april_step_3(self: Any, s: int) -> None:
        if self.arm.label == "april" and s == 3:

            def full_disk(trainer: SimTrainer, path: str) -> None:
                raise OSError(28, "No space left on device")

            monkeypatch.setattr(SimTrainer, "save_state", full_disk, raising=False)
            raise KeyboardInterrupt
        await original(self, s)

    monkeypatch.setattr(experiment.ArmSession, "_step", stop_at_april_step_3)
    run = tmp_path / "run"
    assert main(["run", *SIM, "--checkpoint-every", "2", "--out", str(run)]) == 130
    assert "the trainer state could not be saved at the interruption" in caplog.text
    assert "the resume runs again from step 2" in caplog.text
    status = _status(run)
    assert status["state"] == "interrupted" and status["full"]["april#0"]["steps"] == 2
    monkeypatch.setattr(experiment.ArmSession, "_step", original)
    monkeypatch.setattr(SimTrainer, "save_state", save_state, raising=False)
    assert main(["run", "--resume", str(run), "--no-progress"]) == 0
    for table in TABLES:
        assert comparable_rows(run, table) == comparable_rows(reference, table), table


def test_checkpoint_every_zero_saves_the_trainer_only_at_an_interruption_and_a_kill_replays_from_zero(
    uninterrupted_run: tuple[Path, Any], stateful: StatefulSimTrainer, tmp_path: Path
) -> None:
    reference, histories = uninterrupted_run
    run = tmp_path / "run"
    stateful.interrupt_after_training = (1, 1)  # april's trainer moved past checkpoint 1: nothing saved
    assert main(["run", *SIM, "--checkpoint-every", "0", "--out", str(run)]) == 130
    assert stateful.saves == []
    status = _status(run)
    assert status["completed"]["april#0"] == 1 and "april#0" not in status["full"]
    stateful.made.clear()
    stateful.interrupt_after_training = None
    assert main(["run", "--resume", str(run), "--no-progress"]) == 0
    for table in TABLES:
        assert comparable_rows(run, table) == comparable_rows(reference, table), table
    assert len(stateful.made) == 1 and stateful.history(0) == histories[1]
    assert stateful.saves == []


def test_the_default_policy_writes_no_trainer_state_in_a_short_run(
    stateful: StatefulSimTrainer, tmp_path: Path
) -> None:
    from april_bench.experiment_config import ExperimentConfig

    assert ExperimentConfig().checkpoint_every == 10
    assert main(["run", *sim_flags(steps=10), "--out", str(tmp_path / "run")]) == 0
    assert stateful.saves == []  # step 10 is the last: nothing trains after it
    assert main(["run", *sim_flags(steps=11), "--out", str(tmp_path / "run11")]) == 0
    assert len(stateful.saves) == 3 and all(s.endswith("-s10.trainer.pt") for s in stateful.saves)


def test_a_negative_checkpoint_every_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", *SIM, "--checkpoint-every", "-1"]) == 2
    err = capsys.readouterr().err
    assert "error: --checkpoint-every must be >= 0" in err and "Traceback" not in err


# ------------------------------------------------------------------------------- the status's record
def test_rewind_moves_unfinished_sessions_back_to_their_full_checkpoint(tmp_path: Path) -> None:
    status = RunStatus(
        path=tmp_path / "status.json",
        completed={"a#0": 7, "b#0": 5, "c#0": 3, "d#0": 9},
        finished=["d#0"],
        rows={"a#0": {"steps": 7}, "b#0": {"steps": 5}, "c#0": {"steps": 3}, "d#0": {"steps": 9}},
        full={"a#0": {"steps": 5, "rows": {"steps": 5}}, "b#0": {"steps": 5, "rows": {"steps": 5}}},
    )
    assert status.rewind() == {"a#0": (7, 5), "c#0": (3, 0)}
    assert status.completed == {"a#0": 5, "b#0": 5, "d#0": 9}  # d finished: never rewound
    assert status.rows == {"a#0": {"steps": 5}, "b#0": {"steps": 5}, "d#0": {"steps": 9}}
    status.save()
    again = RunStatus.load(tmp_path)
    assert again.completed == status.completed and again.full == status.full


def test_a_status_from_before_the_policy_resumes_from_every_checkpoint(tmp_path: Path) -> None:
    (tmp_path / "status.json").write_text(
        json.dumps({"state": "interrupted", "completed": {"sync#0": 3}, "finished": [], "message": ""})
    )
    status = RunStatus.load(tmp_path)
    assert status.full is None and status.full_steps("sync#0") == 3
    assert status.rewind() == {} and status.completed == {"sync#0": 3}


@pytest.mark.parametrize(
    "full", [[], {"sync#0": 3}, {"sync#0": {"steps": -1}}, {"sync#0": {"steps": 1, "rows": {"steps": "x"}}}]
)
def test_a_damaged_full_record_is_one_line(full: object, tmp_path: Path) -> None:
    from april_bench.config import ConfigError

    (tmp_path / "status.json").write_text(
        json.dumps({"state": "interrupted", "completed": {"sync#0": 3}, "finished": [], "full": full})
    )
    with pytest.raises(ConfigError, match="field 'full' must map sessions to their last full checkpoint"):
        RunStatus.load(tmp_path)


# ----------------------------------------------------------------------------- real weights (slow)
#: Columns that are clock readings (tests/test_schedule_determinism.py): the only ones that may differ.
TIME_COLUMNS = {
    "requests": {"t_submit", "t_first_token", "t_done"},
    "steps": {
        "t_start",
        "rollout_time_s",
        "train_time_s",
        "weight_sync_time_s",
        "step_time_s",
        "drain_time_s",
        "bookkeeping_s",
        "saturated_tokens_per_s",
        "abort_rounds",
    },
    "samples": set(),
}


def _untimed(run: Path, table: str) -> list[str]:
    drop = TIME_COLUMNS[table]
    rows = ({k: v for k, v in row.items() if k not in drop} for row in table_rows(run, table))
    return sorted(json.dumps(row, sort_keys=True) for row in rows)


@pytest.mark.slow
def test_an_embedded_run_resumed_from_its_last_trainer_state_has_an_uninterrupted_runs_rows(
    tmp_path: Path,
) -> None:
    """The hf engine and the torch trainer, blocks of one step in ABBA order: APRIL is stopped while
    training its fourth step (first in that block), so its weights are past its checkpoint after 3
    steps and it resumes from the trainer state saved after 2, running its third step again; sync,
    paused at that moment after 3 steps, gets its trainer state saved at the interruption."""
    env = {**os.environ, "APRIL_BENCH_CACHE": str(tmp_path / "cache")}
    run_flags = embedded_flags(steps=4, block_steps=1, eval_every=100, checkpoint_every=2)
    stop = (
        "import sys, april_bench.trainers.torch_trainer as t\n"
        "orig = t.TorchTrainer._train\n"
        "seen = []\n"
        "def _train(self, batch, version):\n"
        "    out = orig(self, batch, version)\n"
        "    seen.append(version)\n"
        "    if version == 3 and seen.count(3) == 1:\n"  # the first arm to train step 3 (ABBA: april)
        "        raise KeyboardInterrupt\n"
        "    return out\n"
        "t.TorchTrainer._train = _train\n"
        "from april_bench.cli import main\n"
        "sys.exit(main(sys.argv[1:]))\n"
    )

    def run(*args: str, code: str | None = None) -> subprocess.CompletedProcess[str]:
        cmd = [sys.executable, "-c", code] if code else [sys.executable, "-m", "april_bench"]
        return subprocess.run([*cmd, *args], capture_output=True, text=True, timeout=900, env=env)

    full = run("run", *run_flags, "--out", str(tmp_path / "full"))
    assert full.returncode == 0, full.stderr
    stopped = run("run", *run_flags, "--out", str(tmp_path / "run"), code=stop)
    assert stopped.returncode == 130, stopped.stderr
    status = _status(tmp_path / "run")
    assert status["completed"] == {"sync#0": 3, "april#0": 3}, status
    assert status["full"]["april#0"]["steps"] == 2 and status["full"]["sync#0"]["steps"] == 3
    resumed = run("run", "--resume", str(tmp_path / "run"), "--no-progress")
    assert resumed.returncode == 0, resumed.stderr
    assert "session april#0 completed 3 step(s) but its trainer state was saved after 2" in resumed.stderr
    for table in TIME_COLUMNS:
        assert _untimed(tmp_path / "run", table) == _untimed(tmp_path / "full", table), table


def test_a_trainer_class_patched_then_restored_is_stateless_again() -> None:
    # isinstance against the runtime protocol would keep ABCMeta's cached "yes" after the patch is
    # undone, and every later run in the process would treat the simulated trainer as stateful.
    from april_bench.trainers.protocol import has_state

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(SimTrainer, "save_state", lambda self, path: None, raising=False)
        patch.setattr(SimTrainer, "load_state", lambda self, path: None, raising=False)
        assert has_state(SimTrainer.__new__(SimTrainer))
    assert not has_state(SimTrainer.__new__(SimTrainer))
