"""The megatron trainer: megatron-core ranks (spawned processes, gloo on CPU) against the torch trainer.

Tests marked ``megatron`` need megatron-core (``pip install 'april-bench[megatron]'``, ``tox -e megatron``)
and skip without it; the option checks and the vocabulary padding run everywhere.
"""

from __future__ import annotations

import asyncio
import importlib.util
from pathlib import Path

import pytest
import torch
from helpers import embedded_flags

from april_bench.cli import main
from april_bench.config import ConfigError
from april_bench.models.zoo import build_model
from april_bench.results.store import check_run, load_run
from april_bench.trainers.fsdp import PolicySpec
from april_bench.trainers.megatron import ModelShape
from april_bench.trainers.megatron_trainer import MegatronTrainer, pad_vocab, padded_shape
from april_bench.trainers.registry import TRAINERS, TrainerSettings
from april_bench.trainers.torch_trainer import TorchTrainer
from april_bench.types import FinishReason, Group, Prompt, Segment

#: Odd on purpose: tp=2 pads it to 18, and the padding must not change the loss.
VOCAB = 17
#: What must agree between the megatron and torch trainers on the same batch.
MATCHED = ("loss", "pg_loss", "grad_norm", "entropy")


def _group(uid: int, lengths: list[int], rewards: list[float]) -> Group:
    prompt = Prompt(uid=uid, source_id=f"p{uid}", length=3, token_ids=(1, 5 + uid % 4, 6))
    group = Group.fresh(prompt, len(lengths))
    for i, (sample, length, reward) in enumerate(zip(group.samples, lengths, rewards, strict=True)):
        ids = tuple(3 + (uid + i + k) % (VOCAB - 3) for k in range(length))
        sample.append(Segment(f"r{uid}", 1, length, FinishReason.STOP, 1, ids, (-1.0,) * length))
        sample.reward = reward
    return group


def _batch() -> list[Group]:
    return [
        _group(0, [2, 5, 3, 1], [1.0, 0.0, 0.0, 1.0]),
        _group(1, [4, 4, 2, 6], [1.0, 0.0, 1.0, 1.0]),
        _group(2, [1, 3, 7, 2], [0.0, 1.0, 0.0, 0.0]),
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


def _torch(start: dict[str, torch.Tensor], device: str, options: dict[str, object]) -> TorchTrainer:
    module = build_model("tiny", vocab_size=VOCAB, seed=3)
    module.load_state_dict(start)
    # the ranks compute every row (zero_advantage=train: their passes are collectives), as does this one
    return TorchTrainer.Config(device=device, zero_advantage="train", **options).build(  # type: ignore[arg-type]
        module=module
    )


def _compare(device: str, tp: int, options: dict[str, object], tmp_path: Path) -> None:
    start = _start()
    single = _torch(start, device, options)
    expected = _run(single, steps=2)
    megatron = MegatronTrainer.Config(device=device, tp=tp, **options).build(  # type: ignore[arg-type]
        model=PolicySpec("tiny", VOCAB, 3, start)
    )
    try:
        got = _run(megatron, steps=2)
        weights = megatron.weights()
        megatron.save_state(str(tmp_path / "state.pt"))
        megatron.load_state(str(tmp_path / "state.pt"))
        assert megatron.weights().keys() == weights.keys()
        checkpoint = Path(megatron.save(str(tmp_path / "policy")))
    finally:
        megatron.close()
    for want, have in zip(expected, got, strict=True):
        for key in MATCHED:
            assert have[key] == pytest.approx(want[key], rel=1e-4, abs=1e-6), key
    reference = {k: v.cpu() for k, v in single.model.state_dict().items()}
    assert weights.keys() == reference.keys()  # Hugging Face names, vocabulary unpadded
    assert weights["model.embed_tokens.weight"].shape == reference["model.embed_tokens.weight"].shape
    # the same update on both sides (as in test_fsdp_trainer: updates, not weights, are compared)
    moved = torch.cat([(reference[k] - start[k]).flatten() for k in start])
    theirs = torch.cat([(weights[k] - start[k]).flatten() for k in start])
    assert moved.norm() > 1e-4
    assert (theirs - moved).norm() / moved.norm() < 1e-3
    assert (checkpoint / "config.json").is_file()


@pytest.mark.megatron
@pytest.mark.slow
@pytest.mark.parametrize(
    ("tp", "options"),
    [
        (1, {"algorithm": "grpo"}),
        (2, {"algorithm": "dapo", "mini_batches": 2, "lr": 3e-3}),
        (2, {"algorithm": "gspo", "max_tokens_per_micro_batch": 24}),
    ],
    ids=["tp1-grpo", "tp2-dapo-2mb", "tp2-gspo-micro"],
)
def test_megatron_ranks_match_the_torch_trainer_on_cpu(
    tp: int, options: dict[str, object], tmp_path: Path
) -> None:
    _compare("cpu", tp, options, tmp_path)


@pytest.mark.gpu
@pytest.mark.megatron
@pytest.mark.slow
def test_megatron_matches_the_torch_trainer_on_cuda(tmp_path: Path) -> None:
    _compare("cuda", 1, {"algorithm": "grpo"}, tmp_path)


@pytest.mark.megatron
@pytest.mark.slow
def test_run_trains_the_embedded_task_with_the_megatron_trainer(tmp_path: Path) -> None:
    out = tmp_path / "run"
    argv = embedded_flags(
        engine="hf",
        trainer="megatron",
        trainer_arg="tp=2",
        steps=2,
        rollout_batch_size=2,
        n_samples_per_prompt=2,
        over_sampling_batch_size=4,
        max_response_len=16,
        task_arg="max_n=30",
        out=out,
    )
    assert main(["run", *argv]) == 0
    assert check_run(load_run(out)) == []


# ---------------------------------------------------------------- no megatron-core needed
def _settings() -> TrainerSettings:
    return TrainerSettings(
        algorithm="grpo",
        off_policy="as-is",
        temperature=1.0,
        max_response_len=8,
        model="tiny",
        hardware="cpu",
    )


def test_megatron_options_are_checked_before_any_rank_starts() -> None:
    spec = TRAINERS.get("megatron")
    assert spec.needs_tokens
    for args, match in (
        ({"tp": 0}, "tp and pp"),
        ({"pp": 2}, "pipeline"),
        ({"kl_coef": 0.1}, "kl_coef=0"),
        ({"activation_checkpointing": True}, "recomputation"),
        ({"backend": "mpi"}, "backend"),
    ):
        with pytest.raises(ConfigError, match=match):
            spec.check(_settings(), args)
    with pytest.raises(ConfigError, match="tp=3 must divide"):  # 4 heads, 2 KV heads
        MegatronTrainer.Config(tp=3, device="cpu").build(model=PolicySpec("tiny", VOCAB, 3, _start()))


@pytest.mark.skipif(importlib.util.find_spec("megatron") is not None, reason="megatron-core is installed")
def test_without_megatron_core_the_check_names_the_extra() -> None:
    with pytest.raises(ConfigError, match=r"april-bench\[megatron\]"):
        TRAINERS.get("megatron").check(_settings(), {"tp": 1})


def test_vocabulary_padding_is_zero_rows_up_to_a_multiple_of_tp() -> None:
    start = _start()
    shape = padded_shape(ModelShape.of(build_model("tiny", vocab_size=VOCAB).config), 2)
    assert shape.vocab == 18
    padded = pad_vocab(start, shape.vocab)
    embed = padded["model.embed_tokens.weight"]
    assert embed.shape[0] == 18 and torch.equal(embed[:VOCAB], start["model.embed_tokens.weight"])
    assert not embed[VOCAB:].any()
