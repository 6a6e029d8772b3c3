"""APRIL: Active Partial Rollouts.

Each step launches N' > N groups (buffered partial groups first, FIFO, then
new prompts), accepts finished groups until N are done, aborts everything still
running and buffers every group that came back unfinished - whole, with its
finished members keeping their reward.  Next step those groups are resumed
first, from their token ids, with the remaining budget
``max_response_len - response_len``.  This mirrors the slime-based reference
(``--partial-rollout --over-sampling-batch-size``) with its known bugs fixed:
groups that finish during the drain or in the same instant as the N-th are
kept instead of silently dropped, the budget never exceeds the limit, and
every token carries the policy version that produced it.

Two optional caps bound how stale a recycled response may get.  A sample over a
cap restarts from its prompt when it is next resumed; its discarded tokens are
counted (``restart_tokens``), never hidden:

* ``max_version_span``: the oldest token of a resumed sample (finished or not)
  may be at most this many policy versions older than the current policy;
* ``max_aborts_per_sample``: an unfinished sample aborted more than this many
  times since it last started restarts (finished members of a buffered group
  are kept).
"""

from __future__ import annotations

from dataclasses import dataclass

from april_bench.config import BaseConfig, ConfigError, Configurable, param
from april_bench.rollout.strategy import BaseStrategy, Disposition, RolloutView, wave_refill
from april_bench.types import Group, Sample

__all__ = ["AprilStrategy"]


class AprilStrategy(BaseStrategy, Configurable):
    """Over-provision, stop at N, recycle the unfinished groups first next step."""

    @dataclass(kw_only=True, slots=True, frozen=True)
    class Config(BaseConfig):
        over_sampling_batch_size: int | None = param(
            None, help="N' for this arm (default: the rollout's --over-sampling-batch-size; APRIL: about 2N)"
        )
        max_version_span: int | None = param(
            None, help="restart a resumed sample whose oldest token is more than this many versions old"
        )
        max_aborts_per_sample: int | None = param(
            None, help="restart a sample once it has been aborted more than this many times"
        )

        def __post_init__(self) -> None:
            if self.over_sampling_batch_size is not None and self.over_sampling_batch_size < 1:
                raise ConfigError("over_sampling_batch_size must be >= 1")
            for name in ("max_version_span", "max_aborts_per_sample"):
                value = getattr(self, name)
                if value is not None and value < 0:
                    raise ConfigError(f"{name} must be >= 0 or unset, got {value}")

    name = "april"
    partial_rollout = True

    def __init__(self, config: Config) -> None:
        self.config = config

    def launch_count(self, view: RolloutView) -> int:
        wave = self.config.over_sampling_batch_size or view.over_sampling
        return wave_refill(view, max(wave, view.target_groups))

    def on_leftover(self, group: Group, view: RolloutView) -> Disposition:
        return Disposition.BUFFER

    def keep_partial(self, sample: Sample, view: RolloutView) -> bool:
        cfg = self.config
        if (
            cfg.max_aborts_per_sample is not None
            and not sample.status.is_finished
            and sample.aborts_since_restart > cfg.max_aborts_per_sample
        ):
            return False
        oldest = sample.oldest_version()
        return not (
            cfg.max_version_span is not None
            and oldest is not None
            and view.policy_version - oldest > cfg.max_version_span
        )
