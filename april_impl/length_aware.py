"""Length-aware scheduling: APRIL that launches the longest work first and aborts the longest only.

Two changes to APRIL, each a knob so the ablation can separate them:

* ``order``: buffered groups launch longest first (most response tokens held, the
  best predictor of a long remaining response: lengths within a group are similar,
  Seer), so the tail starts early instead of last; ``shortest_first`` is the
  SortedRL-like opposite, ``fifo`` is APRIL's.  With ``engine_priority`` the same
  order reaches engines that schedule by priority (vLLM, SGLang).
* ``abort_share``: once N groups are accepted, abort only this share of the
  in-flight groups - those running longest (earliest launched, most tokens held) -
  and let the rest finish before the step ends.  1.0 is APRIL's abort-all.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Collection, Sequence
from dataclasses import dataclass

from april_bench.config import ConfigError, param
from april_bench.rollout.strategy import Candidate, GroupProgress, RolloutView
from april_impl.april import AprilStrategy

__all__ = ["LaunchOrder", "LengthAwareStrategy"]


class LaunchOrder(enum.StrEnum):
    LONGEST_FIRST = "longest_first"
    SHORTEST_FIRST = "shortest_first"
    FIFO = "fifo"


def _held(progress: GroupProgress) -> tuple[int, int]:
    return progress.longest, progress.tokens


class LengthAwareStrategy(AprilStrategy):
    """APRIL with length-ordered launches and a selective abort of the longest groups."""

    @dataclass(kw_only=True, slots=True, frozen=True)
    class Config(AprilStrategy.Config):
        order: LaunchOrder = param(
            LaunchOrder.LONGEST_FIRST,
            help="buffered groups' launch order: longest_first, shortest_first or fifo",
        )
        engine_priority: bool = param(True, help="pass the launch order to the engine as request priority")
        abort_share: float = param(
            1.0, help="share of in-flight groups (the longest running) aborted at the stop; the rest finish"
        )

        def __post_init__(self) -> None:
            AprilStrategy.Config.__post_init__(self)
            try:
                object.__setattr__(self, "order", LaunchOrder(self.order))
            except ValueError:
                raise ConfigError(
                    f"order must be one of {', '.join(o.value for o in LaunchOrder)}, got {self.order!r}"
                ) from None
            if not 0.0 < self.abort_share <= 1.0:
                raise ConfigError(f"abort_share must be in (0, 1], got {self.abort_share}")

    name = "length-aware"

    def __init__(self, config: Config) -> None:
        super().__init__(config)
        self.length_config = config

    def select(self, candidates: Sequence[Candidate], count: int, view: RolloutView) -> Sequence[Candidate]:
        order = self.length_config.order
        buffered = [c for c in candidates if not c.fresh]
        if order is not LaunchOrder.FIFO:  # sorted() is stable: ties keep FIFO order
            longest = order is LaunchOrder.LONGEST_FIRST
            buffered = sorted(buffered, key=lambda c: _held(c.progress), reverse=longest)
        return [*buffered, *(c for c in candidates if c.fresh)][:count]

    def priority(self, group: GroupProgress, view: RolloutView) -> int:
        cfg = self.length_config
        if not cfg.engine_priority or cfg.order is LaunchOrder.FIFO:
            return 0
        return -group.longest if cfg.order is LaunchOrder.LONGEST_FIRST else group.longest

    def stop_abort(self, view: RolloutView) -> Collection[int] | None:
        share = self.length_config.abort_share
        if share >= 1.0:
            return None
        running = sorted(
            view.groups.items(),
            key=lambda item: (item[1].running_for_s or 0.0, *_held(item[1])),
            reverse=True,
        )
        return [uid for uid, _ in running[: math.ceil(share * len(running))]]
