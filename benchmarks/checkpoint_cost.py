"""The bytes one trainer checkpoint takes (``TorchTrainer.save_state``: float32 weights and AdamW's
state), for a model shape, without a GPU and without allocating the weights.

The model is built on PyTorch's ``meta`` device from the zoo's config (``april_bench.models.zoo``), the
optimizer is the torch trainer's (AdamW over ``model.parameters()``), and the state AdamW keeps after
its first step is counted from its own parameter groups: ``exp_avg`` and ``exp_avg_sq`` of each
parameter's size and dtype (``max_exp_avg_sq`` too with ``amsgrad``) and a float32 ``step``.  Tied
weights are one tensor, written once.  ``tests/test_checkpoint_cost.py`` checks the count against the
file the trainer writes for ``tiny`` (within the file format's per-tensor overhead).

    python benchmarks/checkpoint_cost.py                       # the GPU recipe's 1.5B shape and Qwen3-4B
    python benchmarks/checkpoint_cost.py --model qwen3-8b --every 10 --steps 12
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any

DEFAULT_MODELS = ("r1-distill-qwen-1.5b", "qwen3-4b")


@dataclass(frozen=True, slots=True)
class CheckpointCost:
    model: str
    vocab_size: int
    parameters: int
    weight_bytes: int
    optimizer_bytes: int
    tensors: int

    @property
    def total_bytes(self) -> int:
        return self.weight_bytes + self.optimizer_bytes


def synthetic_vocab() -> int:
    """The synthetic task's vocabulary: the size its runs build the model with (the GPU recipe's)."""
    from april_bench.tasks.synthetic import SyntheticTask

    return int(SyntheticTask.Config().build().tokenizer.vocab_size)


def checkpoint_cost(
    model: str, *, vocab_size: int | None = None, amsgrad: bool = False, module: Any = None
) -> CheckpointCost:
    """What ``TorchTrainer.save_state`` writes for ``model`` (a zoo name; ``vocab_size``: the task's,
    else the model's own), after the first optimizer step.  ``module``: count this model instead (any
    device) - the test's way to compare with a file."""
    import torch

    from april_bench.trainers.torch_trainer import TorchTrainer

    if module is None:
        from transformers import AutoModelForCausalLM

        from april_bench.models.zoo import model_config

        with torch.device("meta"):
            config = model_config(model, vocab_size=vocab_size)
            module = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    defaults = TorchTrainer.Config()
    optimizer = torch.optim.AdamW(
        module.parameters(), lr=defaults.lr, betas=defaults.betas, amsgrad=amsgrad
    )  # the trainer's optimizer
    weights: dict[int, Any] = {}
    for tensor in module.state_dict(keep_vars=True).values():
        weights.setdefault(id(tensor), tensor)  # tied weights: one tensor
    weight_bytes = sum(t.numel() * t.element_size() for t in weights.values())
    moments = 3 if amsgrad else 2
    params = [p for group in optimizer.param_groups for p in group["params"]]
    step_bytes = torch.zeros((), dtype=torch.float32).element_size()
    optimizer_bytes = sum(moments * p.numel() * p.element_size() + step_bytes for p in params)
    return CheckpointCost(
        model=model,
        vocab_size=int(module.config.vocab_size),
        parameters=sum(p.numel() for p in params),
        weight_bytes=weight_bytes,
        optimizer_bytes=optimizer_bytes,
        tensors=len(weights) + (moments + 1) * len(params),
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--model", action="append", help="zoo model name (repeatable; default: the two above)"
    )
    parser.add_argument("--every", type=int, default=10, help="--checkpoint-every to price (default 10)")
    parser.add_argument("--steps", type=int, default=20, help="steps per arm to price (default 20)")
    parser.add_argument("--arms", type=int, default=2, help="arms of the run (default 2: sync, APRIL)")
    args = parser.parse_args(argv)
    print(
        "| model | vocabulary | parameters | weights (GB) | AdamW state (GB) | one trainer checkpoint (GB) | "
        f"written by {args.arms} arms x {args.steps} steps: every step (GB) | "
        f"--checkpoint-every {args.every} (GB) |"
    )
    print("|---|---|---|---|---|---|---|---|")
    synthetic = synthetic_vocab()
    for name, vocab, what in (
        (name, vocab, what)
        for name in args.model or DEFAULT_MODELS
        for vocab, what in (
            (synthetic, "synthetic task (the GPU recipe)"),
            (None, "the model's (a math run)"),
        )
    ):
        cost = checkpoint_cost(name, vocab_size=vocab)
        every_step = (args.steps - 1) * args.arms  # none after the last step
        scheduled = ((args.steps - 1) // args.every if args.every else 0) * args.arms
        gb = 1e9
        print(
            f"| {name} | {cost.vocab_size:,}: {what} | {cost.parameters / 1e9:.3f} B | "
            f"{cost.weight_bytes / gb:.2f} | "
            f"{cost.optimizer_bytes / gb:.2f} | **{cost.total_bytes / gb:.2f}** | "
            f"{every_step * cost.total_bytes / gb:.0f} | {scheduled * cost.total_bytes / gb:.0f} |"
        )
    print(
        "computed from the model config and AdamW's state (no weights allocated); an interruption adds "
        "at most one checkpoint per arm"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
