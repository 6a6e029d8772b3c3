"""The simulated trainer: a policy update costs modelled time, and changes nothing else.

Time per step = 5 x F x T / (gpus x peak BF16 FLOP/s x MFU), with F the matmul
FLOPs per token (2 x matmul parameters) and T the prompt + response tokens of
the batch.  On a virtual clock the step sleeps that long; on a real one (a fake engine served over HTTP)
it only reports it.  The 5 passes of F are slime's colocated recipe: the old-policy
log-prob forward (1), the training forward (1), the full-recompute forward (1)
and the backward (2).  Attention FLOPs are left out, so long contexts are
slightly under-priced.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass

from april_bench.config import BaseConfig, Configurable, param
from april_bench.profiles.hardware import hardware_profile
from april_bench.profiles.models import MODELS
from april_bench.trainers.protocol import TrainResult
from april_bench.types import Group
from april_bench.vtime import VirtualTimeLoop

__all__ = ["SimTrainer"]

PASSES = 5  # log-prob forward + forward + recompute forward + backward (2)


class SimTrainer(Configurable):
    @dataclass(kw_only=True, slots=True, frozen=True)
    class Config(BaseConfig):
        hardware: str = param("h100", help="hardware profile")
        model: str = param("qwen3-4b", help="model profile")
        num_gpus: int | None = param(None, help="training GPUs (default: one node; colocated with rollout)")

    def __init__(self, config: Config) -> None:
        self.config = config
        self.hardware = hardware_profile(config.hardware)
        self.model = MODELS.get(config.model)
        self.num_gpus = config.num_gpus or self.hardware.gpus_per_node

    def train_time(self, tokens: int) -> float:
        hw = self.hardware
        return PASSES * self.model.flops_per_token * tokens / (self.num_gpus * hw.bf16_flops * hw.train_mfu)

    async def train(self, batch: Sequence[Group], *, step: int, policy_version: int) -> TrainResult:
        tokens = sum(s.prompt.length + s.response_len for g in batch for s in g.samples)
        seconds = self.train_time(tokens)
        if isinstance(asyncio.get_running_loop(), VirtualTimeLoop):
            await asyncio.sleep(seconds)
        # On a real clock (a fake engine served over HTTP) the modelled time is reported, not slept:
        # the run is labelled simulated, and a real-time wait would only slow it down.
        return TrainResult(metrics={"train_tokens": float(tokens), "train_time_s": seconds})

    def weights(self) -> None:
        return None
