"""The rollout-strategy protocol: pure decisions over plain data.

A strategy never touches an engine.  The :class:`~april_bench.rollout.loop.RolloutLoop`
does the mechanics (submit, accept, filter, abort until idle, drain, resume) and
asks the strategy:

* :meth:`RolloutStrategy.launch_count` - how many groups to launch now?  Asked
  at the start of a step and after every group that finishes or is rejected;
* :meth:`RolloutStrategy.select` - which candidates launch, in what order:
  carried-over (buffered) groups and the next fresh prompts, each with its
  progress (tokens so far, policy versions, aborts).  Buffered groups it leaves
  out stay buffered; fresh prompts it leaves out stay first in the stream;
* :meth:`RolloutStrategy.request_budget` - a cap on the tokens one request may
  generate this step (segment rollout); ``None`` means the full remaining budget;
* :meth:`RolloutStrategy.priority` - the engine priority of a group's requests
  (engines that schedule by priority honour it; others ignore it);
* :meth:`RolloutStrategy.abort_now` - groups to abort right away, mid-step
  (selective abort); asked after every group returns;
* :meth:`RolloutStrategy.stop_abort` - once N groups are accepted, which
  in-flight groups to abort (``None``: all); the others run to completion
  before the step ends;
* :meth:`RolloutStrategy.on_leftover` - a group was still unfinished (or
  finished surplus) when the step stopped: buffer it for a later step, or drop it?
* :meth:`RolloutStrategy.keep_partial` - a buffered sample is about to resume:
  keep its partial tokens, or restart it from the prompt?
* :meth:`RolloutStrategy.on_step_end` - the step's outcome, for strategies that
  adapt (over-provisioning from the observed completion distribution);
* :meth:`RolloutStrategy.group_shape` - how many samples a fresh group launches
  and how many finished ones complete it (the rest are aborted and dropped);
* :attr:`RolloutStrategy.pins_versions` - True: every request generates with
  the weights its sample started on, so a resumed partial finishes on the
  policy version that began it (an engine that holds several versions).

:class:`BaseStrategy` answers every question the way the paper's strategies do
(FIFO, full budget, no priority, abort everything at N), so each sibling
overrides only what makes it different.  The synchronous baseline,
oversample-and-discard and APRIL are siblings behind this protocol, so a
comparison differs in the strategy alone.
"""

from __future__ import annotations

import abc
import enum
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from april_bench.types import Group, Sample

__all__ = [
    "BaseStrategy",
    "Candidate",
    "Disposition",
    "GroupProgress",
    "RefillMode",
    "RolloutStrategy",
    "RolloutView",
    "StepSummary",
    "wave_refill",
]


class Disposition(enum.StrEnum):
    BUFFER = "buffer"  # keep the group whole; it is resumed first in a later step
    DROP = "drop"  # throw it away; its prompt is counted as dropped, its tokens as wasted


class RefillMode(enum.StrEnum):
    """How to top up when dynamic sampling rejects groups."""

    WAVE = "wave"  # launch a whole wave when accepted + in flight < N (slime / APRIL reference)
    GRANULAR = "granular"  # launch exactly the deficit (slime PR #2218)


@dataclass(frozen=True, slots=True)
class GroupProgress:
    """Where one group stands, as a strategy may see it."""

    uid: int
    source_id: str
    prompt_len: int
    samples: int
    finished_samples: int
    #: Response tokens the group holds (what came back from the engine so far).
    tokens: int
    #: Longest response in the group so far.
    longest: int
    #: Oldest and newest policy version among its tokens (``None``: no tokens yet).
    oldest_version: int | None
    newest_version: int | None
    #: Most aborts any of its samples went through.
    aborts: int
    #: Step of the group's first launch (``None``: never launched).
    first_step: int | None
    #: Seconds since it was launched this step (``None`` unless in flight).
    running_for_s: float | None = None

    @classmethod
    def of(cls, group: Group, running_for_s: float | None = None) -> GroupProgress:
        lengths = [s.response_len for s in group.samples]
        versions = [v for s in group.samples for v, _ in s.version_runs()]
        return cls(
            uid=group.uid,
            source_id=group.prompt.source_id,
            prompt_len=group.prompt.length,
            samples=len(group.samples),
            finished_samples=sum(1 for s in group.samples if s.status.is_finished),
            tokens=sum(lengths),
            longest=max(lengths, default=0),
            oldest_version=min(versions, default=None),
            newest_version=max(versions, default=None),
            aborts=max((s.abort_count for s in group.samples), default=0),
            first_step=group.first_step,
            running_for_s=running_for_s,
        )


@dataclass(frozen=True, slots=True)
class Candidate:
    """A group that could launch now: carried over from a buffer, or the next fresh prompt."""

    progress: GroupProgress
    #: True for a prompt never launched before (taken from the stream).
    fresh: bool

    @property
    def uid(self) -> int:
        return self.progress.uid


@dataclass(frozen=True, slots=True)
class RolloutView:
    """What a strategy may look at: counts for the current step and, on demand, each group's
    progress.  Nothing in it is mutable."""

    step: int
    policy_version: int
    #: N: groups the trainer needs this step.
    target_groups: int
    #: N': the rollout's over-sampling batch size (a strategy may override it).
    over_sampling: int
    accepted: int
    #: Groups launched this step that have not come back yet.
    in_flight: int
    #: Groups waiting in the carry-over buffer.
    buffered: int
    rejected: int
    launched: int
    refill: RefillMode
    #: Seconds since the step started (on the arm's clock).
    elapsed_s: float = 0.0
    #: Our requests the engine has not returned yet.
    pending_requests: int = 0
    #: In-flight groups by uid (computed when read).
    groups: Mapping[int, GroupProgress] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class StepSummary:
    """What a step did, for strategies that adapt between steps."""

    step: int
    launched_groups: int
    accepted_groups: int
    buffered_groups: int
    dropped_groups: int
    rollout_time_s: float
    drain_time_s: float
    generated_tokens: int
    #: Seconds from the step start to each accepted group's completion, in order.
    completion_times_s: tuple[float, ...] = ()


@runtime_checkable
class RolloutStrategy(Protocol):
    """Decisions that distinguish one rollout strategy from another (:class:`BaseStrategy` supplies the
    defaults of every member but :meth:`launch_count` and :meth:`on_leftover`)."""

    name: str
    #: True for strategies that abort and resume partial responses: an async driver then updates
    #: weights with requests in flight by default.
    partial_rollout: bool
    #: True: every request names the policy version its sample started on (``GenerateRequest.
    #: policy_version``), and the loop tells the engine which old versions buffered partials need.
    pins_versions: bool

    def launch_count(self, view: RolloutView) -> int:
        """Groups to launch now (0 for none)."""
        ...

    def select(self, candidates: Sequence[Candidate], count: int, view: RolloutView) -> Sequence[Candidate]:
        """At most ``count`` of ``candidates`` (buffered first, then fresh), in launch order."""
        ...

    def request_budget(self, sample: Sample, remaining: int, view: RolloutView) -> int:
        """Tokens this sample's request may generate (at most ``remaining``, at least 1)."""
        ...

    def priority(self, group: GroupProgress, view: RolloutView) -> int:
        """Engine priority of a group's requests (lower runs first, as in vLLM and SGLang)."""
        ...

    def abort_now(self, view: RolloutView) -> Collection[int]:
        """Uids of in-flight groups to abort at once (their partials come back as leftovers)."""
        ...

    def stop_abort(self, view: RolloutView) -> Collection[int] | None:
        """Once N groups are accepted: uids of in-flight groups to abort (``None``: all of them)."""
        ...

    def on_leftover(self, group: Group, view: RolloutView) -> Disposition:
        """What to do with a group still in flight (or finished surplus) when the step stops."""
        ...

    def keep_partial(self, sample: Sample, view: RolloutView) -> bool:
        """Whether a buffered sample resumes from its partial tokens (False restarts it)."""
        ...

    def on_step_end(self, summary: StepSummary) -> None:
        """Called once per step, after the carry-over."""
        ...

    def group_shape(self, n: int, view: RolloutView) -> tuple[int, int]:
        """``(launched, kept)`` samples of a fresh group (``n``: the run's samples per prompt): the group
        is complete once ``kept`` of its ``launched`` samples finished; the others are aborted and
        dropped.  ``1 <= kept <= launched``."""
        ...

    def state(self) -> dict[str, object]:
        """What the strategy learned so far, JSON-serialisable (a checkpoint holds it)."""
        ...

    def restore(self, state: dict[str, object]) -> None:
        """Continue from :meth:`state`'s result (a resumed run)."""
        ...


class BaseStrategy(abc.ABC):
    """The defaults of every question: FIFO launch, full budget, one priority, abort all at N.

    Subclasses set ``name`` and override what makes them different; :meth:`launch_count` and
    :meth:`on_leftover` have no default (they are what a strategy *is*).
    """

    name = "base"
    #: True for strategies that abort and resume partial responses (APRIL's family): an async
    #: driver then updates weights with requests in flight by default.
    partial_rollout = False
    #: True: requests generate with the weights their sample started on (consistent rollout).
    pins_versions = False

    @abc.abstractmethod
    def launch_count(self, view: RolloutView) -> int: ...

    def select(self, candidates: Sequence[Candidate], count: int, view: RolloutView) -> Sequence[Candidate]:
        return candidates[:count]

    def request_budget(self, sample: Sample, remaining: int, view: RolloutView) -> int:
        return remaining

    def priority(self, group: GroupProgress, view: RolloutView) -> int:
        return 0

    def abort_now(self, view: RolloutView) -> Collection[int]:
        return ()

    def stop_abort(self, view: RolloutView) -> Collection[int] | None:
        return None

    @abc.abstractmethod
    def on_leftover(self, group: Group, view: RolloutView) -> Disposition: ...

    def keep_partial(self, sample: Sample, view: RolloutView) -> bool:
        return True

    def on_step_end(self, summary: StepSummary) -> None:
        return None

    def group_shape(self, n: int, view: RolloutView) -> tuple[int, int]:
        return n, n

    def state(self) -> dict[str, object]:
        """What an adaptive strategy learned so far (a resumed run restores it); stateless: empty."""
        return {}

    def restore(self, state: dict[str, object]) -> None:
        return None


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
