"""``--trainer ray``: any registered trainer (``torch``, ``fsdp``, ``megatron``) on a Ray cluster.

``fsdp`` and ``megatron`` run one Ray actor per rank (``ranks=actors``, the default): the trainer's
driver side stays here and its ranks are placed by a placement group across the cluster's nodes
(``placement``: SPREAD, STRICT_SPREAD, PACK, STRICT_PACK), ``num_cpus`` / ``num_gpus`` each, with
``torch.distributed`` initialised from rank 0's node (:mod:`.ray_ranks`).  ``ranks=processes``, and
the one-process ``torch`` trainer, run the whole trainer inside one actor:

The actor builds the inner trainer with the run's :class:`TrainerSettings` (their starting weights
evaluated once here, so they pickle), reserving ``num_cpus`` / ``num_gpus`` on whichever node Ray
places it; the driver keeps the trainer protocol.  ``weights()`` fetches the inner trainer's state
dict from the actor; an engine pool (``--engine ray``) then puts it in the object store once for
all replicas.  Checked against ray 2.60.0 (async actor calls awaited in asyncio, ``ray.get``).

A dead actor (killed, its node lost, its process OOM-killed: Ray's ``RayActorError``) raises
:class:`~april_bench.trainers.protocol.TrainerLost` from every call: the run ends as interrupted with
the ``run --resume`` line (every completed step's trainer state is checkpointed), never a traceback.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from april_bench.config import BaseConfig, ConfigError, Configurable, param
from april_bench.registry import Spec
from april_bench.trainers.protocol import TrainerLost, TrainResult, has_state
from april_bench.types import Group

__all__ = ["RayTrainer", "TrainerActor", "build_ray", "check_ray"]


class RayTrainer(Configurable):
    """The trainer protocol on the driver; the inner trainer in a Ray actor."""

    has_weights = True  # a real trainer in an actor (``weights()`` fetches them: not a cheap check)

    @dataclass(kw_only=True, slots=True, frozen=True)
    class Config(BaseConfig):
        trainer: str = param("torch", help="the trainer the actor runs: torch, fsdp or megatron")
        address: str | None = param(None, help="Ray cluster address (None: join or start a local one)")
        num_cpus: float = param(
            0.5,
            help="CPUs the trainer actor reserves, or each rank actor (ranks=actors; each arm has its own)",
        )
        num_gpus: float = param(
            0.0,
            help="GPUs the trainer actor reserves (ranks=processes: fsdp world_size, megatron tp), "
            "or each rank actor (ranks=actors: 1 on GPUs)",
        )
        ranks: str = param(
            "actors",
            help="fsdp/megatron: actors (one Ray actor per rank, placed across nodes) or processes "
            "(one actor spawning every rank on its node)",
        )
        placement: str = param(
            "SPREAD",
            help="ranks=actors: placement-group strategy, PACK, SPREAD, STRICT_PACK or STRICT_SPREAD",
        )
        placement_timeout_s: float = param(600.0, help="seconds to wait for the actor to be placed and built")
        trainer_args: Mapping[str, Any] = param(help="the inner trainer's options", default_factory=dict)

        def __post_init__(self) -> None:
            if self.trainer in ("ray", "sim", "auto"):
                raise ConfigError("--trainer-arg trainer must name a real trainer: torch, fsdp or megatron")
            if self.ranks not in ("actors", "processes"):
                raise ConfigError(f"--trainer-arg ranks must be actors or processes, got {self.ranks!r}")
            if self.placement not in ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"):
                raise ConfigError(
                    "--trainer-arg placement must be PACK, SPREAD, STRICT_PACK or STRICT_SPREAD"
                )

        @property
        def rank_actors(self) -> bool:
            """True when each rank is its own actor (a multi-rank trainer with ``ranks=actors``)."""
            return self.ranks == "actors" and self.trainer in ("fsdp", "megatron")

    def __init__(self, config: Config, *, inner: Spec, settings: Any) -> None:
        import ray

        self.config = config
        if not ray.is_initialized():
            ray.init(address=config.address, include_dashboard=False, log_to_driver=False)
        actor: Any = ray.remote(TrainerActor).options(num_cpus=config.num_cpus, num_gpus=config.num_gpus)
        self._actor: Any = actor.remote(inner, settings, dict(config.trainer_args))
        try:  # build errors surface here, not at the first step
            ray.get(self._actor.ready.remote(), timeout=config.placement_timeout_s)
        except ray.exceptions.GetTimeoutError:
            ray.kill(self._actor)
            raise RuntimeError(
                f"Ray did not start the trainer actor ({config.num_cpus:g} CPUs, {config.num_gpus:g} GPUs) "
                f"within {config.placement_timeout_s:g} s; free now: {ray.available_resources()}"
            ) from None

    async def train(self, batch: Sequence[Group], *, step: int, policy_version: int) -> TrainResult:
        import ray

        try:
            result: TrainResult = await self._actor.train.remote(list(batch), step, policy_version)
        except ray.exceptions.RayActorError as exc:
            raise _lost("train", exc) from None
        return result

    def weights(self) -> Any:
        return self._get("weights", self._actor.weights)

    def save_state(self, path: str) -> None:
        self._get("save_state", self._actor.save_state, path)  # a path on the actor's node (shared storage)

    def load_state(self, path: str) -> None:
        self._get("load_state", self._actor.load_state, path)

    def _get(self, what: str, method: Any, *args: Any) -> Any:
        import ray

        try:
            return ray.get(method.remote(*args))
        except ray.exceptions.RayActorError as exc:
            raise _lost(what, exc) from None

    def close(self) -> None:
        import ray

        if self._actor is not None:
            actor, self._actor = self._actor, None
            with contextlib.suppress(ray.exceptions.RayActorError):  # already dead: nothing to close
                ray.get(actor.close.remote())
            ray.kill(actor)


class TrainerActor:
    """Runs inside the Ray actor: one registered trainer (its spec)."""

    def __init__(self, inner: Spec, settings: Any, args: dict[str, Any]) -> None:
        self.trainer = inner.build(settings, args)

    def ready(self) -> bool:
        return True

    async def train(self, batch: list[Group], step: int, version: int) -> TrainResult:
        return await self.trainer.train(batch, step=step, policy_version=version)

    def weights(self) -> Any:
        return self.trainer.weights()

    def save_state(self, path: str) -> None:
        if not has_state(self.trainer):
            raise TypeError("this trainer keeps no state")
        self.trainer.save_state(path)

    def load_state(self, path: str) -> None:
        if not has_state(self.trainer):
            raise TypeError("this trainer keeps no state")
        self.trainer.load_state(path)

    def close(self) -> None:
        close = getattr(self.trainer, "close", None)
        if close is not None:
            close()


def _lost(what: str, exc: BaseException) -> TrainerLost:
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return TrainerLost(f"the Ray trainer actor died ({what}: {type(exc).__name__}: {first})")


def _inner(config: RayTrainer.Config, parts: Sequence[Spec]) -> Spec:
    """The inner trainer's spec, among the ones ``TRAINERS`` hands the actor (``parts``)."""
    by_name = {spec.name: spec for spec in parts}
    if config.trainer not in by_name:
        raise ConfigError(f"--trainer-arg trainer must name a real trainer: {', '.join(by_name)}")
    return by_name[config.trainer]


def check_ray(config: RayTrainer.Config, settings: Any, *, parts: Sequence[Spec]) -> None:
    """The inner trainer's options (every ``--trainer-arg`` not the actor's own), checked by its entry."""
    _inner(config, parts).check(settings, config.trainer_args)


def build_ray(config: RayTrainer.Config, settings: Any, *, parts: Sequence[Spec]) -> Any:
    check_ray(config, settings, parts=parts)
    if config.rank_actors:
        return _rank_actors(config, _inner(config, parts), settings)
    start = settings.initial_weights() if settings.initial_weights is not None else None
    portable = dataclasses.replace(settings, initial_weights=None if start is None else _Value(start))
    trainer: RayTrainer = config.build(inner=_inner(config, parts), settings=portable)
    return trainer


def _rank_actors(config: RayTrainer.Config, inner: Spec, settings: Any) -> Any:
    """The fsdp or megatron trainer driven from here, each rank a Ray actor (:mod:`.ray_ranks`)."""
    import ray

    from april_bench.trainers.fsdp import PolicySpec
    from april_bench.trainers.ray_ranks import RayRanks
    from april_bench.trainers.start import starting_module

    if not ray.is_initialized():
        ray.init(address=config.address, include_dashboard=False, log_to_driver=False)
    module = starting_module(settings)  # the ranks start where the one-process trainer would
    model = PolicySpec(settings.model, settings.vocab_size, settings.seed, module.state_dict())
    launcher = RayRanks(
        num_cpus=config.num_cpus,
        num_gpus=config.num_gpus,
        placement=config.placement,
        timeout_s=config.placement_timeout_s,
    )
    # fsdp's and megatron's Config, parsed as the one-process trainer's would be (check_ray checked them)
    return inner.configure(settings, config.trainer_args).build(model=model, launcher=launcher)


@dataclass(frozen=True, slots=True)
class _Value:
    value: Any

    def __call__(self) -> Any:
        return self.value
