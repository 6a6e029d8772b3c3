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
from typing import Any, ClassVar

from april_bench.config import ConfigError
from april_bench.registry import Registry, Spec
from april_bench.trainers.protocol import Trainer
from april_bench.trainers.start import starting_module

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
    """A registered trainer: how to build it (``config``, ``factory``, ``checker``), and what it needs."""

    #: True when it trains on token ids (the engine must produce them).
    needs_tokens: bool

    option_flag: ClassVar[str] = "--trainer-arg"
    kind: ClassVar[str] = "trainer"

    def build(self, settings: TrainerSettings, args: Mapping[str, Any]) -> Trainer:
        trainer: Trainer = Spec.build(self, settings, args)
        return trainer


#: What the run decides for every torch-based trainer (``--algo``, ``--off-policy``, the rollout's
#: temperature and response limit, the tokenizer's padding); a ``--trainer-arg`` of the same name wins.
_TORCH_DECIDED = tuple(
    (name, name) for name in ("algorithm", "off_policy", "temperature", "max_response_len", "pad_token_id")
)

TRAINERS: Registry[TrainerSpec] = Registry("trainer")
TRAINERS.register(
    "torch",
    TrainerSpec(
        "torch",
        "april_bench.trainers.registry:build_torch",
        config="april_bench.trainers.torch_trainer:TorchTrainer.Config",
        decided=_TORCH_DECIDED,
        needs_tokens=True,
    ),
    "one-process policy-gradient trainer (CPU or CUDA): GRPO, DAPO, GSPO",
)
TRAINERS.register(
    "fsdp",
    TrainerSpec(
        "fsdp",
        "april_bench.trainers.registry:build_ranks",
        config="april_bench.trainers.fsdp:FSDPTrainer.Config",
        decided=_TORCH_DECIDED,
        needs_tokens=True,
    ),
    "the torch trainer data-parallel over world_size processes with FSDP2 (gloo on CPU, nccl on CUDA)",
)
TRAINERS.register(
    "megatron",
    TrainerSpec(
        "megatron",
        "april_bench.trainers.registry:build_megatron",
        config="april_bench.trainers.megatron_trainer:MegatronTrainer.Config",
        decided=_TORCH_DECIDED,
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
        config="april_bench.trainers.ray_actor:RayTrainer.Config",
        rest="trainer_args",
        owner="the ray trainer",
        options_note="any other option goes to the trainer that trainer= names: its options",
        parts=(TRAINERS.get("torch"), TRAINERS.get("fsdp"), TRAINERS.get("megatron")),
    ),
    "a trainer on a Ray cluster: torch in one actor; fsdp or megatron with one actor per rank, placed "
    "across nodes (trainer=torch|fsdp|megatron)",
)
TRAINERS.register(
    "sim",
    TrainerSpec(
        "sim",
        None,
        config="april_bench.trainers.sim:SimTrainer.Config",
        fixed=(("hardware", "--hw"), ("model", "--model"), ("num_gpus", "--num-gpus")),
        owner="the simulated trainer",
        needs_tokens=False,
    ),
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


def build_torch(config: Any, settings: TrainerSettings) -> Trainer:
    trainer: Trainer = config.build(module=starting_module(settings))
    return trainer


def build_ranks(config: Any, settings: TrainerSettings) -> Trainer:
    """A trainer over rank processes (FSDP, Megatron): the ranks start where the one-process trainer
    would, from the seeded model's state."""
    from april_bench.trainers.fsdp import PolicySpec

    module = starting_module(settings)
    spec = PolicySpec(settings.model, settings.vocab_size, settings.seed, module.state_dict())
    trainer: Trainer = config.build(model=spec)
    return trainer


def check_megatron(config: Any, settings: TrainerSettings) -> None:
    if importlib.util.find_spec("megatron") is None:  # found, not imported: the ranks import it
        raise ConfigError("--trainer megatron needs megatron-core: pip install 'april-bench[megatron]'")


def build_megatron(config: Any, settings: TrainerSettings) -> Trainer:
    check_megatron(config, settings)
    return build_ranks(config, settings)
