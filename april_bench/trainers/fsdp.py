"""``fsdp``: the torch trainer, data-parallel over ``world_size`` processes with FSDP2.

Each rank is a spawned process (or, under ``--trainer ray``, a Ray actor on any node:
:mod:`.ray_ranks`) holding a ``fully_shard``-ed copy of the policy (every decoder layer its own FSDP
group, then the root), its own AdamW over its parameter shards, and the same loss as
:class:`~april_bench.trainers.torch_trainer.TorchTrainer`: every rank builds the batch's rows (cheap),
computes a disjoint share of each mini-batch (rows ``rank::world_size``), and weights its loss by
``world_size * its loss denominator / the mini-batch's`` so that FSDP's averaged gradients are the
one-process gradients of the whole mini-batch (``algorithms.losses.loss_denominator``).

The driver (this process, where the rollout runs) talks to the ranks over pipes or Ray calls
(:mod:`.ranks`).
After a step the engine gets the weights gathered to rank 0 as a full CPU state dict (``weights()``,
the in-process WeightSync); resumable state is the full model and optimizer state dicts in one file.

Checked against torch 2.13.0: ``torch.distributed.fsdp.fully_shard`` (FSDP2) shards on a CPU mesh
(``_get_device_from_mesh`` returns the CPU device for ``device_type="cpu"``) and runs its
all-gathers and reduce-scatters over gloo; ``torch.distributed.checkpoint.state_dict``'s
``get_model_state_dict`` / ``set_model_state_dict`` (and the optimizer ones) with
``StateDictOptions(full_state_dict=True, cpu_offload=True)`` gather to and load from full tensors.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Any

import torch

from april_bench.config import ConfigError, Configurable, param
from april_bench.trainers.logprobs import logits_token_logprobs
from april_bench.trainers.protocol import TrainResult
from april_bench.trainers.ranks import Handler, Launcher, RankRecipe, start_ranks
from april_bench.trainers.torch_trainer import TorchTrainer, _Rows
from april_bench.types import Group

__all__ = ["FSDPTrainer", "PolicySpec"]


@dataclass(frozen=True, slots=True)
class PolicySpec:
    """What every rank needs to build the same starting policy."""

    name: str
    vocab_size: int | None
    seed: int
    weights: dict[str, torch.Tensor]


class FSDPTrainer(Configurable):
    """Drives ``world_size`` FSDP2 ranks; the trainer protocol on this side, collectives on theirs."""

    #: ``weights()`` gathers every rank's shard: callers that only ask whether there are weights must
    #: not call it (``backends.weights.choose_weight_sync``).
    has_weights = True

    @dataclass(kw_only=True, slots=True, frozen=True)
    class Config(TorchTrainer.Config):
        world_size: int = param(2, help="data-parallel ranks (processes; one GPU each on CUDA)")
        backend: str = param("auto", help="process-group backend: gloo, nccl, or auto (nccl on CUDA)")
        start_timeout_s: float = param(300.0, help="seconds to wait for the ranks to start")
        reshard_after_forward: bool = param(True, help="free gathered parameters after forward (FSDP2)")

        def __post_init__(self) -> None:
            TorchTrainer.Config.__post_init__(self)
            if self.world_size < 1:
                raise ConfigError(f"--trainer-arg world_size must be >= 1, got {self.world_size}")
            if self.backend not in ("auto", "gloo", "nccl"):
                raise ConfigError(f"--trainer-arg backend must be auto, gloo or nccl, got {self.backend!r}")
            if self.kl_coef > 0:
                raise ConfigError(
                    "the fsdp trainer keeps no reference model: use kl_coef=0 (APRIL's setting) "
                    "or --trainer torch"
                )
            if self.max_tokens_per_micro_batch is not None:
                # every rank must run the same number of forward/backward passes (FSDP collectives);
                # token-budget packing gives ranks different counts
                raise ConfigError(
                    "the fsdp trainer splits each mini-batch over its ranks and takes no "
                    "max_tokens_per_micro_batch yet: raise --trainer-arg mini_batches or world_size instead"
                )

        def torch_config(self) -> TorchTrainer.Config:
            """The per-rank trainer's settings (everything but the process layout)."""
            own = {f.name for f in fields(FSDPTrainer.Config)} - {f.name for f in fields(TorchTrainer.Config)}
            shared = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in own}
            return TorchTrainer.Config(**shared)

    def __init__(self, config: Config, *, model: PolicySpec, launcher: Launcher | None = None) -> None:
        self.config = config
        self._ranks = start_ranks(
            RankRecipe(functools.partial(_build_rank, config, model)),
            config,
            name="fsdp",
            needs=f"--trainer-arg world_size={config.world_size} needs that many GPUs",
            launcher=launcher,
        )

    @property
    def placement(self) -> list[dict[str, Any]]:
        """Where each rank runs (Ray actors: their node ids; local processes: nothing to say)."""
        return self._ranks.placement

    # ------------------------------------------------------------ trainer protocol
    async def train(self, batch: Sequence[Group], *, step: int, policy_version: int) -> TrainResult:
        replies = await self._ranks.acall("train", list(batch), step, policy_version)
        metrics: dict[str, float] = replies[0]
        return TrainResult(metrics=metrics)

    def weights(self) -> dict[str, torch.Tensor]:
        """The full policy, gathered to rank 0 (CPU tensors)."""
        state: dict[str, torch.Tensor] = self._call("weights")[0]
        return state

    # ---------------------------------------------- weights over a process group (collective.WeightSource)
    async def weight_group_address(self) -> str:
        """A free port on rank 0's node: rank 0 sends the weights (a local process at this process's
        node address, which is its own)."""
        from april_bench.collective import host_address

        here = host_address().removeprefix("tcp://").rpartition(":")[0]
        address: str = (await asyncio.to_thread(self._ranks.call, "weight_address", here))[0]
        return address

    async def join_weight_group(self, address: str, world: int, backend: str) -> None:
        # in a thread: rank 0's join waits for the engine's workers, joining meanwhile
        await asyncio.to_thread(self._ranks.call, "join_weights", address, world, backend)

    async def send_weights(self, per_tensor: bool = False) -> None:
        """Every rank gathers the full policy (an FSDP collective); rank 0 broadcasts it (``per_tensor``:
        SGLang's wire, one broadcast per tensor)."""
        await asyncio.to_thread(self._ranks.call, "send_weights", per_tensor)

    async def weight_header(self) -> dict[str, list[Any]]:
        """Names, dtypes and full shapes from rank 0's sharded parameters (no gather)."""
        found: dict[str, list[Any]] = (await asyncio.to_thread(self._ranks.call, "weight_header"))[0]
        return found

    def leave_weight_group(self) -> None:
        self._ranks.call("leave_weights")

    def save_state(self, path: str) -> None:
        """Full model and optimizer state dicts, written atomically by rank 0."""
        self._call("save_state", path)

    def load_state(self, path: str) -> None:
        self._call("load_state", path)

    def close(self) -> None:
        """Stop the ranks (idempotent)."""
        self._ranks.close()

    def _call(self, command: str, *args: Any) -> list[Any]:
        return self._ranks.call(command, *args)


# ---------------------------------------------------------------- the rank side
class _RankTrainer(TorchTrainer):
    """The torch trainer on a disjoint share of every mini-batch, with FSDP-averaged gradients."""

    _splits_rows = False  # every rank runs the same passes (collectives)

    @dataclass(kw_only=True, slots=True, frozen=True)
    class Config(TorchTrainer.Config):
        """The torch trainer's options (a rank is built directly, with a ``TorchTrainer.Config``)."""

    def __init__(
        self, config: TorchTrainer.Config, *, module: torch.nn.Module, rank: int, world: int
    ) -> None:
        super().__init__(config, module=module)
        self.rank, self.world = rank, world

    def _logprobs(
        self, model: torch.nn.Module, rows: _Rows, index: torch.Tensor, width: int
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Through the root module's forward, so FSDP gathers the embedding and head it holds (the
        chunked path calls submodules directly and would see sharded weights)."""
        ids = rows.ids[index, : width + 1]
        logits = model(input_ids=ids, attention_mask=rows.attention[index, : width + 1]).logits[:, :-1]
        return logits_token_logprobs(
            logits, ids[:, 1:], rows.mask[index, :width], temperature=self.config.temperature
        )

    def _local(self, part: list[int]) -> list[int]:
        if len(part) < self.world:
            raise ValueError(
                f"a mini-batch of {len(part)} rows cannot be split over {self.world} fsdp ranks; "
                "use fewer mini_batches or ranks, or larger batches"
            )
        return part[self.rank :: self.world]

    def _gradient_scale(self) -> float:
        # FSDP averages the ranks' gradients; each rank's loss already carries its share of the
        # mini-batch's loss units, so the average must be undone to give the one-process sum.
        return float(self.world)

    def _reduce(
        self, totals: dict[str, float], weights: dict[str, float]
    ) -> tuple[dict[str, float], dict[str, float]]:
        """Every rank's weighted metric sums added up (the same names on every rank)."""
        import torch.distributed as dist

        names = sorted(totals)
        values = [*(totals[n] for n in names), *(weights[n] for n in names)]
        reduced = torch.tensor(values, dtype=torch.float64)
        dist.all_reduce(reduced)
        k = len(names)
        return (
            {n: float(reduced[i]) for i, n in enumerate(names)},
            {n: float(reduced[k + i]) for i, n in enumerate(names)},
        )


def _shard(module: torch.nn.Module, mesh: Any, reshard_after_forward: bool) -> None:
    """Every decoder layer its own FSDP group (the longest ModuleList), then the root."""
    from torch.distributed.fsdp import fully_shard

    lists = [m for m in module.modules() if isinstance(m, torch.nn.ModuleList)]
    layers = max(lists, key=len) if lists else torch.nn.ModuleList()
    for layer in layers:
        fully_shard(layer, mesh=mesh, reshard_after_forward=reshard_after_forward)
    fully_shard(module, mesh=mesh, reshard_after_forward=reshard_after_forward)


def _build_rank(config: FSDPTrainer.Config, model: PolicySpec, rank: int, device: str, index: int) -> Handler:
    """A rank (the :class:`~april_bench.trainers.ranks.RankRecipe`), in the joined group: shard the
    policy on GPU ``index`` (or the CPU), then serve the driver's commands."""
    from torch.distributed.device_mesh import init_device_mesh

    from april_bench.models.zoo import build_model

    module = build_model(model.name, vocab_size=model.vocab_size, seed=model.seed)
    module.load_state_dict(model.weights)
    module.to(torch.device(device, index) if device == "cuda" else torch.device(device))
    mesh = init_device_mesh(device, (config.world_size,))
    _shard(module, mesh, config.reshard_after_forward)
    torch_config = config.torch_config().replace(device=device)
    return _handler(_RankTrainer(torch_config, module=module, rank=rank, world=config.world_size), rank)


def _handler(trainer: _RankTrainer, rank: int) -> Handler:
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
        get_optimizer_state_dict,
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    from april_bench.collective import WeightGroup, header, host_address

    full = StateDictOptions(full_state_dict=True, cpu_offload=True)
    weights: list[WeightGroup] = []  # rank 0's weight group, once joined

    def handle(command: str, args: list[Any]) -> Any:
        if command == "train":
            batch, step, version = args
            return asyncio.run(trainer.train(batch, step=step, policy_version=version)).metrics
        if command == "weights":
            state = get_model_state_dict(trainer.model, options=full)  # a collective: every rank
            return state if rank == 0 else None
        if command == "weight_address":
            (here,) = args
            return host_address(here) if rank == 0 else None
        if command == "join_weights":
            address, world, backend = args
            weights[:] = [WeightGroup(address, 0, world, backend=backend)] if rank == 0 else []
            return None
        if command == "send_weights":
            (per_tensor,) = args
            state = get_model_state_dict(trainer.model, options=full)  # a collective: every rank
            for group in weights:
                group.send_each(state) if per_tensor else group.send(state)
            return None
        if command == "weight_header":  # a DTensor's shape is the full tensor's
            return header(trainer.model.state_dict()) if rank == 0 else None
        if command == "leave_weights":
            weights.clear()
            return None
        if command == "save_state":
            (path,) = args
            model_state = get_model_state_dict(trainer.model, options=full)
            optim_state = get_optimizer_state_dict(trainer.model, trainer.optimizer, options=full)
            if rank == 0:
                from april_bench.trainers.state_file import save_atomic

                save_atomic({"model": model_state, "optimizer": optim_state}, path)
            return None
        if command == "load_state":
            (path,) = args
            saved = torch.load(path, map_location="cpu", weights_only=True)
            options = StateDictOptions(full_state_dict=True)
            set_model_state_dict(trainer.model, saved["model"], options=options)
            set_optimizer_state_dict(trainer.model, trainer.optimizer, saved["optimizer"], options=options)
            return None
        raise ValueError(f"unknown command {command!r}")

    return handle
