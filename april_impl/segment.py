"""Segment rollout (UloRL, arXiv 2507.19766; Kimi k1.5 partial rollouts): APRIL with a per-step budget.

Every request may generate at most ``segment_len`` tokens in one step.  A response
that reaches its segment without finishing pauses: its group comes back unfinished
while the step goes on (more groups launch in its place), and it is buffered and
continued first next step, from its token ids.  A very long response therefore
spreads over several steps instead of holding one step open; the price is that its
later segments come from newer policies (off-policy tokens, bounded by APRIL's
``max_version_span`` if set).

A step here still trains N groups, so the launch rule differs from APRIL's in one
point: a paused group keeps its slot in the wave (UloRL's batch is fixed), and the
next wave of N' goes out only when every group of the current one has come back
(finished or paused).  Refilling each paused slot at once instead would launch a
new group per pause and, with a segment much shorter than the typical response,
fill the buffer faster than later steps can drain it.  Everything else - abort at
N, FIFO resume - is APRIL's.
"""

from __future__ import annotations

from dataclasses import dataclass

from april_bench.config import ConfigError, param
from april_bench.rollout.strategy import RolloutView, StepSummary
from april_bench.types import Sample
from april_impl.april import AprilStrategy

__all__ = ["SegmentRolloutStrategy"]


class SegmentRolloutStrategy(AprilStrategy):
    """APRIL whose requests stop at a fixed segment; unfinished responses continue next step."""

    @dataclass(kw_only=True, slots=True, frozen=True)
    class Config(AprilStrategy.Config):
        segment_len: int = param(4096, help="tokens one response may generate per step (UloRL's segment)")

        def __post_init__(self) -> None:
            AprilStrategy.Config.__post_init__(self)
            if self.segment_len < 1:
                raise ConfigError(f"segment_len must be >= 1, got {self.segment_len}")

    name = "segment"

    def __init__(self, config: Config) -> None:
        super().__init__(config)
        self.segment_len = config.segment_len
        #: (launched, rejected) counts when the current wave went out.
        self._wave_start = (0, 0)

    def launch_count(self, view: RolloutView) -> int:
        wave = max(self.config.over_sampling_batch_size or view.over_sampling, view.target_groups)
        if view.in_flight == 0 and view.accepted < view.target_groups:
            self._wave_start = (view.launched, view.rejected)  # the step's start, or the wave came back
            return wave
        launched, rejected = self._wave_start
        occupied = (view.launched - launched) - (view.rejected - rejected)  # rejections free their slot
        return max(0, wave - occupied)

    def on_step_end(self, summary: StepSummary) -> None:
        self._wave_start = (0, 0)

    def request_budget(self, sample: Sample, remaining: int, view: RolloutView) -> int:
        span = self.config.max_version_span
        limit = sample.response_len + remaining  # the response limit
        if span is not None and self.segment_len * (span + 1) < limit:
            # a response needing more segments than the span allows restarts forever: refuse at once
            raise ConfigError(
                f"segment: responses of up to {limit} tokens need {-(-limit // self.segment_len)} segments "
                f"of {self.segment_len}, but max_version_span={span} restarts any that spans more than "
                f"{span + 1}; raise segment_len to {-(-limit // (span + 1))} or max_version_span to "
                f"{-(-limit // self.segment_len) - 1}"
            )
        return min(remaining, self.segment_len)
