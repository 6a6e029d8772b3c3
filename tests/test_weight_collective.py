"""Weights over a process group (``april_bench.collective``, ``backends.weights.CollectiveSync``): gloo
on the CPU between a sender and receivers (threads of this process, or the fsdp trainer's rank 0),
exact tensors and dtypes, the group formed again when a worker was replaced, and the object-store
fallback when a broadcast fails."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest
import torch
from test_fsdp_trainer import VOCAB, _module, _start

from april_bench.backends.weights import CollectiveSync, DriverSource, choose_weight_sync
from april_bench.collective import WeightGroup, WeightReceivers, host_address
from april_bench.engines.protocol import WeightUpdate
from april_bench.trainers.torch_trainer import TorchTrainer


def test_a_broadcast_reaches_every_receiver_exactly() -> None:
    state = {
        "w": torch.randn(3, 4),
        "ids": torch.arange(5),
        "half": torch.randn(2, 2).to(torch.bfloat16),
        "v": torch.randn(7),
    }
    address = host_address()
    got: dict[int, list[dict[str, Any]]] = {}

    def receive(rank: int) -> None:
        group = WeightGroup(address, rank, 3, timeout_s=60)
        got[rank] = [group.receive(), group.receive()]

    threads = [threading.Thread(target=receive, args=(r,)) for r in (1, 2)]
    for t in threads:
        t.start()
    sender = WeightGroup(address, 0, 3, timeout_s=60)
    sender.send(state)
    sender.send({"w": state["w"] * 2})
    for t in threads:
        t.join(60)
    for rank in (1, 2):
        first, second = got[rank]
        assert list(first) == list(state)
        for name, tensor in state.items():
            assert first[name].dtype == tensor.dtype and torch.equal(first[name], tensor), name
        assert list(second) == ["w"] and torch.equal(second["w"], state["w"] * 2)


class _Receivers:
    """An engine with ``workers`` receiving threads (collective.WeightReceivers); ``fail_at``: the
    version whose receive raises before it joins the broadcast (a worker lost)."""

    info: Any = None

    def __init__(self, workers: int, *, fail_at: int | None = None) -> None:
        self.workers, self.fail_at = workers, fail_at
        self.groups: list[WeightGroup] = []
        self.current = True
        self.joins = 0
        self.installed: list[tuple[int, str, dict[str, torch.Tensor]]] = []

    def weight_receivers(self) -> int:
        return self.workers

    def weight_group_current(self) -> bool:
        return self.current

    async def join_weight_group(self, address: str, first: int, world: int, backend: str) -> None:
        self.joins += 1
        self.groups = list(
            await asyncio.gather(
                *(
                    asyncio.to_thread(WeightGroup, address, first + i, world, timeout_s=20)
                    for i in range(self.workers)
                )
            )
        )
        self.current = True

    async def receive_weights(self, version: int) -> None:
        if version == self.fail_at:
            raise RuntimeError("worker lost")
        states = await asyncio.gather(*(asyncio.to_thread(g.receive) for g in self.groups))
        self.installed += [(version, "collective", s) for s in states]

    async def update_weights(self, update: WeightUpdate) -> None:  # the fallback's path
        self.installed.append((update.version, "object_store", dict(update.weights or {})))


@pytest.mark.slow
def test_collective_sync_forms_the_group_once_again_after_a_replacement_and_falls_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # the sender waits for the failed receiver this long, then the fallback runs (not gloo's 30 min)
    monkeypatch.setattr("april_bench.collective.GROUP_TIMEOUT_S", 3.0)
    trainer = TorchTrainer.Config(device="cpu").build(module=_module(_start()))
    engine = _Receivers(2, fail_at=3)
    assert isinstance(engine, WeightReceivers)
    sync = CollectiveSync(_ObjectStore())

    async def go() -> None:
        await sync.push(trainer, engine, 1)  # type: ignore[arg-type]
        await sync.push(trainer, engine, 2)  # type: ignore[arg-type]
        assert engine.joins == 1  # one group for every update
        engine.current = False  # a worker was replaced: the next update forms the group again
        await sync.push(trainer, engine, 3)  # type: ignore[arg-type]  # fails: the object store
        assert engine.joins == 2
        await sync.push(trainer, engine, 4)  # type: ignore[arg-type]  # a group again
        assert engine.joins == 3

    asyncio.run(go())
    reference = trainer.weights()
    assert [(v, how) for v, how, _ in engine.installed] == [
        (1, "collective"),
        (1, "collective"),
        (2, "collective"),
        (2, "collective"),
        (3, "object_store"),
        (4, "collective"),
        (4, "collective"),
    ]
    for _, _, state in engine.installed:
        assert state.keys() == reference.keys()
        assert all(torch.equal(state[k], reference[k]) for k in reference)
    assert len(sync.fallbacks) == 1
    # one clear line: the receivers' error, and the sender's own (it gave up at the group's timeout)
    assert "engine receivers: RuntimeError: worker lost" in sync.fallbacks[0]
    assert "sender: " in sync.fallbacks[0]


class _ObjectStore:
    kind = "state_dict"

    async def push(self, trainer: Any, engine: Any, version: int) -> None:
        await engine.update_weights(WeightUpdate(version=version, weights=trainer.weights()))


def test_an_engine_with_weight_receivers_gets_the_collective_sync(tmp_path: Any) -> None:
    trainer = TorchTrainer.Config(device="cpu").build(module=_module(_start()))

    class Info:
        weight_formats = ("state_dict", "none")
        name = "probe"

    engine = _Receivers(1)
    engine.info = Info()
    assert choose_weight_sync(engine, trainer, tmp_path).kind == "collective"  # type: ignore[arg-type]
    engine.workers = 0  # --engine-arg weights=object_store: no receivers
    assert choose_weight_sync(engine, trainer, tmp_path).kind == "state_dict"  # type: ignore[arg-type]
    assert isinstance(DriverSource(trainer), DriverSource)


@pytest.mark.slow
def test_the_fsdp_trainers_rank_0_broadcasts_the_gathered_policy() -> None:
    from april_bench.trainers.fsdp import FSDPTrainer, PolicySpec

    start = _start()
    fsdp = FSDPTrainer.Config(device="cpu", world_size=2).build(model=PolicySpec("tiny", VOCAB, 3, start))
    engine = _Receivers(1)
    try:
        asyncio.run(CollectiveSync(_ObjectStore()).push(fsdp, engine, 1))  # type: ignore[arg-type]
        fsdp.leave_weight_group()
    finally:
        fsdp.close()
    ((version, how, state),) = engine.installed
    assert (version, how) == (1, "collective")
    assert state.keys() == start.keys()
    assert all(torch.equal(state[k], start[k]) for k in start)


def test_the_vllm_worker_extension_joins_receives_and_reloads_in_place() -> None:
    """april-bench's vLLM worker extension (what ``/collective_rpc`` calls, string arguments): the
    worker joins as rank ``first + its rank``, receives one broadcast and hands it to vLLM's in-place
    ``reload_weights`` as (name, tensor) pairs."""
    from april_bench.engines.vllm.worker import WeightReload

    class Worker(WeightReload):
        rank = 1  # the second tensor-parallel worker

        def __init__(self) -> None:
            self.model_runner = type("Runner", (), {"model": torch.nn.Linear(2, 2)})()
            self.reloaded: list[tuple[str, torch.Tensor]] = []

        def reload_weights(self, weights_iterator: Any) -> None:
            self.reloaded = list(weights_iterator)

    worker = Worker()
    with pytest.raises(RuntimeError, match="before join_weight_group"):
        worker.receive_weights()
    address = host_address()
    state = {"a": torch.arange(4.0), "b": torch.ones(2, 2, dtype=torch.bfloat16)}
    # first rank 0 of the server's workers plus this worker's own rank 1: group rank 1 of 2
    joined = threading.Thread(target=worker.join_weight_group, args=(address, "0", "2", "gloo", "20"))
    joined.start()
    sender = WeightGroup(address, 0, 2, timeout_s=20)
    joined.join(30)
    assert worker._april_weight_group.rank == 1
    received: list[int] = []
    receiving = threading.Thread(target=lambda: received.append(worker.receive_weights()))
    receiving.start()
    sender.send(state)
    receiving.join(30)
    assert received == [2]
    assert [name for name, _ in worker.reloaded] == ["a", "b"]
    assert all(torch.equal(t, state[n]) and t.dtype == state[n].dtype for n, t in worker.reloaded)
