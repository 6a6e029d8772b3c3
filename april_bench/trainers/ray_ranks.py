"""Trainer ranks as Ray actors, one per rank, placed across the cluster's nodes.

:class:`RayRanks` is a :class:`~april_bench.trainers.ranks.Launcher`: the fsdp and megatron trainers
hand it the same :class:`~april_bench.trainers.ranks.RankRecipe` they run in local processes.  It
reserves one placement-group bundle per rank (``num_cpus`` CPUs and ``num_gpus`` GPUs each) with the
strategy asked for (``SPREAD``: across nodes where they allow, ``STRICT_SPREAD``: every rank on its
own node, ``PACK``/``STRICT_PACK``: as few nodes as fit, which keeps NCCL on one node's links), starts
one :class:`RankActor` in each bundle, and initialises ``torch.distributed`` from an address on rank
0's node (``tcp://<rank 0's node IP>:<a free port there>``): gloo on the CPU, NCCL on GPUs.  Ray
gives each GPU rank its own ``CUDA_VISIBLE_DEVICES``, so a rank's GPU is device 0 of its actor.

A rank's failure is raised with its traceback; a dead rank actor (killed, its node lost) raises
:class:`~april_bench.trainers.protocol.TrainerLost`, which ends the run as interrupted (resumable).
Checked against ray 2.60.0 (``ray.util.placement_group``, ``PlacementGroupSchedulingStrategy``,
``ray.util.get_node_ip_address``, ``ray.get_runtime_context().get_node_id()``).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from dataclasses import dataclass
from typing import Any

from april_bench.trainers.protocol import TrainerLost
from april_bench.trainers.ranks import Handler, RankRecipe, join_group

__all__ = ["RankActor", "RayRankGroup", "RayRanks"]

STRATEGIES = ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD")


@dataclass(frozen=True, slots=True)
class RayRanks:
    """Launches a trainer's ranks as Ray actors (see the module docstring); ``num_cpus`` and
    ``num_gpus`` are each rank's."""

    num_cpus: float = 1.0
    num_gpus: float = 0.0
    placement: str = "SPREAD"
    timeout_s: float = 600.0

    def __call__(self, recipe: RankRecipe, config: Any, *, name: str, needs: str) -> RayRankGroup:
        if self.placement not in STRATEGIES:
            from april_bench.config import ConfigError

            raise ConfigError(f"--trainer-arg placement must be one of {', '.join(STRATEGIES)}")
        device = config.device if config.device != "auto" else ("cuda" if self.num_gpus > 0 else "cpu")
        if device == "cuda" and self.num_gpus <= 0:
            from april_bench.config import ConfigError

            raise ConfigError(f"{needs}: give each rank actor a GPU (--trainer-arg num_gpus=1)")
        backend = config.backend if config.backend != "auto" else ("nccl" if device == "cuda" else "gloo")
        return RayRankGroup(
            recipe, world=config.world_size, device=device, backend=backend, name=name, launcher=self
        )


class RayRankGroup:
    """``world`` :class:`RankActor` s in one placement group, driven like a local rank group."""

    def __init__(
        self, recipe: RankRecipe, *, world: int, device: str, backend: str, name: str, launcher: RayRanks
    ) -> None:
        import ray
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        self.name = name
        self._actors: list[Any] = []
        self._lost = False
        bundle = {"CPU": launcher.num_cpus, **({"GPU": launcher.num_gpus} if launcher.num_gpus > 0 else {})}
        self._group: Any = placement_group([bundle] * world, strategy=launcher.placement)
        try:
            ray.get(self._group.ready(), timeout=launcher.timeout_s)
        except ray.exceptions.GetTimeoutError:
            ray.util.remove_placement_group(self._group)
            raise RuntimeError(
                f"Ray cannot place {world} {name} ranks of {bundle} ({launcher.placement}) within "
                f"{launcher.timeout_s:g} s; free now: {ray.available_resources()}. Use fewer ranks, smaller "
                "num_cpus/num_gpus, or placement=SPREAD/PACK"
            ) from None
        try:
            for rank in range(world):
                actor: Any = ray.remote(RankActor).options(
                    num_cpus=launcher.num_cpus,
                    num_gpus=launcher.num_gpus,
                    scheduling_strategy=PlacementGroupSchedulingStrategy(
                        self._group, placement_group_bundle_index=rank
                    ),
                    name=None,
                )
                self._actors.append(
                    actor.remote(recipe, rank, world, device, backend, int(launcher.num_cpus))
                )
            nodes = self._get([a.node_id.remote() for a in self._actors], launcher.timeout_s)
            address = self._get([self._actors[0].free_address.remote()], launcher.timeout_s)[0]
            self._get([a.start.remote(address) for a in self._actors], launcher.timeout_s)
        except BaseException:
            self.close()
            raise
        #: Where each rank runs, in rank order.
        self.placement: list[dict[str, Any]] = [
            {"rank": rank, "node_id": node} for rank, node in enumerate(nodes)
        ]
        self.address: str = address

    def call(self, command: str, *args: Any) -> list[Any]:
        """Send every rank ``command`` and return their replies in rank order."""
        if not self._actors:
            raise RuntimeError(f"the {self.name} trainer is closed")
        return self._get([a.call.remote(command, list(args)) for a in self._actors], None)

    async def acall(self, command: str, *args: Any) -> list[Any]:
        """:meth:`call` without blocking the event loop (the rollout goes on meanwhile)."""
        import ray

        if not self._actors:
            raise RuntimeError(f"the {self.name} trainer is closed")
        refs = [a.call.remote(command, list(args)) for a in self._actors]
        try:
            return list(await asyncio.gather(*refs))
        except (ray.exceptions.RayActorError, ray.exceptions.RayTaskError) as exc:
            raise self._error(exc) from None

    def actor(self, rank: int) -> Any:
        """Rank ``rank``'s actor handle (the weight broadcast calls rank 0's own methods)."""
        return self._actors[rank]

    def close(self) -> None:
        """Stop the ranks and free their bundles (idempotent)."""
        import ray

        actors, self._actors = self._actors, []
        if not self._lost:  # a lost rank leaves the others waiting in a collective: no orderly stop
            stops = [actor.stop.remote() for actor in actors]
            with contextlib.suppress(
                ray.exceptions.RayActorError, ray.exceptions.RayTaskError, ray.exceptions.GetTimeoutError
            ):
                ray.get(stops, timeout=60)
        for actor in actors:
            ray.kill(actor)
        if self._group is not None:
            group, self._group = self._group, None
            ray.util.remove_placement_group(group)

    def _get(self, refs: list[Any], timeout: float | None) -> list[Any]:
        import ray

        try:
            return list(ray.get(refs, timeout=timeout))
        except ray.exceptions.GetTimeoutError:
            raise RuntimeError(f"the {self.name} ranks did not start within {timeout:.0f} s") from None
        except (ray.exceptions.RayActorError, ray.exceptions.RayTaskError) as exc:
            raise self._error(exc) from None

    def _error(self, exc: BaseException) -> Exception:
        import ray

        if isinstance(exc, ray.exceptions.RayActorError):
            self._lost = True
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            return TrainerLost(f"a {self.name} rank actor died ({type(exc).__name__}: {first})")
        return RuntimeError(f"{self.name} rank failed:\n{exc}")


class RankActor:
    """One trainer rank inside a Ray actor: the recipe's life, split over the driver's calls."""

    def __init__(
        self, recipe: RankRecipe, rank: int, world: int, device: str, backend: str, threads: int
    ) -> None:
        self.recipe, self.rank, self.world = recipe, rank, world
        self.device, self.backend, self.threads = device, backend, threads
        self._stack = contextlib.ExitStack()
        self._handle: Handler | None = None
        self._joined = False

    def node_id(self) -> str:
        import ray

        return str(ray.get_runtime_context().get_node_id())

    def free_address(self) -> str:
        """A ``tcp://`` rendezvous address on this node (rank 0's), reachable from the others."""
        import ray

        host = ray.util.get_node_ip_address()
        with socket.socket() as probe:
            probe.bind((host, 0))
            port: int = probe.getsockname()[1]
        return f"tcp://{host}:{port}"

    def start(self, address: str) -> None:
        """Join the process group at ``address``, enter the recipe's scope and build the rank."""
        join_group(
            self.rank, self.world, self.device, self.backend, address, device_index=0, threads=self.threads
        )
        self._joined = True
        self._stack.enter_context(self.recipe.enter(self.device))
        self._handle = self.recipe.build(self.rank, self.device, 0)

    def call(self, command: str, args: list[Any]) -> Any:
        if self._handle is None:
            raise RuntimeError(f"rank {self.rank} was not started")
        return self._handle(command, args)

    def stop(self) -> None:
        """Leave the scope, the library's groups, then the process group (idempotent)."""
        import torch.distributed as dist

        self._handle = None
        self._stack.close()
        if self._joined:
            self._joined = False
            if self.recipe.leave is not None:
                self.recipe.leave()
            dist.destroy_process_group()
