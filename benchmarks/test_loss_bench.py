"""Micro-benchmark: the policy losses on a training-sized batch (``pytest benchmarks --benchmark-only``).

A batch of 256 responses (32 groups x 8) of 512 tokens, float32 on the CPU: group advantages, then
:func:`april_bench.algorithms.losses.policy_loss` for each algorithm's preset and each off-policy
treatment (``tis`` and ``mask`` read per-token versions).  Forward only: the trainer's backward pass
is the model's, not the loss's.  One torch thread, so that runs compare on a shared machine.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch

from april_bench.algorithms.losses import LossConfig, group_advantages, policy_loss

GROUPS, GROUP_SIZE, TOKENS = 32, 8, 512


@pytest.fixture(scope="module", autouse=True)
def one_thread() -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def batch() -> dict[str, Any]:
    gen = torch.Generator().manual_seed(0)
    n = GROUPS * GROUP_SIZE
    old = -torch.rand(n, TOKENS, generator=gen) * 3
    lengths = torch.randint(1, TOKENS + 1, (n,), generator=gen)
    mask = (torch.arange(TOKENS)[None, :] < lengths[:, None]).float()
    return {
        "logprobs": old + 0.05 * torch.randn(n, TOKENS, generator=gen),
        "old_logprobs": old,
        "behaviour_logprobs": old + 0.05 * torch.randn(n, TOKENS, generator=gen),
        "rewards": torch.randint(0, 2, (n,), generator=gen).float(),
        "mask": mask,
        "token_versions": torch.randint(0, 3, (n, TOKENS), generator=gen),
    }


@pytest.mark.benchmark(group="loss")
def test_group_advantages(benchmark: Any, batch: dict[str, Any]) -> None:
    advantages = benchmark(group_advantages, batch["rewards"], GROUP_SIZE)
    assert advantages.shape == batch["rewards"].shape and torch.isfinite(advantages).all()


@pytest.mark.benchmark(group="loss")
@pytest.mark.parametrize(
    ("algorithm", "off_policy"),
    [("grpo", "as-is"), ("dapo", "as-is"), ("gspo", "as-is"), ("grpo", "tis"), ("grpo", "mask")],
)
def test_policy_loss(benchmark: Any, batch: dict[str, Any], algorithm: str, off_policy: str) -> None:
    config = LossConfig.for_algorithm(algorithm, off_policy=off_policy)
    advantages = group_advantages(batch["rewards"], GROUP_SIZE)
    loss, metrics = benchmark(
        policy_loss,
        config,
        logprobs=batch["logprobs"],
        old_logprobs=batch["old_logprobs"],
        advantages=advantages,
        mask=batch["mask"],
        behaviour_logprobs=batch["behaviour_logprobs"],
        token_versions=batch["token_versions"],
        current_version=2,
    )
    assert torch.isfinite(loss) and "pg_loss" in metrics
