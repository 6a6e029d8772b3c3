"""The rollout loop: the mechanics every strategy shares.

One call of :meth:`RolloutLoop.run_step` collects N accepted groups:

1. launch the groups the strategy asks for and selects - by default buffered
   groups first (FIFO), then new prompts.  A buffered sample resumes from its
   token ids with ``max_new_tokens = max_response_len - response_len`` (never
   above the limit, or the strategy's smaller segment budget; a sample with no
   budget left is TRUNCATED without a request);
2. as groups finish, score them, apply DAPO dynamic sampling if enabled
   (reject groups whose rewards are all equal), accept the rest, and ask the
   strategy whether to launch more;
3. once N groups are accepted, abort every request still in flight (or those
   the strategy names, letting the rest finish) and re-abort until the engine
   is idle and every request has returned (a request that lands after the abort
   must not run on), then hand each group that came back to the strategy:
   buffer it whole, or drop it.

Nothing is lost silently: every launched prompt ends trained, buffered or
dropped, and the step record counts each.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import math
import time
from collections.abc import AsyncIterator, Collection
from dataclasses import dataclass
from typing import Any, cast

from april_bench.algorithms.filters import keep_group
from april_bench.compiled import mypyc_attr
from april_bench.config import BaseConfig, ConfigError, Configurable, param
from april_bench.engines.protocol import (
    ACCOUNTING,
    SATURATION,
    VERSIONS,
    Completion,
    Consumable,
    Engine,
    EngineError,
    EngineWork,
    GenerateRequest,
    SamplingParams,
)
from april_bench.envs.protocol import Environment, EpisodeWorkload
from april_bench.results.recorder import RunRecorder
from april_bench.results.records import Fate, RequestRecord, StepRecord
from april_bench.rollout import episodes
from april_bench.rollout.buffer import GroupBuffer
from april_bench.rollout.progress import ProgressView
from april_bench.rollout.state import group_from_dict, group_to_dict
from april_bench.rollout.step import CarryOver, InFlight, Meter, Pending, StepState, step_record
from april_bench.rollout.strategy import (
    BaseStrategy,
    Candidate,
    Disposition,
    GroupProgress,
    RefillMode,
    RolloutStrategy,
    RolloutView,
    StepSummary,
)
from april_bench.seeding import sample_seed
from april_bench.types import FinishReason, Group, Prompt, Sample, SampleStatus, Segment, concat_ids
from april_bench.workload import PromptStream, Workload

__all__ = ["RolloutConfig", "RolloutLoop", "RolloutStalled", "StepOutcome"]


#: Requests one launch wave may hold: past this, memory for the bookkeeping alone runs to gigabytes
#: and no engine's queue holds it (SGLang's max_running_requests tops out at 4,096 per replica).
MAX_REQUESTS_PER_WAVE = 1 << 20


@mypyc_attr(native_class=False)  # compiled: its base is not (april_bench/compiled.py)
class RolloutStalled(ConfigError):
    """A step cannot gather N groups (every group keeps failing the filter, or no group finishes).

    The message is ``reason`` then ``fix`` (the ``run`` flags that change it); a command with other
    flags (``whatif``) or one that can leave the arm out (``ablate``) shows ``reason`` with its own
    advice.  ``arm``: the label of the arm that stalled, set by the session that ran it."""

    def __init__(self, reason: str, fix: str) -> None:
        super().__init__(f"{reason}. {fix}")
        self.reason = reason
        self.fix = fix
        self.arm: str | None = None


@mypyc_attr(native_class=False)  # compiled: its base is not (april_bench/compiled.py)
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
    max_groups_per_step: int | None = param(
        None, help="stop a step that launched this many groups without N passing (default: 16 x N')"
    )
    seed: int = param(0, help="sampling seed: sample i of prompt u gets the same seed in every arm")
    env_calls_at_stop: str = param(
        "finish", help="multi-turn episodes: calls out at a stop finish, or cancel (made again on resume)"
    )

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
        wave = self.over_sampling_batch_size * self.n_samples_per_prompt
        if wave > MAX_REQUESTS_PER_WAVE:
            raise ConfigError(
                f"--over-sampling-batch-size x --n-samples-per-prompt = {wave:,} requests per launch wave, "
                f"more than any engine holds ({MAX_REQUESTS_PER_WAVE:,}); lower them"
            )
        if self.max_groups_per_step is not None and self.max_groups_per_step < self.over_sampling_batch_size:
            raise ConfigError(
                f"rollout max_groups_per_step ({self.max_groups_per_step}) must be >= "
                f"--over-sampling-batch-size ({self.over_sampling_batch_size})"
            )
        if self.env_calls_at_stop not in ("finish", "cancel"):
            raise ConfigError(
                f"rollout env_calls_at_stop must be finish or cancel, got {self.env_calls_at_stop!r}"
            )
        for name in ("reabort_interval_s", "abort_timeout_s"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"rollout {name} must be > 0, got {getattr(self, name)}")
        if not (math.isfinite(self.temperature) and self.temperature >= 0):
            raise ConfigError(f"rollout temperature must be a finite number >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:  # NaN fails this too
            raise ConfigError(f"rollout top_p must be in (0, 1], got {self.top_p}")

    def sampling_params(self) -> SamplingParams:
        return SamplingParams(temperature=self.temperature, top_p=self.top_p)


@dataclass(slots=True)
class StepOutcome:
    """The accepted batch plus the step's rollout record (train fields still empty)."""

    batch: list[Group]
    record: StepRecord


@mypyc_attr(native_class=False)  # compiled: its base is not (april_bench/compiled.py)
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
        repeat: int = 0,
    ) -> None:
        self.config = config
        self.arm = arm
        self.repeat = repeat
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
        #: Multi-turn episodes (rollout/episodes.py): the workload's environment answers each turn.
        self.env: Environment | None = workload.environment if isinstance(workload, EpisodeWorkload) else None
        self._next_request = 0
        self._next_order = 0
        #: False when the strategy's ``request_budget`` is BaseStrategy's (``remaining``, the view
        #: unread): ``submit`` then builds no view for it.
        budget = getattr(strategy, "request_budget", None)
        self._budget_reads_view = getattr(budget, "__func__", None) is not BaseStrategy.request_budget

    def shift_clock(self, seconds: float) -> None:
        """Move the records' time origin forward (the harness excludes evaluation time)."""
        self._t0 += seconds

    def state(self) -> dict[str, Any]:
        """What a resumed run needs to continue this loop exactly: the carry-over buffer (every
        partial token with its policy version), the prompt stream's position and the id counters."""
        return {
            "buffer": [group_to_dict(g) for g in self.buffer],
            "prompt_position": self.prompts.position,
            "prompts_returned": self.prompts.returned_uids(),
            "next_request": self._next_request,
            "next_order": self._next_order,
        }

    def restore(self, state: dict[str, Any]) -> None:
        """Continue from :meth:`state` (prompts are rebuilt by the workload from their uids)."""
        self.prompts.restore(state["prompt_position"], state["prompts_returned"])
        for data in state["buffer"]:
            self.buffer.put(group_from_dict(data, self.prompts.make))
        self._next_request = state["next_request"]
        self._next_order = state["next_order"]

    # ------------------------------------------------------------------ step
    async def run_step(
        self, step: int, policy_version: int, *, oldest_allowed: int | None = None
    ) -> StepOutcome:
        """Collect N groups.  ``oldest_allowed`` (an async driver's staleness bound): a buffered
        sample with a token older than this version restarts from its prompt before it launches."""
        loop = asyncio.get_running_loop()
        st = StepState(step=step, version=policy_version, t_start=loop.time(), oldest_allowed=oldest_allowed)
        work_before = self._work()
        with Meter(st):
            self._maybe_launch(st)
        await st.enough.wait()
        self._raise_if_failed(st)
        t_stop = loop.time()
        if self.config.env_calls_at_stop == "cancel":
            episodes.cancel(st)  # calls out now, or started by a turn that ends during the abort
        abort_rounds = await self._stop(st) if st.pending else 0
        await asyncio.gather(*_unsettled(st.pumps), *_unsettled(st.aborts))
        await episodes.drain(st)  # environment calls out at the stop finish or end cancelled (docs/agents.md)
        self._raise_if_failed(st)
        t_end = loop.time()
        work_after = self._work()
        work = None if work_before is None or work_after is None else work_after.minus(work_before)
        with Meter(st):
            carried = self._carry_over(st)
            if self.strategy.pins_versions:
                self._retain_versions()
        record = step_record(
            st,
            arm=self.arm,
            t0=self._t0,
            t_end=t_end,
            drain=t_end - t_stop,
            abort_rounds=abort_rounds,
            carried=carried,
            saturated_tokens_per_s=self._saturated(st),
            repeat=self.repeat,
            work=work,
        )
        self.strategy.on_step_end(
            StepSummary(
                step=step,
                launched_groups=st.launched,
                accepted_groups=len(st.accepted),
                buffered_groups=carried.buffered,
                dropped_groups=carried.dropped,
                rollout_time_s=record.rollout_time_s,
                drain_time_s=record.drain_time_s,
                generated_tokens=st.generated,
                completion_times_s=tuple(st.accepted_at),
            )
        )
        return StepOutcome(batch=st.accepted, record=record)

    # ------------------------------------------------------------ launching
    def _view(self, st: StepState) -> RolloutView:
        now = asyncio.get_running_loop().time()
        return RolloutView(
            step=st.step,
            policy_version=st.version,
            target_groups=self.config.rollout_batch_size,
            over_sampling=self.config.over_sampling_batch_size,
            accepted=len(st.accepted),
            in_flight=len(st.in_flight),
            buffered=len(self.buffer),
            rejected=st.rejected,
            launched=st.launched,
            refill=self.config.refill,
            elapsed_s=now - st.t_start,
            pending_requests=len(st.pending),
            groups=ProgressView(st.in_flight, now),
        )

    def _maybe_launch(self, st: StepState) -> None:
        if st.stopping:
            return
        view = self._view(st)
        count = self.strategy.launch_count(view)
        cap = self.config.max_groups_per_step or 16 * max(self.config.over_sampling_batch_size, 1)
        if count > 0 and st.launched + count > cap:
            if st.in_flight:
                return  # wait for what is out; the check repeats when it comes back
            unfinished = st.launched - len(st.accepted) - st.rejected  # back unfinished: buffered
            reason = (
                f"step {st.step} launched {st.launched} groups and only {len(st.accepted)} of "
                f"{self.config.rollout_batch_size} passed"
            )
            if unfinished > 0:
                reason += f"; {unfinished} came back unfinished (buffered for a later step)"
            if st.rejected or not unfinished:
                reason += f"; {st.rejected} were rejected by dynamic sampling (all rewards equal" + (
                    ": does the grader score every response the same?)" if st.rejected >= unfinished else ")"
                )
            raise RolloutStalled(
                reason,
                "Check the grader (--task-arg grader=), turn the filter off (--no-dynamic-sampling), or "
                "raise --rollout-arg max_groups_per_step",
            )
        chosen = self._select(count, view) if count > 0 else []
        if not chosen:
            if not st.in_flight and len(st.accepted) < self.config.rollout_batch_size:
                raise EngineError(
                    f"strategy {self.strategy.name!r} launched nothing while step {st.step} still needs "
                    f"{self.config.rollout_batch_size - len(st.accepted)} groups"
                    + (" (the prompt stream is exhausted)" if count > 0 else "")
                )
            return
        self._launch(st, chosen, view)

    def _select(self, count: int, view: RolloutView) -> list[tuple[Group, GroupProgress]]:
        """Ask the strategy which candidates launch; return the chosen groups in launch order."""
        buffered = {g.uid: g for g in self.buffer}
        fresh = {p.uid: p for p in self.prompts.take(count)}
        n = self.config.n_samples_per_prompt
        candidates = [Candidate(GroupProgress.of(g), fresh=False) for g in buffered.values()]
        candidates += [Candidate(_fresh_progress(p, n), fresh=True) for p in fresh.values()]
        chosen = list(self.strategy.select(candidates, count, view))
        uids = [c.uid for c in chosen]
        if len(chosen) > count or len(set(uids)) != len(uids) or not set(uids) <= {c.uid for c in candidates}:
            raise EngineError(
                f"strategy {self.strategy.name!r} selected {uids}: at most {count} distinct candidates"
            )
        taken = {g.uid: g for g in self.buffer.remove({c.uid for c in chosen if not c.fresh})}
        self.prompts.give_back(p for uid, p in fresh.items() if uid not in set(uids))
        groups = []
        launched, kept = self.strategy.group_shape(n, view) if any(c.fresh for c in chosen) else (n, n)
        if not 1 <= kept <= launched:
            raise EngineError(
                f"strategy {self.strategy.name!r} asked for groups of {launched} keeping {kept}: "
                "need 1 <= kept <= launched"
            )
        for c in chosen:
            group = Group.fresh(fresh[c.uid], launched, kept) if c.fresh else taken[c.uid]
            groups.append((group, c.progress))
        return groups

    def _launch(self, st: StepState, chosen: list[tuple[Group, GroupProgress]], view: RolloutView) -> None:
        now = asyncio.get_running_loop().time()
        requests: list[GenerateRequest] = []
        ready: list[InFlight] = []
        for group, progress in chosen:
            if group.first_step is None:
                group.first_step = st.step
                st.new_prompts += 1
            else:
                st.resumed += 1
            flight = InFlight(group=group, order=self._next_order, outstanding=0, t_launch=now)
            if group.keep is not None:
                flight.finished = [s for s in group.samples if s.status.is_finished]
            self._next_order += 1
            st.in_flight[group.uid] = flight
            st.launched += 1
            priority = self.strategy.priority(progress, view)
            for sample in group.samples:
                request = self._request_for(st, sample, view, priority)
                if request is None:
                    if self.env is not None and episodes.awaits_answer(sample):
                        episodes.call_again(self, st, flight, sample, priority)  # cancelled at a stop
                    continue
                requests.append(request)
                flight.outstanding += 1
                st.pending[request.request_id] = Pending(flight, sample, request, sample.response_len, now)
            if flight.outstanding == 0:
                ready.append(flight)
        if requests:
            self._send(st, requests)
        for flight in ready:  # buffered groups that were already finished
            self._on_group_returned(st, flight)

    def _request_for(
        self, st: StepState, sample: Sample, view: RolloutView, priority: int
    ) -> GenerateRequest | None:
        oldest = sample.oldest_version()
        if st.oldest_allowed is not None and oldest is not None and oldest < st.oldest_allowed:
            st.restart_tokens += sample.restart()  # the driver's staleness bound, finished or not
            st.restarted += 1
        elif sample.response_len and not self.strategy.keep_partial(sample, view):
            st.restart_tokens += sample.restart()
            st.restarted += 1
        elif (
            self.strategy.pins_versions
            and oldest is not None
            and not sample.status.is_finished
            and not self._holds(oldest, st)
        ):
            st.restart_tokens += sample.restart()  # its weights are gone (a resumed run): start over
            st.restarted += 1
        if self.env is not None:
            if sample.env_state is None:
                episodes.begin(self.env, sample, st)
            elif episodes.awaits_answer(sample):
                return None  # its environment call was cancelled at a stop: it is made again first
        return self.next_request(st, sample, view, priority)

    def next_request(
        self, st: StepState, sample: Sample, view: RolloutView, priority: int
    ) -> GenerateRequest | None:
        """The request that continues ``sample`` (``None``: it is finished, or has no budget left)."""
        if sample.status.is_finished:
            return None
        remaining = self.config.max_response_len - sample.response_len
        if remaining <= 0:
            sample.status = SampleStatus.TRUNCATED
            return None
        budget = max(1, min(remaining, self.strategy.request_budget(sample, remaining, view)))
        if sample.start_step is None:
            sample.start_step = st.step
        replay = None
        if self._replay:
            if self.env is not None and sample.env_state is not None:
                target = self.env.replay_len(sample.env_state)  # this turn's end
            else:
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
            priority=priority,
            prefix_len=sample.response_len,
            policy_version=self._pinned_version(sample, st) if self.strategy.pins_versions else None,
        )

    @staticmethod
    def _pinned_version(sample: Sample, st: StepState) -> int:
        """The version a consistent rollout's request generates with: its sample's (one version
        throughout), or the step's for a sample with no tokens yet."""
        oldest = sample.oldest_version()
        return st.version if oldest is None else oldest

    def _sampling_for(self, sample: Sample) -> SamplingParams:
        if not self._seeded:
            return self._sampling
        seed = sample_seed(self.config.seed, sample.prompt.uid, sample.index)
        return dataclasses.replace(self._sampling, seed=seed)

    def submit(self, st: StepState, flight: InFlight, sample: Sample, priority: int) -> bool:
        """Send the request that continues ``sample`` of ``flight`` now (an episode's next turn, once
        its environment answered); ``False`` when there is none (it is finished, or has no budget
        left).  Its completion comes back through the step like any other."""
        with Meter(st):
            # the view only for a strategy that reads it here (an episode's every turn comes this way)
            view = self._view(st) if self._budget_reads_view else _NO_VIEW
            request = self.next_request(st, sample, view, priority)
            if request is None:
                return False
            now = asyncio.get_running_loop().time()
            st.pending[request.request_id] = Pending(flight, sample, request, sample.response_len, now)
            self._send(st, [request])
            return True

    def _send(self, st: StepState, requests: list[GenerateRequest]) -> None:
        """Hand ``requests`` (already pending) to the engine; a pump brings their completions back."""
        st.requests += len(requests)
        st.peak_concurrency = max(st.peak_concurrency, len(st.pending))
        st.all_returned.clear()
        tick = time.perf_counter()
        stream = self.engine.generate(requests)
        st.bookkeeping_s -= time.perf_counter() - tick  # the engine's submit is not ours
        if hasattr(stream, "consume"):  # a Consumable: the same passes as the pump task, without it
            consumable = cast(Consumable, stream)
            st.pumps.append(
                consumable.consume(functools.partial(self._pumped, st), functools.partial(self.fail, st))
            )
        else:
            st.pumps.append(asyncio.ensure_future(self._pump(st, stream)))

    # ------------------------------------------------------------ returning
    def fail(self, st: StepState, error: BaseException) -> None:
        """End the step with ``error`` (the first one wins): the step wakes and raises it where it is
        awaited."""
        st.error = st.error or error
        st.enough.set()
        st.all_returned.set()

    async def _pump(self, st: StepState, stream: AsyncIterator[Completion]) -> None:
        try:
            async for completion in stream:
                with Meter(st):
                    self._on_completion(st, completion)
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # wake the step: it re-raises the error where it is awaited
            self.fail(st, exc)
            if not isinstance(exc, Exception):
                raise  # KeyboardInterrupt, SystemExit: stop the loop now
            # An Exception is not re-raised here: the step raises it, and a task holding it too
            # would be reported as "exception never retrieved" when the run ends on that error.

    def _pumped(self, st: StepState, completion: Completion) -> None:
        with Meter(st):
            self._on_completion(st, completion)

    def _on_completion(self, st: StepState, c: Completion) -> None:
        pending = st.pending.pop(c.request_id, None)
        if pending is None:
            raise EngineError(f"engine returned unknown or duplicate request id {c.request_id!r}")
        if c.num_tokens > pending.request.max_new_tokens:
            raise EngineError(
                f"{c.request_id}: engine returned {c.num_tokens} tokens for max_new_tokens="
                f"{pending.request.max_new_tokens}"
            )
        sample = pending.sample
        for segment in _segments(c, st.step):
            sample.append(segment)
        if c.finish_reason is FinishReason.LENGTH and sample.response_len < self.config.max_response_len:
            sample.status = SampleStatus.PARTIAL  # a segment budget, not the response limit, stopped it
        keep = pending.flight.group.keep
        if keep is not None and sample.status.is_finished:
            pending.flight.finished.append(sample)
            if len(pending.flight.finished) == keep:  # the group is complete: its surplus stops now
                ids = self._request_ids(st, [pending.flight.group.uid])
                if ids:
                    st.aborts.append(asyncio.ensure_future(self.engine.abort(ids)))
        st.generated += c.num_tokens
        st.context_token_sum += c.num_tokens * (pending.request.input_len + (c.num_tokens - 1) / 2)
        if c.finish_reason == "abort":
            st.aborted_requests += 1
        self.recorder.add(
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
                repeat=self.repeat,
            )
        )
        if self.env is not None:
            sample.request_time_s += c.t_done - pending.t_submit
            if c.finish_reason is FinishReason.STOP:
                episodes.call(self, st, pending)  # the turn ended: the environment answers the action
                return
        self.request_returned(st, pending.flight)

    def request_returned(self, st: StepState, flight: InFlight) -> None:
        """One of ``flight``'s samples is back (its request, or its episode's last environment call)."""
        flight.outstanding -= 1
        if flight.outstanding == 0:
            self._on_group_returned(st, flight)
        if not st.pending and not st.env_pending:
            st.all_returned.set()

    def _on_group_returned(self, st: StepState, flight: InFlight) -> None:
        group = flight.group
        del st.in_flight[group.uid]
        if group.keep is not None and group.is_finished:
            self._drop_surplus(st, flight)
        if st.stopping:
            st.leftovers.append(flight)  # surplus or unfinished: the strategy decides
            return
        if not group.is_finished:
            # Aborted or stopped at a segment although the step goes on (the strategy's selective
            # abort, an engine-side timeout, another client's abort-all): carry it over like any
            # leftover, and keep the step going.
            st.leftovers.append(flight)
            self._maybe_launch(st)
            self._abort_selected(st)
            return
        self._score(group)
        if self.config.dynamic_sampling and not keep_group(group.rewards()):
            st.rejected += 1
            st.rejected_tokens += group.response_tokens
            self.recorder.sample_fates(
                self.arm,
                [group],
                step=st.step,
                fate=Fate.DROPPED,
                reason="filter_rejected",
                repeat=self.repeat,
            )
        else:
            st.accepted.append(group)
            st.accepted_at.append(asyncio.get_running_loop().time() - st.t_start)
            if len(st.accepted) >= self.config.rollout_batch_size:
                st.stopping = True
                st.enough.set()
                return
        self._maybe_launch(st)
        self._abort_selected(st)

    def _drop_surplus(self, st: StepState, flight: InFlight) -> None:
        """A group complete with ``keep`` finished samples keeps the first that finished; the rest
        (aborted or finished later) are dropped, their tokens counted as wasted."""
        group = flight.group
        assert group.keep is not None
        kept = {id(s) for s in flight.finished[: group.keep]}
        surplus = [s for s in group.samples if id(s) not in kept]
        group.samples = [s for s in group.samples if id(s) in kept]
        group.keep = None
        if surplus:
            self.recorder.sample_fates(
                self.arm,
                [Group(prompt=group.prompt, samples=surplus)],
                step=st.step,
                fate=Fate.DROPPED,
                reason="response_surplus",
                repeat=self.repeat,
            )

    def _score(self, group: Group) -> None:
        """Reward every finished sample once (finished members of a buffered group keep theirs)."""
        for sample in group.samples:
            if sample.reward is None and sample.status.is_finished:
                sample.reward = self.workload.reward(sample)

    # ------------------------------------------------------------- aborting
    def _request_ids(self, st: StepState, uids: Collection[int]) -> list[str]:
        wanted = set(uids)
        return [rid for rid, p in st.pending.items() if p.flight.group.uid in wanted]

    def _abort_selected(self, st: StepState) -> None:
        """Abort the in-flight groups the strategy names now (mid-step selective abort)."""
        if not st.in_flight:
            return
        uids = self.strategy.abort_now(self._view(st))
        ids = self._request_ids(st, uids) if uids else []
        if ids:
            st.aborts.append(asyncio.ensure_future(self.engine.abort(ids)))

    async def _stop(self, st: StepState) -> int:
        """N groups are in: abort what the strategy says (default: everything) until idle."""
        uids = self.strategy.stop_abort(self._view(st))
        if uids is None:
            return await self._abort_until_idle(st)
        rounds = 0
        ids = self._request_ids(st, uids)
        if ids:
            await self.engine.abort(ids)
            rounds += 1
        await st.all_returned.wait()  # the others run to completion
        self._raise_if_failed(st)
        return rounds + await self._abort_until_idle(st)

    async def _abort_until_idle(self, st: StepState) -> int:
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

    def _carry_over(self, st: StepState) -> CarryOver:
        """Buffer or drop every group that came back unfinished or after the stop."""
        view = self._view(st)
        out = CarryOver()
        for flight in sorted(st.leftovers, key=lambda f: f.order):
            group = flight.group
            self._score(group)
            if self.strategy.on_leftover(group, view) is Disposition.BUFFER:
                self.buffer.put(group)
                out.buffered += 1
                out.buffered_tokens += group.response_tokens
                out.partial += sum(1 for s in group.samples if s.response_len and not s.status.is_finished)
            else:
                out.dropped += 1
                out.dropped_tokens += group.response_tokens
                reason = "surplus_discarded" if group.is_finished else "unfinished_discarded"
                self.recorder.sample_fates(
                    self.arm, [group], step=st.step, fate=Fate.DROPPED, reason=reason, repeat=self.repeat
                )
        return out

    def _holds(self, version: int, st: StepState) -> bool:
        """Whether the engine can still generate with ``version``'s weights."""
        engine = VERSIONS.of(self.engine)
        return version == st.version or (engine is not None and version in engine.held_versions())

    def _retain_versions(self) -> None:
        """Consistent rollout: the engine keeps the weights of every version a buffered partial
        started on (it finishes on them), and frees the others."""
        versions = {v for g in self.buffer for s in g.samples if (v := s.oldest_version()) is not None}
        engine = VERSIONS.of(self.engine)
        if engine is None:
            raise ConfigError(
                f"strategy {self.strategy.name!r} finishes each partial on the weights that began it, "
                f"but engine {self.engine.info.name!r} holds one weight version; use --engine sim or hf"
            )
        engine.retain_versions(versions)

    def _raise_if_failed(self, st: StepState) -> None:
        if st.error is not None:
            raise st.error

    def _work(self) -> EngineWork | None:
        """The engine's work counters now (``None``: it does not count its work)."""
        counted = ACCOUNTING.of(self.engine)
        return counted.work() if counted else None

    def _saturated(self, st: StepState) -> float | None:
        model = SATURATION.of(self.engine)
        if model is None:
            return None  # a real server cannot know its no-tail rate
        mean_context = st.context_token_sum / st.generated if st.generated else 0.0
        return model.saturated_tokens_per_s(st.peak_concurrency, mean_context)


#: What ``submit`` hands a strategy whose ``request_budget`` does not read the view (BaseStrategy's).
_NO_VIEW = cast(RolloutView, None)


def _segments(c: Completion, step: int) -> list[Segment]:
    """One segment per policy version the completion's tokens carry (a weight update that landed
    while the request ran splits it), so every token keeps the version that produced it.  Only the
    last segment carries the finish reason: the earlier ones end where an update began."""
    if c.version_runs is None:  # one version, one segment (the common case: no update landed)
        n = c.num_tokens
        return [
            Segment(
                request_id=c.request_id,
                policy_version=c.policy_version,
                num_tokens=n,
                finish_reason=c.finish_reason,
                step=step,
                token_ids=None if c.output_ids is None else c.output_ids[0:n],
                logprobs=None if c.logprobs is None else c.logprobs[0:n],
            )
        ]
    runs = c.runs()
    out: list[Segment] = []
    start = 0
    for i, (version, n) in enumerate(runs):
        last = i == len(runs) - 1
        out.append(
            Segment(
                request_id=c.request_id,
                policy_version=version,
                num_tokens=n,
                finish_reason=c.finish_reason if last else FinishReason.LENGTH,
                step=step,
                token_ids=None if c.output_ids is None else c.output_ids[start : start + n],
                logprobs=None if c.logprobs is None else c.logprobs[start : start + n],
            )
        )
        start += n
    return out


def _fresh_progress(prompt: Prompt, samples: int) -> GroupProgress:
    return GroupProgress(
        uid=prompt.uid,
        source_id=prompt.source_id,
        prompt_len=prompt.length,
        samples=samples,
        finished_samples=0,
        tokens=0,
        longest=0,
        oldest_version=None,
        newest_version=None,
        aborts=0,
        first_step=None,
    )


def _unsettled(futures: list[Any]) -> list[Any]:
    """The futures a gather still waits for or takes an error from: a step has a pump per request,
    and most are done by the stop (a done one would add a callback, and nothing to wait for)."""
    return [f for f in futures if not f.done() or f.cancelled() or f.exception() is not None]
