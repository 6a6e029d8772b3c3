"""Response over-sampling (RollPacker, arXiv 2509.21009): APRIL whose groups launch more than n responses.

RollPacker's short rounds over-provision responses as well as prompts: a prompt gets
``ceil(response_ratio x n)`` responses and its group is complete once the first n of them finish;
the others are aborted at that moment and dropped (their tokens are counted as wasted,
``response_surplus`` in the samples table).  APRIL over-provisions whole groups only and waits for
all n responses of a group.  Everything else - N', abort at N, buffering whole groups - is APRIL's.

What it trades: a group no longer waits for its longest response (the tail inside a group is cut),
for extra decode work that is thrown away, and a selection bias: the n kept responses are the
shortest of the launched ones, which the trainer sees as a shorter-than-sampled length
distribution.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from april_bench.config import ConfigError, param
from april_bench.rollout.strategy import RolloutView
from april_impl.april import AprilStrategy

__all__ = ["ResponseOversampleStrategy"]


class ResponseOversampleStrategy(AprilStrategy):
    """APRIL whose groups launch ``response_ratio x n`` responses and keep the first n that finish."""

    @dataclass(kw_only=True, slots=True, frozen=True)
    class Config(AprilStrategy.Config):
        response_ratio: float = param(1.5, help="responses launched per group, as a multiple of n")

        def __post_init__(self) -> None:
            AprilStrategy.Config.__post_init__(self)
            if self.response_ratio < 1.0:
                raise ConfigError(f"response_ratio must be >= 1, got {self.response_ratio}")

    name = "response-oversample"

    def __init__(self, config: Config) -> None:
        super().__init__(config)
        self.ratio = config.response_ratio

    def group_shape(self, n: int, view: RolloutView) -> tuple[int, int]:
        return math.ceil(self.ratio * n), n
