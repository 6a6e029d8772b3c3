"""Micro-benchmark: simulator steps at the paper's scale (``pytest benchmarks --benchmark-only``).

One call is a whole 4-step run of one arm on the simulated MI300X (32 groups x 8, over-sampling 64,
16,384-token limit): engine events, the rollout loop, the strategy and the recorder, with the
session's setup (about a fifth of the time).  Real CPU time on this machine; the simulated seconds
inside are not what is timed.  See docs/benchmarks.md.
"""

from __future__ import annotations

import pytest

from april_bench.experiment import ExperimentConfig, run

STEPS = 4


@pytest.mark.benchmark(group="sim-step")
@pytest.mark.parametrize("arm", ["sync", "oversample-discard", "april"])
def test_sim_steps(benchmark: pytest.FixtureRequest, arm: str) -> None:
    config = ExperimentConfig(
        hardware="mi300x", algorithm="grpo", engine="sim", steps=STEPS, strategies=(arm,)
    )
    benchmark.extra_info["steps"] = STEPS
    result = benchmark(run, config, progress=False)
    assert len(result.recorder["steps"]) == STEPS
