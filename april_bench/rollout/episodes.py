"""Multi-turn episodes in the rollout loop: the environment's side of a sample's life.

A sample of an :class:`~april_bench.envs.protocol.EpisodeWorkload` is an episode.  When it first
launches (or restarts) its environment is reset (:func:`begin`); every request that ends with a
stop (EOS or a tool-call token) ends a *turn*, and instead of returning the sample to its group the
loop hands the turn's tokens to the environment (:func:`call`).  The environment answers on the
loop's clock (a real tool's latency, or virtual seconds under the simulator's loop) with either

* observation tokens: appended as an observation segment (loss mask 0, counted in
  ``observation_tokens``, prefilled by the next turn and never generated), after which the next
  turn is launched at once with the whole episode as its input ids; or
* ``done``: the episode is COMPLETED with the environment's reward.

Aborts: an abort reaches only engine requests.  A turn aborted mid-generation keeps its partial
tokens (as any partial sample).  An environment call in flight when a step stops is *let finish* by
default (:func:`drain`): its observation is appended and the episode is carried over at a turn
boundary, so a resumed episode never repeats a tool call and its state is exactly the one the call
left.  With ``--rollout-arg env_calls_at_stop=cancel`` the calls out when N groups are in are
cancelled (:func:`cancel`), and so are those a turn ending during the abort starts: the step does
not wait for them, the episode keeps its state (a step never mutates it) and its unanswered turn,
and the call is made again when it resumes (:func:`call_again`).  After the stop no new turn is
launched: what the strategy does with the carried-over episode (buffer and resume it, or drop it)
is its ``on_leftover``, as for any partial.

The loop runs episodes through its public members only (:class:`Host`): this module never imports
the loop, which imports it.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Coroutine, Mapping, Sequence
from typing import Any, Protocol

from april_bench.envs.protocol import Environment, EnvStep
from april_bench.rollout.step import InFlight, Pending, StepState
from april_bench.types import FinishReason, Sample, SampleStatus, Segment
from april_bench.vtime import hops

__all__ = [
    "EpisodeSettings",
    "Host",
    "awaits_answer",
    "begin",
    "call",
    "call_again",
    "cancel",
    "drain",
    "turn_action",
]


class EpisodeSettings(Protocol):
    """The loop's settings an episode reads (:class:`~april_bench.rollout.loop.RolloutConfig` has them)."""

    @property
    def max_response_len(self) -> int: ...

    @property
    def env_calls_at_stop(self) -> str: ...


class Host(Protocol):
    """What an episode needs of the loop that runs it (:class:`~april_bench.rollout.loop.RolloutLoop`)."""

    @property
    def env(self) -> Environment | None: ...

    @property
    def config(self) -> EpisodeSettings: ...

    def submit(self, st: StepState, flight: InFlight, sample: Sample, priority: int) -> bool:
        """Send the request that continues ``sample`` now; ``False`` when there is none."""
        ...

    def request_returned(self, st: StepState, flight: InFlight) -> None:
        """One of ``flight``'s samples is back."""

    def fail(self, st: StepState, error: BaseException) -> None:
        """End the step with ``error``."""


def begin(env: Environment, sample: Sample, st: StepState) -> None:
    """Reset the environment for a sample starting (or restarting) its episode."""
    first = env.reset(sample.prompt, sample.index)
    sample.env_state = dict(first.state)
    if first.token_ids:
        _observe(sample, first.token_ids, st, version=st.version)


def turn_action(sample: Sample) -> list[int]:
    """The tokens the policy generated since the last observation: this turn's action (a turn cut
    by an abort and resumed spans several segments, possibly of several policy versions)."""
    out: list[int] = []
    for seg in reversed(sample.segments):
        if seg.observation:
            break
        out[:0] = seg.token_ids or ()
    return out


def call(loop: Host, st: StepState, pending: Pending) -> None:
    """Start the environment call that answers the turn ``pending`` just ended."""
    key, priority = pending.request.request_id, pending.request.priority
    _start(loop, st, pending.flight, pending.sample, key, priority)


def awaits_answer(sample: Sample) -> bool:
    """A turn ended (its last segment stopped) and no observation answered it: its environment call
    was cancelled at a stop (``env_calls_at_stop=cancel``) and is made again when the episode resumes."""
    if sample.status.is_finished or not sample.segments:
        return False
    last = sample.segments[-1]
    return not last.observation and last.finish_reason is FinishReason.STOP


def call_again(loop: Host, st: StepState, flight: InFlight, sample: Sample, priority: int) -> None:
    """Make the call a stop cancelled, for a resumed episode (instead of a request)."""
    flight.outstanding += 1
    _start(loop, st, flight, sample, f"again-{sample.prompt.uid}-{sample.index}", priority)


def cancel(st: StepState) -> None:
    """Cancel the environment calls still out (the stop's ``env_calls_at_stop=cancel``): each episode
    keeps its state and its unanswered turn, and :func:`call_again` makes the call on resume."""
    st.env_cancel.set()


async def drain(st: StepState) -> None:
    """Wait for every environment call still out (they finish, or end cancelled; none launches a turn
    after the stop)."""
    while st.env_pending:
        await asyncio.gather(*list(st.env_pending.values()))


def _start(loop: Host, st: StepState, flight: InFlight, sample: Sample, key: str, priority: int) -> None:
    sample.status = SampleStatus.PARTIAL  # not finished while the environment answers
    st.all_returned.clear()
    step_then = getattr(loop.env, "step_then", None)  # ThenStep (isinstance of a protocol is slow)
    if step_then is not None and loop.config.env_calls_at_stop != "cancel":
        # The call without a task: each part runs in the loop pass where the task's step would
        # (its first step is scheduled now, as creating the task schedules it), and the future
        # resolves where the task would have finished (drain awaits it as it awaits a task).
        clock = asyncio.get_running_loop()
        done: asyncio.Future[None] = asyncio.Future(loop=clock)  # clock.create_future(), a call less
        st.env_pending[key] = done
        hops(clock)((_call_then, (step_then, loop, st, flight, sample, key, priority, done)))
        return
    st.env_pending[key] = asyncio.ensure_future(_call(loop, st, flight, sample, key, priority))


def _call_then(
    step_then: Callable[[Mapping[str, Any], Sequence[int], Callable[[EnvStep | Exception], None]], None],
    loop: Host,
    st: StepState,
    flight: InFlight,
    sample: Sample,
    key: str,
    priority: int,
    done: asyncio.Future[None],
) -> None:
    """:func:`_call`'s first step, for an environment with ``step_then``
    (:class:`~april_bench.envs.protocol.ThenStep`)."""
    assert sample.env_state is not None
    t0 = asyncio.get_running_loop().time()
    step_then(
        sample.env_state,
        turn_action(sample),
        functools.partial(_answered_then, loop, st, flight, sample, key, priority, done, t0),
    )


def _answered_then(
    loop: Host,
    st: StepState,
    flight: InFlight,
    sample: Sample,
    key: str,
    priority: int,
    done: asyncio.Future[None],
    t0: float,
    answer: EnvStep | Exception,
) -> None:
    """The rest of :func:`_call` once ``step_then`` answered; then the call's future resolves (or
    takes what the bookkeeping raised), as the task would."""
    try:
        if isinstance(answer, Exception):  # the step raises it where it is awaited
            del st.env_pending[key]
            loop.fail(st, answer)
        else:
            _answered(loop, st, flight, sample, key, priority, t0, answer)
    except BaseException as exc:
        done.set_exception(exc)
        if not isinstance(exc, Exception):
            raise
        return
    done.set_result(None)


async def _call(loop: Host, st: StepState, flight: InFlight, sample: Sample, key: str, priority: int) -> None:
    env = loop.env
    assert env is not None and sample.env_state is not None
    clock = asyncio.get_running_loop()
    t0 = clock.time()
    try:
        if loop.config.env_calls_at_stop == "cancel":
            answer = await _unless_cancelled(env.step(sample.env_state, turn_action(sample)), st.env_cancel)
        else:
            answer = await env.step(sample.env_state, turn_action(sample))
    except Exception as exc:  # the step raises it where it is awaited
        del st.env_pending[key]
        loop.fail(st, exc)
        return
    _answered(loop, st, flight, sample, key, priority, t0, answer)


def _answered(
    loop: Host,
    st: StepState,
    flight: InFlight,
    sample: Sample,
    key: str,
    priority: int,
    t0: float,
    answer: EnvStep | None,
) -> None:
    """A call answered (``None``: cancelled at the stop): the bookkeeping, and the next turn."""
    if answer is None:  # cancelled at the stop: the state and the unanswered turn stay
        st.env_cancelled += 1
        del st.env_pending[key]
        loop.request_returned(st, flight)
        return
    del st.env_pending[key]
    seconds = asyncio.get_running_loop().time() - t0
    sample.env_calls += 1
    sample.env_time_s += seconds
    st.env_calls += 1
    st.env_time_s += seconds
    sample.env_state = dict(answer.state)
    if answer.done:
        sample.status = SampleStatus.COMPLETED
        if answer.reward is not None:
            sample.reward = answer.reward
    else:
        _observe(sample, answer.token_ids, st, version=sample.segments[-1].policy_version)
        if sample.response_len >= loop.config.max_response_len:
            sample.status = SampleStatus.TRUNCATED
        elif not st.stopping and not st.error and loop.submit(st, flight, sample, priority):
            return  # the next turn, at once
    loop.request_returned(st, flight)


async def _unless_cancelled(call: Coroutine[Any, Any, EnvStep], cancel: asyncio.Event) -> EnvStep | None:
    """The call's answer, or ``None`` when ``cancel`` is set first (the call is then cancelled).  The
    call runs as its own task, so the cancel reaches it whenever it comes, even before it starts; the
    caller is never cancelled, so its bookkeeping always runs."""
    step = asyncio.ensure_future(call)
    stop = asyncio.ensure_future(cancel.wait())
    try:
        await asyncio.wait((step, stop), return_when=asyncio.FIRST_COMPLETED)
    finally:
        stop.cancel()
    if not step.done():
        step.cancel()
        return None
    return step.result()


def _observe(sample: Sample, token_ids: tuple[int, ...], st: StepState, *, version: int) -> None:
    """Append an observation: a turn boundary the next request resumes from (status PARTIAL)."""
    sample.append(
        Segment(
            request_id=f"obs-{sample.env_calls}",
            policy_version=version,
            num_tokens=len(token_ids),
            finish_reason=FinishReason.STOP,
            step=st.step,
            token_ids=tuple(token_ids),
            logprobs=(0.0,) * len(token_ids),
            observation=True,
        )
    )
    sample.status = SampleStatus.PARTIAL
    st.observation_tokens += len(token_ids)
