"""The fsdp trainer for real: two gloo ranks (spawned processes, FSDP2) against the one-process trainer."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import torch

from april_bench.config import ConfigError
from april_bench.models.zoo import build_model
from april_bench.trainers.fsdp import FSDPTrainer, PolicySpec
from april_bench.trainers.registry import TRAINERS, TrainerSettings
from april_bench.trainers.torch_trainer import TorchTrainer
from april_bench.types import FinishReason, Group, Prompt, Segment

VOCAB = 17


def _group(uid: int, lengths: list[int], rewards: list[float], *, stale: int = 0) -> Group:
    """One prompt's group; the first ``stale`` tokens of each response come from policy version 0."""
    prompt = Prompt(uid=uid, source_id=f"p{uid}", length=3, token_ids=(1, 5 + uid % 4, 6))
    group = Group.fresh(prompt, len(lengths))
    for i, (sample, length, reward) in enumerate(zip(group.samples, lengths, rewards, strict=True)):
        ids = [3 + (uid + i + k) % (VOCAB - 3) for k in range(length)]
        cut = min(stale, length)
        for version, part in ((0, ids[:cut]), (1, ids[cut:])):
            if part:
                sample.append(
                    Segment(
                        f"r{uid}",
                        version,
                        len(part),
                        FinishReason.STOP,
                        version,
                        tuple(part),
                        (-1.0,) * len(part),
                    )
                )
        sample.reward = reward
    return group


def _batch() -> list[Group]:
    # uneven lengths and a group of equal rewards, so the ranks' shares of tokens and sequences differ
    return [
        _group(0, [2, 5, 3, 1], [1.0, 0.0, 0.0, 1.0], stale=2),
        _group(1, [4, 4, 2, 6], [1.0, 1.0, 1.0, 1.0]),
        _group(2, [1, 3, 7, 2], [0.0, 1.0, 0.0, 0.0], stale=1),
    ]


def _start() -> dict[str, torch.Tensor]:
    return build_model("tiny", vocab_size=VOCAB, seed=3).state_dict()


def _run(trainer: object, steps: int) -> list[dict[str, float]]:
    async def go() -> list[dict[str, float]]:
        return [
            (await trainer.train(_batch(), step=s, policy_version=1)).metrics  # type: ignore[attr-defined]
            for s in range(steps)
        ]

    return asyncio.run(go())


@pytest.mark.slow
@pytest.mark.parametrize(
    "options",
    [
        {"algorithm": "grpo"},
        {"algorithm": "dapo", "off_policy": "mask", "mini_batches": 2, "lr": 3e-3},
    ],
    ids=["grpo", "dapo-mask-2mb"],
)
def test_two_gloo_ranks_match_the_one_process_trainer(options: dict[str, object], tmp_path: Path) -> None:
    start = _start()
    # FSDP ranks compute every row (zero_advantage is theirs to ignore: the passes are collectives),
    # so the one process does too, for the same metrics
    single = TorchTrainer.Config(device="cpu", zero_advantage="train", **options).build(  # type: ignore[arg-type]
        module=_module(start)
    )
    expected = _run(single, steps=2)
    fsdp = FSDPTrainer.Config(device="cpu", world_size=2, **options).build(  # type: ignore[arg-type]
        model=PolicySpec("tiny", VOCAB, 3, start)
    )
    try:
        got = _run(fsdp, steps=2)
        weights = fsdp.weights()
        fsdp.save_state(str(tmp_path / "state.pt"))
    finally:
        fsdp.close()
    for want, have in zip(expected, got, strict=True):
        for key in ("loss", "pg_loss", "grad_norm", "entropy", "masked_token_fraction"):
            assert have[key] == pytest.approx(want[key], rel=1e-4, abs=1e-6), key
    reference = single.model.state_dict()
    assert weights.keys() == reference.keys()
    # The same update on both sides.  Compared as updates, not weights: AdamW divides by the root of
    # the second moment, so float noise in a near-zero gradient moves an element by up to lr; the
    # update as a whole must agree to 0.1%.
    moved = torch.cat([(reference[k] - start[k]).flatten() for k in start])
    theirs = torch.cat([(weights[k] - start[k]).flatten() for k in start])
    assert moved.norm() > 1e-4  # the policy did move: two untouched copies would agree trivially
    assert (theirs - moved).norm() / moved.norm() < 1e-3
    saved = torch.load(tmp_path / "state.pt", weights_only=True)
    torch.testing.assert_close(saved["model"]["model.norm.weight"], reference["model.norm.weight"])
    assert saved["optimizer"]["state"], "AdamW moments are saved"


def _module(start: dict[str, torch.Tensor]) -> torch.nn.Module:
    module = build_model("tiny", vocab_size=VOCAB, seed=3)
    module.load_state_dict(start)
    return module


def test_fsdp_options_are_checked_without_starting_ranks() -> None:
    settings = TrainerSettings(
        algorithm="grpo",
        off_policy="as-is",
        temperature=1.0,
        max_response_len=8,
        model="tiny",
        hardware="cpu",
    )
    spec = TRAINERS.get("fsdp")
    assert spec.needs_tokens
    assert spec.configure(settings, {"world_size": 2}).world_size == 2  # type: ignore[attr-defined]
    with pytest.raises(ConfigError, match="world_size"):
        spec.check(settings, {"world_size": 0})
    with pytest.raises(ConfigError, match="kl_coef=0"):
        spec.check(settings, {"kl_coef": 0.1})
    with pytest.raises(ConfigError, match="unknown --trainer-arg"):
        spec.check(settings, {"wrold_size": 2})
    torch_options = FSDPTrainer.Config(world_size=4, lr=2e-4).torch_config()
    assert isinstance(torch_options, TorchTrainer.Config) and torch_options.lr == 2e-4
