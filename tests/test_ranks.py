"""A trainer rank's life (``trainers.ranks.run_rank``), the one bootstrap the fsdp and megatron trainers
share: gloo ranks on the CPU join one process group, serve the driver's commands, report a failed
build with its traceback, and leave through the trainer's own ``leave`` before the group."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import pytest

from april_bench.trainers.ranks import Handler, RankGroup, free_address, run_rank


def _rank(rank: int, world: int, fail_rank: int, marks: str, address: str, pipe: Connection) -> None:
    import torch
    import torch.distributed as dist

    def build() -> Handler:
        if rank == fail_rank:
            raise ValueError(f"no shard for rank {rank}")

        def handle(command: str, args: list[Any]) -> Any:
            value = torch.tensor([float(rank + 1)])
            dist.all_reduce(value)  # a collective: every rank is in the group
            return (command, *args, float(value))

        return handle

    @contextlib.contextmanager
    def scope() -> Iterator[None]:
        Path(marks, f"scope-{rank}").touch()
        yield

    def leave() -> None:
        Path(marks, f"left-{rank}").touch()

    run_rank(rank, world, "cpu", "gloo", address, pipe, build, scope=scope, leave=leave)


@pytest.mark.slow
def test_ranks_join_one_group_serve_commands_and_leave(tmp_path: Path) -> None:
    group = RankGroup(
        _rank, (2, -1, str(tmp_path), free_address()), world=2, name="probe", start_timeout_s=300
    )
    try:
        assert group.call("sum", 7) == [("sum", 7, 3.0), ("sum", 7, 3.0)]
    finally:
        group.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["left-0", "left-1", "scope-0", "scope-1"]


@pytest.mark.slow
def test_a_rank_that_fails_to_build_reports_its_traceback(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match=r"(?s)probe rank 0 failed:.*ValueError: no shard for rank 0"):
        RankGroup(_rank, (1, 0, str(tmp_path), free_address()), world=1, name="probe", start_timeout_s=300)
    assert (tmp_path / "left-0").exists()  # it left the group all the same
