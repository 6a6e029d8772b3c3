"""The state of one rollout step, and the step record built from it."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

from april_bench.engines.protocol import EngineWork, GenerateRequest
from april_bench.results.records import StepRecord
from april_bench.types import Group, Sample

__all__ = ["CarryOver", "InFlight", "Meter", "Pending", "StepState", "step_record"]


@dataclass(slots=True)
class InFlight:
    group: Group
    order: int
    outstanding: int
    t_launch: float = 0.0
    #: A group that keeps fewer samples than it launched (``Group.keep``): its finished samples in
    #: the order they finished (those finished before this launch first).
    finished: list[Sample] = field(default_factory=list)


@dataclass(slots=True)
class Pending:
    flight: InFlight
    sample: Sample
    request: GenerateRequest
    prefix_len: int
    t_submit: float


@dataclass(slots=True)
class CarryOver:
    """What the carry-over did with the groups that came back unfinished or surplus."""

    buffered: int = 0
    buffered_tokens: int = 0
    partial: int = 0
    dropped: int = 0
    dropped_tokens: int = 0


@dataclass(slots=True)
class StepState:
    step: int
    version: int
    t_start: float
    #: An async driver's staleness bound: buffered samples with older tokens restart (None: no bound).
    oldest_allowed: int | None = None
    accepted: list[Group] = field(default_factory=list)
    #: Seconds from the step start to each accepted group's completion.
    accepted_at: list[float] = field(default_factory=list)
    in_flight: dict[int, InFlight] = field(default_factory=dict)
    pending: dict[str, Pending] = field(default_factory=dict)
    #: Groups that came back unfinished (aborted, or stopped at a segment) or as surplus after the
    #: stop: the strategy decides at the end of the step whether each is buffered or dropped.
    leftovers: list[InFlight] = field(default_factory=list)
    #: What brings each engine stream's completions back (a task, or a stream's ``consume``).
    pumps: list[asyncio.Future[None]] = field(default_factory=list)
    aborts: list[asyncio.Task[None]] = field(default_factory=list)
    enough: asyncio.Event = field(default_factory=asyncio.Event)
    all_returned: asyncio.Event = field(default_factory=asyncio.Event)
    error: BaseException | None = None
    stopping: bool = False
    launched: int = 0
    new_prompts: int = 0
    resumed: int = 0
    rejected: int = 0
    rejected_tokens: int = 0
    restarted: int = 0
    restart_tokens: int = 0
    requests: int = 0
    aborted_requests: int = 0
    generated: int = 0
    context_token_sum: float = 0.0
    peak_concurrency: int = 0
    bookkeeping_s: float = 0.0
    #: Multi-turn episodes: environment calls in flight (by the request that ended the turn), and
    #: the calls answered, their seconds and observation tokens this step.
    env_pending: dict[str, asyncio.Future[None]] = field(default_factory=dict)
    env_calls: int = 0
    env_time_s: float = 0.0
    observation_tokens: int = 0
    env_cancelled: int = 0
    #: Set at the stop with ``env_calls_at_stop=cancel``: every call still out (or started later) ends.
    env_cancel: asyncio.Event = field(default_factory=asyncio.Event)


class Meter:
    """Adds the real (not virtual) seconds spent inside the block to the step's bookkeeping."""

    __slots__ = ("_st", "_tick")

    def __init__(self, st: StepState) -> None:
        self._st = st
        self._tick = 0.0

    def __enter__(self) -> None:
        self._tick = time.perf_counter()

    def __exit__(self, *exc: object) -> None:
        self._st.bookkeeping_s += time.perf_counter() - self._tick


def step_record(
    st: StepState,
    *,
    arm: str,
    t0: float,
    t_end: float,
    drain: float,
    abort_rounds: int,
    carried: CarryOver,
    saturated_tokens_per_s: float | None,
    repeat: int = 0,
    work: EngineWork | None = None,
) -> StepRecord:
    mean_context = st.context_token_sum / st.generated if st.generated else 0.0
    return StepRecord(
        arm=arm,
        step=st.step,
        policy_version=st.version,
        t_start=st.t_start - t0,
        rollout_time_s=t_end - st.t_start,
        train_time_s=0.0,
        weight_sync_time_s=0.0,
        step_time_s=0.0,
        drain_time_s=drain,
        launched_groups=st.launched,
        new_prompts=st.new_prompts,
        resumed_groups=st.resumed,
        accepted_groups=len(st.accepted),
        rejected_groups=st.rejected,
        rejected_tokens=st.rejected_tokens,
        dropped_groups=carried.dropped,
        dropped_tokens=carried.dropped_tokens,
        buffered_groups=carried.buffered,
        buffered_tokens=carried.buffered_tokens,
        partial_samples=carried.partial,
        restarted_samples=st.restarted,
        restart_tokens=st.restart_tokens,
        requests=st.requests,
        aborted_requests=st.aborted_requests,
        abort_rounds=abort_rounds,
        generated_tokens=st.generated,
        trained_tokens=sum(g.response_tokens for g in st.accepted),
        off_policy_tokens=sum(s.off_policy_tokens(st.version) for g in st.accepted for s in g.samples),
        peak_concurrency=st.peak_concurrency,
        mean_context=mean_context,
        saturated_tokens_per_s=saturated_tokens_per_s,
        bookkeeping_s=st.bookkeeping_s,
        repeat=repeat,
        engine_iterations=None if work is None else work.engine_iterations,
        decode_iterations=None if work is None else work.decode_iterations,
        decode_tokens=None if work is None else work.decode_tokens,
        prefill_tokens=None if work is None else work.prefill_tokens,
        reprefill_tokens=None if work is None else work.reprefill_tokens,
        work_deterministic=None if work is None else work.deterministic,
        env_calls=st.env_calls,
        env_time_s=st.env_time_s,
        observation_tokens=st.observation_tokens,
        env_cancelled=st.env_cancelled,
    )
