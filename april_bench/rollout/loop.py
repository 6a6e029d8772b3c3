"""The rollout loop: the mechanics every strategy shares.

One call of :meth:`RolloutLoop.run_step` collects N accepted groups:

1. launch the groups the strategy asks for - buffered groups first (FIFO),
   then new prompts.  A buffered sample resumes from its token ids with
   ``max_new_tokens = max_response_len - response_len`` (never above the
   limit; a sample with no budget left is TRUNCATED without a request);
2. as groups finish, score them, apply DAPO dynamic sampling if enabled
   (reject groups whose rewards are all equal), accept the rest, and ask the
   strategy whether to launch more;
3. once N groups are accepted, abort every request still in flight and
   re-abort until the engine is idle and every request has returned (a request
   that lands after the abort must not run on), then hand each group that came
   back to the strategy: buffer it whole, or drop it.

Nothing is lost silently: every launched prompt ends trained, buffered or
dropped, and the step record counts each.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import math
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from april_bench.config import BaseConfig, ConfigError, Configurable, param
from april_bench.engines.protocol import (
    Completion,
    Engine,
    EngineError,
    GenerateRequest,
    SamplingParams,
    SaturationModel,
)
from april_bench.results.records import Fate, RequestRecord, RunRecorder, StepRecord
from april_bench.rollout.buffer import GroupBuffer
from april_bench.rollout.strategy import Disposition, RefillMode, RolloutStrategy, RolloutView
from april_bench.seeding import sample_seed
from april_bench.types import Group, Sample, SampleStatus, Segment, concat_ids
from april_bench.workload import PromptStream, Workload

__all__ = ["RolloutConfig", "RolloutLoop", "StepOutcome", "keep_group"]


def keep_group(rewards: list[float]) -> bool:
    """DAPO dynamic sampling: keep a group only if its rewards are not all equal
    (unbiased float64 std > 1e-6, slime ``check_reward_nonzero_std``)."""
    if len(rewards) < 2:
        return True
    mean = sum(rewards) / len(rewards)
    var = sum((r - mean) ** 2 for r in rewards) / (len(rewards) - 1)
    return math.sqrt(var) > 1e-6


@dataclass(kw_only=True, slots=True, frozen=True)
class RolloutConfig(BaseConfig):
    rollout_batch_size: int = param(32, help="N: prompt groups trained per step")
    n_samples_per_prompt: int = param(8, help="samples (responses) per prompt group")
    over_sampling_batch_size: int = param(64, help="N': groups per launch wave for over-sampling strategies")
    max_response_len: int = param(16384, help="response token limit (resumed samples included)")
    temperature: float = param(0.8, help="sampling temperature (APRIL scripts: 0.8)")
    top_p: float = param(1.0, help="nucleus sampling threshold")
    dynamic_sampling: bool = param(False, help="DAPO dynamic sampling: reject groups with all-equal rewards")
    refill: RefillMode = param(RefillMode.WAVE, help="refill after rejections: a whole wave, or the deficit")
    reabort_interval_s: float = param(1.0, help="re-abort if requests are still out after this long")
    abort_timeout_s: float = param(180.0, help="give up if the engine is not idle this long after abort")
    replay_lengths: bool = param(False, help="replay the workload's response lengths on a real engine")
    seed: int = param(0, help="sampling seed: sample i of prompt u gets the same seed in every arm")

    def __post_init__(self) -> None:
        try:
            object.__setattr__(self, "refill", RefillMode(self.refill))  # accept "wave" from JSON / CLI
        except ValueError:
            raise ConfigError(f"--refill must be one of {', '.join(m.value for m in RefillMode)}") from None
        for name in ("rollout_batch_size", "n_samples_per_prompt", "max_response_len"):
            if getattr(self, name) < 1:
                raise ConfigError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}")
        if self.over_sampling_batch_size < self.rollout_batch_size:
            raise ConfigError(
                f"--over-sampling-batch-size ({self.over_sampling_batch_size}) must be >= "
                f"--rollout-batch-size ({self.rollout_batch_size}); set it to at least "
                f"{self.rollout_batch_size} (APRIL recommends about twice)"
            )
        if self.reabort_interval_s <= 0 or self.abort_timeout_s <= 0:
            raise ConfigError("abort intervals must be positive")

    def sampling_params(self) -> SamplingParams:
        return SamplingParams(temperature=self.temperature, top_p=self.top_p)


@dataclass(slots=True)
class StepOutcome:
    """The accepted batch plus the step's rollout record (train fields still empty)."""

    batch: list[Group]
    record: StepRecord


@dataclass(slots=True)
class _InFlight:
    group: Group
    order: int
    outstanding: int


@dataclass(slots=True)
class _Pending:
    flight: _InFlight
    sample: Sample
    request: GenerateRequest
    prefix_len: int
    t_submit: float


@dataclass(slots=True)
class _StepState:
    step: int
    version: int
    t_start: float
    accepted: list[Group] = field(default_factory=list)
    in_flight: dict[int, _InFlight] = field(default_factory=dict)
    pending: dict[str, _Pending] = field(default_factory=dict)
    returned_after_stop: list[_InFlight] = field(default_factory=list)
    pumps: list[asyncio.Task[None]] = field(default_factory=list)
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


class RolloutLoop(Configurable):
    """Runs rollout steps for one arm: one strategy, one engine, one workload."""

    Config = RolloutConfig

    def __init__(
        self,
        config: RolloutConfig,
        *,
        arm: str,
        engine: Engine,
        strategy: RolloutStrategy,
        workload: Workload,
        prompts: PromptStream,
        recorder: RunRecorder,
        t0: float = 0.0,
    ) -> None:
        self.config = config
        self.arm = arm
        self.engine = engine
        self.strategy = strategy
        self.workload = workload
        self.prompts = prompts
        self.recorder = recorder
        self.buffer = GroupBuffer()
        self._t0 = t0
        self._sampling = config.sampling_params()
        self._replay = config.replay_lengths or not engine.info.produces_tokens
        self._seeded = engine.info.produces_tokens  # an engine that samples gets per-sample seeds
        self._next_request = 0
        self._next_order = 0

    def shift_clock(self, seconds: float) -> None:
        """Move the records' time origin forward (the harness excludes evaluation time)."""
        self._t0 += seconds

    # ------------------------------------------------------------------ step
    async def run_step(self, step: int, policy_version: int) -> StepOutcome:
        loop = asyncio.get_running_loop()
        st = _StepState(step=step, version=policy_version, t_start=loop.time())
        with _Meter(st):
            self._maybe_launch(st)
        await st.enough.wait()
        self._raise_if_failed(st)
        t_stop = loop.time()
        abort_rounds = await self._abort_until_idle(st) if st.pending else 0
        await asyncio.gather(*st.pumps)
        self._raise_if_failed(st)
        t_end = loop.time()
        with _Meter(st):
            carried = self._carry_over(st)
        record = self._step_record(st, t_end, t_end - t_stop, abort_rounds, carried)
        return StepOutcome(batch=st.accepted, record=record)

    # ------------------------------------------------------------ launching
    def _view(self, st: _StepState) -> RolloutView:
        return RolloutView(
            step=st.step,
            policy_version=st.version,
            target_groups=self.config.rollout_batch_size,
            accepted=len(st.accepted),
            in_flight=len(st.in_flight),
            buffered=len(self.buffer),
            rejected=st.rejected,
            launched=st.launched,
            refill=self.config.refill,
        )

    def _maybe_launch(self, st: _StepState) -> None:
        if st.stopping:
            return
        count = self.strategy.launch_count(self._view(st))
        if count <= 0:
            if not st.in_flight and len(st.accepted) < self.config.rollout_batch_size:
                raise RuntimeError(
                    f"strategy {self.strategy.name!r} launched nothing while step {st.step} still needs "
                    f"{self.config.rollout_batch_size - len(st.accepted)} groups"
                )
            return
        groups = self.buffer.take(count)
        st.resumed += len(groups)
        fresh = self.prompts.take(count - len(groups))
        st.new_prompts += len(fresh)
        groups += [Group.fresh(p, self.config.n_samples_per_prompt) for p in fresh]
        self._launch(st, groups)

    def _launch(self, st: _StepState, groups: list[Group]) -> None:
        now = asyncio.get_running_loop().time()
        view = self._view(st)
        requests: list[GenerateRequest] = []
        ready: list[_InFlight] = []
        for group in groups:
            if group.first_step is None:
                group.first_step = st.step
            flight = _InFlight(group=group, order=self._next_order, outstanding=0)
            self._next_order += 1
            st.in_flight[group.uid] = flight
            st.launched += 1
            for sample in group.samples:
                request = self._request_for(st, sample, view)
                if request is None:
                    continue
                requests.append(request)
                flight.outstanding += 1
                st.pending[request.request_id] = _Pending(flight, sample, request, sample.response_len, now)
            if flight.outstanding == 0:
                ready.append(flight)
        if requests:
            st.requests += len(requests)
            st.peak_concurrency = max(st.peak_concurrency, len(st.pending))
            st.all_returned.clear()
            tick = time.perf_counter()
            stream = self.engine.generate(requests)
            st.bookkeeping_s -= time.perf_counter() - tick  # the engine's submit is not ours
            st.pumps.append(asyncio.ensure_future(self._pump(st, stream)))
        for flight in ready:  # buffered groups that were already finished
            self._on_group_returned(st, flight)

    def _request_for(self, st: _StepState, sample: Sample, view: RolloutView) -> GenerateRequest | None:
        if sample.response_len and not self.strategy.keep_partial(sample, view):
            st.restart_tokens += sample.restart()
            st.restarted += 1
        if sample.status.is_finished:
            return None
        budget = self.config.max_response_len - sample.response_len
        if budget <= 0:
            sample.status = SampleStatus.TRUNCATED
            return None
        if sample.start_step is None:
            sample.start_step = st.step
        replay = None
        if self._replay:
            target = self.workload.replay_len(sample.prompt, sample.index, sample.start_step)
            if target is None:
                raise ConfigError(
                    f"engine {self.engine.info.name!r} needs replayed lengths but workload "
                    f"{self.workload.name!r} provides none; use a workload with a length model"
                )
            replay = max(1, target - sample.response_len)
        prompt = sample.prompt
        input_ids = None
        if prompt.token_ids is not None and sample.has_tokens:
            input_ids = concat_ids(prompt.token_ids, sample.response_ids())
        request_id = f"{self.arm}-{self._next_request:010x}"  # equal length: no id prefixes another
        self._next_request += 1
        return GenerateRequest(
            request_id=request_id,
            input_len=prompt.length + sample.response_len,
            max_new_tokens=budget,
            sampling=self._sampling_for(sample),
            input_ids=input_ids,
            replay_len=replay,
            routing_key=str(prompt.uid),
        )

    def _sampling_for(self, sample: Sample) -> SamplingParams:
        if not self._seeded:
            return self._sampling
        seed = sample_seed(self.config.seed, sample.prompt.uid, sample.index)
        return dataclasses.replace(self._sampling, seed=seed)

    # ------------------------------------------------------------ returning
    async def _pump(self, st: _StepState, stream: AsyncIterator[Completion]) -> None:
        try:
            async for completion in stream:
                with _Meter(st):
                    self._on_completion(st, completion)
        except BaseException as exc:  # wake the step so it can re-raise
            st.error = st.error or exc
            st.enough.set()
            st.all_returned.set()
            raise

    def _on_completion(self, st: _StepState, c: Completion) -> None:
        pending = st.pending.pop(c.request_id, None)
        if pending is None:
            raise EngineError(f"engine returned unknown or duplicate request id {c.request_id!r}")
        if c.num_tokens > pending.request.max_new_tokens:
            raise EngineError(
                f"{c.request_id}: engine returned {c.num_tokens} tokens for max_new_tokens="
                f"{pending.request.max_new_tokens}"
            )
        sample = pending.sample
        sample.append(
            Segment(
                request_id=c.request_id,
                policy_version=c.policy_version,
                num_tokens=c.num_tokens,
                finish_reason=c.finish_reason,
                step=st.step,
                token_ids=c.output_ids,
                logprobs=c.logprobs,
            )
        )
        st.generated += c.num_tokens
        st.context_token_sum += c.num_tokens * (pending.request.input_len + (c.num_tokens - 1) / 2)
        if c.finish_reason == "abort":
            st.aborted_requests += 1
        self.recorder.requests.append(
            RequestRecord(
                arm=self.arm,
                step=st.step,
                request_id=c.request_id,
                group_uid=sample.prompt.uid,
                sample_index=sample.index,
                prompt_len=sample.prompt.length,
                prefix_len=pending.prefix_len,
                max_new_tokens=pending.request.max_new_tokens,
                output_len=c.num_tokens,
                finish_reason=c.finish_reason.value,
                policy_version=c.policy_version,
                t_submit=pending.t_submit - self._t0,
                t_first_token=None if c.t_first_token is None else c.t_first_token - self._t0,
                t_done=c.t_done - self._t0,
                replica=c.replica,
                num_retractions=c.num_retractions,
            )
        )
        flight = pending.flight
        flight.outstanding -= 1
        if flight.outstanding == 0:
            self._on_group_returned(st, flight)
        if not st.pending:
            st.all_returned.set()

    def _on_group_returned(self, st: _StepState, flight: _InFlight) -> None:
        group = flight.group
        del st.in_flight[group.uid]
        if st.stopping:
            st.returned_after_stop.append(flight)  # surplus or unfinished: the strategy decides
            return
        if not group.is_finished:
            # Aborted although we did not stop (an engine-side timeout, another client's
            # abort-all): carry it over like any leftover, and keep the step going.
            st.returned_after_stop.append(flight)
            self._maybe_launch(st)
            return
        self._score(group)
        if self.config.dynamic_sampling and not keep_group(group.rewards()):
            st.rejected += 1
            st.rejected_tokens += group.response_tokens
            self.recorder.sample_fates(
                self.arm, [group], step=st.step, fate=Fate.DROPPED, reason="filter_rejected"
            )
        else:
            st.accepted.append(group)
            if len(st.accepted) >= self.config.rollout_batch_size:
                st.stopping = True
                st.enough.set()
                return
        self._maybe_launch(st)

    def _score(self, group: Group) -> None:
        """Reward every finished sample once (finished members of a buffered group keep theirs)."""
        for sample in group.samples:
            if sample.reward is None and sample.status.is_finished:
                sample.reward = self.workload.reward(sample)

    # ------------------------------------------------------------- stopping
    async def _abort_until_idle(self, st: _StepState) -> int:
        """Abort everything, and re-abort until every request is back and the engine is idle."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.config.abort_timeout_s
        rounds = 0
        while True:
            if st.pending:
                await self.engine.abort(None)
                rounds += 1
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(st.all_returned.wait(), self.config.reabort_interval_s)
                self._raise_if_failed(st)
            if not st.pending and (await self.engine.load()).idle:
                return rounds
            if loop.time() > deadline:
                raise EngineError(
                    f"engine {self.engine.info.name!r} still had {len(st.pending)} of our requests out "
                    f"{self.config.abort_timeout_s:.0f} s after abort; its abort endpoint may be broken"
                )
            if not st.pending:  # idle by our count, busy by the engine's: abort and poll again
                await self.engine.abort(None)
                rounds += 1
                await asyncio.sleep(self.config.reabort_interval_s)

    def _carry_over(self, st: _StepState) -> tuple[int, int, int, int, int]:
        """Buffer or drop every group that came back after the stop; returns counts."""
        view = self._view(st)
        buffered = buffered_tokens = partial = dropped = dropped_tokens = 0
        for flight in sorted(st.returned_after_stop, key=lambda f: f.order):
            group = flight.group
            self._score(group)
            if self.strategy.on_leftover(group, view) is Disposition.BUFFER:
                self.buffer.put(group)
                buffered += 1
                buffered_tokens += group.response_tokens
                partial += sum(1 for s in group.samples if s.response_len and not s.status.is_finished)
            else:
                dropped += 1
                dropped_tokens += group.response_tokens
                reason = "surplus_discarded" if group.is_finished else "unfinished_discarded"
                self.recorder.sample_fates(self.arm, [group], step=st.step, fate=Fate.DROPPED, reason=reason)
        return buffered, buffered_tokens, partial, dropped, dropped_tokens

    def _raise_if_failed(self, st: _StepState) -> None:
        if st.error is not None:
            raise st.error

    def _step_record(
        self, st: _StepState, t_end: float, drain: float, abort_rounds: int, carried: tuple[int, ...]
    ) -> StepRecord:
        buffered, buffered_tokens, partial, dropped, dropped_tokens = carried
        mean_context = st.context_token_sum / st.generated if st.generated else 0.0
        return StepRecord(
            arm=self.arm,
            step=st.step,
            policy_version=st.version,
            t_start=st.t_start - self._t0,
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
            dropped_groups=dropped,
            dropped_tokens=dropped_tokens,
            buffered_groups=buffered,
            buffered_tokens=buffered_tokens,
            partial_samples=partial,
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
            saturated_tokens_per_s=self._saturated(st.peak_concurrency, mean_context),
            bookkeeping_s=st.bookkeeping_s,
        )

    def _saturated(self, concurrency: int, mean_context: float) -> float | None:
        if not isinstance(self.engine, SaturationModel):
            return None  # a real server cannot know its no-tail rate
        return self.engine.saturated_tokens_per_s(concurrency, mean_context)


class _Meter:
    """Adds the real (not virtual) seconds spent inside the block to the step's bookkeeping."""

    __slots__ = ("_st", "_tick")

    def __init__(self, st: _StepState) -> None:
        self._st = st
        self._tick = 0.0

    def __enter__(self) -> None:
        self._tick = time.perf_counter()

    def __exit__(self, *exc: object) -> None:
        self._st.bookkeeping_s += time.perf_counter() - self._tick
