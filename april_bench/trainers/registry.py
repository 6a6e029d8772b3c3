"""Trainers by name (``--trainer``), and their factories, built from what the experiment decided.

Any trainer pairs with any engine that fits it: a trainer that needs token ids
(``torch``) needs an engine that produces them; the simulated trainer prices a
step from token counts alone and pairs with anything.  ``auto`` is ``sim`` on a
token-free engine and ``torch`` otherwise.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from april_bench.config import ConfigError, config_from
from april_bench.registry import Registry, Spec
from april_bench.trainers.protocol import Trainer

__all__ = ["TRAINERS", "TrainerSettings", "TrainerSpec", "resolve_trainer"]


@dataclass(frozen=True, slots=True)
class TrainerSettings:
    """What an experiment decided for its trainer; native options come from ``--trainer-arg``."""

    algorithm: str
    off_policy: str
    temperature: float
    max_response_len: int
    model: str
    hardware: str
    seed: int = 0
    pad_token_id: int = 0
    vocab_size: int | None = None
    num_gpus: int | None = None
    #: The starting weights (the same the engine starts from).
    initial_weights: Callable[[], Any] | None = None


@dataclass(frozen=True, slots=True)
class TrainerSpec(Spec):
    """A registered trainer: how to build it (``factory``, ``checker``), and what it needs."""

    #: True when it trains on token ids (the engine must produce them).
    needs_tokens: bool

    def build(self, settings: TrainerSettings, args: Mapping[str, Any]) -> Trainer:
        trainer: Trainer = self.load(self.factory)(settings, args)
        return trainer


TRAINERS: Registry[TrainerSpec] = Registry("trainer")
TRAINERS.register(
    "torch",
    TrainerSpec(
        "torch",
        "april_bench.trainers.registry:build_torch",
        needs_tokens=True,
        checker="april_bench.trainers.registry:check_torch",
    ),
    "one-process policy-gradient trainer (CPU or CUDA): GRPO, DAPO, GSPO",
)
TRAINERS.register(
    "fsdp",
    TrainerSpec(
        "fsdp",
        "april_bench.trainers.registry:build_fsdp",
        needs_tokens=True,
        checker="april_bench.trainers.registry:check_fsdp",
    ),
    "the torch trainer data-parallel over world_size processes with FSDP2 (gloo on CPU, nccl on CUDA)",
)
TRAINERS.register(
    "megatron",
    TrainerSpec(
        "megatron",
        "april_bench.trainers.registry:build_megatron",
        needs_tokens=True,
        checker="april_bench.trainers.registry:check_megatron",
    ),
    "the torch trainer's loss on a megatron-core GPTModel, tensor-parallel over tp processes "
    "(needs the megatron extra; gloo on CPU, nccl on CUDA)",
)
TRAINERS.register(
    "ray",
    TrainerSpec(
        "ray",
        "april_bench.trainers.ray_actor:build_ray",
        needs_tokens=True,
        checker="april_bench.trainers.ray_actor:check_ray",
        parts=(TRAINERS.get("torch"), TRAINERS.get("fsdp"), TRAINERS.get("megatron")),
    ),
    "a torch or fsdp trainer in a Ray actor, placed on any node of the cluster (trainer=torch|fsdp)",
)
TRAINERS.register(
    "sim",
    TrainerSpec("sim", "april_bench.trainers.registry:build_sim", needs_tokens=False),
    "simulated: a step costs modelled time and changes nothing",
)


def resolve_trainer(requested: str, *, engine: str, produces_tokens: bool) -> TrainerSpec:
    """The trainer to build: ``auto`` by the engine, a named one checked against it."""
    name = requested if requested != "auto" else ("torch" if produces_tokens else "sim")
    spec = TRAINERS.get(name)
    if spec.needs_tokens and not produces_tokens:
        raise ConfigError(
            f"--trainer {name} trains a model on its own tokens, but engine {engine!r} has no model behind "
            "its output (lengths or fake tokens); use --trainer sim, or a real engine (--engine hf)"
        )
    return spec


def _options(settings: TrainerSettings, args: Mapping[str, Any]) -> dict[str, Any]:
    """What the run decides for every torch-based trainer, then the user's --trainer-arg options."""
    return {
        "algorithm": settings.algorithm,
        "off_policy": settings.off_policy,
        "temperature": settings.temperature,
        "max_response_len": settings.max_response_len,
        "pad_token_id": settings.pad_token_id,
        **args,
    }


def _starting_module(settings: TrainerSettings) -> Any:
    """The seeded model with the task's starting weights loaded (what every torch trainer starts from)."""
    from april_bench.models.zoo import build_model

    module = build_model(settings.model, vocab_size=settings.vocab_size, seed=settings.seed)
    start = settings.initial_weights() if settings.initial_weights is not None else None
    if start is not None:
        module.load_state_dict(start)
    return module


def check_torch(settings: TrainerSettings, args: Mapping[str, Any]) -> Any:
    from april_bench.trainers.torch_trainer import TorchTrainer

    return config_from(
        TorchTrainer.Config, _options(settings, args), where="--trainer-arg", owner="the torch trainer"
    )


def build_torch(settings: TrainerSettings, args: Mapping[str, Any]) -> Trainer:
    config = check_torch(settings, args)
    trainer: Trainer = config.build(module=_starting_module(settings))
    return trainer


def check_fsdp(settings: TrainerSettings, args: Mapping[str, Any]) -> Any:
    from april_bench.trainers.fsdp import FSDPTrainer

    return config_from(
        FSDPTrainer.Config, _options(settings, args), where="--trainer-arg", owner="the fsdp trainer"
    )


def build_fsdp(settings: TrainerSettings, args: Mapping[str, Any]) -> Trainer:
    from april_bench.trainers.fsdp import PolicySpec

    config = check_fsdp(settings, args)
    module = _starting_module(settings)  # the ranks start where the one-process trainer would
    spec = PolicySpec(settings.model, settings.vocab_size, settings.seed, module.state_dict())
    trainer: Trainer = config.build(model=spec)
    return trainer


def check_megatron(settings: TrainerSettings, args: Mapping[str, Any]) -> Any:
    from april_bench.trainers.megatron_trainer import MegatronTrainer

    config = config_from(
        MegatronTrainer.Config, _options(settings, args), where="--trainer-arg", owner="the megatron trainer"
    )
    if importlib.util.find_spec("megatron") is None:  # found, not imported: the ranks import it
        raise ConfigError("--trainer megatron needs megatron-core: pip install 'april-bench[megatron]'")
    return config


def build_megatron(settings: TrainerSettings, args: Mapping[str, Any]) -> Trainer:
    from april_bench.trainers.fsdp import PolicySpec

    config = check_megatron(settings, args)
    module = _starting_module(settings)  # the ranks start where the one-process trainer would
    spec = PolicySpec(settings.model, settings.vocab_size, settings.seed, module.state_dict())
    trainer: Trainer = config.build(model=spec)
    return trainer


def build_sim(settings: TrainerSettings, args: Mapping[str, Any]) -> Trainer:
    from april_bench.trainers.sim import SimTrainer

    options = {"hardware": settings.hardware, "model": settings.model, "num_gpus": settings.num_gpus, **args}
    trainer: Trainer = config_from(
        SimTrainer.Config,
        options,
        where="--trainer-arg",
        owner="the simulated trainer",
        fixed=("hardware", "model", "num_gpus"),
    ).build()
    return trainer
