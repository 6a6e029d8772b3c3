"""Per-episode figures of multi-turn runs (docs/agents.md), from sample rows only.

For the trained episodes of each arm: how many, turns per episode, generated and observation
tokens per turn, the environment's share of an episode's time (its calls' seconds over calls plus
its requests' seconds, queueing included), and how many were resumed across policy versions (their
generated tokens came from more than one version: carried over a step by partial rollout, or cut by
an in-flight weight update).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["EPISODE_COLUMNS", "EpisodeTotals", "episode_table"]

EPISODE_COLUMNS = (
    "Strategy",
    "Episodes trained",
    "Turns/episode",
    "Gen tok/turn",
    "Obs tok/turn",
    "Env time share",
    "Env calls/step",
    "Resumed across versions",
)


@dataclass(slots=True)
class EpisodeTotals:
    """One arm's trained episodes, accumulated row by row."""

    episodes: int = 0
    turns: int = 0
    generated: int = 0
    observed: int = 0
    env_s: float = 0.0
    request_s: float = 0.0
    calls: int = 0
    across_versions: int = 0

    def add(self, sample: Mapping[str, Any]) -> None:
        """A trained sample row with an ``episode`` field."""
        e = sample["episode"]
        self.episodes += 1
        self.turns += int(e["turns"])
        self.generated += int(e["generated_tokens"])
        self.observed += int(sample.get("observation_tokens", 0))
        self.env_s += float(e["env_time_s"])
        self.request_s += float(e.get("request_time_s", 0.0))
        self.calls += int(e["env_calls"])
        self.across_versions += len({v for v, n in sample.get("version_runs", ()) if n}) > 1

    def metrics(self, steps: int) -> dict[str, Any]:
        turns = self.turns or None
        busy = self.env_s + self.request_s
        return {
            "episodes": self.episodes,
            "turns_per_episode": self.turns / self.episodes if self.episodes else None,
            "generated_tokens_per_turn": self.generated / turns if turns else None,
            "observation_tokens_per_turn": self.observed / turns if turns else None,
            "env_time_share": self.env_s / busy if busy else None,
            "env_calls_per_step": self.calls / steps if steps else None,
            "resumed_across_versions": self.across_versions,
            "resumed_across_versions_share": self.across_versions / self.episodes if self.episodes else None,
        }


def episode_table(summary: Mapping[str, Mapping[str, Any]]) -> list[list[str]]:
    """One row per arm with episodes (``summary[arm]["episodes"]``); empty when no arm has any."""
    rows = []
    for arm, m in summary.items():
        e = m.get("episodes")
        if not e:
            continue
        share = e["resumed_across_versions_share"]
        rows.append(
            [
                arm,
                f"{e['episodes']:,}",
                _num(e["turns_per_episode"], "{:.2f}"),
                _num(e["generated_tokens_per_turn"], "{:.1f}"),
                _num(e["observation_tokens_per_turn"], "{:.1f}"),
                _num(e["env_time_share"], "{:.0%}"),
                _num(e["env_calls_per_step"], "{:,.0f}"),
                f"{e['resumed_across_versions']:,}" + ("" if share is None else f" ({share:.0%})"),
            ]
        )
    return rows


def _num(value: Any, fmt: str) -> str:
    return "n/a" if value is None else fmt.format(value)
