"""Drivers: how an arm's rollout, training and weight updates are ordered in time.

An arm is written ``name[...,driver=MODE,...]``; the driver options ride in the
brackets with the strategy's own (:data:`DRIVER_OPTIONS`), so one comparison can
vary the driver alone:

* ``sync`` (the default): rollout step k, then train on it, then push weights;
  policy version = step;
* ``one-step-off`` (verl's one-step off-policy pipeline): the rollout of step
  k+1 starts when training on step k starts, with the weights from before
  step k; weights are pushed when both are done (never with requests in
  flight).  Every token it generates is one version behind the trainer (step
  0: none); a strategy's resumed partials add their own age, which the
  strategy's ``max_version_span`` caps if set;
* ``stale`` with ``max_staleness=eta`` (AReaL's staleness-bounded async RL):
  a generator runs rollout steps back to back, and the trainer takes each
  batch as it comes; the rollout of step s launches only once the policy
  version is at least ``s - eta``, and a buffered partial whose oldest token is
  older than that restarts, so no trained token is more than eta versions
  behind.  When the trainer finishes, its weights are pushed at once: with
  ``weight_update=inflight`` the engine pauses, installs and continues the
  requests in flight (their later tokens carry the new version); with
  ``drain`` the push waits until the rollout step in flight has returned;
* ``lookahead`` with ``steps_ahead=k`` (Tinker's ``sampling_steps_ahead``, prime-rl's
  ``max_async_level``): the same generator and gate, at most k steps ahead of training, but
  nothing is restarted for its age: a buffered partial keeps every token, however old (a
  strategy's own ``max_version_span`` still applies).

"With or without partial rollout" is the strategy: a ``sync``-style strategy
runs every request to completion (its default update is ``drain``: a request
never mixes versions); APRIL and its family over-provision, abort at N and
resume partials (default ``inflight``: tokens are stamped with the version
that produced them).

The policy version is the number of weight pushes the engine has received; a
batch trained at step k is trained by a policy at version k.  On the
simulator an async arm runs rollout and training on disjoint GPUs (a
disaggregated split, ``train_gpus``, default a quarter of the node), as verl
and AReaL do; a sync arm time-shares all of them (colocated, as APRIL/slime).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from april_bench.config import ConfigError, Configurable
from april_bench.rollout.driver_config import DRIVER_OPTIONS, DriverConfig, DriverMode, WeightUpdateMode
from april_bench.rollout.loop import RolloutLoop, StepOutcome
from april_bench.trainers.protocol import Trainer
from april_bench.vtime import VirtualTimeLoop

__all__ = ["DRIVER_OPTIONS", "DriverConfig", "DriverMode", "Pipeline", "StepDone", "WeightUpdateMode"]


@dataclass(slots=True)
class StepDone:
    """One trained step of a pipelined arm, with the loop-clock times of its phases."""

    step: int
    outcome: StepOutcome
    train_result: Any
    #: The policy version the batch was trained by (= weight pushes so far).
    train_version: int
    rollout_start: float
    rollout_end: float
    train_start: float
    train_end: float
    sync_start: float
    sync_end: float
    #: When the step ended on the session clock (set by the session that records it).
    session_end: float | None = None


class Pipeline(Configurable):
    """Runs one arm's rollout and training concurrently under a :class:`DriverConfig`.

    Two chains share the engine: the rollout chain runs :meth:`RolloutLoop.run_step` for step
    after step, each when the driver's gate opens; the training chain trains each batch as it
    comes and pushes the new weights.  Between calls of :meth:`run` (blocks of steps, an
    evaluation) the pipeline drains: rollouts already done wait, trained, in :attr:`ready`.
    """

    Config = DriverConfig

    def __init__(
        self,
        config: DriverConfig,
        *,
        rollout: RolloutLoop,
        trainer: Trainer,
        push: Callable[[int], Awaitable[None]],
        total_steps: int,
        partial_rollout: bool,
        version: int = 0,
    ) -> None:
        if not config.asynchronous:
            raise ConfigError(
                "the pipeline runs the one-step-off, stale and lookahead drivers; sync runs step by step"
            )
        self.config = config
        self.rollout = rollout
        self.trainer = trainer
        self._push = push
        self.total_steps = total_steps
        self.update = config.update_mode(partial_rollout)
        #: Weight pushes the engine has received.
        self.version = version
        self._next_rollout = version
        self._train_started = version  # steps whose training has started (one-step-off's gate)
        self._outcomes: dict[int, asyncio.Future[tuple[StepOutcome, float, float]]] = {}
        self._cond: asyncio.Condition | None = None
        self._rolling = False
        self._pushing = False
        self._push_pending = False

    def _outcome(self, step: int) -> asyncio.Future[tuple[StepOutcome, float, float]]:
        if step not in self._outcomes:
            self._outcomes[step] = asyncio.get_running_loop().create_future()
        return self._outcomes[step]

    def _gate(self, step: int) -> bool:
        """May the rollout of ``step`` launch now?"""
        if self._rolling or self._pushing or self._push_pending:
            return False
        if self.config.driver is DriverMode.ONE_STEP_OFF:
            return self._train_started >= step
        return self.version >= step - self.config.lookahead

    async def run(self, steps: range, on_step: Callable[[StepDone], Awaitable[None]]) -> None:
        """Train ``steps`` (rolling out ahead as the driver allows, never past ``total_steps``), calling
        ``on_step`` after each push; return with nothing in flight."""
        self._cond = asyncio.Condition()
        horizon = min(steps.stop + self.config.lookahead, self.total_steps)
        rollouts = asyncio.ensure_future(self._rollouts(horizon))
        try:
            for step in steps:
                await on_step(await self._train(step))
            await rollouts
        finally:
            if not rollouts.done():
                rollouts.cancel()
            # its error, if any, reached the training chain through the step's future: retrieve it here
            await asyncio.gather(rollouts, return_exceptions=True)

    async def _rollouts(self, horizon: int) -> None:
        assert self._cond is not None
        cond = self._cond
        loop = asyncio.get_running_loop()
        while self._next_rollout < horizon:
            step = self._next_rollout
            async with cond:
                await cond.wait_for(lambda step=step: self._gate(step))  # type: ignore[misc]
                self._rolling = True
            start = loop.time()
            try:
                outcome = await self.rollout.run_step(
                    step, self.version, oldest_allowed=self.config.oldest_allowed(step)
                )
            except BaseException as exc:
                self._outcome(step).set_exception(exc)
                raise
            finally:
                async with cond:
                    self._rolling = False
                    cond.notify_all()
            self._outcome(step).set_result((outcome, start, loop.time()))
            self._next_rollout = step + 1

    async def _train(self, step: int) -> StepDone:
        assert self._cond is not None
        cond = self._cond
        loop = asyncio.get_running_loop()
        future = self._outcome(step)
        outcome, r_start, r_end = await future
        del self._outcomes[step]
        version = self.version
        train_start = loop.time()
        async with cond:
            self._train_started = step + 1
            cond.notify_all()
        result = await self._train_batch(outcome, step, version)
        train_end = loop.time()
        async with cond:
            if self.update is WeightUpdateMode.DRAIN:
                self._push_pending = True
                await cond.wait_for(lambda: not self._rolling)  # wait for the rollout step in flight
                self._push_pending = False
            self._pushing = True
        sync_start = loop.time()
        try:
            await self._push(version + 1)
        finally:
            async with cond:
                self._pushing = False
                self.version = version + 1
                cond.notify_all()
        return StepDone(
            step=step,
            outcome=outcome,
            train_result=result,
            train_version=version,
            rollout_start=r_start,
            rollout_end=r_end,
            train_start=train_start,
            train_end=train_end,
            sync_start=sync_start,
            sync_end=loop.time(),
        )

    async def _train_batch(self, outcome: StepOutcome, step: int, version: int) -> Any:
        if isinstance(asyncio.get_running_loop(), VirtualTimeLoop):
            return await self.trainer.train(outcome.batch, step=step, policy_version=version)
        # A real trainer computes without awaiting: in a thread, so the engine keeps generating meanwhile.
        return await asyncio.to_thread(
            asyncio.run, self.trainer.train(outcome.batch, step=step, policy_version=version)
        )
