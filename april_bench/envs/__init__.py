"""Environments for multi-turn agent episodes (docs/agents.md).

A sample may be an *episode*: generation turns separated by environment steps.  The policy's
turn ends where the engine stops (EOS or a tool-call token); the environment takes the turn's
tokens as its action and answers with observation tokens, which the rollout loop appends to the
response (masked from the loss, counted as prefill) before the next turn, or ends the episode with
a reward.  :mod:`.protocol` is the contract; :mod:`.scripted` is the fake environment with scripted
turn lengths and latencies that the exact-schedule tests use.  The real CPU environment, the
synthetic task's calculator, is a task (:mod:`april_bench.tasks.agent`).
"""

from __future__ import annotations

from april_bench.envs.protocol import Environment, EnvStep, EpisodeWorkload

__all__ = ["EnvStep", "Environment", "EpisodeWorkload"]
