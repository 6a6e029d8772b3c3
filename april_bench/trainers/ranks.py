"""The fsdp and megatron trainers' ranks: one bootstrap, run in spawned processes or in Ray actors.

A trainer describes its rank once, as a :class:`RankRecipe` (build the rank's model in the joined
process group and return its command handler; optionally a scope around the rank's life and a
``leave`` for a library's own groups).  :func:`start_ranks` runs the recipe ``world`` times:

* in spawned processes on this machine (:class:`RankGroup`, the default): the driver (the process
  running the rollout) waits for each to report ready, then sends every rank the same command over a
  pipe and collects one reply per rank, in rank order.  A rank answers ``("ok", value)`` or
  ``("error", traceback)``; an error or a dead rank is raised here.  A process rank's life (threads,
  device, process group, build, serve, leave) is :func:`run_rank`;
* in Ray actors, one per rank, placed across the cluster's nodes by a placement group
  (:mod:`.ray_ranks`): the same recipe, the same :func:`join_group`, the group's address taken from
  rank 0's node.
"""

from __future__ import annotations

import contextlib
import functools
import os
import socket
import time
import traceback
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any, Protocol

__all__ = [
    "Launcher",
    "RankGroup",
    "RankRecipe",
    "Ranks",
    "free_address",
    "join_group",
    "place_ranks",
    "run_rank",
    "serve",
    "start_ranks",
]

#: A rank's command handler: ``handle(command, args)`` is the reply to the driver.
Handler = Callable[[str, list[Any]], Any]


@dataclass(frozen=True, slots=True)
class RankRecipe:
    """How a trainer makes one rank, the same in a process or an actor (picklable: module-level
    functions, or ``functools.partial`` of them).

    ``build(rank, device, device_index)`` runs after the rank joined the process group and returns
    its command handler; ``scope(device)`` is entered before ``build`` and left at the end of the
    rank's life; ``leave()`` runs last, before the process group is destroyed."""

    build: Callable[[int, str, int], Handler]
    scope: Callable[[str], AbstractContextManager[Any]] | None = None
    leave: Callable[[], None] | None = None

    def enter(self, device: str) -> AbstractContextManager[Any]:
        return self.scope(device) if self.scope is not None else contextlib.nullcontext()


class Ranks(Protocol):
    """A started group of ranks, as the trainer drives it."""

    #: Where each rank runs, in rank order (``{"rank", "node_id"}``; empty for local processes).
    placement: list[dict[str, Any]]

    def call(self, command: str, *args: Any) -> list[Any]: ...

    async def acall(self, command: str, *args: Any) -> list[Any]: ...

    def close(self) -> None: ...


class Launcher(Protocol):
    """Starts ``world`` ranks of ``recipe``; ``config`` carries ``device``, ``backend``,
    ``world_size`` and ``start_timeout_s``; ``needs`` names the setting that asked for the GPUs."""

    def __call__(self, recipe: RankRecipe, config: Any, *, name: str, needs: str) -> Ranks: ...


class RankGroup:
    """``world`` spawned processes running ``target(rank, *args, pipe)``."""

    def __init__(
        self,
        target: Callable[..., None],
        args: tuple[Any, ...],
        *,
        world: int,
        name: str,
        start_timeout_s: float,
    ) -> None:
        import torch.multiprocessing as mp

        self.name = name
        self.placement: list[dict[str, Any]] = []
        context = mp.get_context("spawn")
        self._pipes: list[Connection] = []
        self._ranks: list[Any] = []
        for rank in range(world):
            ours, theirs = context.Pipe()
            process = context.Process(
                target=target, args=(rank, *args, theirs), daemon=True, name=f"april-{name}-rank{rank}"
            )
            process.start()
            theirs.close()
            self._pipes.append(ours)
            self._ranks.append(process)
        try:
            self._gather(start_timeout_s)  # every rank reports ready
        except BaseException:
            self.close()
            raise

    def call(self, command: str, *args: Any) -> list[Any]:
        """Send every rank ``command`` and return their replies in rank order."""
        if not self._pipes:
            raise RuntimeError(f"the {self.name} trainer is closed")
        for pipe in self._pipes:
            pipe.send((command, *args))
        return self._gather(None)

    async def acall(self, command: str, *args: Any) -> list[Any]:
        """:meth:`call`, as the trainer's async methods use it (the pipes block this thread)."""
        return self.call(command, *args)

    def close(self) -> None:
        """Stop the ranks (idempotent)."""
        for pipe in self._pipes:
            with contextlib.suppress(BrokenPipeError, OSError):  # a rank that already died
                pipe.send(("stop",))
        for process in self._ranks:
            process.join(timeout=30)
            if process.is_alive():
                process.terminate()
                process.join(timeout=10)
        for pipe in self._pipes:
            pipe.close()
        self._pipes, self._ranks = [], []

    def _gather(self, timeout: float | None) -> list[Any]:
        """One reply per rank, in rank order; a rank's error or death is raised here."""
        deadline = None if timeout is None else time.monotonic() + timeout
        replies: list[Any] = []
        for rank, (pipe, process) in enumerate(zip(self._pipes, self._ranks, strict=True)):
            while not pipe.poll(1.0):
                if not process.is_alive():
                    raise RuntimeError(f"{self.name} rank {rank} exited with code {process.exitcode}")
                if deadline is not None and time.monotonic() > deadline:
                    raise RuntimeError(f"{self.name} rank {rank} did not start within {timeout:.0f} s")
            status, value = pipe.recv()
            if status == "error":
                raise RuntimeError(f"{self.name} rank {rank} failed:\n{value}")
            replies.append(value)
        return replies


def place_ranks(device: str, backend: str, world: int, needs: str) -> tuple[str, str]:
    """The ranks' device and process-group backend: ``auto`` picks CUDA where visible (nccl), else the
    CPU (gloo).  ``needs`` names the setting that asked for ``world`` GPUs, for the error."""
    import torch

    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and torch.cuda.device_count() < world:
        from april_bench.config import ConfigError

        raise ConfigError(f"{needs}; {torch.cuda.device_count()} visible")
    return device, (backend if backend != "auto" else ("nccl" if device == "cuda" else "gloo"))


def start_ranks(
    recipe: RankRecipe, config: Any, *, name: str, needs: str, launcher: Launcher | None = None
) -> Ranks:
    """The ranks of a multi-rank trainer (FSDP, Megatron), each made by ``recipe``: by ``launcher``
    (for example :class:`.ray_ranks.RayRanks`, one Ray actor per rank), else spawned processes on this
    machine, placed by :func:`place_ranks`.  ``config`` carries ``device``, ``backend``,
    ``world_size`` and ``start_timeout_s``."""
    if launcher is not None:
        return launcher(recipe, config, name=name, needs=needs)
    device, backend = place_ranks(config.device, config.backend, config.world_size, needs)
    return RankGroup(
        _process_rank,
        (recipe, config.world_size, device, backend, free_address()),
        world=config.world_size,
        name=name,
        start_timeout_s=config.start_timeout_s,
    )


def _process_rank(
    rank: int, recipe: RankRecipe, world: int, device: str, backend: str, address: str, pipe: Connection
) -> None:
    """A spawned process's rank: ``recipe`` run by :func:`run_rank` (its GPU is its rank's)."""
    run_rank(
        rank,
        world,
        device,
        backend,
        address,
        pipe,
        functools.partial(recipe.build, rank, device, rank),
        scope=functools.partial(recipe.enter, device),
        leave=recipe.leave,
    )


def free_address() -> str:
    """A ``tcp://`` rendezvous address on a free local port."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return f"tcp://127.0.0.1:{port}"


def run_rank(
    rank: int,
    world: int,
    device: str,
    backend: str,
    address: str,
    pipe: Connection,
    build: Callable[[], Handler],
    *,
    scope: Callable[[], AbstractContextManager[Any]] = contextlib.nullcontext,
    leave: Callable[[], None] | None = None,
) -> None:
    """A rank's life, in its spawned process: share the CPU's threads, take its GPU, join the process
    group at ``address``, then (inside ``scope()``) ``build()`` its model, report ready (or the
    traceback) to the driver and :func:`serve` the handler ``build`` returned; at the end ``leave()``
    (a library's own groups) and leave the process group."""
    import torch.distributed as dist

    try:
        join_group(
            rank, world, device, backend, address, device_index=rank, threads=(os.cpu_count() or 1) // world
        )
    except BaseException:
        pipe.send(("error", traceback.format_exc()))
        return
    try:
        with scope():
            try:
                handle = build()
            except BaseException:
                pipe.send(("error", traceback.format_exc()))
                return
            pipe.send(("ok", None))
            serve(pipe, handle)
    finally:
        if leave is not None:
            leave()
        dist.destroy_process_group()


def join_group(
    rank: int, world: int, device: str, backend: str, address: str, *, device_index: int, threads: int
) -> None:
    """Share the CPU's threads (``threads`` of them, at least one), take GPU ``device_index`` on CUDA,
    and join the process group at ``address`` as ``rank`` of ``world``."""
    import torch
    import torch.distributed as dist

    torch.set_num_threads(max(1, threads))
    if device == "cuda":
        torch.cuda.set_device(device_index)
    dist.init_process_group(backend, init_method=address, rank=rank, world_size=world)


def serve(pipe: Connection, handle: Handler) -> None:
    """A rank's command loop: ``handle(command, args)``'s value is the reply, until ``stop``."""
    while True:
        command, *args = pipe.recv()
        if command == "stop":
            return
        try:
            pipe.send(("ok", handle(command, args)))
        except Exception:
            pipe.send(("error", traceback.format_exc()))
