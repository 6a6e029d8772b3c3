"""Small builders shared by the tests: command-line flags for small runs, a run directory's rows, a
run interrupted before a given step, a rollout loop over the fake engine, and the one-line-error
checks."""

from __future__ import annotations

import contextlib
import gzip
import json
from collections.abc import Callable, Collection, Iterator
from pathlib import Path
from typing import Any

from april_bench.engines.fake import FakeEngine
from april_bench.engines.protocol import WeightUpdate
from april_bench.results.recorder import RunRecorder
from april_bench.results.records import Fate
from april_bench.rollout.loop import RolloutConfig, RolloutLoop, StepOutcome
from april_bench.rollout.strategy import RolloutStrategy
from april_bench.vtime import run_virtual
from april_bench.workload import ScriptedWorkload

__all__ = [
    "EMBEDDED",
    "SIM",
    "comparable_rows",
    "embedded_flags",
    "fake_arm",
    "flags",
    "interrupt_at",
    "one_error",
    "read_jsonl",
    "refused",
    "sim_flags",
    "table_rows",
    "tiny_sim_flags",
]


# ------------------------------------------------------------------------------------------- flags
def flags(**options: object) -> list[str]:
    """Command-line flags from keyword options, in order: ``steps=3`` -> ``--steps 3``; ``True`` -> the
    bare flag (``no_progress=True``); ``None`` or ``False`` -> left out; a list or tuple -> the flag
    repeated (``engine_arg=["a=1", "b=2"]``)."""
    out: list[str] = []
    for name, value in options.items():
        flag = "--" + name.replace("_", "-")
        if value is None or value is False:
            continue
        if value is True:
            out.append(flag)
        elif isinstance(value, list | tuple):
            for item in value:
                out += [flag, str(item)]
        else:
            out += [flag, str(value)]
    return out


#: A small simulated run on the H100 profile: sync and APRIL part within a few steps, in seconds.
SIM: dict[str, object] = {
    "hw": "h100",
    "steps": 3,
    "rollout_batch_size": 4,
    "n_samples_per_prompt": 4,
    "over_sampling_batch_size": 8,
    "max_response_len": 2048,
    "no_progress": True,
}

#: The changes to :data:`SIM` for one step of the smallest batches.
TINY: dict[str, object] = {
    "steps": 1,
    "rollout_batch_size": 2,
    "n_samples_per_prompt": 2,
    "over_sampling_batch_size": 4,
    "max_response_len": 512,
}

#: A small embedded run (the hf engine on a tiny model warm-started for 20 steps): about a minute.
EMBEDDED: dict[str, object] = {
    "steps": 3,
    "rollout_batch_size": 4,
    "n_samples_per_prompt": 4,
    "over_sampling_batch_size": 8,
    "max_response_len": 48,
    "warmstart_arg": "steps=20",
    "no_progress": True,
}


def sim_flags(**changes: object) -> list[str]:
    """:data:`SIM`'s flags with ``changes`` (``steps=4``; ``None`` drops a flag:
    ``over_sampling_batch_size=None``)."""
    return flags(**{**SIM, **changes})


def tiny_sim_flags(**changes: object) -> list[str]:
    """:data:`SIM`'s flags for one step of the smallest batches (a run that only has to finish), with
    ``changes``."""
    return sim_flags(**{**TINY, **changes})


def embedded_flags(**changes: object) -> list[str]:
    """:data:`EMBEDDED`'s flags with ``changes``."""
    return flags(**{**EMBEDDED, **changes})


# -------------------------------------------------------------------------------------------- rows
def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """Every row of a JSON Lines file (blank lines skipped)."""
    with path.open(encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def table_rows(run: Path, table: str) -> list[dict[str, Any]]:
    """A run directory's table: ``<table>.jsonl``, or ``<table>.jsonl.gz`` once compressed."""
    plain = run / f"{table}.jsonl"
    if plain.exists():
        return read_jsonl(plain)
    with gzip.open(run / f"{table}.jsonl.gz", "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def comparable_rows(run: Path, table: str, *, drop: Collection[str] = ("bookkeeping_s",)) -> list[str]:
    """A table's rows, order-free, for comparing two runs: each row as sorted JSON, without ``drop``
    (by default the harness's own CPU seconds: measured, not simulated)."""
    rows = ({k: v for k, v in row.items() if k not in drop} for row in table_rows(run, table))
    return sorted(json.dumps(row, sort_keys=True) for row in rows)


# ---------------------------------------------------------------------------------- interruptions
@contextlib.contextmanager
def interrupt_at(step: int, arm: str | None = None) -> Iterator[None]:
    """Inside the block, a run stops as Ctrl-C would stop it when session ``arm`` (any arm: ``None``)
    is about to run step ``step`` (``KeyboardInterrupt`` before the step; the steps before it are
    complete and checkpointed).  The session's step is restored on leaving the block."""
    from april_bench.experiment.session import ArmSession

    original = ArmSession._step

    async def interrupted(self: ArmSession, s: int) -> None:
        if s == step and arm in (None, self.arm.label):
            raise KeyboardInterrupt
        await original(self, s)

    ArmSession._step = interrupted  # type: ignore[method-assign]
    try:
        yield
    finally:
        ArmSession._step = original  # type: ignore[method-assign]


def fake_arm(
    strategy: RolloutStrategy,
    length: Callable[[int, int], int],
    *,
    steps: int,
    reward: Callable[[int, int], float] = lambda uid, i: float(i % 2),
    engine: dict[str, Any] | None = None,
    **rollout: Any,
) -> tuple[list[StepOutcome], RunRecorder, RolloutLoop]:
    """Run ``steps`` steps of one strategy on the fake engine (one token per second per request)."""
    settings = {
        "rollout_batch_size": 2,
        "n_samples_per_prompt": 2,
        "over_sampling_batch_size": 4,
        "max_response_len": 64,
        "replay_lengths": True,
    }
    settings.update(rollout)
    config = RolloutConfig(**settings)
    fake = FakeEngine.Config(**(engine or {})).build()
    workload = ScriptedWorkload(length, reward)
    recorder = RunRecorder()
    outcomes: list[StepOutcome] = []

    async def main() -> RolloutLoop:
        await fake.start()
        loop = config.build(
            arm=strategy.name,
            engine=fake,
            strategy=strategy,
            workload=workload,
            prompts=workload.prompt_stream(),
            recorder=recorder,
        )
        for step in range(steps):
            outcome = await loop.run_step(step, step)
            recorder.add(outcome.record)
            recorder.sample_fates(
                strategy.name,
                outcome.batch,
                step=step,
                fate=Fate.TRAINED,
                reason="accepted",
                train_version=step,
            )
            outcomes.append(outcome)
            await fake.update_weights(WeightUpdate(step + 1))
        recorder.sample_fates(strategy.name, list(loop.buffer), step=steps, fate=Fate.BUFFERED, reason="end")
        return loop

    loop = run_virtual(main())
    return outcomes, recorder, loop


def one_error(err: str) -> str:
    """The one ``error:`` line of a refused command's stderr (no traceback, exactly one such line)."""
    assert "Traceback" not in err, err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, err
    return errors[0]


def refused(capsys: Any, argv: list[str], message: str) -> str:
    """Run ``argv`` through the CLI, expect exit 2 with one ``error:`` line holding ``message``."""
    from april_bench.cli import main

    capsys.readouterr()
    assert main(argv) == 2
    line = one_error(capsys.readouterr().err)
    assert message in line, line
    return line
