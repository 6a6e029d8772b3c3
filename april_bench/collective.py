"""Weights over a process group: the trainer's rank 0 (or the driver) broadcasts, engine workers receive.

A :class:`WeightGroup` is a process group of its own (a ``TCPStore`` at the sender's address and a
gloo or NCCL ``ProcessGroup`` on it), apart from any default group its members already joined (a
trainer rank is in its trainer's group; vLLM's workers are in theirs): what vLLM's
``StatelessProcessGroup`` and SGLang's ``init_weights_update_group`` build.  Rank 0 sends, ranks
``1..world-1`` receive.  Two wires: april-bench's (``flat``: a header of every tensor's name, dtype
and shape, as JSON in a uint8 tensor after its length, then one flat buffer per dtype, so a whole
policy is a few broadcasts; vLLM workers through april-bench's worker extension, hf replicas) and
SGLang's (``per_tensor``: one broadcast per tensor, the header sent to the server over HTTP first,
``/update_weights_from_distributed``).

Neutral: trainers (the sending side) and engines (the receiving side) both import this module; it
imports nothing of theirs.  :func:`host_address` names a free port on this node (its Ray node IP when
inside a Ray worker, else the loopback).
"""

from __future__ import annotations

import datetime
import json
import socket
import sys
from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

__all__ = [
    "GROUP_TIMEOUT_S",
    "EngineWorkers",
    "WeightGroup",
    "WeightReceivers",
    "WeightSource",
    "header",
    "host_address",
    "weight_wire",
]

#: Seconds a member waits for the others (joining, and each broadcast): a receiver that failed leaves
#: the sender blocked this long at most (gloo's own default is 30 minutes, torch's store's 300 s).
GROUP_TIMEOUT_S = 60.0


@runtime_checkable
class WeightSource(Protocol):
    """A trainer whose own rank 0 sends the weights (it joins the group as rank 0)."""

    async def weight_group_address(self) -> str:
        """A free ``tcp://host:port`` on the sending rank's node."""
        ...

    async def join_weight_group(self, address: str, world: int, backend: str) -> None: ...

    async def send_weights(self, per_tensor: bool = False) -> None:
        """Broadcast the current policy (every trainer rank takes part in gathering it): with
        ``per_tensor``, SGLang's wire (:meth:`WeightGroup.send_each`), else april-bench's."""
        ...

    async def weight_header(self) -> dict[str, list[Any]]:
        """The policy's names, dtypes and shapes (:func:`header`), without gathering it."""
        ...

    def leave_weight_group(self) -> None: ...


@runtime_checkable
class WeightReceivers(Protocol):
    """An engine whose workers receive weights over a :class:`WeightGroup` (ranks ``first..``)."""

    def weight_receivers(self) -> int:
        """How many receiving ranks the engine has now."""
        ...

    def weight_group_current(self) -> bool:
        """False when a worker that joined has been replaced since (the group must be formed again)."""
        ...

    async def join_weight_group(self, address: str, first: int, world: int, backend: str) -> None: ...

    async def receive_weights(self, version: int, header: dict[str, list[Any]] | None = None) -> None:
        """Receive one broadcast and install it as ``version`` on every worker (``header``: the
        tensors' names, dtypes and shapes, given when the wire is ``per_tensor``)."""
        ...


@runtime_checkable
class EngineWorkers(Protocol):
    """One engine whose own workers receive (a vLLM server's or in-process engine's workers through
    ``collective_rpc``; an SGLang server through ``/init_weights_update_group`` and
    ``/update_weights_from_distributed``): ranks ``first .. first + weight_workers() - 1``."""

    def weight_workers(self) -> int: ...

    async def join_weight_group(self, address: str, first: int, world: int, backend: str) -> None: ...

    async def receive_weights(self, version: int, header: dict[str, list[Any]] | None = None) -> None:
        """Receive one broadcast (the engine idle: nothing in flight) and serve it as ``version``."""
        ...


def weight_wire(receivers: object) -> str:
    """How ``receivers`` take a broadcast: ``per_tensor`` (SGLang's: one broadcast per tensor, the
    header given by HTTP) or ``flat`` (april-bench's: a header, then one buffer per dtype)."""
    wire = getattr(receivers, "weight_wire", None)
    return "flat" if wire is None else str(wire())


def host_address(host: str | None = None) -> str:
    """A ``tcp://`` address on a free port of this node, reachable from the cluster's other nodes: at
    this node's Ray IP inside a Ray driver or worker, else at ``host`` (the driver's, for a process it
    spawned on its own node), else the loopback."""
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        host = ray.util.get_node_ip_address()
    host = host or "127.0.0.1"
    with socket.socket() as probe:
        probe.bind((host, 0))
        port: int = probe.getsockname()[1]
    return f"tcp://{host}:{port}"


class WeightGroup:
    """Rank ``rank`` of a ``world``-member weight group at ``address`` (rank 0 hosts the store).

    Joining blocks until every member joined (call it from a thread, or from an actor of its own);
    joining and each broadcast give up after ``timeout_s`` (default :data:`GROUP_TIMEOUT_S`)."""

    def __init__(
        self,
        address: str,
        rank: int,
        world: int,
        *,
        backend: str = "gloo",
        timeout_s: float | None = None,
    ) -> None:
        import torch
        import torch.distributed as dist

        host, _, port = address.removeprefix("tcp://").rpartition(":")
        timeout = datetime.timedelta(seconds=GROUP_TIMEOUT_S if timeout_s is None else timeout_s)
        self.rank, self.world, self.backend = rank, world, backend
        self.device = torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" else None
        self._store: Any = dist.TCPStore(host, int(port), world, rank == 0, timeout)
        store = dist.PrefixStore("april-weights", self._store)
        self._group: Any = (
            dist.ProcessGroupNCCL(store, rank, world, dist.ProcessGroupNCCL.Options())
            if backend == "nccl"
            else dist.ProcessGroupGloo(store, rank, world, timeout)
        )

    def send(self, state: Mapping[str, Any]) -> None:
        """Rank 0: broadcast ``state`` (a state dict of tensors) to every other member."""
        import torch

        header: list[list[Any]] = [
            [name, str(t.dtype).removeprefix("torch."), list(t.shape)] for name, t in state.items()
        ]
        raw = torch.frombuffer(bytearray(json.dumps(header).encode()), dtype=torch.uint8)
        self._broadcast(torch.tensor([raw.numel()], dtype=torch.int64))
        self._broadcast(raw)
        for dtype in _dtypes(header):
            flat = torch.cat([state[name].detach().reshape(-1) for name, d, _ in header if d == dtype])
            self._broadcast(flat)

    def send_each(self, state: Mapping[str, Any]) -> None:
        """Rank 0: SGLang's wire (``update_weights_from_distributed``): one broadcast per tensor, in
        ``state``'s order, no header (the receivers were told names, dtypes and shapes over HTTP:
        :func:`header`)."""
        for name in sorted(state):  # the order of :func:`header`
            self._broadcast(state[name].detach().contiguous())

    def receive_each(self, names: list[str], dtypes: list[str], shapes: list[list[int]]) -> dict[str, Any]:
        """Ranks 1..: SGLang's wire, one broadcast per named tensor."""
        import torch

        state: dict[str, Any] = {}
        for name, dtype, shape in zip(names, dtypes, shapes, strict=True):
            state[name] = self._broadcast(torch.empty(shape, dtype=getattr(torch, dtype)))
        return state

    def receive(self) -> dict[str, Any]:
        """Ranks 1..: one broadcast from rank 0, as a state dict of CPU (or this GPU's) tensors."""
        import torch

        length = torch.zeros(1, dtype=torch.int64)
        self._broadcast(length)
        raw = torch.zeros(int(length[0]), dtype=torch.uint8)
        self._broadcast(raw)
        header = json.loads(bytes(raw.tolist()).decode())
        state: dict[str, Any] = {}
        for dtype in _dtypes(header):
            mine = [(name, shape) for name, d, shape in header if d == dtype]
            sizes = [_numel(shape) for _, shape in mine]
            flat = torch.empty(sum(sizes), dtype=getattr(torch, dtype))
            flat = self._broadcast(flat)
            for (name, shape), part in zip(mine, flat.split(sizes), strict=True):
                state[name] = part.view(shape).clone()
        return {name: state[name] for name, _, _ in header}  # the sender's order

    def close(self) -> None:
        self._group = None
        self._store = None

    def _broadcast(self, tensor: Any) -> Any:
        """Broadcast from rank 0 in place; on NCCL through this GPU (the result back where it was)."""
        import torch.distributed as dist

        where = tensor.device
        moved = tensor.to(self.device) if self.device is not None else tensor
        options = dist.BroadcastOptions()
        options.rootRank = 0
        self._group.broadcast([moved], options).wait()
        if moved is not tensor:
            tensor.copy_(moved.to(where))
        return tensor


def header(state: Mapping[str, Any]) -> dict[str, list[Any]]:
    """``state``'s names, dtypes and shapes as SGLang's ``/update_weights_from_distributed`` takes them,
    in name order (:meth:`WeightGroup.send_each`'s)."""
    names = sorted(state)
    return {
        "names": names,
        "dtypes": [str(state[n].dtype).removeprefix("torch.") for n in names],
        "shapes": [list(state[n].shape) for n in names],
    }


def _dtypes(header: list[Any]) -> list[str]:
    return sorted({dtype for _, dtype, _ in header})


def _numel(shape: list[int]) -> int:
    n = 1
    for size in shape:
        n *= size
    return n
