"""Recipes: experiments are Python functions returning a complete :class:`ExperimentConfig`.

``python -m april_bench run`` starts from :func:`recipe_for` the chosen
hardware and applies the flags the user gave on top, so two arms of a
comparison differ only in ``strategies``.
"""

from __future__ import annotations

from typing import Any

from april_bench.experiment_config import ExperimentConfig
from april_bench.rollout.loop import RolloutConfig

__all__ = ["embedded", "paper", "recipe_for"]


def embedded(**overrides: Any) -> ExperimentConfig:
    """The embedded default: a tiny Qwen3 learning the synthetic task on the CPU, sync vs APRIL.

    Sized to finish in about five minutes on two cores, warm start included
    (about a minute, cached for later runs).
    """
    settings: dict[str, Any] = {
        "hardware": "cpu",
        # GRPO, the paper's headline setting (--algo dapo adds dynamic sampling; its sync baseline
        # then refills whole waves and throws most of them away - see the README).
        "algorithm": "grpo",
        "dataset": "synthetic",
        "model": "tiny",
        "engine": "auto",
        "strategies": ("sync", "april"),
        "steps": 60,
        "eval_every": 10,
        # Measured on a shared machine: the arms alternate every 5 steps (ABBA), so a burst of load
        # lands on both, and the gain is the median of 12 paired blocks per repeat.  The first step
        # of each arm pays one-off costs (allocator, first kernels) and is left out of the pairs.
        "block_steps": 5,
        "warmup_steps": 1,
        "rollout": RolloutConfig(
            rollout_batch_size=16,
            n_samples_per_prompt=8,
            over_sampling_batch_size=32,
            max_response_len=192,
            temperature=1.0,
        ),
        "trainer_args": {"lr": 3e-4},
    }
    settings.update(overrides)
    return ExperimentConfig(**settings)


def paper(hardware: str = "mi300x", **overrides: Any) -> ExperimentConfig:
    """APRIL's published setting: Qwen3-4B on one 8-GPU node, 32 groups x 8, over-sampling 64, 16k tokens."""
    settings: dict[str, Any] = {"hardware": hardware, "model": "qwen3-4b", "dataset": "dapo-math-17k"}
    settings.update(overrides)
    return ExperimentConfig(**settings)


def recipe_for(hardware: str, **overrides: Any) -> ExperimentConfig:
    return embedded(**overrides) if hardware == "cpu" else paper(hardware, **overrides)
