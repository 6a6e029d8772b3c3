"""Small builders shared by the tests: a rollout loop over the fake engine."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from april_bench.engines.fake import FakeEngine
from april_bench.engines.protocol import WeightUpdate
from april_bench.results.recorder import RunRecorder
from april_bench.results.records import Fate
from april_bench.rollout.loop import RolloutConfig, RolloutLoop, StepOutcome
from april_bench.rollout.strategy import RolloutStrategy
from april_bench.vtime import run_virtual
from april_bench.workload import ScriptedWorkload


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
