"""The rollout-strategy protocol: pure decisions over plain data.

A strategy never touches an engine.  The :class:`~april_bench.rollout.loop.RolloutLoop`
does the mechanics (submit, accept, filter, abort until idle, drain, resume) and
asks the strategy three questions:

* :meth:`RolloutStrategy.launch_count` - how many groups to launch now?  Asked
  at the start of a step and after every group that finishes or is rejected;
* :meth:`RolloutStrategy.on_leftover` - a group was still unfinished (or
  finished surplus) when the step stopped: buffer it for a later step, or drop it?
* :meth:`RolloutStrategy.keep_partial` - a buffered sample is about to resume:
  keep its partial tokens, or restart it from the prompt?

Buffered groups are always launched before new prompts (FIFO).  The synchronous
baseline, oversample-and-discard and APRIL are siblings behind this protocol,
so a comparison differs in the strategy alone.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from april_bench.types import Group, Sample

__all__ = ["Disposition", "RefillMode", "RolloutStrategy", "RolloutView", "wave_refill"]


class Disposition(enum.StrEnum):
    BUFFER = "buffer"  # keep the group whole; it is resumed first in a later step
    DROP = "drop"  # throw it away; its prompt is counted as dropped, its tokens as wasted


class RefillMode(enum.StrEnum):
    """How to top up when dynamic sampling rejects groups."""

    WAVE = "wave"  # launch a whole wave when accepted + in flight < N (slime / APRIL reference)
    GRANULAR = "granular"  # launch exactly the deficit (slime PR #2218)


@dataclass(frozen=True, slots=True)
class RolloutView:
    """What a strategy may look at: counts for the current step, nothing mutable."""

    step: int
    policy_version: int
    #: N: groups the trainer needs this step.
    target_groups: int
    accepted: int
    #: Groups launched this step that have not come back yet.
    in_flight: int
    #: Groups waiting in the carry-over buffer.
    buffered: int
    rejected: int
    launched: int
    refill: RefillMode


@runtime_checkable
class RolloutStrategy(Protocol):
    """Decisions that distinguish one rollout strategy from another."""

    name: str

    def launch_count(self, view: RolloutView) -> int:
        """Groups to launch now (0 for none)."""
        ...

    def on_leftover(self, group: Group, view: RolloutView) -> Disposition:
        """What to do with a group still in flight (or finished surplus) when the step stops."""
        ...

    def keep_partial(self, sample: Sample, view: RolloutView) -> bool:
        """Whether a buffered sample resumes from its partial tokens (False restarts it)."""
        ...


def wave_refill(view: RolloutView, wave: int) -> int:
    """The reference launch rule: launch when accepted + in flight < N.

    The first launch of a step is always a whole wave.  A refill (after DAPO
    rejections) is a whole wave in ``wave`` mode - slime's
    ``over_sampling_batch_size`` refill, so one rejection in the sync baseline
    relaunches N groups - and only the deficit in ``granular`` mode.
    """
    deficit = view.target_groups - view.accepted - view.in_flight
    if deficit <= 0:
        return 0
    if view.launched and view.refill is RefillMode.GRANULAR:
        return deficit
    return wave
