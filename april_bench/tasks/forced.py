"""Forced-length runs (``--length-oracle PROFILE``): any task's prompts, with every response's length and
reward drawn from a length profile (:class:`april_bench.sim.length_oracle.LengthOracle`).

The engine then generates exactly the drawn number of tokens, ignoring the stop token (the rollout
loop sends the draw as ``GenerateRequest.replay_len``: the hf engine bans EOS in its decode loop until
then; vLLM gets ``ignore_eos`` and ``max_tokens``; SGLang ``ignore_eos`` and ``max_new_tokens``), so a
real engine runs a paper-shaped long-tailed workload with any model, random weights included, and
its schedule - which requests run together, for how many forward passes, what is aborted and resumed -
is a function of the seed alone, not of the machine's floating-point arithmetic.  Rewards come from
the same draw, so DAPO's filter decides the same way everywhere.  The tokens are the model's, but
what they say is not graded: a forced-length run has no accuracy claim, and it is labelled
forced-length in its config, provenance and tables.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from april_bench.config import ConfigError
from april_bench.envs.protocol import EpisodeWorkload
from april_bench.sim.length_oracle import LengthOracle
from april_bench.types import Prompt, Sample, SampleStatus
from april_bench.workload import PromptStream, Workload

if TYPE_CHECKING:
    from april_bench.experiment_config import ExperimentConfig
    from april_bench.tasks.base import Task

__all__ = ["ForcedLengths", "force_lengths"]


class ForcedLengths:
    """A workload's prompts with the oracle's lengths and rewards (:mod:`april_bench.workload`'s protocol)."""

    def __init__(self, base: Workload, oracle: LengthOracle) -> None:
        self.base = base
        self.oracle = oracle
        self.name = f"{base.name} (forced lengths: {oracle.label})"

    @property
    def has_rewards(self) -> bool:
        return self.oracle.has_rewards

    def prompt_stream(self) -> PromptStream:
        return self.base.prompt_stream()

    def longest_prompt(self) -> int:
        return self.base.longest_prompt()

    def replay_len(self, prompt: Prompt, sample_index: int, start_step: int) -> int:
        return self.oracle.length(prompt.uid, sample_index, start_step)

    def reward(self, sample: Sample) -> float:
        """1 for a drawn-right answer that ended at its drawn length, 0 otherwise (truncated included)."""
        right = self.oracle.correct(sample.prompt.uid, sample.index)
        return 1.0 if right and sample.status is SampleStatus.COMPLETED else 0.0


def oracle_for(config: ExperimentConfig) -> LengthOracle | None:
    """The run's length oracle (``None`` without ``--length-oracle``)."""
    if config.length_oracle is None:
        return None
    rollout = config.rollout
    return LengthOracle(
        config.length_oracle,
        seed=config.seed,
        n_samples_per_prompt=rollout.n_samples_per_prompt,
        max_response_len=rollout.max_response_len,
    )


def force_lengths(task: Task, config: ExperimentConfig) -> Task:
    """``task`` with its workload's lengths and rewards drawn by the run's oracle, replayed on any engine."""
    oracle = oracle_for(config)
    if oracle is None:
        return task
    if isinstance(task.workload, EpisodeWorkload):
        raise ConfigError(
            "--length-oracle forces single-turn response lengths; multi-turn episodes "
            f"(--dataset {config.dataset}) draw theirs per turn: drop --length-oracle"
        )
    if config.dynamic_sampling_on and not oracle.has_rewards:
        raise ConfigError(
            f"--length-oracle {oracle.label}: dynamic sampling needs rewards, and the trace has no 'reward' "
            "or 'correct' column; add one or use --no-dynamic-sampling"
        )
    described = oracle.describe()
    task.workload = ForcedLengths(task.workload, oracle)
    task.replay_lengths = True
    task.forced_lengths = described
    task.notes.append(_note(described))
    return task


def _note(described: dict[str, Any]) -> str:
    scale = described["scale"]
    how = f"scaled x{scale:.4g}" + (
        f" (cap {described['cap']:,} -> {described['max_response_len']:,})" if described["cap"] else ""
    )
    return (
        f"forced lengths: every response's length and reward drawn from {described['profile']} "
        f"({how}); the engine ignores the stop token until then, so the run measures scheduling at that "
        "workload and its rewards are not the model's accuracy"
    )
